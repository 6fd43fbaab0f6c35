"""The reference's internals of WebDataset reading and preparation (``megatron.energon.flavors.
webdataset.{prepare, metadata, itar, ...}``), mapped onto energon's ``format`` and ``source``
layers for code that uses them directly."""
