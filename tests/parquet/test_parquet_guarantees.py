"""Parquet leaves keep energon's guarantees: metadatasets (blends with tar data, subsets,
subflavors), damaged row groups and files counted and located, the ledger naming file, row group
and row, ``simulate`` counting rows per file, bounded memory with a large row group, and a clear
message without pyarrow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from energon import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset
from energon.errors import ParquetFormatError
from energon.format.parquet import prepare_parquet
from energon.ledger.ledger import Ledger
from energon.preflight.simulate import SimulationSettings, simulate
from energon.source.parquet_read import reset_table_reader
from energon.source.shard_reader import reset_shard_reader
from tests.helpers.datasets import make_captioning_dataset
from tests.helpers.parquet import tar_as_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tar_ds(tmp_path_factory):
    return make_captioning_dataset(tmp_path_factory.mktemp("tar"), num_samples=40, num_shards=4)


@pytest.fixture(scope="module")
def pq_ds(tar_ds, tmp_path_factory):
    return tar_as_parquet(tar_ds, tmp_path_factory.mktemp("pq"), row_group_size=4)


def _file_keys(root, name):
    return pq.read_table(root / name, columns=["key"]).column("key").to_pylist()


def _train(path, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=kwargs.pop("workers", 0))
    options = dict(batch_size=2, shuffle_buffer_size=5, max_samples_per_sequence=3)
    return get_train_dataset(path, worker_config=wc, **{**options, **kwargs})


def test_blend_subset_and_subflavors_with_tar_data(tar_ds, pq_ds, tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        textwrap.dedent(
            f"""\
            __module__: megatron.energon
            __class__: MetadatasetV2
            splits:
              train:
                blend:
                  - weight: 1
                    path: {pq_ds}
                    subset: {{range: [0, 20]}}
                    subflavors: {{origin: parquet}}
                  - weight: 1
                    path: {tar_ds}
                    subflavors: {{origin: tar}}
            """
        )
    )
    loader = get_savable_loader(_train(mix, batch_size=None))
    it = iter(loader)
    samples = [next(it) for _ in range(120)]
    origins = Counter(s.__subflavors__["origin"] for s in samples)
    assert 40 <= origins["parquet"] <= 80 and origins["parquet"] + origins["tar"] == 120
    parquet_keys = {s.__key__ for s in samples if s.__subflavors__["origin"] == "parquet"}
    first_half = set(_file_keys(pq_ds, "parts/data-00000.parquet"))
    first_half |= set(_file_keys(pq_ds, "parts/data-00001.parquet"))
    assert parquet_keys <= first_half  # the subset's range: rows 0..19 (the first two files)


def test_ledger_names_file_row_group_and_row(pq_ds):
    dataset = _train(pq_ds)
    loader = get_savable_loader(_train(pq_ds))
    it = iter(loader)
    delivered = [next(it) for _ in range(6)]
    ledger = Ledger(dataset)
    for step, batch in enumerate(delivered):
        (record,) = ledger.describe_step(step)
        samples = record.samples
        assert [s.key for s in samples] == list(batch.__key__)
        for sample in samples:
            assert sample.shard.endswith(".parquet") and sample.row_group == sample.row // 4
            assert _file_keys(pq_ds, sample.shard)[sample.row] == sample.key
            table = pq.ParquetFile(pq_ds / sample.shard).metadata
            column = table.row_group(sample.row_group).column(0)
            assert sample.byte_offset <= column.data_page_offset


def test_simulate_counts_rows_per_file(pq_ds):
    settings = SimulationSettings(
        world_size=1,
        num_workers=2,
        batch_size=2,
        steps=5,
        shuffle_buffer_size=5,
        max_samples_per_sequence=3,
    )
    sim = simulate(str(pq_ds), settings)
    (source,) = sim.train["sources"]
    assert source["samples"] == 40
    assert {s["shard"]: s["samples"] for s in source["shards"]} == {
        f"parts/data-{i:05d}.parquet": 10 for i in range(4)
    }
    # rows drawn per file in one epoch: what the real loader delivers
    (epoch,) = sim.train["micro_batches_per_rank"]
    it = iter(get_savable_loader(_train(pq_ds, workers=2)))
    drawn = Counter(sources[0].shard_name for _ in range(epoch) for sources in next(it).__sources__)
    assert {s["shard"]: s["drawn"] for s in source["shards"]} == dict(drawn)


class _Failures:
    def __init__(self, path):
        self.path = path

    def __call__(self, exc, sample=None, sources=None):
        with open(self.path, "a") as f:
            f.write(f"{type(exc).__name__}|{getattr(exc, 'path', '')}\n")


@pytest.mark.parametrize("workers", [2])
def test_damaged_row_group_is_skipped_counted_and_located(pq_ds, tmp_path, workers):
    root = tmp_path / "damaged"
    import shutil

    shutil.copytree(pq_ds, root)
    name = "parts/data-00002.parquet"
    group = pq.ParquetFile(root / name).metadata.row_group(1)
    with open(root / name, "r+b") as f:  # garbage over the page headers of row group 1
        for c in range(group.num_columns):
            f.seek(group.column(c).data_page_offset)
            f.write(b"\xee" * 24)
    reset_shard_reader()
    reset_table_reader()
    log = tmp_path / f"failures{workers}.log"
    wc = WorkerConfig(
        rank=0, world_size=1, num_workers=workers, global_error_handler=_Failures(log)
    )
    dataset = get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
    loader = get_savable_loader(dataset)
    keys = [s.__key__ for s in loader]
    lost = set(_file_keys(pq_ds, name)[4:8])
    assert sorted(keys) == sorted(set(_all_keys(pq_ds)) - lost)
    lines = log.read_text().splitlines()
    assert len(lines) == 4 and all(line.startswith("DamagedSampleError|") for line in lines)
    report = loader.error_report()
    assert report["skipped"] == 4
    example = report["sources"][0]["examples"][0]
    assert (example["shard"], example["row_group"]) == (name, 1)
    assert example["row"] in range(4, 8) and example["offset"] > 0


def _all_keys(root):
    return [
        k for p in sorted(root.rglob("*.parquet")) for k in _file_keys(root, p.relative_to(root))
    ]


def test_a_damaged_file_stops_prepare_naming_every_damaged_file(pq_ds, tmp_path):
    import shutil

    root = tmp_path / "broken"
    shutil.copytree(pq_ds, root, ignore=shutil.ignore_patterns(".nv-meta"))
    for name in ("parts/data-00001.parquet", "parts/data-00003.parquet"):
        data = (root / name).read_bytes()
        (root / name).write_bytes(data[: len(data) // 2])  # the footer is gone
    with pytest.raises(ParquetFormatError) as error:
        prepare_parquet(root, progress=False)
    message = str(error.value)
    assert "2 of 4 files are damaged" in message
    assert "data-00001.parquet" in message and "data-00003.parquet" in message
    assert not (root / ".nv-meta" / "parquet.json").exists()  # nothing looks prepared


MEMORY_SCRIPT = """
import hashlib, os, sys
import pyarrow as pa, pyarrow.parquet as pq
root, mode = sys.argv[1], sys.argv[2]
from energon.source.kinds import open_leaf
from energon.source.parquet_read import table_reader
leaf = open_leaf(root, split_part="train")
pool = pa.default_memory_pool()
base = pool.max_memory()
order = list(range(len(leaf)))
if mode == "shuffled":
    order = order[200:] + order[:200][::-1]
