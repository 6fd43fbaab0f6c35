"""Every kind of source from object storage (JSONL, aux folders and datasets, dataset scripts), and
the prefetching chunk cache that remote reads go through, against moto on loopback."""

from __future__ import annotations

import json
import textwrap
import time

import boto3
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from energon import (
    Cooker,
    DefaultTaskEncoder,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    cooker,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)
from energon.cli.main import cli
from energon.remote import RemoteNotFoundError, remote_stats, s3
from energon.source.prefetch import RemoteChunkCache
from tests.helpers.datasets import make_captioning_dataset, make_text_dataset, upload_to_s3

pytest.importorskip("moto.server")
pytestmark = pytest.mark.usefixtures("fake_aws_env")

BUCKET = "energon-sources"


def _val(path, **kwargs) -> list:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=kwargs.pop("num_workers", 0))
    ds = get_val_dataset(path, worker_config=wc, batch_size=None, **kwargs)
    return list(get_savable_loader(ds))


def _train_keys(path, num_workers: int, batches: int) -> list:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        path, worker_config=wc, batch_size=4, shuffle_buffer_size=7, max_samples_per_sequence=5
    )
    it = iter(get_savable_loader(ds))
    return [list(next(it)["__key__"]) for _ in range(batches)]


def test_jsonl_prepared_and_loaded_from_s3(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(37)))
    upload_to_s3(path, f"s3://{BUCKET}/jsonl")
    url = f"s3://{BUCKET}/jsonl/records.jsonl"
    result = CliRunner().invoke(cli, ["prepare", url])
    assert result.exit_code == 0, result.output
    assert "Found 37 samples" in result.output
    assert CliRunner().invoke(cli, ["prepare", str(path)]).exit_code == 0
    # the index uploaded next to the file is byte-identical to a local prepare
    remote_index = s3.read_bytes(f"s3://{BUCKET}/jsonl/records.jsonl.idx")
    assert remote_index == (tmp_path / "records.jsonl.idx").read_bytes()
    remote = [s["json"]["text"] for s in _val(url)]
    assert remote == [f"record {i}" for i in range(37)]
    assert _train_keys(url, 2, 6) == _train_keys(path, 2, 6)


def test_jsonl_stale_remote_index_is_refused(tmp_path):
    path = tmp_path / "stale.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)))
    upload_to_s3(path, f"s3://{BUCKET}/stale")
    url = f"s3://{BUCKET}/stale/stale.jsonl"
    assert CliRunner().invoke(cli, ["prepare", url]).exit_code == 0
    path.write_text(path.read_text() + json.dumps({"i": 5}) + "\n")
    upload_to_s3(path, f"s3://{BUCKET}/stale")  # the data changed, the index did not
    with pytest.raises(ValueError, match="Regenerate the index"):
        _val(url)


@cooker(need_primary=True)
def cook_with_aux(sample, captions, extra_ds, primary):
    own = primary.get(".txt")
    extra = captions.get(sample["__key__"] + ".txt", sample)
    from_dataset = extra_ds.get(sample["__key__"] + ".txt", sample)
    return TextSample(**basic_sample_keys(sample), text=f"{own}|{extra}|{from_dataset}")


class AuxEncoder(DefaultTaskEncoder):
    cookers = [Cooker(stateless(cook_with_aux))]


