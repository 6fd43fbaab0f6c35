"""The reference's internals of indexed JSONL datasets (``megatron.energon.flavors.jsonl.
{ijsonl, ijsonl_reader, jsonl_prepare}``), mapped onto ``energon.format.jsonl``."""
