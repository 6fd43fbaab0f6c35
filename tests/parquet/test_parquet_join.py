"""Joins by key with Parquet members (with a WebDataset member, and Parquet with Parquet), the
join modes, exact restore and the ledger through such a join; sample-level ``exclude`` entries of
a Parquet dataset's ``split.yaml``."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from energon import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset
from energon.cli.main import cli
from energon.format.parquet import prepare_parquet
from energon.ledger.ledger import Ledger
from energon.source.parquet import ParquetLeaf
from tests.helpers.datasets import TEXT_YAML, make_text_dataset
from tests.helpers.parquet import tar_as_parquet
from tests.metadataset.test_join_and_crude import joined_text

PARQUET_TEXT_YAML = TEXT_YAML + "key_column: key\n"


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """``a``/``b``: 55 samples with the same keys (other texts); ``c``: 40 of those keys. Each as
    a WebDataset (``a``, ``b``, ``c``) and as Parquet with a key column (``a_pq``, ...)."""
    root = tmp_path_factory.mktemp("pqjoin")
    make_text_dataset(root / "a", num_samples=55, num_shards=5)
    make_text_dataset(root / "b", num_samples=55, num_shards=5, seed=3)
    make_text_dataset(root / "c", num_samples=40, num_shards=5, seed=4)
    for name in "abc":
        out = root / f"{name}_pq"
        out.mkdir()
        tar_as_parquet(root / name, out, row_group_size=4)
        (out / ".nv-meta" / "dataset.yaml").write_text(PARQUET_TEXT_YAML)
    return root


def join_yaml(root: Path, name: str, primary: str, secondary: str, nonmatch: str) -> Path:
    path = root / name
    path.write_text(
        f"""
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    join:
      - path: {os.path.join(".", primary)}
      - path: {os.path.join(".", secondary)}
        nonmatch: {nonmatch}
    joiner:
      __module__: {joined_text.__module__}
      __function__: joined_text
