"""Field-by-field checks of the metadata files against the format spec (F4-F8)."""

from __future__ import annotations

import json
import sqlite3
import struct

import pytest
import yaml

from energon.format.dataset_yaml import (
    crude_dataset_yaml,
    describe_sample_type,
    field_map_dataset_yaml,
    read_dataset_yaml,
    sample_loader_dataset_yaml,
    write_dataset_yaml,
    write_sample_loader_template,
)
from energon.format.info import DatasetInfoError, read_dataset_info, read_info, write_info
from energon.format.split import (
    SplitConfigError,
    UnknownSplitError,
    collapse_braces,
    expand_all,
    read_split,
    split_config_text,
    write_split,
)
from energon.format.sqlite_index import INDEXES, read_index_uuid
from energon.format.tar_index import TarIndex, TarIndexError, tar_index_path, write_tar_index
from energon.prepare.dataset import prepare_dataset
from tests.helpers.tarfiles import make_captioning_shards

# ---- .tar.idx ------------------------------------------------------------------------------


def test_tar_index_path():
    assert tar_index_path("parts/data-0.tar") == "parts/data-0.tar.idx"
    assert tar_index_path("x.tgz") == "x.tar.idx"
    assert tar_index_path("noext") == "noext.tar.idx"


def test_tar_index_bytes_and_reader(tmp_path):
    path = tmp_path / "a.tar.idx"
    write_tar_index(path, [0, 1536, 4096])
    assert path.read_bytes() == struct.pack("QQQ", 0, 1536, 4096)
    assert not list(tmp_path.glob("*.tmp"))
    index = TarIndex(path)
    assert len(index) == 2
    assert index.byte_range(1) == (1536, 4096)
    assert index[0] == 0
    with pytest.raises(TarIndexError):
        index.byte_range(2)


def test_tar_index_reader_pickles_without_open_file(tmp_path):
    import pickle

    path = tmp_path / "a.tar.idx"
    write_tar_index(path, [0, 512])
    index = TarIndex(path)
    assert len(index) == 1
    clone = pickle.loads(pickle.dumps(index))
    assert clone._offsets is None and clone.byte_range(0) == (0, 512)


def test_tar_index_bad_size_and_missing(tmp_path):
    bad = tmp_path / "bad.tar.idx"
    bad.write_bytes(b"\0" * 12)
    with pytest.raises(TarIndexError, match="multiple of 8"):
        len(TarIndex(bad))
    with pytest.raises(TarIndexError, match="not found"):
        len(TarIndex(tmp_path / "missing.tar.idx"))


# ---- .info.json ----------------------------------------------------------------------------


def test_info_json_text_and_key_order(tmp_path):
    counts = {"parts/b.tar": 3, "parts/a.tar": 5}
    write_info(tmp_path, counts, "1.2.3")
    text = (tmp_path / ".nv-meta" / ".info.json").read_text()
    assert text == json.dumps({"energon_version": "1.2.3", "shard_counts": counts}, indent=2)
    assert list(read_info(tmp_path)) == ["parts/b.tar", "parts/a.tar"]
    assert read_dataset_info(tmp_path).total_samples == 8


def test_info_yaml_fallback_and_sync(tmp_path):
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / ".info.yaml").write_text("energon_version: old\nshard_counts:\n  x.tar: 4\n")
    assert read_info(tmp_path) == {"x.tar": 4}
    write_info(tmp_path, {"x.tar": 7}, "new")
    assert yaml.safe_load((meta / ".info.yaml").read_text())["shard_counts"] == {"x.tar": 7}
    assert read_info(tmp_path) == {"x.tar": 7}


def test_info_strict_parsing(tmp_path):
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / ".info.json").write_text('{"shard_counts": {"a.tar": 1}, "extra": 1}')
    with pytest.raises(DatasetInfoError, match="unknown keys"):
        read_info(tmp_path)
    (meta / ".info.json").write_text('{"shard_counts": {"a.tar": "1"}}')
    with pytest.raises(DatasetInfoError, match="integers"):
        read_info(tmp_path)
    with pytest.raises(DatasetInfoError, match="prepared"):
        read_info(tmp_path / "nowhere")


