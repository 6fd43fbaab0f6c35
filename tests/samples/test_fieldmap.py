"""Field map parsing, per-sample resolution with fallbacks, and build-time checks."""

from __future__ import annotations

import pickle

import pytest
import torch

from energon.errors import SampleException
from energon.samples import CaptioningSample, Sample, VQASample
from energon.source.fieldmap import FieldAccessError, FieldMap, check_field_map, resolve_field_map
from energon.structs import edataclass

FIELD_MAP = {"image": "jpg,png", "caption": "json[caption],txt", "first": "json[items][0]"}


def test_parts_are_the_first_tokens_of_every_option():
    assert resolve_field_map(FIELD_MAP).parts == frozenset({"jpg", "png", "json", "txt"})


def test_first_resolving_option_wins():
    fm = resolve_field_map(FIELD_MAP)
    parts = {
        "__key__": "k",
        "png": "P",
        "json": {"caption": "from json", "items": [10, 20]},
        "txt": "t",
    }
    assert fm.apply(parts) == {"image": "P", "caption": "from json", "first": 10}


def test_missing_key_or_part_falls_back_to_next_option():
    fm = resolve_field_map({"caption": "json[caption],txt"})
    assert fm.apply({"json": {"other": 1}, "txt": "fallback"}) == {"caption": "fallback"}
    assert fm.apply({"txt": "only txt"}) == {"caption": "only txt"}


def test_nested_access_and_integer_indices():
    fm = resolve_field_map({"v": "json[a][b][1][c]"})
    assert fm.apply({"json": {"a": {"b": [{"c": 0}, {"c": 5}]}}}) == {"v": 5}


def test_none_is_a_resolved_value():
    fm = resolve_field_map({"v": "json[a],txt"})
    assert fm.apply({"json": {"a": None}, "txt": "x"}) == {"v": None}


def test_last_option_failure_names_field_spec_key_and_reason():
    fm = resolve_field_map({"caption": "json[caption],txt"})
    with pytest.raises(FieldAccessError) as info:
        fm.apply({"__key__": "s42", "json": {}, "jpg": b""})
    message = str(info.value)
    assert "'s42'" in message and "'caption'" in message and "'json[caption],txt'" in message
    assert "json[caption] failed: KeyError" in message
    assert "json[caption] failed: KeyError" in message
    assert "part 'txt' is missing (parts present: jpg, json)" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, SampleException)
    assert (info.value.field, info.value.key) == ("caption", "s42")


def test_bad_index_reports_the_access_error():
    fm = resolve_field_map({"v": "json[items][x]"})
    with pytest.raises(
        FieldAccessError, match=r"json\[items\]\[x\] failed: TypeError: list index 'x'"
    ):
        fm.apply({"__key__": "k", "json": {"items": [1]}})
    with pytest.raises(FieldAccessError, match="IndexError"):
        resolve_field_map({"v": "json[items][3]"}).apply({"json": {"items": [1]}})
    with pytest.raises(FieldAccessError, match="cannot index a str"):
        resolve_field_map({"v": "txt[a]"}).apply({"txt": "text"})


@pytest.mark.parametrize("spec", ["", "json[a", "json]a[", "jpg,,png", "[a]"])
def test_malformed_specs_fail_at_parse_time(spec):
    with pytest.raises(ValueError, match="Invalid field map spec for field 'f'"):
        resolve_field_map({"f": spec})


def test_whitespace_and_list_specs():
    fm = resolve_field_map({"a": " jpg , png ", "b": ["json[x]", "txt"]})
    assert fm.apply({"png": 1, "txt": 2}) == {"a": 1, "b": 2}
    assert fm.specs["b"] == "json[x],txt"


def test_field_map_is_picklable_and_reusable():
    fm = pickle.loads(pickle.dumps(resolve_field_map(FIELD_MAP)))
    assert isinstance(fm, FieldMap) and resolve_field_map(fm) is fm
    assert fm.apply({"jpg": 1, "txt": "t", "json": {"items": [3]}}) == {
        "image": 1,
        "caption": "t",
        "first": 3,
    }


def test_check_accepts_complete_maps():
    check_field_map(CaptioningSample, {"image": "jpg", "caption": "txt"})
    check_field_map(VQASample, {"image": "jpg", "context": "txt", "answers": "json[a]"})
    resolve_field_map({"image": "jpg", "caption": "txt"}, sample_type=CaptioningSample)


def test_check_lists_missing_required_fields():
    @edataclass
    class Three(Sample):
        a: torch.Tensor
        b: str
        c: int
        d: int = 0

    with pytest.raises(ValueError, match=r"does not map required field\(s\) \['b', 'c'\]"):
        check_field_map(Three, {"a": "jpg"})


def test_check_rejects_unknown_and_loader_fields():
    with pytest.raises(ValueError, match=r"\['img'\], which are not fields of CaptioningSample"):
        resolve_field_map({"img": "jpg", "caption": "txt"}, sample_type=CaptioningSample)
    with pytest.raises(ValueError, match="fills in itself"):
        check_field_map(CaptioningSample, {"image": "jpg", "caption": "txt", "__key__": "txt"})
    with pytest.raises(TypeError):
        check_field_map(dict, {})
