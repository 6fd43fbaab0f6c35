"""Loading datasets from a real S3 API server (moto in server mode) on loopback, with faults.

The server and a fault-injecting proxy run on 127.0.0.1 for the duration of the module; the
loader reaches them through ``s3://`` URLs exactly as users do, with fake credentials.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.remote import RemoteNotFoundError, remote_stats, s3
from tests.helpers.datasets import make_captioning_dataset, make_text_dataset, upload_to_s3
from tests.helpers.s3_fault_proxy import start_fault_proxy  # noqa: E402

pytest.importorskip("moto.server")

BUCKET = "energon-test"


pytestmark = pytest.mark.usefixtures("fake_aws_env")  # moto server: tests/conftest.py


@pytest.fixture(scope="module")
def remote_text(tmp_path_factory, moto_endpoint):
    """A text dataset, local and uploaded to ``s3://BUCKET/text`` (plus a metadataset YAML)."""
    root = make_text_dataset(tmp_path_factory.mktemp("rtext"), num_samples=60, num_shards=3)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(name, "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        upload_to_s3(root, f"s3://{BUCKET}/text", moto_endpoint)
        meta = root.parent / "meta"
        meta.mkdir()
        (meta / "meta.yaml").write_text(
            "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n"
            "  train:\n    blend:\n      - weight: 1\n        path: ./ds\n"
        )
        upload_to_s3(root, f"s3://{BUCKET}/mds/ds", moto_endpoint)
        upload_to_s3(meta, f"s3://{BUCKET}/mds", moto_endpoint)
    return root


@pytest.fixture(scope="module")
def remote_captioning(tmp_path_factory, moto_endpoint):
    root = make_captioning_dataset(tmp_path_factory.mktemp("rcap"), num_samples=24, num_shards=2)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(name, "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        upload_to_s3(root, f"s3://{BUCKET}/cap", moto_endpoint)
    return root


def _loader(path, num_workers: int):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        path, worker_config=wc, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4
    )
    return get_savable_loader(ds)


def _take(loader, n: int) -> list:
    it = iter(loader)
    return [next(it) for _ in range(n)]


def _texts(batches) -> list:
    return [(tuple(b.__key__), tuple(b.text)) for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_text_from_s3_equals_local(remote_text, num_workers):
    local = _texts(_take(_loader(remote_text, num_workers), 25))
    remote = _texts(_take(_loader(f"s3://{BUCKET}/text", num_workers), 25))
    assert remote == local
    if num_workers == 0:
        assert remote_stats().bytes_read > 0


def test_captioning_from_s3_equals_local(remote_captioning):
    local = _take(_loader(remote_captioning, 0), 6)
    remote = _take(_loader(f"s3://{BUCKET}/cap", 0), 6)
    for a, b in zip(local, remote):
        assert a.__key__ == b.__key__
        assert a.caption == b.caption
        assert torch.equal(a.image, b.image)


def test_s3_save_restore(remote_text):
    url = f"s3://{BUCKET}/text"
    loader = _loader(url, 2)
    it = iter(loader)
    [next(it) for _ in range(4)]
    state = loader.save_state_rank()
    expected = _texts([next(it) for _ in range(8)])
    restored = _loader(url, 2)
    restored.restore_state_rank(state)
    assert _texts(_take(restored, 8)) == expected


def test_remote_metadataset_relative_path(remote_text):
    local = _texts(_take(_loader(remote_text, 0), 10))
    remote = _texts(_take(_loader(f"s3://{BUCKET}/mds/meta.yaml", 0), 10))
    assert remote == local


def test_missing_object_fails_fast_with_its_name(remote_text):
    """Fast means without retries (and their backoff): counted, not timed."""
    remote_stats().reset()
    with pytest.raises(FileNotFoundError, match="s3://energon-test/nope"):
        _loader(f"s3://{BUCKET}/nope", 0)
    with pytest.raises(RemoteNotFoundError, match="s3://energon-test/text/missing.tar"):
        s3.read_range(f"s3://{BUCKET}/text/missing.tar", 0, 10)
    assert remote_stats().retries == 0


@pytest.fixture
def fault_proxy(moto_endpoint):
    url, handler, stop = start_fault_proxy(moto_endpoint)
    yield url, handler
    stop()


def test_faults_do_not_change_the_output(remote_text, fault_proxy, monkeypatch):
    url = f"s3://{BUCKET}/text"
    clean = _texts(_take(_loader(url, 0), 20))
    proxy_url, handler = fault_proxy
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy_url)
    monkeypatch.setenv("ENERGON_S3_READ_TIMEOUT", "0.5")
    monkeypatch.setenv("ENERGON_CACHE_DIR", str(Path(str(remote_text)).parent / "cache-faults"))
    s3.reset_client()
    remote_stats().reset()
    faulty = _texts(_take(_loader(url, 0), 20))
    assert faulty == clean
    assert all(count > 0 for count in handler.faults.values()), handler.faults
    # Every injected fault (cut body, 503, stall past the read timeout) costs exactly one retry,
    # counted by us: botocore's own retries are off, so none is hidden.
    stats = remote_stats()
    assert stats.retries == sum(handler.faults.values()), (stats, handler.faults)
    assert stats.throttled == handler.faults["slowdown"]  # each 503 SlowDown lowered concurrency


def _first_tries() -> int:
    """Requests so far, less retries and hedged second requests (a slow, busy machine adds those)."""
    stats = remote_stats()
    return stats.requests - stats.retries - stats.hedged


def test_read_ahead_serves_consecutive_samples_from_one_request(remote_text):
    # A first loader fetches what is read once per process (the shards' indices, two requests a
    # shard), so that the count below does not depend on which tests ran before in this process.
    _take(_loader(f"s3://{BUCKET}/text", 0), 1)
    before = _first_tries()
    batches = _take(_loader(f"s3://{BUCKET}/text", 0), 20)  # 60 samples: the whole dataset
    samples = sum(len(b.__key__) for b in batches)
    requests = _first_tries() - before
    assert samples == 60
    assert requests < samples / 3, f"{requests} requests (metadata included) for {samples} samples"


def test_credentials_never_in_state_or_errors(remote_text, monkeypatch):
    import json

    secret, key_id = "s3cr3t-never-shown-4711", "AKIDNEVERSHOWN"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    s3.reset_client()
    loader = _loader(f"s3://{BUCKET}/text", 0)
    it = iter(loader)
    next(it)
    state = json.dumps(loader.save_state_rank(), default=str)
    assert secret not in state and key_id not in state
    with pytest.raises(RemoteNotFoundError) as err:
        s3.read_range(f"s3://{BUCKET}/text/missing.tar", 0, 10)
    assert secret not in str(err.value) and key_id not in str(err.value)
    s3.reset_client()


def test_ranged_reads_skip_botocore_and_match_it(remote_text, monkeypatch):
    """The presigned fast path serves ranged reads; botocore's get_object is not called, and the
    bytes are those botocore returns."""
    url = f"s3://{BUCKET}/text/parts/data-00000.tar"
    calls = []
    real_client = s3.client()
    real_get = real_client.get_object

    def counting_get(**kwargs):
        calls.append(kwargs)
        return real_get(**kwargs)

    monkeypatch.setattr(real_client, "get_object", counting_get)
    fast = s3.read_range(url, 100, 900)
    assert calls == []
    monkeypatch.setenv("ENERGON_S3_FAST_GET", "0")
    assert s3.read_range(url, 100, 900) == fast
    assert len(calls) == 1


def test_fast_path_errors_do_not_show_the_presigned_url(remote_text, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("ENERGON_REMOTE_MAX_ATTEMPTS", "2")
    s3.reset_client()
    with pytest.raises(Exception) as err:
        s3.read_range(f"s3://{BUCKET}/text/parts/data-00000.tar", 0, 10)
    message = str(err.value)
    assert "s3://energon-test/text/parts/data-00000.tar" in message
    assert "X-Amz" not in message and "Signature" not in message
    s3.reset_client()
