"""`energon simulate`'s start-up reads per rank against what a real rank asks object storage for:
a rank in this process reads a dataset from the loopback S3 server through a logging proxy,
and the bytes of every request but the samples' (``.tar``) add up to the simulated figure; by
its first batch it has read no more than that."""

from __future__ import annotations

import os
import re
import shutil
from urllib.parse import unquote, urlparse

import pytest

from energon import WorkerConfig, get_loader, get_train_dataset
from energon.format.split_shards import write_shard_table
from energon.preflight.simulate import SimulationSettings, simulate
from energon.remote import remote_stats, s3
from tests.helpers.datasets import make_text_dataset, upload_to_s3
from tests.helpers.s3_fault_proxy import start_fault_proxy

pytest.importorskip("moto.server")
pytestmark = pytest.mark.usefixtures("fake_aws_env")

WORLD, BATCH = 4, 2
SHARDS, PER_SHARD = 96, 8  # 3 blocks of the shard table (32 shards each), one per page


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_text_dataset(
        tmp_path_factory.mktemp("startup") / "ds", num_samples=SHARDS * PER_SHARD, num_shards=SHARDS
    )


def _bytes_asked(requests, local, prefix) -> tuple[int, int, int]:
    """(index and metadata bytes, sample bytes, repeated GETs) of the GETs the proxy forwarded,
    each byte range of an object counted once: a retry (a request that timed out on this loaded
    machine) or a hedged read of sample bytes asks for the same bytes again."""
    index = samples = repeated = 0
    seen = set()
    for method, path, byte_range in requests:
        key = unquote(urlparse(path).path).split(f"/{prefix}/", 1)[-1]
        if method != "GET" or not (local / key).exists():  # a HEAD, or a 404
            continue
        if (key, byte_range) in seen:
            repeated += 1
            continue
        seen.add((key, byte_range))
        size = os.path.getsize(local / key)
        if byte_range is not None:
            first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", byte_range).groups())
            size = min(last + 1, size) - first
        if key.endswith(".tar"):
            samples += size
        else:
            index += size
    return index, samples, repeated


@pytest.mark.parametrize(
    "rank,workers,table", [(1, 0, "blocks"), (2, 2, "paged"), (3, 0, None)], ids=str
)
def test_simulated_startup_reads_are_what_a_rank_reads(
    dataset, tmp_path, moto_endpoint, monkeypatch, rank, workers, table
):
    local = tmp_path / "ds"
    shutil.copytree(dataset, local)
    if table is None:  # the fallback: every rank reads .info.json in full
        (local / ".nv-meta" / "shard_table.bin").unlink()
    elif table == "paged":  # all three levels: 24 blocks of 4 shards, 4 pages of 6 blocks
        write_shard_table(local, "split.yaml", block_shards=4, max_pages=4)
    prefix = f"startup-{rank}"
    upload_to_s3(local, f"s3://energon-startup/{prefix}")
    settings = SimulationSettings(world_size=WORLD, num_workers=workers, batch_size=BATCH)
    reads = simulate(str(local), settings).train["startup_reads"]
    assert reads["not_counted"] == []
    files = set(reads["summary"][0]["files"])
    expected = {".nv-meta/dataset.yaml", ".nv-meta/split.yaml"}
    expected |= (
        {".nv-meta/index.uuid", ".nv-meta/shard_table.bin"} if table else {".nv-meta/.info.json"}
    )
    assert files == expected

    proxy, handler, stop = start_fault_proxy(moto_endpoint, faults=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
    s3.reset_client()
    remote_stats().reset()
    try:
        wc = WorkerConfig(rank=rank, world_size=WORLD, num_workers=workers)
        ds = get_train_dataset(
            f"s3://energon-startup/{prefix}",
            worker_config=wc,
            batch_size=BATCH,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
        )
        batches = iter(get_loader(ds))
        next(batches)
        first, _, _ = _bytes_asked(list(handler.requests), local, prefix)
        rest = sum(1 for _ in batches)
    finally:
        stop()
    assert rest == len(ds) - 1
    index, samples, repeated = _bytes_asked(handler.requests, local, prefix)
    if workers == 0:  # (workers count their retries in their own processes)
        stats = remote_stats()
        assert repeated <= stats.retries + stats.hedged, "a byte range was read twice"
    assert samples > 0
    assert first <= reads["bytes"][rank]
    assert index == reads["bytes"][rank]
    own = reads["own_bytes"][rank]
    assert own > 0 and reads["bytes"][rank] == reads["summary_bytes"] + own