def test_aux_folder_and_aux_dataset_from_s3(tmp_path):
    root = tmp_path / "mds"
    crude = make_text_dataset(root / "crude", num_samples=10, num_shards=2, seed=7)
    (crude / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
    )
    make_text_dataset(root / "extra", num_samples=10, num_shards=2, seed=7)  # same keys
    keys = [s["__key__"] for s in _val(crude, split_part="train")]
    (root / "captions").mkdir()
    for key in keys:
        (root / "captions" / f"{key}.txt").write_text(f"aux of {key}")
    (root / "aux.yaml").write_text(
        textwrap.dedent(
            """
            __module__: megatron.energon
            __class__: MetadatasetV2
            splits:
              train:
                path: ./crude
                aux:
                  captions: filesystem://captions
                  extra_ds: ./extra
            """
        )
    )
    upload_to_s3(root, f"s3://{BUCKET}/aux")
    local = [s.text for s in _val(root / "aux.yaml", split_part="train", task_encoder=AuxEncoder())]
    remote = [
        s.text
        for s in _val(f"s3://{BUCKET}/aux/aux.yaml", split_part="train", task_encoder=AuxEncoder())
    ]
    assert remote == local and len(remote) == len(keys) > 0
    for text, key in zip(remote, keys):
        own, extra, from_dataset = text.split("|")
        assert extra == f"aux of {key}" and own and from_dataset


def test_aux_folder_refuses_names_outside_it_remotely():
    from energon.errors import SampleException
    from energon.source.file_store import SystemFileStore

    store = SystemFileStore(f"s3://{BUCKET}/aux/captions")
    with pytest.raises(SampleException, match="outside"):
        store["../crude/.nv-meta/dataset.yaml"]


SCRIPT = textwrap.dedent(
    """
    def sample_loader(raw):
        return {"caption": raw["txt"].upper(), "image": raw["jpg"]}

    def part_filter(part):
        return part in ("jpg", "txt")
    """
)


def test_dataset_with_sample_loader_script_from_s3(tmp_path):
    root = make_captioning_dataset(tmp_path / "scripted", num_samples=8, num_shards=2)
    (root / ".nv-meta" / "sample_loader.py").write_text(SCRIPT)
    (root / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
        "sample_loader: sample_loader.py:sample_loader\npart_filter: sample_loader.py:part_filter\n"
    )
    upload_to_s3(root, f"s3://{BUCKET}/scripted")
    local = _val(root, split_part="train", num_workers=2)
    remote = _val(f"s3://{BUCKET}/scripted", split_part="train", num_workers=2)
    assert [s.caption for s in remote] == [s.caption for s in local]
    assert all(s.caption == s.caption.upper() for s in remote)


# -- the chunk cache ------------------------------------------------------------------------


@pytest.fixture
def blob():
    """A 64 KiB object and the boundaries of 64 'samples' of 1 KiB in it."""
    data = np.random.default_rng(0).integers(0, 256, 64 * 1024, dtype=np.uint8).tobytes()
    client = s3.client()
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    client.put_object(Bucket=BUCKET, Key="blob/data.bin", Body=data)
    return f"s3://{BUCKET}/blob/data.bin", data, np.arange(0, 65 * 1024, 1024, dtype=np.uint64)


HANG_S = 120  # waits that end as soon as the awaited thing happens: only a hang reaches this
STALL_S = 25.0  # a stalled request: inside the 30 s read timeout, so no retry ends it


