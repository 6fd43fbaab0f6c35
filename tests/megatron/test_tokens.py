"""Token files, GPT indices (against a brute-force walk), the token leaf in the loader, lazy start-up."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.loader.savable_dataset import SavableDataset
from energon.megatron import gpt_indices as gi
from energon.megatron.gpt_dataset import GPTConfig, MockTokens, build_gpt_datasets
from energon.megatron.indexed import (
    IndexedFormatError,
    IndexedTokens,
    find_prefixes,
    merge_prefixes,
)
from energon.pipeline.spec import PipelineSpec
from energon.plan.sources import Source
from energon.source.tokens import TokenLeaf
from energon.task_encoder import DefaultTaskEncoder
from tests.helpers.datasets import write_prefix

# -- .bin/.idx ------------------------------------------------------------------------------------


def test_round_trip_and_merge(tmp_path):
    a = write_prefix(str(tmp_path / "a"), 10, seed=1)
    b = write_prefix(str(tmp_path / "b"), 7, seed=2)
    ds = IndexedTokens(tmp_path / "a")
    assert len(ds) == 10 and ds.num_documents == 10 and ds.dtype == np.uint16
    assert [ds[i].tolist() for i in range(10)] == a
    assert ds.get(3, 1, 2).tolist() == a[3][1:3]
    assert find_prefixes(tmp_path) == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert merge_prefixes(find_prefixes(tmp_path), tmp_path / "m") == 17
    merged = IndexedTokens(tmp_path / "m")
    assert [merged[i].tolist() for i in range(17)] == a + b
    assert merged.document_indices.tolist() == list(range(18))


def test_reader_is_lazy_and_pickles_small(tmp_path):
    write_prefix(str(tmp_path / "a"), 5)
    ds = IndexedTokens(tmp_path / "nonexistent")  # constructing reads nothing
    with pytest.raises(IndexedFormatError, match="not found"):
        len(ds)
    known = IndexedTokens(tmp_path / "a", num_sequences=5, num_documents_plus_one=6)
    assert len(known) == 5 and known._arrays is None  # counted without opening the .idx
    known[0]
    assert len(pickle.dumps(known)) < 500


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda p: _patch(p + ".idx", 0, b"NOTMAGIC!"), "bad magic"),
        (lambda p: _truncate(p + ".idx", 40), "truncated"),
        (lambda p: _truncate(p + ".idx", 20), "header"),
        (lambda p: _patch(p + ".idx", 17, bytes([4])), "wrong dtype"),  # uint16 data read as int32
        (lambda p: _patch(p + ".idx", 17, bytes([99])), "unknown dtype code"),
        (lambda p: _truncate(p + ".bin", 10), "truncated"),
    ],
)
def test_bad_inputs_give_clear_errors(tmp_path, damage, message):
    prefix = str(tmp_path / "a")
    write_prefix(prefix, 5)
    damage(prefix)
    with pytest.raises(IndexedFormatError, match=message):
        ds = IndexedTokens(prefix)
        ds[0]


def _patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


# -- GPT indices vs a brute-force walk (megatron's algorithm written as a plain loop) ------------------


def brute_force_sample_index(sizes, doc_index, seq, num_samples, extra):
    rows = [(0, 0)]
    d, off = 0, 0
    for _ in range(num_samples):
        remaining = seq + extra
        while remaining > 0:
            doc_len = sizes[doc_index[d]] - off
            remaining -= doc_len
            if remaining <= 0:
                off += remaining + doc_len - extra
                remaining = 0
            elif d == len(doc_index) - 1:
                off = sizes[doc_index[d]] - extra
                break
            else:
                d, off = d + 1, 0
        rows.append((d, off))
    return np.array(rows)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=25).filter(lambda s: sum(s) > 2),
    seq=st.integers(1, 12),
    extra=st.integers(0, 1),
    drop_last=st.booleans(),
)
def test_vectorized_sample_index_equals_the_walk(sizes, seq, extra, drop_last):
    sizes = np.asarray(sizes, dtype=np.int32)
    doc_index = np.random.RandomState(0).permutation(len(sizes)).astype(np.int32)
    n = gi.num_gpt_samples(int(sizes.sum()), seq, extra, drop_last)
    if n <= 0:
        return
    ours = gi.build_sample_index(sizes, doc_index, seq, n, extra)
    assert np.array_equal(ours, brute_force_sample_index(sizes, doc_index, seq, n, extra))


def test_blend_indices_follow_weights_without_rng():
    d, s = gi.build_blending_indices([0.5, 0.3, 0.2], 1000)
    assert np.bincount(d).tolist() == [500, 300, 200]
    for k in range(3):
        assert s[d == k].tolist() == list(range(int((d == k).sum())))
    d2, _ = gi.build_exhaustive_blending_indices([3, 0, 5])
    assert np.bincount(d2, minlength=3).tolist() == [3, 0, 5]


def test_split_matrix_and_hash_inputs():
    assert gi.parse_split("99,1") == [0.99, 0.01, 0.0]
    assert gi.split_matrix([0.5, 0.5, 0.0]) == [(0, 0.5), (0.5, 1.0), None]
    assert gi.split_sequence_ids(10, (0.25, 0.75)).tolist() == [2, 3, 4, 5, 6, 7]  # round half even


# -- datasets and lazy start-up -------------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path):
    prefixes = []
    for i in range(3):
        p = str(tmp_path / f"p{i}")
        write_prefix(p, 60, seed=i)
        prefixes.append(p)
    return prefixes


def config(tmp_path, **kw):
    return GPTConfig(
        sequence_length=16,
        split="90,10,0",
        tokenizer={"class": "Byte"},
        eod_token=0,
        path_to_cache=str(tmp_path / "cache"),
        **kw,
    )


def test_second_start_builds_nothing_and_maps_lazily(tmp_path, corpus, monkeypatch):
    blend = ["1", corpus[0], "2", corpus[1], "1", corpus[2]]
    first = build_gpt_datasets(blend, [200, 10, None], config(tmp_path))
    expected = [first[0].window(k) for k in range(0, 200, 37)]

    def forbidden(*a, **k):
        raise AssertionError("built although cached")

    monkeypatch.setattr(gi, "build_gpt_indices", forbidden)
    monkeypatch.setattr(gi, "build_blending_indices", forbidden)
    opened = []
    real_open = IndexedTokens._open
    monkeypatch.setattr(
        IndexedTokens, "_open", lambda self: opened.append(self.prefix) or real_open(self)
    )
    again = build_gpt_datasets(blend, [200, 10, None], config(tmp_path))
    assert len(again[0]) == len(first[0]) and opened == []  # no .idx touched to know the length
    assert [again[0].window(k).tolist() for k in range(0, 200, 37)] == [
        e.tolist() for e in expected
    ]


def test_sample_dict_semantics(tmp_path, corpus):
    cfg = config(tmp_path, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)
    ds = build_gpt_datasets([corpus[0]], [20, None, None], cfg)[0]
    s = ds[3]
    text = ds.window(3)
    assert s["tokens"].tolist() == text[:-1].tolist() and s["labels"].tolist() == text[1:].tolist()
    assert s["tokens"].dtype.is_floating_point is False and s["loss_mask"].dtype.is_floating_point
    assert s["attention_mask"].shape == (1, 16, 16) and s["attention_mask"].dtype.is_signed is False
    eods = (s["tokens"] == 0).nonzero().flatten().tolist()
    assert all(s["loss_mask"][i] == 0 for i in eods)
    for i in eods:  # a new document restarts positions and cannot see the previous one
        if i + 1 < 16:
            assert s["position_ids"][i + 1] == 0
            assert bool(s["attention_mask"][0, i + 1, i])


def test_mock_tokens_need_no_files():
    ds = build_gpt_datasets(
        None, [50, None, None], GPTConfig(sequence_length=64, split="1,1,1", mock=True)
    )[0]
    assert len(ds) >= 50
    assert ds[0]["tokens"].shape == (64,)
    assert isinstance(ds.tokens, MockTokens)


# -- the leaf in energon's loader ----------------------------------------------------------------


def make_loader(leaf, num_workers=0):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    te = DefaultTaskEncoder()
    spec = PipelineSpec(
        sources=[Source(leaf, 0, len(leaf))],
        mode="none",
        training=True,
        seed=wc.seed_offset,
        num_streams=2,
        batch_size=4,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        shuffle_over_epochs=None,
        task_encoder=te,
        decoder=te.decoder,
        error_handler=wc.global_error_handler,
    )
    return get_savable_loader(SavableDataset.from_spec(spec, wc))


def test_token_leaf_in_the_loader_with_save_and_restore(tmp_path, corpus):
    leaf = TokenLeaf.from_blend(
        ["1", corpus[0], "1", corpus[1]], config=config(tmp_path), num_samples=64, shard_size=16
    )
    assert len(leaf) == 64 and leaf.shard_starts == [0, 16, 32, 48]
    loader = make_loader(leaf, num_workers=1)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    b = first[0]
    assert b["tokens"].shape == (4, 16) and b["labels"].shape == (4, 16)
    assert b["loss_mask"].shape == (4, 16) and b["position_ids"].shape == (4, 16)
    assert b["attention_mask"].shape == (4, 1, 16, 16)
    seen = [int(k.split("/")[-1]) for batch in first for k in batch["__key__"]]
    for batch in first:
        for key, tokens in zip(batch["__key__"], batch["tokens"]):
            assert tokens.tolist() == leaf.dataset.window(int(key.split("/")[-1]))[:-1].tolist()
    state = json.loads(json.dumps(loader.save_state_rank()))
    expected = [next(it) for _ in range(4)]
    restored = make_loader(leaf, num_workers=0)
    restored.restore_state_rank(state)
    it2 = iter(restored)
    again = [next(it2) for _ in range(4)]
    assert [b["__key__"] for b in again] == [b["__key__"] for b in expected]
    assert all(bool((x["tokens"] == y["tokens"]).all()) for x, y in zip(again, expected))
    assert len(set(seen)) == len(seen)


def test_token_leaf_errors_are_sample_errors(tmp_path, corpus):
    from energon.errors import SampleException

    leaf = TokenLeaf.from_blend([corpus[0]], config=config(tmp_path), num_samples=10)
    os.truncate(corpus[0] + ".bin", 4)
    with pytest.raises(SampleException, match="window 0"):
        leaf.load(0, None, ("tokens", 0, 0))


# -- through the public loading API -----------------------------------------------------------------


def test_token_prefix_loads_through_get_train_dataset(tmp_path, corpus):
    from energon import get_val_dataset

    cfg = config(tmp_path)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)

    def loader(**kw):
        options = dict(
            batch_size=4,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            token_config=cfg,
            shuffle_over_epochs_multiplier=None,
            parallel_shard_iters=1,
        )
        options.update(kw)
        return get_savable_loader(get_train_dataset(corpus[0], worker_config=wc, **options))

    first = loader()
    it = iter(first)
    batch = next(it)
    assert batch["tokens"].shape == (4, 16) and batch["labels"].shape == (4, 16)
    assert set(batch) >= {"tokens", "labels", "loss_mask", "position_ids"}
    # unshuffled reading serves megatron's own sample order
    leaf = TokenLeaf.from_blend(corpus[0], config=cfg, split="train")
    expected = torch.stack([torch.as_tensor(leaf.dataset[i]["tokens"]) for i in range(4)])
    assert torch.equal(batch["tokens"], expected)
    state = first.save_state_rank()
    following = [next(it)["tokens"] for _ in range(3)]
    again = loader()
    again.restore_state_rank(state)
    it2 = iter(again)
    assert all(torch.equal(next(it2)["tokens"], t) for t in following)
    val = get_val_dataset(corpus[0], worker_config=wc, batch_size=4, token_config=cfg)
    assert len(list(get_savable_loader(val))) > 0
    with pytest.raises(ValueError, match="token_config"):
        get_train_dataset(
            corpus[0],
            worker_config=wc,
            batch_size=4,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
