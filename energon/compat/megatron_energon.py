"""``megatron.energon`` under the alias: energon's public names, served from ``energon``.

A module of its own (not ``energon`` itself) because Python binds every imported submodule as an
attribute of its parent: ``import megatron.energon.task_encoder`` must set
``megatron.energon.task_encoder`` to the mapped module without touching ``energon.task_encoder``, and
``import megatron.energon.edataclass`` must not replace the ``edataclass`` decorator by a module.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import energon

__path__: list[str] = []  # a package: its submodules come from the alias's module map

# Megatron-Energon 7.4's ``__all__`` (all of them are energon public names).
REFERENCE_ALL = [
    "__version__", "AugmentTaskEncoder", "BaseCoreDatasetFactory", "BaseWebdatasetFactory",
    "basic_sample_keys", "batch_list", "batch_pad_stack", "batch_stack", "Batch", "BatchDataset",
    "BlendDataset", "CachePool", "CaptioningSample", "CaptioningWebdataset", "concat_pad",
    "ConcatDataset", "cooker", "Cooker", "CrudeJsonlDatasetFactory", "CrudeSample",
    "CrudeWebdataset", "DatasetLoader", "DatasetLoaderInterface", "DecodeFileStore",
    "DefaultCrudeJsonlDatasetFactory", "DefaultDecoderWebdatasetFactory",
    "DefaultGenericWebdatasetFactory", "DefaultTaskEncoder", "DirectLazy", "edataclass",
    "EpochizeDataset", "FileCacheLazy", "FileStore", "FileStoreCachePool", "FileStoreDecoder",
    "FilterDataset", "GcDataset", "generic_batch", "generic_concat", "get_loader",
    "get_savable_loader", "get_train_dataset", "get_val_dataset", "get_val_datasets",
    "GroupBatchDataset", "homogeneous_concat_mix", "ImageClassificationSample",
    "ImageClassificationWebdataset", "ImageSample", "ImageWebdataset", "InterleavedSample",
    "InterleavedWebdataset", "IterMapDataset", "JoinedWebdatasetFactory", "Lazy", "LimitDataset",
    "load_dataset", "log_exception", "LogSampleDataset", "MapDataset", "Metadataset",
    "MetadatasetV2", "MixBatchDataset", "MockLazy", "MultiChoiceVQASample",
    "MultiChoiceVQAWebdataset", "NoCachePool", "OCRSample", "OCRWebdataset", "PackingDataset",
    "PrimaryFileStore", "prepare_metadataset", "RepeatDataset", "reraise_exception", "Sample",
    "SampleDecoder", "SavableDataLoader", "SavableDataset", "traverse_metadataset",
    "ShuffleBufferDataset", "SimilarityInterleavedSample", "SimilarityInterleavedWebdataset",
    "SkipSample", "SourceInfo", "StandardWebdatasetFactory", "stateless", "SystemFileStore",
    "TaskEncoder", "TextSample", "TextWebdataset", "VidQASample", "VidQAWebdataset",
    "VQAOCRWebdataset", "VQASample", "VQAWebdataset", "WorkerConfig",
]  # fmt: skip

__all__ = list(REFERENCE_ALL)


def __getattr__(name: str) -> Any:
    try:
        return getattr(energon, name)
    except AttributeError:
        pass
    from energon.compat.alias import reference_submodule

    try:
        return reference_submodule(sys.modules[__name__], name)
    except AttributeError:
        raise AttributeError(f"module 'megatron.energon' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(REFERENCE_ALL) | set(energon.__all__))


class _PublicNamesModule(types.ModuleType):
    """Submodule imports bind modules on their parent; never over a public name."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in energon.__all__:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _PublicNamesModule
