"""prepare_dataset end to end: splits, errors that name the culprit, atomic publication."""

from __future__ import annotations

import os
import random
import sqlite3

import pytest

from energon.format.info import read_dataset_info, read_info
from energon.format.split import read_split
from energon.format.sqlite_index import DuplicateSampleKeyError, read_index_uuid
from energon.format.tar import DuplicateKeyInShardError, TarFormatError
from energon.format.tar_index import TarIndex
from energon.prepare.dataset import (
    EmptyShardError,
    PrepareError,
    ShardReadError,
    discover_shards,
    prepare_dataset,
    split_by_patterns,
    split_by_ratio,
)
from tests.helpers.tarfiles import captioning_members, make_captioning_shards, write_tar


def _snapshot(root):
    """Every generated file's bytes (metadata and tar indices)."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tar"))
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


def test_prepare_writes_everything(tmp_path):
    shards = make_captioning_shards(tmp_path, (30, 20), with_json=True)
    result = prepare_dataset(
        tmp_path, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1
    )
    assert result.shard_counts == {"parts/data-0.tar": 30, "parts/data-1.tar": 20}
    assert result.total_samples == 50
    assert result.part_names == ["png", "txt", "json"]
    assert result.first_samples == [
        ("000000", ["png", "txt", "json"]),
        ("000001", ["png", "txt", "json"]),
    ]
    assert result.split_parts == {"train": shards}
    assert read_info(tmp_path) == result.shard_counts
    assert read_split(tmp_path).split_parts == {"train": shards}
    for shard, count in result.shard_counts.items():
        assert len(TarIndex(tmp_path / (shard + ".idx"))) == count
    meta = tmp_path / ".nv-meta"
    assert sorted(p.name for p in meta.iterdir()) == [
        ".info.json",
        "index.sqlite",
        "index.uuid",
        "shard_table.bin",
        "split.yaml",
    ]
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_parallel_and_serial_prepare_write_identical_files(tmp_path):
    counts = [random.Random(i).randint(1, 25) for i in range(7)]
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    for root in (serial, parallel):
        make_captioning_shards(root, counts)
    prepare_dataset(
        serial,
        split_parts_ratio=[("train", 6), ("val", 1), ("test", 0)],
        progress=False,
        num_workers=1,
    )
    prepare_dataset(
        parallel,
        split_parts_ratio=[("train", 6), ("val", 1), ("test", 0)],
        progress=False,
        num_workers=3,
    )
    a, b = _snapshot(serial), _snapshot(parallel)
    for files in (a, b):  # the shard table names the index it belongs to: the same but for that
        uuid = files.pop(".nv-meta/index.uuid")
        table = files[".nv-meta/shard_table.bin"]
        files[".nv-meta/shard_table.bin"] = table.replace(uuid, b"x" * len(uuid))
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if not k.endswith(".sqlite")} == {
        k: v for k, v in b.items() if not k.endswith(".sqlite")
    }
    rows = []
    for root in (serial, parallel):
        db = sqlite3.connect(root / ".nv-meta" / "index.sqlite")
        rows.append(
            (
                db.execute("SELECT * FROM samples ORDER BY rowid").fetchall(),
                db.execute("SELECT * FROM sample_parts ORDER BY rowid").fetchall(),
            )
        )
    assert rows[0] == rows[1]


def test_discover_shards_sorted_relative_with_exclude(tmp_path):
    for name in ("b/2.tar", "a/1.tgz", "a/10.tar", "c/skip_me.tar", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert discover_shards(tmp_path) == ["a/1.tgz", "a/10.tar", "b/2.tar", "c/skip_me.tar"]
    assert discover_shards(tmp_path, exclude="skip") == ["a/1.tgz", "a/10.tar", "b/2.tar"]


def test_split_by_ratio_whole_shards_cumulative_rounding():
    shards = [f"s{i}.tar" for i in range(10)]
    assert {
        k: len(v)
        for k, v in split_by_ratio(shards, [("train", 8), ("val", 1), ("test", 1)]).items()
    } == {
        "train": 8,
        "val": 1,
        "test": 1,
    }
    # exact fractions: 0.7 + 0.2 is 0.9 exactly, so no shard is lost to float rounding
    result = split_by_ratio(shards, [("train", 0.7), ("val", 0.2), ("test", 0.1)])
    assert [len(v) for v in result.values()] == [7, 2, 1]
    assert sum(result.values(), []) == shards  # no shuffle without a seed
    odd = split_by_ratio(shards[:3], [("train", 1), ("val", 1), ("test", 1)])
    assert odd == {"train": ["s0.tar"], "val": ["s1.tar"], "test": ["s2.tar"]}
    assert split_by_ratio(shards[:2], [("train", 1), ("val", 1), ("test", 1)])["train"] == []


def test_split_by_ratio_shuffle_is_reference_compatible():
    shards = [f"s{i}.tar" for i in range(10)]
    expected = list(shards)
    random.Random(42).shuffle(expected)
    result = split_by_ratio(shards, [("train", 1.0)], shuffle_seed=42)
    assert result["train"] == expected
    # the reference's 2-shard fixture lists data-1 before data-0 with seed 42
    assert split_by_ratio(["parts/data-0.tar", "parts/data-1.tar"], [("train", 1)], 42)[
        "train"
    ] == [
        "parts/data-1.tar",
        "parts/data-0.tar",
    ]


def test_split_by_patterns_regex_and_braces():
    shards = ["train/a.tar", "train/b.tar", "val/a.tar", "x/train/c.tar"]
    result = split_by_patterns(shards, [("train", "train/.*"), ("val", "{val,x}/.*")])
    assert result == {
        "train": ["train/a.tar", "train/b.tar"],
        "val": ["val/a.tar", "x/train/c.tar"],
    }


def test_prepare_with_patterns_and_shuffle(tmp_path):
    make_captioning_shards(tmp_path, (2, 2, 2))
    prepare_dataset(
        tmp_path,
        split_parts_patterns=[("train", "parts/data-[01]"), ("val", "parts/data-2")],
        progress=False,
    )
    split = read_split(tmp_path)
    assert split.split_parts == {
        "train": ["parts/data-0.tar", "parts/data-1.tar"],
        "val": ["parts/data-2.tar"],
    }


def test_duplicate_key_across_shards_names_both_places(tmp_path):
    write_tar(tmp_path / "a.tar", captioning_members(range(0, 3)))
    write_tar(tmp_path / "b.tar", captioning_members(range(2, 4)))
    with pytest.raises(DuplicateSampleKeyError) as err:
        prepare_dataset(tmp_path, progress=False, num_workers=2)
    msg = str(err.value)
    assert err.value.key == "000002"
    assert "shard a.tar at byte offset 4096" in msg and "shard b.tar at byte offset 0" in msg
    assert not (tmp_path / ".nv-meta").exists()
    assert not list(tmp_path.glob("*.idx")) and not list(tmp_path.rglob("*.tmp"))


def test_non_consecutive_duplicate_in_one_shard(tmp_path):
    members = captioning_members([0, 1]) + captioning_members([0])
    write_tar(tmp_path / "a.tar", members)
    with pytest.raises(DuplicateKeyInShardError) as err:
        prepare_dataset(tmp_path, progress=False)
    assert (err.value.first_offset, err.value.second_offset) == (0, 4096)
    assert "a.tar" in str(err.value)


def test_empty_shard_is_an_error(tmp_path):
    make_captioning_shards(tmp_path, (2,))
    write_tar(tmp_path / "parts/empty.tar", [])
    with pytest.raises(EmptyShardError, match="empty.tar: shard contains no samples"):
        prepare_dataset(tmp_path, progress=False, num_workers=2)


def test_truncated_shard_error_names_file_and_offset(tmp_path):
    make_captioning_shards(tmp_path, (3, 3))
    shard = tmp_path / "parts/data-1.tar"
    shard.write_bytes(shard.read_bytes()[:3000])
    with pytest.raises(TarFormatError) as err:
        prepare_dataset(tmp_path, progress=False, num_workers=2)
    assert err.value.path == str(shard)
    assert "truncated" in str(err.value) and "byte offset" in str(err.value)


def test_no_shards(tmp_path):
    with pytest.raises(PrepareError, match="did not find any tar files"):
        prepare_dataset(tmp_path, progress=False)


def test_index_name_collision_tar_and_tgz(tmp_path):
    write_tar(tmp_path / "x.tar", captioning_members([0]))
    write_tar(tmp_path / "x.tgz", captioning_members([1]))
    with pytest.raises(PrepareError, match="share the index file"):
        prepare_dataset(tmp_path, progress=False)


def test_missing_shard_is_a_read_error(tmp_path):
    make_captioning_shards(tmp_path, (2,))
    with pytest.raises(ShardReadError, match="gone.tar: cannot read shard"):
        prepare_dataset(
            tmp_path, ["parts/data-0.tar", "parts/gone.tar"], progress=False, num_workers=2
        )
    assert not (tmp_path / ".nv-meta").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read files without permission")
def test_unreadable_shard(tmp_path):
    make_captioning_shards(tmp_path, (2, 2))
    os.chmod(tmp_path / "parts/data-1.tar", 0)
    with pytest.raises(ShardReadError, match="cannot read shard"):
        prepare_dataset(tmp_path, progress=False)


def test_failed_prepare_keeps_previous_metadata(tmp_path):
    make_captioning_shards(tmp_path, (4, 3, 5))
    prepare_dataset(
        tmp_path, split_parts_ratio=[("train", 2), ("val", 1)], progress=False, num_workers=2
    )
    before = _snapshot(tmp_path)
    # second run: one more shard, but another shard became unreadable (truncated)
    write_tar(tmp_path / "parts/data-3.tar", captioning_members(range(100, 104)))
    broken = tmp_path / "parts/data-2.tar"
    original = broken.read_bytes()
    broken.write_bytes(original[:2500])
    with pytest.raises(TarFormatError):
        prepare_dataset(tmp_path, progress=False, num_workers=2)
    assert _snapshot(tmp_path) == before
    assert not list(tmp_path.rglob("*.tmp"))
    broken.write_bytes(original)
    result = prepare_dataset(tmp_path, progress=False, num_workers=2)
    assert result.total_samples == 16 and len(read_info(tmp_path)) == 4


def test_tar_index_only_rebuilds_indices_and_keeps_splits(tmp_path):
    make_captioning_shards(tmp_path, (3, 2))
    prepare_dataset(tmp_path, split_parts_ratio=[("train", 1), ("val", 1)], progress=False)
    meta = tmp_path / ".nv-meta"
    split_before = (meta / "split.yaml").read_text()
    info_before = (meta / ".info.json").read_text()
    uuid_before = read_index_uuid(tmp_path)
    (tmp_path / "parts/data-0.tar.idx").unlink()
    (meta / "index.sqlite").unlink()
    result = prepare_dataset(tmp_path, tar_index_only=True, progress=False)
    assert result.split_parts is None
    assert len(TarIndex(tmp_path / "parts/data-0.tar.idx")) == 3
    assert (meta / "split.yaml").read_text() == split_before
    assert (meta / ".info.json").read_text() == info_before
    assert read_index_uuid(tmp_path) != uuid_before
    assert sqlite3.connect(meta / "index.sqlite").execute(
        "SELECT COUNT(*) FROM samples"
    ).fetchone() == (5,)


def test_tar_index_only_converts_legacy_info_yaml(tmp_path):
    make_captioning_shards(tmp_path, (3,))
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / ".info.yaml").write_text(
        "energon_version: '1.0'\nshard_counts:\n  parts/data-0.tar: 3\n"
    )
    prepare_dataset(tmp_path, tar_index_only=True, progress=False)
    assert read_dataset_info(tmp_path).energon_version == "1.0"
    assert (meta / ".info.json").is_file()


def test_tmp_path_builds_sqlite_elsewhere(tmp_path):
    root, scratch = tmp_path / "ds", tmp_path / "scratch"
    make_captioning_shards(root, (2, 2))
    prepare_dataset(root, tmp_path=scratch, progress=False)
    assert (root / ".nv-meta" / "index.sqlite").is_file()
    assert scratch.is_dir() and not list(scratch.iterdir())


def test_reprepare_keeps_media_metadata_rows(tmp_path):
    make_captioning_shards(tmp_path, (2,))
    prepare_dataset(tmp_path, progress=False)
    db_path = tmp_path / ".nv-meta" / "index.sqlite"
    with sqlite3.connect(db_path) as db:
        db.execute("INSERT INTO media_metadata VALUES ('000000.png', 'image', '{\"width\":8}')")
    prepare_dataset(tmp_path, progress=False)
    rows = sqlite3.connect(db_path).execute("SELECT * FROM media_metadata").fetchall()
    assert rows == [("000000.png", "image", '{"width":8}')]


def test_explicit_shard_list_with_braces(tmp_path):
    make_captioning_shards(tmp_path, (1, 1, 1))
    result = prepare_dataset(tmp_path, ["parts/data-{0..1}.tar"], progress=False)
    assert list(result.shard_counts) == ["parts/data-0.tar", "parts/data-1.tar"]
