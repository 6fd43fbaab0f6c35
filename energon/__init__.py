"""energon: a multimodal streaming data loader for PyTorch and Megatron.

Public API (re-exports only). Datasets prepared by NVIDIA's Megatron-Energon load here and vice versa.
Names are imported on first use, so ``energon prepare`` and other light commands do not pay for
importing torch.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

_EXPORTS = {
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
    "prepare_metadataset": "energon.format.join_index",
    "traverse_metadataset": "energon.metadataset.resolve",
    "BasicDataLoader": "energon.loader",
    "Batch": "energon.samples",
    "CaptioningSample": "energon.samples",
    "CrudeSample": "energon.samples",
    "EmptyDatasetError": "energon.errors",
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
    "homogeneous_concat_mix": "energon.samples.collate",
    "load_state_file": "energon.state",
    "log_exception": "energon.errors",
    "redistribute_states": "energon.state",
    "reraise_exception": "energon.errors",
    "save_state_file": "energon.state",
    "stateless": "energon.task_encoder",
    # the reference-shaped surface (energon.compat): wrappers, factories, loaders, cache pools
    **{
        name: "energon.compat.wrappers"
        for name in (
            "BatchDataset", "BlendDataset", "ConcatDataset", "EpochizeDataset", "FilterDataset",
            "GcDataset", "GroupBatchDataset", "IterMapDataset", "LimitDataset", "LogSampleDataset",
            "MapDataset", "MixBatchDataset", "PackingDataset", "RepeatDataset",
            "ShuffleBufferDataset",
        )
    },
    **{
        name: "energon.compat.flavors"
        for name in (
            "BaseCoreDatasetFactory", "BaseWebdatasetFactory", "CaptioningWebdataset",
            "CrudeJsonlDatasetFactory", "CrudeWebdataset", "DefaultCrudeJsonlDatasetFactory",
            "DefaultDecoderWebdatasetFactory", "DefaultGenericWebdatasetFactory",
            "ImageClassificationWebdataset", "ImageWebdataset", "InterleavedWebdataset",
            "JoinedWebdatasetFactory", "MultiChoiceVQAWebdataset", "OCRWebdataset",
            "SimilarityInterleavedWebdataset", "StandardWebdatasetFactory", "TextWebdataset",
            "VQAOCRWebdataset", "VQAWebdataset", "VidQAWebdataset",
        )
    },
    **{
        name: "energon.compat.metadataset"
        for name in (
            "DatasetLoader", "DatasetLoaderInterface", "Metadataset", "MetadatasetV2",
            "load_dataset",
        )
    },
    **{
        name: "energon.compat.cache"
        for name in (
            "CachePool", "DirectLazy", "FileCacheLazy", "FileStoreCachePool", "FileStoreDecoder",
            "Lazy", "MockLazy", "NoCachePool",
        )
    },
    **{
        name: "energon.compat.task_encoder"
        for name in ("AugmentTaskEncoder", "DefaultTaskEncoder", "TaskEncoder", "get_val_datasets")
    },
}  # fmt: skip

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