# ---- split.yaml ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "names, collapsed",
    [
        (["parts/data-0.tar", "parts/data-1.tar"], ["parts/data-{0..1}.tar"]),
        ([f"s-{i:03d}.tar" for i in range(100)], ["s-{000..099}.tar"]),
        (
            sorted(f"d-{i}.tar" for i in range(12)),
            ["d-{0..1}.tar", "d-{10..11}.tar", "d-{2..9}.tar"],
        ),
        (["d-9.tar", "d-10.tar"], ["d-9.tar", "d-10.tar"]),  # width changes: no run
        (["a/x1.tar", "a/x3.tar", "a/x4.tar"], ["a/x1.tar", "a/x{3..4}.tar"]),
        (
            ["s0/p0.tar", "s0/p1.tar", "s1/p0.tar", "s1/p1.tar"],
            ["s0/p{0..1}.tar", "s1/p{0..1}.tar"],
        ),
        (["x2.tar", "x1.tar"], ["x2.tar", "x1.tar"]),  # order is kept, not sorted
        (["weird{1}.tar"], ["weird\\{1\\}.tar"]),
        ([], []),
    ],
)
def test_brace_collapse_round_trips(names, collapsed):
    assert collapse_braces(names) == collapsed
    assert expand_all(collapsed) == names


def test_split_yaml_text_matches_reference_layout(tmp_path):
    parts = {
        "train": ["parts/data-1.tar", "parts/data-0.tar"],
        "val": [],
        "test": ["t/0.tar", "t/1.tar"],
    }
    write_split(tmp_path, parts)
    text = (tmp_path / ".nv-meta" / "split.yaml").read_text()
    assert text == (
        "split_parts:\n"
        "  train:\n"
        "  - parts/data-1.tar\n"
        "  - parts/data-0.tar\n"
        "  val: []\n"
        "  test:\n"
        "  - t/{0..1}.tar\n"
        "exclude: []\n"
    )
    config = read_split(tmp_path)
    assert config.split_parts == parts


def test_split_json_fallback_and_custom_name(tmp_path):
    write_split(tmp_path, {"train": ["a.tar"]}, split_config="split.json")
    assert json.loads((tmp_path / ".nv-meta" / "split.json").read_text())["split_parts"] == {
        "train": ["a.tar"]
    }
    assert read_split(tmp_path).shards("train") == ["a.tar"]
    write_split(tmp_path, {"train": ["b.tar"]}, split_config="other.yaml")
    assert read_split(tmp_path, "other.yaml").shards("train") == ["b.tar"]


def test_split_excludes_shards_and_samples(tmp_path):
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / "split2.yaml").write_text(
        "split_parts:\n  train:\n  - parts/data-{0..1}.tar\n"
        "exclude:\n- parts/data-0.tar\n- parts/data-1.tar/00003{5..6}\n"
    )
    config = read_split(tmp_path, "split2.yaml")
    assert config.shards("train") == ["parts/data-1.tar"]
    assert config.sample_excludes() == {
        ("parts/data-1.tar", "000035"),
        ("parts/data-1.tar", "000036"),
    }
    with pytest.raises(UnknownSplitError, match="invalid split part 'nope'"):
        config.shards("nope")


def test_split_strict_parsing(tmp_path):
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / "split.yaml").write_text("split_parts:\n  train: a.tar\n")
    with pytest.raises(SplitConfigError, match="list of shard names"):
        read_split(tmp_path)
    (meta / "split.yaml").write_text("split_part:\n  train: []\n")
    with pytest.raises(SplitConfigError, match="unknown keys"):
        read_split(tmp_path)


def test_split_config_text_json():
    assert json.loads(split_config_text({"train": ["a1", "a2"]}, as_json=True)) == {
        "split_parts": {"train": ["a{1..2}"]},
        "exclude": [],
    }


# ---- index.sqlite + index.uuid -------------------------------------------------------------


def _table_sql(db, name):
    return db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]


