"""energon: a multimodal streaming data loader for PyTorch and Megatron.

Public API (re-exports only). Datasets prepared by NVIDIA's Megatron-Energon load here and vice versa.
Names are imported on first use, so ``energon prepare`` and other light commands do not pay for
importing torch.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

_EXPORTS = {
    "LimitDataset": "energon.loader.wrappers",
    "RepeatDataset": "energon.loader.wrappers",
    "remote_stats": "energon.remote",
    "EpochIndex": "energon.megatron.epoch_index",
    "GPTConfig": "energon.megatron.gpt_dataset",
    "IdentityMultiEpochDatasetWrapper": "energon.megatron.epoch_index",
    "MultiEpochDatasetResampler": "energon.megatron.epoch_index",
    "Blender": "energon.metadataset.resolve",
    "Cooker": "energon.task_encoder",
    "DecodeFileStore": "energon.source.file_store",
    "FileStore": "energon.source.file_store",
    "PrimaryFileStore": "energon.source.file_store",
    "SystemFileStore": "energon.source.file_store",
    "WebdatasetFileStore": "energon.source.file_store",
    "basic_sample_keys": "energon.task_encoder",
    "cooker": "energon.task_encoder",
    "prepare_metadataset": "energon.metadataset.join",
    "traverse_metadataset": "energon.metadataset.resolve",
    "AugmentTaskEncoder": "energon.task_encoder",
    "BasicDataLoader": "energon.loader",
    "Batch": "energon.samples",
    "CaptioningSample": "energon.samples",
    "CrudeSample": "energon.samples",
    "DefaultTaskEncoder": "energon.task_encoder",
    "EmptyDatasetError": "energon.errors",
    "EnergonError": "energon.errors",
    "FatalSampleError": "energon.errors",
    "ImageClassificationSample": "energon.samples",
    "ImageSample": "energon.samples",
    "InterleavedSample": "energon.samples",
    "MultiChoiceVQASample": "energon.samples",
    "OCRSample": "energon.samples",
    "Sample": "energon.samples",
    "SampleDecoder": "energon.decode",
    "SampleException": "energon.errors",
    "SavableDataLoader": "energon.loader",
    "SavableDataset": "energon.loader.savable_dataset",
    "SimilarityInterleavedSample": "energon.samples",
    "SkipSample": "energon.errors",
    "SourceInfo": "energon.samples",
    "StateError": "energon.errors",
    "TaskEncoder": "energon.task_encoder",
    "TextSample": "energon.samples",
    "VQAOCRSample": "energon.samples",
    "VQASample": "energon.samples",
    "VidQASample": "energon.samples",
    "WorkerConfig": "energon.worker",
    "batch_list": "energon.samples.collate",
    "batch_pad_stack": "energon.samples.collate",
    "batch_stack": "energon.samples.collate",
    "concat_pad": "energon.samples.collate",
    "edataclass": "energon.samples.edataclass",
    "generic_batch": "energon.samples.collate",
    "generic_concat": "energon.samples.collate",
    "get_loader": "energon.loader",
    "get_savable_loader": "energon.loader",
    "get_train_dataset": "energon.loader",
    "get_val_dataset": "energon.loader",
    "get_val_datasets": "energon.loader",
    "homogeneous_concat_mix": "energon.samples.collate",
    "load_state_file": "energon.state",
    "log_exception": "energon.errors",
    "redistribute_states": "energon.state",
    "reraise_exception": "energon.errors",
    "save_state_file": "energon.state",
    "stateless": "energon.task_encoder",
}

try:
    __version__ = version("energon-loader")
except PackageNotFoundError:  # running from a source tree
    __version__ = "unknown"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'energon' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = sorted(_EXPORTS) + ["__version__"]
