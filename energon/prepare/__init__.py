"""Preparing data: everything that writes a dataset's metadata, above the on-disk formats it
writes (``energon.format``) and the media extraction it runs: the orchestrator of ``energon
prepare`` for WebDatasets (``dataset``, its chunks ``scan`` in worker processes and the finished
ones kept in ``work``), media metadata into the index (``media``) and the join indices of a
metadataset (``join_indices``)."""