digest = {}
for i in order:
    sample = leaf.load(i, None, ("parquet", 0, i))
    digest[i] = hashlib.sha1(sample["blob"]).hexdigest()
print(pool.max_memory() - base, len(digest), hashlib.sha1(repr(sorted(digest.items())).encode()).hexdigest())
"""


def test_memory_stays_within_the_budget_with_a_large_row_group(tmp_path):
    """One 20 MiB row group read with a 4 MiB budget: windows of a few rows, forward from
    the middle, then backwards from the start (new streams); pyarrow's peak stays under the
    budget and every row is read right."""
    rows = 400
    rng = __import__("numpy").random.default_rng(0)
    blobs = [rng.bytes(50_000) for _ in range(rows)]
    root = tmp_path / "big"
    root.mkdir()
    table = pa.table({"blob": blobs, "n": list(range(rows))})
    # small data pages, no dictionary page for the blobs: what a stream holds besides its window
    # is a page per column (pyarrow's default writer makes pages of 1024 rows and a 1 MiB
    # dictionary page; see docs/parquet.md)
    pq.write_table(
        table,
        root / "one.parquet",
        row_group_size=rows,
        write_batch_size=1,
        data_page_size=64 << 10,
        use_dictionary=["n"],
    )
    prepare_parquet(root, progress=False)
    import hashlib

    expected = hashlib.sha1(
        repr(sorted((i, hashlib.sha1(b).hexdigest()) for i, b in enumerate(blobs))).encode()
    ).hexdigest()
    budget = 4 << 20
    env = {**os.environ, "ENERGON_PARQUET_READ_BUDGET": str(budget), "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(root), "shuffled"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    peak, count, digest = out.stdout.split()
    assert (int(count), digest) == (rows, expected)
    assert int(peak) < budget, f"peak {int(peak) / 2**20:.1f} MiB"


def test_without_pyarrow_energon_imports_and_parquet_names_the_extra(pq_ds):
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["pyarrow"] = None  # as if it were not installed
        import energon
        from energon import WorkerConfig, get_val_dataset
        try:
            get_val_dataset({str(pq_ds)!r}, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None)
        except ImportError as e:
            print("ERROR", e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERROR" in out.stdout and "energon-loader[parquet]" in out.stdout
