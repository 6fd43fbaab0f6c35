"""Sample types: the ``Sample`` base, the built-in types, ``Batch``, ``CrudeSample`` and
``SourceInfo`` with its helpers."""

from energon.samples.base import (
    BASE_SAMPLE_FIELDS,
    CrudeSample,
    ExtendableDataclassMixin,
    PinMemoryMixin,
    Sample,
    pin_memory_recursive,
)
from energon.samples.batch import Batch
from energon.samples.builtin import (
    EXTRA_SAMPLE_TYPES,
    REFERENCE_SAMPLE_TYPES,
    CaptioningSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    SimilarityInterleavedSample,
    TextSample,
    VidQASample,
    VQAOCRSample,
    VQASample,
)
from energon.samples.source_info import SourceInfo, add_source_info, get_source_info

__all__ = [
    "BASE_SAMPLE_FIELDS",
    "EXTRA_SAMPLE_TYPES",
    "REFERENCE_SAMPLE_TYPES",
    "Batch",
    "CaptioningSample",
    "CrudeSample",
    "ExtendableDataclassMixin",
    "ImageClassificationSample",
    "ImageSample",
    "InterleavedSample",
    "MultiChoiceVQASample",
    "OCRSample",
    "PinMemoryMixin",
    "Sample",
    "SimilarityInterleavedSample",
    "SourceInfo",
    "TextSample",
    "VQAOCRSample",
    "VQASample",
    "VidQASample",
    "add_source_info",
    "get_source_info",
    "pin_memory_recursive",
]