def test_sqlite_schema_rows_and_content_offsets(tmp_path):
    shards = make_captioning_shards(tmp_path, (3, 2))
    prepare_dataset(tmp_path, progress=False, num_workers=1)
    db = sqlite3.connect(tmp_path / ".nv-meta" / "index.sqlite")
    columns = {
        t: [r[1:3] for r in db.execute(f"PRAGMA table_info({t})")]
        for t in ("samples", "sample_parts")
    }
    assert columns["samples"] == [
        ("tar_file_id", "INTEGER"),
        ("sample_key", "TEXT"),
        ("sample_index", "INTEGER"),
        ("byte_offset", "INTEGER"),
        ("byte_size", "INTEGER"),
    ]
    assert columns["sample_parts"] == [
        ("tar_file_id", "INTEGER"),
        ("sample_index", "INTEGER"),
        ("part_name", "TEXT"),
        ("content_byte_offset", "INTEGER"),
        ("content_byte_size", "INTEGER"),
    ]
    assert "sample_key TEXT NOT NULL UNIQUE" in _table_sql(db, "samples")
    for table in ("media_metadata", "media_filters"):
        assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,)
    index_names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {
        "idx_samples_by_tar_and_idx",
        "idx_sample_parts_seq",
        "idx_sample_parts_full",
    } <= index_names
    assert len(INDEXES) == 3

    samples = db.execute("SELECT * FROM samples ORDER BY tar_file_id, sample_index").fetchall()
    assert [(r[0], r[1], r[2]) for r in samples] == [
        (0, "000000", 0),
        (0, "000001", 1),
        (0, "000002", 2),
        (1, "000003", 0),
        (1, "000004", 1),
    ]
    for tar_file_id, _key, sample_index, byte_offset, byte_size in samples:
        index = TarIndex(tmp_path / tar_index_path(shards[tar_file_id]))
        start, end = index.byte_range(sample_index)
        assert (byte_offset, byte_size) == (start, end - start)
    parts = db.execute(
        "SELECT s.sample_key, p.part_name, p.tar_file_id, p.content_byte_offset, p.content_byte_size "
        "FROM sample_parts p JOIN samples s USING (tar_file_id, sample_index)"
    ).fetchall()
    assert len(parts) == 10
    for key, part, tar_file_id, offset, size in parts:
        with open(tmp_path / shards[tar_file_id], "rb") as f:
            f.seek(offset)
            payload = f.read(size)
        if part == "txt":
            assert payload == f"caption of sample {int(key)}".encode()
        else:
            assert part == "png" and payload.startswith(b"\x89PNG")


def test_index_uuid_changes_on_every_prepare(tmp_path):
    make_captioning_shards(tmp_path, (2,))
    prepare_dataset(tmp_path, progress=False, num_workers=1)
    first = read_index_uuid(tmp_path)
    assert len(first) == 36 and first.count("-") == 4
    prepare_dataset(tmp_path, progress=False, num_workers=1)
    assert read_index_uuid(tmp_path) != first


# ---- dataset.yaml --------------------------------------------------------------------------


def test_dataset_yaml_styles(tmp_path):
    write_dataset_yaml(
        tmp_path, field_map_dataset_yaml("CaptioningSample", {"image": "jpg", "caption": "txt"})
    )
    assert (tmp_path / ".nv-meta" / "dataset.yaml").read_text() == (
        "sample_type:\n"
        "  __module__: megatron.energon\n"
        "  __class__: CaptioningSample\n"
        "field_map:\n"
        "  image: jpg\n"
        "  caption: txt\n"
    )
    assert describe_sample_type(read_dataset_yaml(tmp_path)) == "CaptioningSample"
    write_dataset_yaml(tmp_path, crude_dataset_yaml(), "crude.yaml")
    crude = read_dataset_yaml(tmp_path, "crude.yaml")
    assert crude == {"__module__": "megatron.energon", "__class__": "CrudeWebdataset"}
    assert describe_sample_type(crude).startswith("crude")
    loader = sample_loader_dataset_yaml("TextSample")
    assert loader["sample_loader"] == "sample_loader.py:sample_loader"
    assert loader["part_filter"] == "sample_loader.py:part_filter"


def test_sample_loader_template_is_valid_python_and_kept(tmp_path):
    assert write_sample_loader_template(tmp_path, [("text", "str")], ["txt", "json"])
    source = (tmp_path / ".nv-meta" / "sample_loader.py").read_text()
    namespace: dict = {}
    exec(compile(source, "sample_loader.py", "exec"), namespace)
    assert namespace["part_filter"]("txt") and not namespace["part_filter"]("jpg")
    assert namespace["sample_loader"]({"__key__": "k", "TODO": "v"}) == {
        "__key__": "k",
        "text": "v",
    }
    (tmp_path / ".nv-meta" / "sample_loader.py").write_text("# mine\n")
    assert not write_sample_loader_template(tmp_path, [("text", "str")], ["txt"])
    assert (tmp_path / ".nv-meta" / "sample_loader.py").read_text() == "# mine\n"