"""
    )
    return path


def prepared(path: Path) -> Path:
    result = CliRunner().invoke(cli, ["prepare", str(path)])
    assert result.exit_code == 0, result.output
    assert "Joined" in result.output
    return path


def val_texts(path) -> list[tuple[str, str]]:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(
        get_val_dataset(path, split_part="train", worker_config=wc, batch_size=None)
    )
    return [(s.__key__, s.text) for s in loader]


@pytest.mark.parametrize(
    "primary,secondary_kind", [("a", "_pq"), ("a_pq", ""), ("a_pq", "_pq")], ids=str
)
@pytest.mark.parametrize("nonmatch,rows", [("error", 55), ("skip", 40), ("none", 55)])
def test_join_modes_with_parquet_members(roots, primary, secondary_kind, nonmatch, rows):
    secondary = ("b" if nonmatch == "error" else "c") + secondary_kind
    name = f"join_{primary}_{secondary}_{nonmatch}.yaml"
    got = val_texts(prepared(join_yaml(roots, name, primary, secondary, nonmatch)))
    assert len(got) == rows
    plain_primary = val_texts(roots / primary)
    plain_other = dict(val_texts(roots / secondary))
    # the primary's order drives the join; every secondary sample is the one with the same key
    assert [k for k, _ in got] == [
        k for k, _ in plain_primary if nonmatch != "skip" or k in plain_other
    ]
    primary_text = dict(plain_primary)
    for key, text in got:
        left, right = text.split("|")
        assert left == primary_text[key]
        assert right == plain_other.get(key, "<none>")
    if nonmatch == "none":
        assert sum(text.endswith("|<none>") for _, text in got) == 15


def test_a_parquet_member_without_a_match_fails_at_prepare(roots):
    path = join_yaml(roots, "join_pq_bad.yaml", "a", "c_pq", "error")
    result = CliRunner().invoke(cli, ["prepare", str(path)])
    # a bad dataset is the user's error: one line on stderr, exit status 1 (docs/cli.md)
    assert result.exit_code == 1, result.output
    assert "has no match" in result.stderr and "c_pq" in result.stderr
    assert "Traceback" not in result.stderr


def test_parquet_members_without_a_key_column_join_by_file_and_row(roots, tmp_path):
    """Without ``key_column`` a row's key is ``<file>/<row>``: two datasets with the same file
    names join row by row."""
    for name, words in (("left", "abc"), ("right", "xyz")):
        (tmp_path / name / "data").mkdir(parents=True)
        for f in range(2):
            texts = [f"{words[f]}{i}".encode() for i in range(6 + f)]
            pq.write_table(pa.table({"txt": texts}), tmp_path / name / f"data/{f}.parquet")
        prepare_parquet(tmp_path / name, progress=False)
        (tmp_path / name / ".nv-meta" / "dataset.yaml").write_text(TEXT_YAML)
    got = val_texts(prepared(join_yaml(tmp_path, "rows.yaml", "left", "right", "error")))
    assert got == [
        (f"data/{f}.parquet/{i}", f"{'ab'[f]}{i}|{'xy'[f]}{i}")
        for f in range(2)
        for i in range(6 + f)
    ]


def train_loader(path, workers=2):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_train_dataset(
        path, worker_config=wc, batch_size=4, shuffle_buffer_size=10, max_samples_per_sequence=5
    )
    return dataset, get_savable_loader(dataset)


@pytest.mark.parametrize("primary,secondary", [("a_pq", "b"), ("a", "b_pq")])
def test_joined_parquet_rows_restore_exactly(roots, primary, secondary):
    path = prepared(
        join_yaml(roots, f"restore_{primary}_{secondary}.yaml", primary, secondary, "error")
    )
    _, first = train_loader(path)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.save_state_rank()
    expected = [(b.__key__, b.text) for b in (next(it) for _ in range(6))]
    _, again = train_loader(path)
    again.restore_state_rank(state)
    it2 = iter(again)
    assert [(b.__key__, b.text) for b in (next(it2) for _ in range(6))] == expected


def test_ledger_through_a_join_with_a_parquet_primary(roots):
    path = prepared(join_yaml(roots, "ledger_pq.yaml", "a_pq", "b", "error"))
    dataset, loader = train_loader(path, workers=0)
    it = iter(loader)
    delivered = [next(it) for _ in range(5)]
    ledger = Ledger(dataset)
    keys_of = {
        name: pq.read_table(roots / "a_pq" / name, columns=["key"]).column("key").to_pylist()
        for name in ParquetLeaf.open(roots / "a_pq", split_part="train").shard_names
    }
    for step, batch in enumerate(delivered):
        (record,) = ledger.describe_step(step)
        assert [s.key for s in record.samples] == list(batch.__key__)
        for sample in record.samples:
            assert sample.shard.endswith(".parquet") and sample.row_group == sample.row // 4
            assert keys_of[sample.shard][sample.row] == sample.key


@pytest.mark.filterwarnings("ignore:.*matches nothing")
def test_sample_excludes_of_a_parquet_split(roots, tmp_path):
    """``<file>/<key>`` in ``exclude`` skips that row: by key column value, or by row number
    (``<file>/<row>``, the row's key) without one; an entry that matches no row warns."""
    import shutil

    root = tmp_path / "pq"
    shutil.copytree(roots / "a_pq", root)
    leaf = ParquetLeaf.open(root, split_part="train")
    files = leaf.shard_names
    all_keys = [k for k, _ in val_texts(root)]
    first_file = pq.read_table(root / files[0], columns=["key"]).column("key").to_pylist()
    split = (root / ".nv-meta" / "split.yaml").read_text()
    gone = [first_file[2], first_file[3]]
    (root / ".nv-meta" / "split.yaml").write_text(
        split.replace(
            "exclude: []",
            f"exclude:\n- {files[0]}/{gone[0]}\n- {files[0]}/{gone[1]}\n- {files[1]}/nokey\n",
        )
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = [k for k, _ in val_texts(root)]
    assert kept == [k for k in all_keys if k not in gone]
    assert [str(w.message) for w in caught if "matches nothing" in str(w.message)] and all(
        "nokey" in str(w.message) for w in caught if "matches nothing" in str(w.message)
    )
    # training never draws them either, and joins leave them out (another index)
    _, loader = train_loader(root, workers=0)
    it = iter(loader)
    drawn = {k for _ in range(30) for k in next(it).__key__}
    assert drawn == set(all_keys) - set(gone)
    got = val_texts(prepared(join_yaml(tmp_path, "excl.yaml", "pq", f"{roots}/b", "error")))
    assert [k for k, _ in got] == kept
    # without a key column the key part is the row number
    (root / ".nv-meta" / "dataset.yaml").write_text(TEXT_YAML)
    (root / ".nv-meta" / "split.yaml").write_text(
        split.replace("exclude: []", f"exclude:\n- {files[1]}/0\n")
    )
    assert [k for k, _ in val_texts(root)] == [
        k
        for k in (f"{n}/{r}" for n, c in zip(files, leaf.shard_counts) for r in range(c))
        if k != f"{files[1]}/0"
    ]


def test_an_unprepared_parquet_member_names_the_fix(roots, tmp_path):
    """A folder of Parquet files used as it is has no split or index uuid to join by."""
    import shutil

    shutil.copytree(roots / "b_pq", tmp_path / "raw", ignore=shutil.ignore_patterns(".nv-meta"))
    shutil.copytree(roots / "a", tmp_path / "a")
    path = join_yaml(tmp_path, "raw.yaml", "a", "raw", "error")
    result = CliRunner().invoke(cli, ["prepare", str(path)])
    assert result.exit_code == 1, result.output
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert f"energon prepare {tmp_path / 'raw'}" in result.stderr
