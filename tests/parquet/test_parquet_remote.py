"""Parquet datasets in object storage (the real S3 API server on loopback): ``energon prepare``
reads only footers, loading reads row groups by byte range (nothing is downloaded whole), and the
samples and their order equal the local dataset's."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

from energon import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset
from energon.cli.main import cli
from energon.remote import remote_stats
from energon.source.parquet_read import reset_table_reader
from energon.source.shard_reader import reset_shard_reader
from tests.helpers.datasets import make_captioning_dataset, upload_to_s3
from tests.helpers.parquet import tar_as_parquet

pytest.importorskip("moto.server")
pytestmark = pytest.mark.usefixtures("fake_aws_env")

BUCKET = "energon-parquet"


@pytest.fixture(scope="module")
def pq_ds(tmp_path_factory):
    tar = make_captioning_dataset(tmp_path_factory.mktemp("tar"), num_samples=36, num_shards=3)
    return tar_as_parquet(tar, tmp_path_factory.mktemp("pq"), row_group_size=4)


def _keys_val(path):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    samples = list(
        get_savable_loader(
            get_val_dataset(path, split_part="train", worker_config=wc, batch_size=None)
        )
    )
    return [(s.__key__, s.caption, float(s.image.sum())) for s in samples]


def _keys_train(path, workers):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = get_train_dataset(
        path, worker_config=wc, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4
    )
    it = iter(get_savable_loader(ds))
    return [list(next(it).__key__) for _ in range(6)]


def test_prepared_remotely_and_read_by_row_group(pq_ds, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(pq_ds, plain, ignore=shutil.ignore_patterns(".nv-meta"))
    url = f"s3://{BUCKET}/pq"
    upload_to_s3(plain, url)
    data_bytes = sum(p.stat().st_size for p in plain.rglob("*.parquet"))
    remote_stats().reset()
    args = ["prepare", url, "--non-interactive", "--split-ratio", "1,0,0", "--no-progress"]
    args += [
        "--sample-type",
        "CaptioningSample",
        "--field-map",
        '{"image": "jpg", "caption": "txt"}',
    ]
    result = CliRunner().invoke(cli, args + ["--key-column", "key"])
    assert result.exit_code == 0, result.output
    assert "Found 36 rows in 3 files" in result.output
    info = CliRunner().invoke(cli, ["info", url])
    assert info.exit_code == 0 and "Total rows: 36 rows" in info.output, info.output

    reset_shard_reader()
    reset_table_reader()
    remote_stats().reset()
    assert _keys_val(url) == _keys_val(pq_ds)
    stats = remote_stats()
    assert stats.requests >= 3 and stats.bytes_read < 2 * data_bytes
    cached = [n for _, _, names in os.walk(tmp_path / "cache") for n in names]
    assert not any(n.endswith(".parquet") for n in cached)  # never downloaded whole
    assert _keys_train(url, 2) == _keys_train(pq_ds, 2)


def test_prepare_reads_only_footers(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "big"
    folder.mkdir()
    blobs = [np.random.default_rng(i).bytes(100_000) for i in range(20)]
    pq.write_table(pa.table({"blob": blobs}), folder / "a.parquet", row_group_size=5)
    upload_to_s3(folder, f"s3://{BUCKET}/big")
    remote_stats().reset()
    args = ["prepare", f"s3://{BUCKET}/big", "--non-interactive", "--split-ratio", "1,0,0"]
    result = CliRunner().invoke(cli, args + ["--no-progress"])
    assert result.exit_code == 0, result.output
    assert "Found 20 rows in 1 files, 4 row groups" in result.output
    assert remote_stats().bytes_read < 200_000  # of 2 MB: the footer (pyarrow reads 64 KiB)


def test_a_remote_file_used_as_it_is(pq_ds, tmp_path):
    name = "parts/data-00001.parquet"
    upload_to_s3(pq_ds / name, f"s3://{BUCKET}/single")
    url = f"s3://{BUCKET}/single/data-00001.parquet"
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    samples = list(get_savable_loader(get_val_dataset(url, worker_config=wc, batch_size=None)))
    assert [s["__key__"] for s in samples] == [f"data-00001.parquet/{i}" for i in range(12)]
    import pyarrow.parquet as pq

    keys = pq.read_table(pq_ds / name, columns=["key"]).column("key").to_pylist()
    assert [s["key"] for s in samples] == keys


def test_remote_reads_fetch_only_the_columns_the_field_map_uses(tmp_path):
    """A field map that uses the small columns of a file with a large binary column: remote
    reads (prefetched and not) fetch the used column chunks, not whole row groups. The same
    files read as crude rows (every column) fetch all their bytes, for comparison."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from energon.format.parquet import prepare_parquet

    folder = tmp_path / "wide"
    (folder / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for f in range(2):
        rows = range(f * 24, f * 24 + 24)
        table = pa.table(
            {
                "key": [f"row{i:03d}" for i in rows],
                "txt": [f"the text of row {i}".encode() for i in rows],
                "blob": [rng.bytes(50_000) for _ in rows],
            }
        )
        pq.write_table(table, folder / f"data/{f}.parquet", row_group_size=4)
    prepare_parquet(folder, progress=False)
    data_bytes = sum(p.stat().st_size for p in folder.rglob("*.parquet"))
    used = 0
    for path in folder.rglob("*.parquet"):
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            used += sum(meta.row_group(g).column(c).total_compressed_size for c in range(2))
    expected = [(f"row{i:03d}", f"the text of row {i}") for i in range(48)]
    got = {}
    for name, yaml in (
        (
            "text",
            "sample_type: {__module__: energon, __class__: TextSample}\n"
            "field_map: {text: txt}\nkey_column: key\n",
        ),
        ("crude", "__module__: energon\n__class__: CrudeWebdataset\n"),
    ):
        (folder / ".nv-meta" / "dataset.yaml").write_text(yaml)
        upload_to_s3(folder, f"s3://{BUCKET}/{name}")
        reset_shard_reader()
        reset_table_reader()
        remote_stats().reset()
        wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
        samples = get_val_dataset(
            f"s3://{BUCKET}/{name}", split_part="train", worker_config=wc, batch_size=None
        )
        rows = list(get_savable_loader(samples))
        if name == "text":
            assert [(s.__key__, s.text) for s in rows] == expected
        else:
            assert [(s["key"], s["txt"]) for s in rows] == expected
        got[name] = remote_stats().as_dict()
    print(got, used, data_bytes)
    assert got["crude"]["bytes_read"] >= data_bytes - 2 * 65536  # every column chunk
    footers = 2 * 65536  # pyarrow reads the last 64 KiB of each file for its footer
    assert got["text"]["bytes_read"] <= used + footers + 2 * 65536
    assert got["text"]["bytes_read"] < data_bytes / 10
