"""Dataset scripts in .nv-meta: sample_loader and part_filter specs."""

from __future__ import annotations

import pickle
import textwrap

import pytest

from energon.source.sample_loader import (
    PartNameFilter,
    ScriptFunction,
    load_part_filter,
    load_sample_loader,
    load_script_module,
)

SCRIPT = textwrap.dedent(
    """
    CALLS = []

    def sample_loader(raw):
        CALLS.append(raw["__key__"])
        return {"caption": raw["txt"].upper(), "image": raw["jpg"]}

    def other(raw):
        return {"n": 1}

    def part_filter(part):
        return part in ("jpg", "txt")
    """
)


@pytest.fixture
def nv_meta(tmp_path):
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / "sample_loader.py").write_text(SCRIPT)
    return meta


def test_default_function_names(nv_meta):
    loader = load_sample_loader(nv_meta, "sample_loader.py")
    assert loader({"__key__": "k", "txt": "cap", "jpg": b"x"}) == {"caption": "CAP", "image": b"x"}
    part_filter = load_part_filter(nv_meta, "sample_loader.py")
    assert part_filter("jpg") and not part_filter("json")


def test_explicit_function_name_and_str_path(nv_meta):
    assert load_sample_loader(str(nv_meta), "sample_loader.py:other")({}) == {"n": 1}


def test_script_runs_once_per_path(nv_meta):
    first = load_sample_loader(nv_meta, "sample_loader.py")
    second = load_sample_loader(nv_meta, "sample_loader.py:sample_loader")
    first({"__key__": "a", "txt": "", "jpg": b""})
    second({"__key__": "b", "txt": "", "jpg": b""})
    module = load_script_module(nv_meta / "sample_loader.py")
    assert module.CALLS == ["a", "b"]
    assert module.__file__ == str(nv_meta / "sample_loader.py")


def test_missing_function_or_file_fails_at_load_time(nv_meta):
    with pytest.raises(AttributeError, match="no function 'nope'"):
        load_sample_loader(nv_meta, "sample_loader.py:nope")
    with pytest.raises(FileNotFoundError):
        load_sample_loader(nv_meta, "missing.py")
    with pytest.raises(ValueError, match="file.py:function"):
        load_sample_loader(nv_meta, "sample_loader:fn")


def test_script_functions_pickle_by_reference(nv_meta):
    loader = load_sample_loader(nv_meta, "sample_loader.py")
    clone = pickle.loads(pickle.dumps(loader))
    assert isinstance(clone, ScriptFunction) and clone.name == "sample_loader"
    assert clone({"__key__": "k", "txt": "a", "jpg": b""})["caption"] == "A"


def test_part_filter_from_names_callables_and_none(nv_meta):
    names = load_part_filter(nv_meta, ["jpg", "json"])
    assert isinstance(names, PartNameFilter) and names("json") and not names("txt")
    assert pickle.loads(pickle.dumps(names))("jpg")

    def predicate(part: str) -> bool:
        return part.startswith("j")

    assert load_part_filter(nv_meta, predicate) is predicate
    assert load_part_filter(nv_meta, None) is None
    assert load_sample_loader(nv_meta, predicate) is predicate
