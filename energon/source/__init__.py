"""Leaf datasets: turn a sample index into a loaded sample (load time; preparing data is
:mod:`energon.format`'s).

``leaf`` (the :class:`~energon.source.leaf.LeafDataset` contract), ``kinds`` (which kind a path
is, and opening it: the one dispatch), one module per kind (``webdataset``, ``jsonl``, ``join``,
``tokens``), ``shard_reader`` and ``prefetch`` (byte ranges by pread / ranged GET), and what leaves
build samples with: ``dataset_config``, ``fieldmap``, ``sample_loader``, ``file_store`` (aux data).
"""
