"""energon: a multimodal streaming data loader for PyTorch and Megatron.

Public API (re-exports only). Datasets prepared by NVIDIA's Megatron-Energon load here and vice versa.
"""

from importlib.metadata import PackageNotFoundError, version

from energon.batching import (
    batch_list,
    batch_pad_stack,
    batch_stack,
    concat_pad,
    generic_batch,
    generic_concat,
    homogeneous_concat_mix,
)
from energon.dataset import SavableDataset
from energon.decode import SampleDecoder
from energon.edataclass import edataclass
from energon.errors import (
    EmptyDatasetError,
    FatalSampleError,
    SampleException,
    SkipSample,
    StateError,
    log_exception,
    reraise_exception,
)
from energon.loader import (
    BasicDataLoader,
    SavableDataLoader,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    get_val_datasets,
)
from energon.samples import (
    Batch,
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    Sample,
    SimilarityInterleavedSample,
    SourceInfo,
    TextSample,
    VidQASample,
    VQAOCRSample,
    VQASample,
)
from energon.state import load_state_file, redistribute_states, save_state_file
from energon.task_encoder import AugmentTaskEncoder, DefaultTaskEncoder, TaskEncoder, stateless
from energon.worker import WorkerConfig

try:
    __version__ = version("energon-loader")
except PackageNotFoundError:  # running from a source tree
    __version__ = "unknown"

__all__ = [
    "AugmentTaskEncoder",
    "BasicDataLoader",
    "Batch",
    "CaptioningSample",
    "CrudeSample",
    "DefaultTaskEncoder",
    "EmptyDatasetError",
    "FatalSampleError",
    "ImageClassificationSample",
    "ImageSample",
    "InterleavedSample",
    "MultiChoiceVQASample",
    "OCRSample",
    "Sample",
    "SampleDecoder",
    "SampleException",
    "SavableDataLoader",
    "SavableDataset",
    "SimilarityInterleavedSample",
    "SkipSample",
    "SourceInfo",
    "StateError",
    "TaskEncoder",
    "TextSample",
    "VQAOCRSample",
    "VQASample",
    "VidQASample",
    "WorkerConfig",
    "__version__",
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "concat_pad",
    "edataclass",
    "generic_batch",
    "generic_concat",
    "get_loader",
    "get_savable_loader",
    "get_train_dataset",
    "get_val_dataset",
    "get_val_datasets",
    "homogeneous_concat_mix",
    "load_state_file",
    "log_exception",
    "redistribute_states",
    "reraise_exception",
    "save_state_file",
    "stateless",
]
