"""A restart storm: every one of 4,096 ranks restores from a checkpoint at once. What one rank asks
object storage for must not grow with the dataset: a few requests for the metadata (the front of
the shard table, the split config, ``dataset.yaml``, ``index.uuid``), then its own shards'
indices and bytes. No listing, no ``.info.json``, no other rank's shards. Counted at the S3
server's door (a logging proxy in front of moto), for a rank in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from urllib.parse import unquote, urlparse

import pytest

from energon.format.split_shards import write_shard_table
from energon.plan.sharding import stream_range
from tests.helpers.datasets import make_text_dataset, upload_to_s3
from tests.helpers.paths import REPO_ROOT
from tests.helpers.s3_fault_proxy import start_fault_proxy

pytest.importorskip("moto.server")
pytestmark = pytest.mark.usefixtures("fake_aws_env")

BUCKET = "energon-storm"
WORLD = 4096
SHARDS, PER_SHARD = 128, 64  # two samples per rank

RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from energon import WorkerConfig, get_savable_loader, get_train_dataset
    url, rank, state_path, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    wc = WorkerConfig(rank=rank, world_size=4096, num_workers=0)
    ds = get_train_dataset(url, worker_config=wc, batch_size=1, shuffle_buffer_size=None,
                           max_samples_per_sequence=None)
    loader = get_savable_loader(ds)
    if mode == "save":
        it = iter(loader)
        next(it)
        json.dump(loader.save_state_rank(), open(state_path, "w"))
    else:
        loader.restore_state_rank(json.load(open(state_path)))
        it = iter(loader)
    print(json.dumps(list(next(it).__key__)))
    """
)


def _run_rank(url: str, rank: int, state_path, mode: str, endpoint: str, cache) -> list[str]:
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "ENERGON_CACHE_DIR": str(cache),
        "PYTHONPATH": str(REPO_ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", RANK_SCRIPT, url, str(rank), str(state_path), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _own_shards(rank: int) -> set[str]:
    first, end = stream_range(0, SHARDS * PER_SHARD, WORLD, 0, rank)
    shards = range(first // PER_SHARD, -(-end // PER_SHARD))
    return {f"parts/data-{s:05d}.tar" for s in shards}


def test_a_restoring_rank_asks_for_its_own_shards_and_a_constant_rest(tmp_path, moto_endpoint):
    rank = 4095
    local = make_text_dataset(tmp_path / "ds", num_samples=SHARDS * PER_SHARD, num_shards=SHARDS)
    # the table's three levels, as at a million shards: 32 blocks of 4 shards, 4 pages of 8
    write_shard_table(local, "split.yaml", block_shards=4, max_pages=4)
    url = f"s3://{BUCKET}/storm"
    upload_to_s3(local, url)
    state = tmp_path / "state.json"
    saved = _run_rank(url, rank, state, "save", moto_endpoint, tmp_path / "cache-save")
    proxy, handler, stop = start_fault_proxy(moto_endpoint, faults=False)
    try:
        restored = _run_rank(url, rank, state, "restore", proxy, tmp_path / "cache-restore")
    finally:
        stop()
    assert restored == saved  # the restored rank goes on where the saved one was
    requests = [(method, unquote(urlparse(path).path), r) for method, path, r in handler.requests]
    listings = [
        path
        for _, path, _ in handler.requests
        if "list-type" in path or "prefix=" in path or urlparse(path).path.strip("/").count("/") < 1
    ]
    assert listings == []
    keys = [path.split("/storm/", 1)[-1] for _, path, _ in requests]
    assert ".nv-meta/.info.json" in keys  # one HEAD: is it a prepared dataset, and its size
    info = [m for (m, _, _), k in zip(requests, keys) if k == ".nv-meta/.info.json"]
    assert set(info) == {"HEAD"}, "the shard list in .info.json is never read"
    assert ".nv-meta/index.sqlite" not in keys
    own = _own_shards(rank)
    shard_objects = {k for k in keys if k.startswith("parts/")}
    assert shard_objects <= own | {k + ".idx" for k in own}, sorted(shard_objects)
    metadata = [k for k in keys if not k.startswith("parts/")]
    # is it a token prefix (HEAD), a prepared dataset (HEAD .info.json, then its size), the
    # dataset.yaml, index.uuid and split config (HEAD + GET each), the shard table's front part
    # (two GETs), the directory entries of its page and the block of this rank's shards: 13,
    # whatever the size of the dataset
    assert len(metadata) <= 13, [r for r in requests if "/parts/" not in r[1]]
    table = [r for r in requests if r[1].endswith("/shard_table.bin")]
    assert len(table) == 4, table
    assert len(keys) - len(metadata) <= 3 * len(own), keys  # HEAD + GET of the .tar.idx, GETs