def _wait_idle(cache: RemoteChunkCache) -> None:
    deadline = time.monotonic() + HANG_S
    while any(not c.future.done() for c in cache._chunks.values()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_hinted_samples_come_from_one_request(blob):
    url, data, offsets = blob
    cache = RemoteChunkCache(budget=1 << 20)
    remote_stats().reset()
    cache.prefetch(url, offsets[4:21])  # samples 4..19
    _wait_idle(cache)
    assert remote_stats().requests == 1
    for i in range(4, 20):
        start, end = int(offsets[i]), int(offsets[i + 1])
        assert cache.read(url, start, end, offsets) == data[start:end]
    assert remote_stats().requests == 1
    cache.prefetch(url, offsets[4:21])  # already cached: nothing new
    assert remote_stats().requests == 1


def test_hints_respect_the_budget_and_never_evict_unread_hints(blob):
    url, data, offsets = blob
    cache = RemoteChunkCache(budget=8 * 1024)
    cache.prefetch(url, offsets[0:7])  # 6 KiB: fits
    cache.prefetch(url, offsets[10:15])  # 4 KiB more: dropped, the first hint is unread
    _wait_idle(cache)
    assert cache._bytes == 6 * 1024
    assert cache.read(url, 0, 1024, offsets) == data[:1024]  # read: now it may be evicted
    cache.prefetch(url, offsets[10:15])
    _wait_idle(cache)
    assert cache._bytes <= 8 * 1024
    assert cache.read(url, 10 * 1024, 11 * 1024, offsets) == data[10 * 1024 : 11 * 1024]


def test_waiting_for_remote_bytes_is_counted(blob):
    url, data, offsets = blob
    cache = RemoteChunkCache(budget=1 << 20)
    cache.prefetch(url, offsets[0:5])
    _wait_idle(cache)
    remote_stats().reset()
    assert cache.read(url, 0, 1024, offsets) == data[:1024]  # prefetched: no wait
    assert remote_stats().wait_seconds == 0
    assert cache.read(url, 30 * 1024, 31 * 1024, offsets) == data[30 * 1024 : 31 * 1024]
    assert remote_stats().wait_seconds > 0  # not hinted: the read waited for its GET


def test_unhinted_reads_fetch_on_demand_chunks_without_overlap(blob):
    url, data, offsets = blob
    cache = RemoteChunkCache(budget=1 << 20)
    cache.prefetch(url, offsets[8:11])  # samples 8..9 hinted
    _wait_idle(cache)
    remote_stats().reset()
    for i in range(0, 12):
        start, end = int(offsets[i]), int(offsets[i + 1])
        assert cache.read(url, start, end, offsets) == data[start:end]
    # samples 0..7 come from one on-demand chunk (it stops at the hinted chunk), 10.. from another
    assert remote_stats().requests == 2
    spans = sorted((c.start, c.end) for c in cache._chunks.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # a read inside a sample that straddles two chunks is served directly
    assert (
        cache.read(url, 7 * 1024 + 10, 8 * 1024 + 10, offsets)
        == data[7 * 1024 + 10 : 8 * 1024 + 10]
    )


def test_a_failed_prefetch_fails_the_read_that_needs_it_and_is_retried(blob):
    url, data, offsets = blob
    missing = f"s3://{BUCKET}/blob/missing.bin"
    cache = RemoteChunkCache(budget=1 << 20)
    cache.prefetch(missing, offsets[0:3])  # hints never raise
    with pytest.raises(RemoteNotFoundError, match="missing.bin"):
        cache.read(missing, 0, 1024, offsets)
    assert not cache._chunks  # forgotten: the next read tries again
    boto3.client("s3", endpoint_url=s3.client().meta.endpoint_url).put_object(
        Bucket=BUCKET, Key="blob/missing.bin", Body=data
    )
    assert cache.read(missing, 0, 1024, offsets) == data[:1024]


def test_large_uploads_stream_in_parts(tmp_path):
    from energon import epath

    local = tmp_path / "big.sqlite"
    data = np.random.default_rng(1).integers(0, 256, 9 << 20, dtype=np.uint8).tobytes()
    local.write_bytes(data)  # above the 8 MiB multipart threshold
    url = f"s3://{BUCKET}/big/index.sqlite"
    try:
        s3.client().create_bucket(Bucket=BUCKET)
    except s3.client().exceptions.BucketAlreadyOwnedByYou:
        pass
    epath.upload(str(local), url)
    assert s3.read_bytes(url) == data
    assert [k for k in s3.list_keys(f"s3://{BUCKET}/big/")] == [url]  # no temporary left


def test_a_rank_fetches_only_the_shards_it_reads(tmp_path, monkeypatch):
    from energon import epath

    root = make_text_dataset(tmp_path / "ranks", num_samples=96, num_shards=8)
    # one copy per rank: the previous rank's prefetch threads may still be busy, and their reads
    # must not count as this rank's
    for rank in range(4):
        upload_to_s3(root, f"s3://{BUCKET}/ranks{rank}")
    fetched: list[str] = []
    real_read_range = epath.read_range

    def recording_read_range(path: str, start: int, end: int) -> bytes:
        fetched.append(path)
        return real_read_range(path, start, end)

    monkeypatch.setattr(epath, "read_range", recording_read_range)
    for rank in range(4):
        url = f"s3://{BUCKET}/ranks{rank}"
        fetched.clear()
        wc = WorkerConfig(rank=rank, world_size=4, num_workers=0)
        ds = get_train_dataset(
            url, worker_config=wc, batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=3
        )
        it = iter(get_savable_loader(ds))
        # this rank's whole share of an epoch (24 samples): prefetching may run ahead of the batches
        # taken, but never outside the rank's own range
        keys = [k for _ in range(12) for k in next(it)["__key__"]]
        shards_read = {int(k.split("_")[0]) for k in keys}
        shard_files = {p.rsplit("/", 1)[1] for p in fetched if p.startswith(f"{url}/parts/")}
        fetched_shards = {int(name.split("-")[1].split(".")[0]) for name in shard_files}
        assert fetched_shards and fetched_shards <= shards_read, (rank, fetched_shards, shards_read)
        assert len(shards_read) <= 3  # 2 of 8 shards per rank, plus at most a boundary one


def _token_batches(path, num_workers: int, batches: int, **kwargs) -> list:
    from energon.megatron.gpt_dataset import GPTConfig

    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=None,
        max_samples_per_sequence=8,
        token_config=GPTConfig(sequence_length=16, split="90,10,0", eod_token=0),
        **kwargs,
    )
    it = iter(get_savable_loader(ds))
    return [next(it) for _ in range(batches)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_megatron_token_prefix_from_s3(tmp_path, num_workers, monkeypatch):
    from tests.helpers.datasets import write_prefix

    local = tmp_path / "tokens" / "corpus"
    local.parent.mkdir()
    write_prefix(str(local), num_docs=120, seed=3)
    (tmp_path / "tokens" / "mds.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\n"
        "token_config: {sequence_length: 16, split: '90,10,0', eod_token: 0}\n"
        "splits:\n  train:\n    blend:\n      - weight: 1\n        path: ./corpus\n"
    )
    upload_to_s3(tmp_path / "tokens", f"s3://{BUCKET}/tokens{num_workers}")
    url = f"s3://{BUCKET}/tokens{num_workers}/corpus"
    expected = _token_batches(str(local), num_workers, 12)
    remote_stats().reset()
    got = _token_batches(url, num_workers, 12)
    for a, b in zip(expected, got):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["labels"], b["labels"])
    # a remote metadataset naming the prefix relatively gives the same windows
    via_yaml = _token_batches(f"s3://{BUCKET}/tokens{num_workers}/mds.yaml", num_workers, 4)
    for a, b in zip(expected, via_yaml):
        assert torch.equal(a["tokens"], b["tokens"])
    # index arrays are built in the local cache folder, never written to the bucket
    keys = [k.rsplit("/", 1)[1] for k in s3.list_keys(f"s3://{BUCKET}/tokens{num_workers}/")]
    assert sorted(keys) == ["corpus.bin", "corpus.idx", "mds.yaml"]


def test_a_slow_request_is_hedged_and_the_first_answer_wins(blob, monkeypatch):

    from tests.helpers.s3_fault_proxy import start_fault_proxy

    url, data, offsets = blob
    endpoint = s3.client().meta.endpoint_url
    proxy, handler, stop = start_fault_proxy(
        endpoint, schedule=lambda n: "stall" if n == 1 else None
    )
    handler.stall_s = STALL_S
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
    s3.reset_client()
    try:
        cache = RemoteChunkCache(budget=1 << 20, hedge_min_s=0.3)
        remote_stats().reset()
        cache.prefetch(url, offsets[0:9])  # the first ranged GET of the proxy: it stalls
        deadline = time.monotonic() + HANG_S
        while handler.faults["stall"] == 0:  # the fetch thread's request reached the proxy
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert cache.read(url, 1024, 2048, offsets) == data[1024:2048]
        # the hedge (after 0.3 s) answered, not the stalled request (its stall lasts STALL_S)
        assert handler.stalls_ended == 0
        assert remote_stats().hedged == 1 and remote_stats().retries == 0
    finally:
        stop()
        s3.reset_client()


def test_a_queued_chunk_that_is_needed_now_is_fetched_by_the_reader(blob):
    url, data, offsets = blob
    cache = RemoteChunkCache(budget=1 << 20, threads=0)  # no fetch threads: hints stay queued
    cache.prefetch(url, offsets[0:5])
    assert cache._queue and not any(c.future.done() for c in cache._chunks.values())
    assert cache.read(url, 2048, 3072, offsets) == data[2048:3072]


def test_the_first_answer_wins_even_when_the_hedge_is_the_slow_one(blob, monkeypatch):
    import threading

    from tests.helpers.s3_fault_proxy import start_fault_proxy

    url, data, offsets = blob
    endpoint = s3.client().meta.endpoint_url
    proxy, handler, stop = start_fault_proxy(endpoint, schedule=lambda n: "stall")
    handler.stall_s = STALL_S  # every request through the proxy (here: the hedge) stalls
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
    s3.reset_client()
    try:
        cache = RemoteChunkCache(budget=1 << 20, threads=0, hedge_min_s=0.3)
        cache.prefetch(url, offsets[0:9])
        (chunk,) = cache._chunks.values()
        chunk.started = True  # "in flight": its answer comes after 1 s, from the thread below

        def first_request_answers() -> None:
            time.sleep(1.0)
            chunk.future.set_result(data[chunk.start : chunk.end])

        threading.Thread(target=first_request_answers, daemon=True).start()
        assert cache.read(url, 1024, 2048, offsets) == data[1024:2048]
        # the first answer (after 1 s), not the stalled hedge (its stall lasts STALL_S)
        assert handler.stalls_ended == 0
        assert remote_stats().hedged >= 1
    finally:
        stop()
        s3.reset_client()


def test_hinted_token_windows_are_read_from_the_prefetched_chunks(tmp_path):
    """A token leaf hands its datasets the shard reader, so windows it hinted need no request."""
    from energon.megatron.gpt_dataset import GPTConfig
    from energon.source.shard_reader import reset_shard_reader, shard_reader
    from energon.source.tokens import TokenLeaf
    from tests.helpers.datasets import write_prefix

    local = tmp_path / "hinted" / "corpus"
    local.parent.mkdir()
    write_prefix(str(local), num_docs=120, seed=3)
    upload_to_s3(local.parent, f"s3://{BUCKET}/hinted")
    config = GPTConfig(
        sequence_length=16, split="90,10,0", eod_token=0, path_to_cache=str(tmp_path / "cache")
    )
    expected = TokenLeaf.open(str(local), split_part="train", config=config)
    leaf = TokenLeaf.open(f"s3://{BUCKET}/hinted/corpus", split_part="train", config=config)
    assert leaf.remote and not expected.remote
    leaf.load(20, None, ("k", 20))  # opens the remote .bin (a HEAD) outside the measured part
    reset_shard_reader()
    leaf.prefetch(3, 6)  # windows whose byte ranges do not overlap (the data is seeded)
    _wait_idle(shard_reader()._remote)
    remote_stats().reset()
    for k in range(3, 6):
        got = leaf.load(k, None, ("k", k))["tokens"]
        assert torch.equal(got, expected.load(k, None, ("k", k))["tokens"])
    assert remote_stats().requests == 0
