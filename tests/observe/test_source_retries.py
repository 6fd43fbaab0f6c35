"""loader.stats() counts remote read retries per source: a blend of a dataset on a real S3 API
server (moto on loopback, behind a proxy that answers some reads with 503 SlowDown) and a local
copy of it; every retry is counted once, for the remote source only."""

from __future__ import annotations

import pytest

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.remote import remote_stats, s3
from tests.helpers.datasets import make_text_dataset, upload_to_s3
from tests.helpers.s3_fault_proxy import start_fault_proxy

pytest.importorskip("moto.server")
pytestmark = pytest.mark.usefixtures("fake_aws_env")

BUCKET = "energon-observe"


@pytest.fixture(scope="module")
def local_and_remote(tmp_path_factory, moto_endpoint):
    root = make_text_dataset(tmp_path_factory.mktemp("retry-text"), num_samples=60, num_shards=3)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(name, "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        upload_to_s3(root, f"s3://{BUCKET}/text", moto_endpoint)
    blend = root.parent / "blend.yaml"
    blend.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
        "    blend_epochized:\n"
        f"      - repetitions: 1\n        path: {root}\n"
        f"      - repetitions: 1\n        path: s3://{BUCKET}/text\n"
    )
    return blend


@pytest.mark.parametrize("num_workers", [0, 2])
def test_retries_are_counted_per_source(local_and_remote, moto_endpoint, monkeypatch, num_workers):
    # every 4th ranged GET of the remote shards is answered 503 SlowDown (retried, then served)
    proxy, handler, stop = start_fault_proxy(
        moto_endpoint, schedule=lambda n: "slowdown" if n % 4 == 1 else None
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
    monkeypatch.setenv("ENERGON_REMOTE_CHUNK_BYTES", "4096")  # many small reads: several faults
    monkeypatch.setenv("ENERGON_REMOTE_READAHEAD_BYTES", "4096")
    s3.reset_client()
    remote_stats().reset()
    try:
        wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
        dataset = get_train_dataset(
            str(local_and_remote),
            worker_config=wc,
            batch_size=4,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
        )
        loader = get_savable_loader(dataset)
        batches = sum(1 for _ in loader)  # one whole pass: every worker ends and counts
        stats = loader.stats()
    finally:
        stop()
        s3.reset_client()
    assert batches > 0
    local, remote = stats["sources"]
    assert local["path"].endswith("retry-text0") and remote["path"].startswith("s3://")
    assert handler.faults["slowdown"] > 0
    # every retry of the loader's processes (the injected 503s; a connection the proxy reset
    # after one is retried too) was counted once, for the source whose object it was
    retries = sum(w["remote_retries"] for w in stats["workers"])
    assert retries > 0
    assert remote["retries"] == retries
    assert local["retries"] == 0
    assert local["skipped"] == remote["skipped"] == 0
