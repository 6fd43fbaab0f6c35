"""The built-in sample types (the reference's "flavors"), field for field as in the reference.

Images are ``torch.Tensor`` (C, H, W) as produced by the default decoder. All fields are keyword-only.
"""

from __future__ import annotations

from typing import Any

import torch

from energon.samples.base import Sample
from energon.structs import edataclass

__all__ = [
    "EXTRA_SAMPLE_TYPES",
    "REFERENCE_SAMPLE_TYPES",
    "CaptioningSample",
    "ImageClassificationSample",
    "ImageSample",
    "InterleavedSample",
    "MultiChoiceVQASample",
    "OCRSample",
    "SimilarityInterleavedSample",
    "TextSample",
    "VQAOCRSample",
    "VQASample",
    "VidQASample",
]


@edataclass
class CaptioningSample(Sample):
    """An image with its caption."""

    image: torch.Tensor
    caption: str


@edataclass
class ImageSample(Sample):
    """A lone image (e.g. for unsupervised pre-training)."""

    image: torch.Tensor


@edataclass
class ImageClassificationSample(Sample):
    """An image with a class index and/or a class name."""

    image: torch.Tensor
    label: int | None = None
    label_name: str | None = None


@edataclass
class InterleavedSample(Sample):
    """A sequence of images and texts in document order."""

    sequence: list[torch.Tensor | str]


@edataclass
class MultiChoiceVQASample(Sample):
    """A question about an image with answer choices and the index of the right one."""

    image: torch.Tensor
    context: str
    choices: list[str] | None = None
    correct_choice_idx: int = 0


@edataclass
class OCRSample(Sample):
    """An image with its text and optional layout at block, line, word and character level.

    Boxes are tensors of shape (N, 4); classes are a tensor or a list of class names.
    """

    image: torch.Tensor
    text: str
    block_boxes: torch.Tensor | None = None
    block_classes: torch.Tensor | list[str] | None = None
    block_text: list[str] | None = None
    lines_boxes: torch.Tensor | None = None
    lines_text: list[str] | None = None
    words_boxes: torch.Tensor | None = None
    words_text: list[str] | None = None
    chars_boxes: torch.Tensor | None = None
    chars_text: list[str] | None = None


@edataclass
class SimilarityInterleavedSample(Sample):
    """Images and texts of a document with image-text similarities (MMC4 style).

    ``audio`` / ``video`` hold one entry per media part: lazy ``AVDecoder`` objects as decoded by
    default, or tensors made from them (the annotation names the decoded-tensor form).
    """

    images: list[torch.Tensor]
    texts: list[str]
    audio: list[torch.Tensor] | None = None
    video: list[torch.Tensor] | None = None
    similarity_matrix: torch.Tensor | None = None
    matched_text_indices: list[int] | None = None


@edataclass
class TextSample(Sample):
    """Plain text."""

    text: str


@edataclass
class VQASample(Sample):
    """A question (context) about an image with optional weighted answers."""

    image: torch.Tensor
    context: str
    answers: list[str] | None = None
    answer_weights: torch.Tensor | None = None


@edataclass
class VQAOCRSample(Sample):
    """VQA with the image's OCR text and word boxes (the reference has it but does not export it)."""

    image: torch.Tensor
    context: str
    text: str
    answers: list[str] | None = None
    answer_weights: torch.Tensor | None = None
    words_boxes: torch.Tensor | None = None
    words_text: list[str] | None = None


@edataclass
class VidQASample(Sample):
    """A question about a video. ``video`` is whatever the decoder returns for the video part:
    a lazy ``energon.av.AVDecoder`` by default, ``AVData`` with ``av_decode="torch"``, or what a
    task encoder made of it (e.g. a frames tensor)."""

    video: Any
    context: str
    answers: list[str] | None = None
    answer_weights: torch.Tensor | None = None


# The one list of built-in sample types, in the order of the reference's ``energon prepare`` menu:
# users know its numbers from the docs (Megatron-LM's say "9 (VQASample)"), so never reorder it.
REFERENCE_SAMPLE_TYPES: tuple[type[Sample], ...] = (
    CaptioningSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    Sample,
    SimilarityInterleavedSample,
    TextSample,
    VQASample,
    VidQASample,
)
# Built-in types the reference does not offer by name; they follow the reference's list.
EXTRA_SAMPLE_TYPES: tuple[type[Sample], ...] = (VQAOCRSample,)
