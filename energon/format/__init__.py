"""On-disk dataset formats: tar shards and their indices, ``.nv-meta`` metadata, ``prepare``.

Submodules are imported directly (``from energon.format.tar import split_sample_bytes``); this
package deliberately imports nothing heavy so worker processes start fast.
"""
