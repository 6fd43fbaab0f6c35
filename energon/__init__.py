"""energon: a multimodal streaming data loader for PyTorch and Megatron.

Public API (re-exports only). Datasets prepared by NVIDIA's Megatron-Energon load here and vice versa.
Names are imported on first use, so ``energon prepare`` and other light commands do not pay for
importing torch.
"""

import importlib.abc
import importlib.util
import sys
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

_EXPORTS = {
    "Balance": "energon.balance",
    "BalanceCostError": "energon.errors",
    "BalancedBatch": "energon.balance",
    "FittedCost": "energon.balance",
    "fit_cost": "energon.balance",
    "MultimodalCost": "energon.balance",
    "SampleCost": "energon.balance",
    "publish_plans": "energon.balance",
    "PlanStoreError": "energon.errors",
    "SampleDecoder": "energon.decode",
    "ImageNormalizer": "energon.decode.normalize",
    "normalize_images": "energon.decode.normalize",
    "DeviceImageDecoder": "energon.decode.device",
    "decode_images_on_device": "energon.decode.device",
    "ArgumentError": "energon.errors",
    "ArgumentTypeError": "energon.errors",
    "DatasetNotFoundError": "energon.errors",
    "EmptyDatasetError": "energon.errors",
    "ErrorBudget": "energon.errors",
    "ErrorBudgetExceeded": "energon.errors",
    "EnergonError": "energon.errors",
    "FatalSampleError": "energon.errors",
    "NotSimulableError": "energon.errors",
    "PaddingError": "energon.errors",
    "is_padding": "energon.samples.padding",
    "SampleException": "energon.errors",
    "SkipSample": "energon.errors",
    "StateError": "energon.errors",
    "WatchdogTimeout": "energon.errors",
    "WorkerLostError": "energon.errors",
    "WorkerRecoveryError": "energon.errors",
    "ClusterError": "energon.errors",
    "log_exception": "energon.errors",
    "reraise_exception": "energon.errors",
    "prepare_metadataset": "energon.prepare.join_indices",
    "exclude_samples": "energon.cursor.exclude",
    "migrate_states": "energon.cursor.migrate",
    "skip_steps": "energon.cursor.skip",
    "Ledger": "energon.ledger.ledger",
    "export_exposures": "energon.ledger.exposure",
    "simulate": "energon.preflight.simulate",
    "SimulationSettings": "energon.preflight.simulate",
    "BasicDataLoader": "energon.loader",
    "SavableDataLoader": "energon.loader",
    "get_loader": "energon.loader",
    "get_savable_loader": "energon.loader",
    "get_train_dataset": "energon.loader",
    "get_val_dataset": "energon.loader",
    "SavableDataset": "energon.loader.savable_dataset",
    "WorkerRecovery": "energon.loader.recovery",
    "RayWorkers": "energon.loader.workers.ray_workers",
    "EpochIndex": "energon.megatron.epoch_index",
    "IdentityMultiEpochDatasetWrapper": "energon.megatron.epoch_index",
    "MultiEpochDatasetResampler": "energon.megatron.epoch_index",
    "GPTConfig": "energon.megatron.gpt_dataset",
    "Blender": "energon.metadataset.resolve",
    "WeightSchedule": "energon.plan.schedules",
    "remote_stats": "energon.remote",
    "Batch": "energon.samples",
    "CaptioningSample": "energon.samples",
    "CrudeSample": "energon.samples",
    "ImageClassificationSample": "energon.samples",
    "ImageSample": "energon.samples",
    "InterleavedSample": "energon.samples",
    "MultiChoiceVQASample": "energon.samples",
    "OCRSample": "energon.samples",
    "Sample": "energon.samples",
    "SamplePiece": "energon.samples.piece",
    "SimilarityInterleavedSample": "energon.samples",
    "SourceInfo": "energon.samples",
    "TextSample": "energon.samples",
    "VQAOCRSample": "energon.samples",
    "VQASample": "energon.samples",
    "VidQASample": "energon.samples",
    "batch_list": "energon.samples.collate",
    "batch_pad_stack": "energon.samples.collate",
    "batch_stack": "energon.samples.collate",
    "concat_pad": "energon.samples.collate",
    "generic_batch": "energon.samples.collate",
    "generic_concat": "energon.samples.collate",
    "homogeneous_concat_mix": "energon.samples.collate",
    "edataclass": "energon.structs",
    "SampleMeta": "energon.source.meta",
    "DecodeFileStore": "energon.source.file_store",
    "FileStore": "energon.source.file_store",
    "PrimaryFileStore": "energon.source.file_store",
    "SystemFileStore": "energon.source.file_store",
    "WebdatasetFileStore": "energon.source.file_store",
    "load_state_file": "energon.state",
    "redistribute_states": "energon.state",
    "save_state_file": "energon.state",
    "Cooker": "energon.task_encoder",
    "basic_sample_keys": "energon.task_encoder",
    "cooker": "energon.task_encoder",
    "stateless": "energon.task_encoder",
    "uses_sample_meta": "energon.task_encoder",
    "may_split": "energon.task_encoder",
    "last_packing_round": "energon.task_encoder",
    "WorkerConfig": "energon.worker",
    # the reference-shaped surface (energon.compat): wrappers, factories, loaders, cache pools
    "CachePool": "energon.compat.cache",
    "DirectLazy": "energon.compat.cache",
    "FileCacheLazy": "energon.compat.cache",
    "FileStoreCachePool": "energon.compat.cache",
    "FileStoreDecoder": "energon.compat.cache",
    "Lazy": "energon.compat.cache",
    "MockLazy": "energon.compat.cache",
    "NoCachePool": "energon.compat.cache",
    "BaseCoreDatasetFactory": "energon.compat.flavors",
    "BaseWebdatasetFactory": "energon.compat.flavors",
    "CaptioningWebdataset": "energon.compat.flavors",
    "CrudeJsonlDatasetFactory": "energon.compat.flavors",
    "CrudeWebdataset": "energon.compat.flavors",
    "DefaultCrudeJsonlDatasetFactory": "energon.compat.flavors",
    "DefaultDecoderWebdatasetFactory": "energon.compat.flavors",
    "DefaultGenericWebdatasetFactory": "energon.compat.flavors",
    "ImageClassificationWebdataset": "energon.compat.flavors",
    "ImageWebdataset": "energon.compat.flavors",
    "InterleavedWebdataset": "energon.compat.flavors",
    "JoinedWebdatasetFactory": "energon.compat.flavors",
    "MultiChoiceVQAWebdataset": "energon.compat.flavors",
    "OCRWebdataset": "energon.compat.flavors",
    "SimilarityInterleavedWebdataset": "energon.compat.flavors",
    "StandardWebdatasetFactory": "energon.compat.flavors",
    "TextWebdataset": "energon.compat.flavors",
    "VQAOCRWebdataset": "energon.compat.flavors",
    "VQAWebdataset": "energon.compat.flavors",
    "VidQAWebdataset": "energon.compat.flavors",
    "DatasetLoader": "energon.compat.metadataset",
    "DatasetLoaderInterface": "energon.compat.metadataset",
    "Metadataset": "energon.compat.metadataset",
    "MetadatasetV2": "energon.compat.metadataset",
    "load_dataset": "energon.compat.metadataset",
    "traverse_metadataset": "energon.compat.metadataset",
    # the core classes of energon.task_encoder, served through the module that registers the
    # composition behind their build_* hooks (energon.task_encoder.composition)
    "AugmentTaskEncoder": "energon.compat.task_encoder",
    "DefaultTaskEncoder": "energon.compat.task_encoder",
    "TaskEncoder": "energon.compat.task_encoder",
    "get_val_datasets": "energon.compat.task_encoder",
    "BatchDataset": "energon.compat.wrappers",
    "BlendDataset": "energon.compat.wrappers",
    "ConcatDataset": "energon.compat.wrappers",
    "EpochizeDataset": "energon.compat.wrappers",
    "FilterDataset": "energon.compat.wrappers",
    "GcDataset": "energon.compat.wrappers",
    "GroupBatchDataset": "energon.compat.wrappers",
    "IterMapDataset": "energon.compat.wrappers",
    "LimitDataset": "energon.compat.wrappers",
    "LogSampleDataset": "energon.compat.wrappers",
    "MapDataset": "energon.compat.wrappers",
    "MixBatchDataset": "energon.compat.wrappers",
    "PackingDataset": "energon.compat.wrappers",
    "RepeatDataset": "energon.compat.wrappers",
    "ShuffleBufferDataset": "energon.compat.wrappers",
}

# Modules that moved to the layer their concept belongs to (docs/internals.md, "Layers"): the
# old import path keeps working and gives the same module object (so ``isinstance`` holds).
_MOVED = {
    "energon.decode.deadline": "energon.deadline",
    "energon.samples.edataclass": "energon.structs",
    "energon.observe.simulate": "energon.preflight.simulate",
    "energon.observe.measure": "energon.preflight.measure",
    "energon.observe.report": "energon.preflight.report",
    "energon.ledger.native": "energon.pipeline.pointers_native",
    "energon.balance.executor": "energon.pipeline.balanced_executor",
    "energon.ledger.journal": "energon.loader.journal",
    "energon.media.metadata": "energon.format.media_metadata",
    "energon.format.prepare": "energon.prepare.dataset",
    "energon.format.prepare_scan": "energon.prepare.scan",
    "energon.format.prepare_work": "energon.prepare.work",
    "energon.media.prepare": "energon.prepare.media",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves each old path of ``_MOVED`` with the module at its new path (asked last on
    ``sys.meta_path``, so it never shadows a module file)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        return import_module(_MOVED[spec.name])

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module at the new path is complete."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())

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
