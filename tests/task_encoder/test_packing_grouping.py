"""Sequence packing and grouped batching: exact (and elastic) restore with full buffers, the ready-made
first-fit-decreasing packer and its over-length policies, a Megatron-LM-style encoder end to end."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

from energon import (
    DefaultTaskEncoder,
    Sample,
    TextSample,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    redistribute_states,
    stateless,
)
from energon.pipeline.snapshot import stage_states
from energon.task_encoder.packing import PackingTaskEncoder, SequencePacker


@dataclasses.dataclass
class Tokens(Sample):
    tokens: torch.Tensor


def to_tokens(sample: TextSample) -> Tokens:
    data = torch.frombuffer(bytearray(sample.text.encode()), dtype=torch.uint8).to(torch.int64)
    return Tokens(
        __key__=sample.__key__,
        __restore_key__=(),
        __subflavors__=sample.__subflavors__,
        tokens=data,
    )


class TokenPacker(PackingTaskEncoder):
    @stateless
    def encode_sample(self, sample):
        return to_tokens(sample)


def packed_loader(path, num_workers=0, rank=0, world_size=1, **kwargs):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    options = dict(
        batch_size=2, shuffle_buffer_size=5, max_samples_per_sequence=5, packing_buffer_size=8
    )
    options.update(kwargs)
    return get_savable_loader(
        get_train_dataset(
            path, worker_config=wc, task_encoder=TokenPacker(96, over_length="split"), **options
        )
    )


def summary(batch):
    return tuple(batch.__key__), batch.tokens.sum().item(), batch.cu_seqlens.tolist()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_packs_fit_and_restore_exactly_mid_buffer(text_ds, num_workers):
    loader = packed_loader(text_ds, num_workers)
    it = iter(loader)
    for _ in range(30):  # stop where some packing buffer holds samples
        batch = next(it)
        lengths = batch.seq_lengths
        assert batch.tokens.shape[1] <= 96
        assert all(int(c[-1]) <= 96 for c in batch.cu_seqlens)
        state = loader.save_state_rank()
        packing = [stage_states(snap)[4] for _, snap in state["streams"]]
        if any(p["reading"] or p["pending"] for p in packing):
            break
    else:
        pytest.fail("never saved mid-buffer")
    expected = [summary(next(it)) for _ in range(8)]
    again = packed_loader(text_ds, num_workers)
    again.restore_state_rank(state)
    it2 = iter(again)
    assert [summary(next(it2)) for _ in range(8)] == expected
    assert lengths.ndim == 2


def test_packing_restores_elastically(text_ds):
    def run(world_size, steps, states=None):
        per_rank, out = [], []
        for rank in range(world_size):
            loader = packed_loader(text_ds, rank=rank, world_size=world_size, num_streams=4)
            loader.restore_state_rank(states[rank] if states else None)
            it = iter(loader)
            per_rank.append([summary(next(it)) for _ in range(steps)])
            out.append(loader.save_state_rank())
        return [per_rank[r][k] for k in range(steps) for r in range(world_size)], out

    reference, _ = run(1, 20)
    before, states = run(2, 4)
    after, _ = run(1, 12, redistribute_states(states, 1))
    assert before + after == reference


def test_first_fit_decreasing_and_over_length_policies():
    def sample(n, key):
        return {"__key__": key, "__subflavors__": None, "tokens": torch.arange(n)}

    samples = [sample(n, f"s{i}") for i, n in enumerate([60, 50, 40, 30, 20, 10, 150])]
    for policy, expect in (("truncate", 1), ("split", 2), ("drop", 0)):
        packer = SequencePacker(100, over_length=policy)
        groups = packer.select(samples)
        packs = [p for g in groups for p in packer.pack(g)]
        assert all(p.tokens.shape[0] <= 100 for p in packs)
        long_packs = [p for p in packs if p.__key__ == "s6"]
        assert len(long_packs) == expect
        assert (
            getattr(
                packer.stats, {"truncate": "truncated", "split": "split", "drop": "dropped"}[policy]
            )
            == 1
        )
        normal = sorted(p.seq_lengths.tolist() for p in packs if p.__key__ != "s6")
        assert sum(map(sum, normal)) == 210 and len(normal) == 3  # 60+40, 50+30+20, 10 -> FFD
        for p in packs:
            assert p.cu_seqlens.tolist()[-1] == p.tokens.shape[0]
            assert p.position_ids.tolist() == [i for n in p.seq_lengths.tolist() for i in range(n)]


class ReferencePacker(DefaultTaskEncoder):
    """The reference's tested pattern: groups of 1, 4 and 16 in buffer order."""

    def __init__(self, sizes):
        super().__init__()
        self.sizes = sizes

    def select_samples_to_pack(self, samples):
        groups, pos = [], 0
        for n in self.sizes:
            if pos + n <= len(samples):
                groups.append(samples[pos : pos + n])
                pos += n
        return groups

    @stateless
    def pack_selected_samples(self, samples):
        return TextSample.derive_from(samples[0], text=str(len(samples)))


