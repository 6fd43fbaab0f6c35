"""Sample base class, built-in types, Batch and source info helpers."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch

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
    add_source_info,
    get_source_info,
    pin_memory_recursive,
)
from energon.structs import edataclass


def _captioning(key: str = "k0", caption: str = "a cat", shape=(3, 4, 5), **kw: Any):
    return CaptioningSample(
        __key__=key, __restore_key__=("ds", key), image=torch.rand(shape), caption=caption, **kw
    )


def _src(i: int) -> SourceInfo:
    return SourceInfo(
        dataset_path="/data/ds", index=i, shard_name="shard-0.tar", file_names=(f"{i}.jpg",)
    )


# --- edataclass ---------------------------------------------------------------------------


def test_edataclass_is_keyword_only_and_slotted():
    @edataclass
    class Config:
        a: int
        b: str = "x"

    with pytest.raises(TypeError):
        Config(1)  # type: ignore[misc]
    cfg = Config(a=1)
    assert (cfg.a, cfg.b) == (1, "x")
    assert not hasattr(cfg, "__dict__")
    with pytest.raises(AttributeError):
        cfg.c = 3  # type: ignore[attr-defined]


def test_edataclass_accepts_dataclass_options():
    @edataclass(frozen=True)
    class Point:
        x: int

    with pytest.raises(dataclasses.FrozenInstanceError):
        Point(x=1).x = 2  # type: ignore[misc]


# --- Sample --------------------------------------------------------------------------------

BUILTIN_FIELDS = {
    CaptioningSample: {"image": True, "caption": True},
    ImageSample: {"image": True},
    ImageClassificationSample: {"image": True, "label": False, "label_name": False},
    InterleavedSample: {"sequence": True},
    MultiChoiceVQASample: {
        "image": True,
        "context": True,
        "choices": False,
        "correct_choice_idx": False,
    },
    OCRSample: {
        "image": True,
        "text": True,
        **{
            f"{level}_{kind}": False
            for level in ("block", "lines", "words", "chars")
            for kind in ("boxes", "text")
        },
        "block_classes": False,
    },
    SimilarityInterleavedSample: {
        "images": True,
        "texts": True,
        "audio": False,
        "video": False,
        "similarity_matrix": False,
        "matched_text_indices": False,
    },
    TextSample: {"text": True},
    VQASample: {"image": True, "context": True, "answers": False, "answer_weights": False},
    VQAOCRSample: {
        "image": True,
        "context": True,
        "text": True,
        "answers": False,
        "answer_weights": False,
        "words_boxes": False,
        "words_text": False,
    },
    VidQASample: {"video": True, "context": True, "answers": False, "answer_weights": False},
}


@pytest.mark.parametrize("cls", list(BUILTIN_FIELDS), ids=lambda c: c.__name__)
def test_builtin_types_have_the_reference_fields(cls):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert list(fields)[:4] == ["__key__", "__restore_key__", "__subflavors__", "__sources__"]
    own = {n: f.default is dataclasses.MISSING for n, f in fields.items() if not n.startswith("__")}
    assert own == BUILTIN_FIELDS[cls]
    assert all(f.kw_only for f in fields.values())


def test_optional_builtin_fields_default_to_none_or_zero():
    sample = MultiChoiceVQASample(
        __key__="k", __restore_key__=(), image=torch.zeros(1), context="q"
    )
    assert sample.choices is None and sample.correct_choice_idx == 0
    assert (
        OCRSample(__key__="k", __restore_key__=(), image=torch.zeros(1), text="t").chars_boxes
        is None
    )


def test_sample_is_slotted_picklable_and_has_no_singular_subflavor():
    sample = _captioning(__subflavors__={"src": "a"}, __sources__=(_src(1),))
    assert not hasattr(sample, "__dict__")
    assert not hasattr(Sample, "__subflavor__")
    clone = pickle.loads(pickle.dumps(sample))
    assert clone.__key__ == "k0" and clone.caption == "a cat"
    assert clone.__subflavors__ == {"src": "a"} and clone.__sources__ == (_src(1),)
    assert torch.equal(clone.image, sample.image)


def test_sample_requires_key_and_restore_key():
    with pytest.raises(TypeError):
        TextSample(text="x")  # type: ignore[call-arg]


def test_sample_read_access_by_field_name():
    sample = _captioning()
    assert sample["caption"] == "a cat"
    assert sample["__key__"] == "k0"
    assert "image" in sample and "label" not in sample
    with pytest.raises(KeyError, match="no field 'label'"):
        sample["label"]
    with pytest.raises(KeyError):
        sample[0]  # type: ignore[index]


def test_sample_is_not_accidentally_iterable():
    with pytest.raises(TypeError, match="not iterable"):
        iter(_captioning())


def test_megatron_style_plain_dataclass_subclass_works():
    # Megatron-LM declares sample types with plain @dataclass and guards __subflavor__.
    @dataclass
    class SampleListSample(Sample):
        samples: list[Any]
        if not hasattr(Sample, "__subflavor__"):
            __subflavor__: str

    sample = SampleListSample([1, 2], "flav", __key__="k", __restore_key__=("x",))
    assert sample.samples == [1, 2] and sample.__subflavor__ == "flav"
    assert sample["samples"] == [1, 2]


def test_derive_from_keeps_base_fields_and_lets_kwargs_win():
    base = _captioning(__subflavors__={"a": 1}, __sources__=(_src(0),))
    derived = TextSample.derive_from(base, text="hello")
    assert (derived.__key__, derived.__restore_key__) == ("k0", ("ds", "k0"))
    assert derived.__subflavors__ == {"a": 1} and derived.__sources__ == (_src(0),)
    assert derived.text == "hello"
    renamed = TextSample.derive_from(base, text="x", __key__="other")
    assert renamed.__key__ == "other"


def test_derive_from_dict_sample():
    crude = CrudeSample(__key__="c", __restore_key__=("r",), txt="t")
    derived = TextSample.derive_from(crude, text=crude["txt"])
    assert (
        derived.__key__ == "c" and derived.__restore_key__ == ("r",) and derived.__sources__ is None
    )


def test_from_joined_later_samples_win_and_sources_are_unique():
    primary = _captioning(key="p", caption="primary", __sources__=(_src(0),))
    secondary = TextSample(
        __key__="s", __restore_key__=("s",), text="joined", __sources__=(_src(1),)
    )

    @edataclass
    class Joined(Sample):
        image: torch.Tensor
        caption: str
        text: str = ""

    joined = Joined.from_joined(primary, None, secondary)
    assert joined.__key__ == "p" and joined.__restore_key__ == ("ds", "p")
    assert joined.caption == "primary" and joined.text == "joined"
    assert joined.image is primary.image
    assert joined.__sources__ == (_src(0), _src(1))
    # A later sample overwrites earlier non-base fields.
    again = Joined.from_joined(
        primary, secondary, TextSample(__key__="t", __restore_key__=(), text="last")
    )
    assert again.text == "last" and again.__key__ == "p"


def test_from_joined_needs_primary_and_rejects_keywords():
    with pytest.raises(ValueError, match="primary"):
        TextSample.from_joined(None)
    with pytest.raises(TypeError, match="positionally"):
        TextSample.from_joined(primary=_captioning())


def test_extend_builds_subclass_from_base_instance():
    @edataclass
    class Tokenized(CaptioningSample):
        tokens: list[int]

    base = _captioning()
    extended = Tokenized.extend(base, tokens=[1, 2])
    assert isinstance(extended, Tokenized)
    assert (
        extended.caption == base.caption
        and extended.image is base.image
        and extended.tokens == [1, 2]
    )
    with pytest.raises(TypeError, match="dataclass base"):
        Tokenized.extend(TextSample(__key__="k", __restore_key__=(), text="t"), tokens=[])


def test_crude_sample_is_a_dict():
    crude = CrudeSample({"__key__": "k", "jpg": b"x"})
    assert isinstance(crude, dict) and crude["jpg"] == b"x"


# --- pin_memory -----------------------------------------------------------------------------


class _Pair(NamedTuple):
    left: Any
    right: Any


def test_pin_memory_recursion_keeps_structure_of_non_tensor_values():
    value = {"a": [1, ("x", None)], "b": _Pair(2.5, b"raw")}
    pinned = pin_memory_recursive(value)
    assert pinned == value and type(pinned["b"]) is _Pair and pinned is not value


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs an accelerator")
def test_pin_memory_pins_nested_tensors():
    sample = _captioning()
    sample.__subflavors__ = {"t": torch.zeros(2)}
    pinned = sample.pin_memory()
    assert pinned.image.is_pinned() and pinned.__subflavors__["t"].is_pinned()
    assert not sample.image.is_pinned()


# --- Batch ----------------------------------------------------------------------------------


@dataclass
class CaptionBatch(Batch):
    image: torch.Tensor
    caption: list[str]


def test_batch_from_samples_pad_stacks_tensors_and_lists_the_rest():
    a = _captioning("a", "first", shape=(3, 2, 4), __sources__=(_src(0),))
    b = _captioning("b", "second", shape=(3, 5, 3), __sources__=(_src(1), _src(2)))
    batch = CaptionBatch.from_samples([a, b])
    assert batch.image.shape == (2, 3, 5, 4) and batch.image.dtype == torch.float32
    assert torch.equal(batch.image[0, :, :2, :4], a.image)
    assert torch.equal(batch.image[1, :, :5, :3], b.image)
    assert batch.image[0, :, 2:, :].abs().sum() == 0 and batch.image[1, :, :, 3:].abs().sum() == 0
    assert batch.caption == ["first", "second"]
    assert batch.__key__ == ["a", "b"]
    assert batch.__restore_key__ == [("ds", "a"), ("ds", "b")]
    assert batch.__sources__ == (_src(0), _src(1), _src(2))
    assert batch.__subflavors__ is None


def test_batch_from_samples_subflavors_are_per_sample_when_any():
    a = _captioning("a", __subflavors__={"x": 1})
    b = _captioning("b")
    assert CaptionBatch.from_samples([a, b]).__subflavors__ == [{"x": 1}, None]


def test_batch_from_samples_kwargs_win_and_missing_fields_fail_clearly():
    samples = [_captioning("a"), _captioning("b")]
    batch = CaptionBatch.from_samples(samples, caption=["x", "y"], __restore_key__=("batch", 7))
    assert batch.caption == ["x", "y"] and batch.__restore_key__ == ("batch", 7)

    @dataclass
    class LabelBatch(Batch):
        label: list[int]

    with pytest.raises(ValueError, match=r"field 'label' is missing in sample\(s\) \['a', 'b'\]"):
        LabelBatch.from_samples(samples)


def test_batch_from_dict_samples_and_dict_style_access():
    samples = [{"__key__": "a", "__restore_key__": (), "image": torch.ones(1, 2), "caption": "x"}]
    batch = CaptionBatch.from_samples(samples)
    assert batch["image"].shape == (1, 1, 2) and batch["caption"] == ["x"]
    assert batch.image is batch["image"]
    with pytest.raises(KeyError):
        batch["nope"]


def test_batch_derive_from_copies_base_fields():
    batch = CaptionBatch.from_samples([_captioning("a", __sources__=(_src(3),))])

    @dataclass
    class Encoded(Batch):
        tokens: torch.Tensor

    encoded = Encoded.derive_from(batch, tokens=torch.zeros(1, 3))
    assert encoded.__key__ == ["a"] and encoded.__sources__ == (_src(3),)
    assert encoded.__restore_key__ == batch.__restore_key__


def test_plain_batch_is_picklable():
    batch = CaptionBatch.from_samples([_captioning("a"), _captioning("b")])
    clone = pickle.loads(pickle.dumps(batch))
    assert clone.__key__ == ["a", "b"] and torch.equal(clone.image, batch.image)


# --- source info ------------------------------------------------------------------------------


def test_source_info_is_frozen_and_hashable():
    info = _src(5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.index = 6  # type: ignore[misc]
    assert len({info, _src(5)}) == 1


def test_add_source_info_to_samples_and_dicts():
    sample = _captioning()
    assert add_source_info(sample, _src(0)) is sample
    add_source_info(sample, _src(1), _src(2))
    assert sample.__sources__ == (_src(0), _src(1), _src(2))
    crude = CrudeSample(__key__="k")
    add_source_info(crude, _src(9))
    assert crude["__sources__"] == (_src(9),)


def test_get_source_info_from_sample_dict_batch_and_lists():
    a = _captioning("a", __sources__=(_src(0),))
    b = _captioning("b", __sources__=(_src(1), _src(2)))
    assert get_source_info(a) == [_src(0)]
    assert get_source_info([a, b]) == [_src(0), _src(1), _src(2)]
    assert get_source_info({"__sources__": (_src(4),)}) == [_src(4)]
    assert get_source_info(CaptionBatch.from_samples([a, b])) == [_src(0), _src(1), _src(2)]
    assert get_source_info(_captioning()) == []