def test_pack_group_sizes_follow_the_selection(text_ds, text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    train = get_savable_loader(
        get_train_dataset(
            text_ds,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            packing_buffer_size=21,
            task_encoder=ReferencePacker([1, 4, 16]),
        )
    )
    it = iter(train)
    assert [next(it).text for _ in range(4)] == [["1", "4"], ["16", "1"], ["4", "16"], ["1", "4"]]
    val = get_savable_loader(
        get_val_dataset(
            text_val_ds,
            worker_config=wc,
            batch_size=2,
            packing_buffer_size=11,
            num_streams=1,
            task_encoder=ReferencePacker([2, 5, 3, 1]),
        )
    )
    batches = [b.text for b in val]
    assert batches[:2] == [["2", "5"], ["3", "1"]]
    assert sum(int(n) for b in batches for n in b) <= 40


class BucketEncoder(DefaultTaskEncoder):
    """Short and long texts in separate batches of different sizes."""

    def batch_group_criterion(self, sample):
        return ("long", 3) if len(sample.text) > 30 else ("short", 2)


def grouped_loader(path, num_workers=0, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    options = dict(batch_size=None, shuffle_buffer_size=5, max_samples_per_sequence=5)
    options.update(kwargs)
    return get_savable_loader(
        get_train_dataset(path, worker_config=wc, task_encoder=BucketEncoder(), **options)
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_grouped_batches_are_homogeneous_and_restore_mid_bucket(text_ds, num_workers):
    loader = grouped_loader(text_ds, num_workers)
    it = iter(loader)
    for _ in range(9):
        batch = next(it)
        kinds = {len(t) > 30 for t in batch.text}
        assert len(kinds) == 1 and len(batch.text) == (3 if kinds == {True} else 2)
    state = loader.save_state_rank()
    expected = [tuple(next(it).__key__) for _ in range(10)]
    again = grouped_loader(text_ds, num_workers)
    again.restore_state_rank(state)
    it2 = iter(again)
    assert [tuple(next(it2).__key__) for _ in range(10)] == expected
    assert again.can_restore_sample()
    batch = next(it2)
    assert again.restore_sample(batch.__restore_key__).__key__ == batch.__key__


def test_group_wait_bound_flushes_stale_buckets(text_ds):
    class Rare(DefaultTaskEncoder):
        def batch_group_criterion(self, sample):
            return ("rare", 50) if sample.__key__.endswith("3") else ("common", 4)

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(
        get_train_dataset(
            text_ds,
            worker_config=wc,
            batch_size=None,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            task_encoder=Rare(),
            group_max_wait=20,
            num_streams=1,
        )
    )
    it = iter(loader)
    batches = [next(it) for _ in range(30)]
    rare = [b for b in batches if b.__key__[0].endswith("3")]
    assert rare and all(len(b.__key__) < 50 for b in rare), "rare samples never wait for 50 peers"


class MegatronStyleEncoder(DefaultTaskEncoder):
    """Megatron-LM's multimodal pattern: generator encode_sample with restore_seeds and numpy random,
    packing hooks, and a packed sample created with an empty restore key."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample):
        tokens = to_tokens(sample).tokens
        noise = int(np.random.randint(0, 1000))
        yield Tokens(
            __key__=sample.__key__, __restore_key__=(), __subflavors__=None, tokens=tokens + noise
        )

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 3] for i in range(0, len(samples), 3)]

    @stateless
    def pack_selected_samples(self, samples):
        return Tokens(
            __key__=",".join(s.__key__ for s in samples),
            __restore_key__=(),
            __subflavors__=None,
            tokens=torch.cat([s.tokens for s in samples]),
        )

    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "tokens": [s.tokens for s in samples]}

    def encode_batch(self, batch):
        batch["total"] = int(sum(t.sum() for t in batch["tokens"]))
        return batch


def test_megatron_style_encoder_end_to_end(text_ds):
    def loader(num_workers):
        wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
        return get_savable_loader(
            get_train_dataset(
                text_ds,
                worker_config=wc,
                batch_size=1,
                shuffle_buffer_size=10,
                max_samples_per_sequence=10,
                packing_buffer_size=9,
                task_encoder=MegatronStyleEncoder(),
            )
        )

    first = loader(2)
    it = iter(first)
    seen = [next(it) for _ in range(5)]
    assert all(b["keys"][0].count(",") == 2 for b in seen)
    state = first.save_state_rank()
    expected = [(tuple(b["keys"]), b["total"]) for b in (next(it) for _ in range(6))]
    resumed = loader(0)
    resumed.restore_state_rank(state)
    it2 = iter(resumed)
    assert [(tuple(b["keys"]), b["total"]) for b in (next(it2) for _ in range(6))] == expected
    keys = Counter(k for b, _ in expected for k in b[0].split(","))
    assert max(keys.values()) == 1
