"""Packing that splits samples across packs (``SequencePacker(split=True)``), best-fit packing, and
datasets that must stay whole (``pack_whole``): every token exactly once, full packs, exact restore
with pieces in the buffer, the ledger naming both parts of a split sample."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from energon import (
    Ledger,
    SamplePiece,
    TextSample,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    redistribute_states,
    stateless,
    uses_sample_meta,
)
from energon.pipeline.keys import pointer_parts, pointer_target
from energon.pipeline.packing import PackStage
from energon.pipeline.pointers import build_pointer_stages
from energon.pipeline.stages import LoadStage
from energon.samples import Sample
from energon.task_encoder.packing import PackingTaskEncoder, SequencePacker
from tests.helpers.datasets import make_text_dataset
from tests.helpers.stages import (
    MemoryLeaf,
    assert_resumes_exactly,
    counting_policy,
    memory_spec,
    take,
)


def sample(n, key):
    return {"__key__": key, "__subflavors__": None, "tokens": torch.arange(n)}


def described(groups):
    return [
        [
            (m.sample["__key__"], m.start, m.stop) if isinstance(m, SamplePiece) else m["__key__"]
            for m in group
        ]
        for group in groups
    ]


def test_best_fit_puts_a_sample_into_the_fullest_pack_that_fits():
    samples = [sample(n, f"s{n}") for n in (8, 3, 6, 1)]
    first = SequencePacker(10).select(samples)
    best = SequencePacker(10, algorithm="best_fit").select(samples)
    assert described(first) == [["s8", "s1"], ["s6", "s3"]]
    assert described(best) == [["s8"], ["s6", "s3", "s1"]]
    with pytest.raises(ValueError, match="algorithm"):
        SequencePacker(10, algorithm="worst_fit")


def test_split_fills_packs_in_order_and_carries_the_rest_into_the_next():
    packer = SequencePacker(10, split=True)
    samples = [sample(n, f"s{i}") for i, n in enumerate([7, 5, 12, 3, 9])]
    groups = packer.select(samples)
    # 7 + 3 of 5 | 2 of 5 + 8 of 12 | 4 of 12 + 3 + 3 of 9 | (6 of 9: the open pack stays back)
    assert described(groups) == [
        ["s0", ("s1", 0, 3)],
        [("s1", 3, None), ("s2", 0, 8)],
        [("s2", 8, None), "s3", ("s4", 0, 3)],
    ]
    packs = [p for g in groups for p in packer.pack(g)]
    assert [p.tokens.shape[0] for p in packs] == [10, 10, 10]
    assert packs[1].tokens.tolist()[:2] == [3, 4]  # the rest of s1: its tokens 3 and 4
    assert packs[1].seq_lengths.tolist() == [2, 8] and packer.stats.pieces == 5
    # a sample longer than a pack: its rest fills whole packs, then starts the next one
    groups = SequencePacker(10, split=True).select([sample(4, "a"), sample(27, "b")])
    assert described(groups) == [["a", ("b", 0, 6)], [("b", 6, 16)], [("b", 16, 26)]]
    # min_piece: no piece shorter than that; the sample goes to the next pack whole
    groups = SequencePacker(10, split=True, min_piece=4).select(
        [sample(8, "a"), sample(5, "b"), sample(6, "c")]
    )
    assert described(groups) == [["a"], ["b", ("c", 0, 5)]]


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


class SplitPacker(PackingTaskEncoder):
    def __init__(self, max_length=64, **kwargs):
        super().__init__(max_length, split=True, **kwargs)

    @stateless
    def encode_sample(self, sample):
        return to_tokens(sample)


class MetaSplitPacker(SplitPacker):
    """Decides from the index: a text sample's token count is its txt part's bytes here."""

    def __init__(self, max_length=64):
        super().__init__(max_length)
        self.chooser = SequencePacker(
            max_length, split=True, length=lambda meta: meta.part_sizes["txt"]
        )

    @uses_sample_meta
    def select_samples_to_pack(self, metas):
        return self.chooser.select(metas)

    @stateless
    def pack_selected_samples(self, samples):  # one output per group: the ledger can follow
        return self.packer.pack_one(samples)


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    root = tmp_path_factory.mktemp("splitpack")
    make_text_dataset(root / "web", num_samples=80, num_shards=2, seed=3)
    make_text_dataset(root / "sft", num_samples=40, num_shards=2, seed=4)
    path = root / "mix.yaml"
    path.write_text(
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - path: ./web
        subflavors: {src: web}
      - path: ./sft
        pack_whole: true            # never split a conversation across packs
        subflavors: {src: sft}
"""
    )
    return path


def loader(path, te=None, *, rank=0, world_size=1, num_workers=0, state=None, **kwargs):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    options = dict(
        batch_size=1, shuffle_buffer_size=5, max_samples_per_sequence=5, packing_buffer_size=12
    )
    options.update(kwargs)
    ds = get_train_dataset(path, worker_config=wc, task_encoder=te or SplitPacker(), **options)
    ld = get_savable_loader(ds)
    ld.restore_state_rank(state)
    return ld


def members(batch):
    """((source, index), part) of each member of the micro-batch's one packed sample."""
    return [(pointer_target(p), part) for p, part in pointer_parts(batch.__restore_key__)]


def summary(batch):
    return tuple(batch.__key__), batch.tokens.sum().item(), batch.cu_seqlens.tolist()


def test_packs_are_full_and_pack_whole_samples_are_never_cut(mix):
    it = iter(loader(mix))
    batches = [next(it) for _ in range(80)]
    lengths = [int(b.cu_seqlens[0][-1]) for b in batches]
    # only samples that must stay whole leave gaps (and the packer fills them when they fit)
    assert sum(lengths) / (64 * len(lengths)) >= 0.95, lengths
    assert sum(n == 64 for n in lengths) >= 0.5 * len(lengths)
    cut = [(source, part) for b in batches for (source, _), part in members(b) if part]
    assert cut and all(source == 0 for source, _ in cut), "only web samples are split"
    assert any(stop is None for _, (_, stop) in cut) and any(stop for _, (_, stop) in cut)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_restores_exactly_with_the_rest_of_a_split_sample_in_the_buffer(mix, num_workers):
    ld = loader(mix, num_workers=num_workers)
    it = iter(ld)
    for _ in range(40):
        next(it)
        state = json.loads(json.dumps(ld.save_state_rank()))
        if "Piece" in json.dumps(state):
            break
    else:
        pytest.fail("never saved with a piece in a packing buffer")
    expected = [summary(next(it)) for _ in range(10)]
    again = iter(loader(mix, num_workers=2 - num_workers, state=state))
    assert [summary(next(again)) for _ in range(10)] == expected


def test_restores_elastically(mix):
    def run(world_size, steps, states=None):
        per_rank, saved = [], []
        for rank in range(world_size):
            ld = loader(
                mix,
                rank=rank,
                world_size=world_size,
                num_streams=4,
                state=states[rank] if states else None,
            )
            it = iter(ld)
            per_rank.append([summary(next(it)) for _ in range(steps)])
            saved.append(ld.save_state_rank())
        return [per_rank[r][k] for k in range(steps) for r in range(world_size)], saved

    reference, _ = run(1, 24)
    before, states = run(2, 6)
    after, _ = run(1, 12, redistribute_states(states, 1))
    assert before + after == reference


def test_the_ledger_names_both_parts_of_a_split_sample(mix):
    ld = loader(mix, MetaSplitPacker(), shuffle_buffer_size=None)
    it = iter(ld)
    batches = [next(it) for _ in range(30)]
    ledger = Ledger(ld.dataset)
    parts: dict = {}
    for step, batch in enumerate(batches):
        (record,) = ledger.describe_step(step)
        assert record.restore_key == batch.__restore_key__
        for sample in record.samples:
            if sample.part is not None:
                parts.setdefault(sample.key, []).append((step, sample.part))
    split = {key: p for key, p in parts.items() if len(p) >= 2}
    assert split, "some sample is split across two described steps"
    for pieces in split.values():  # its parts follow each other and end at its end
        bounds = [part for _, part in pieces]
        assert bounds[0][0] == 0 and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert [step for step, _ in pieces] == sorted(step for step, _ in pieces)


def test_a_finite_pass_delivers_every_token_exactly_once(mix):
    """Validation: the open pack is flushed at the end of the pass; the tokens of all packs are
    each sample's tokens, once."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(
        mix,
        split_part="train",
        worker_config=wc,
        batch_size=1,
        packing_buffer_size=12,
        task_encoder=SplitPacker(),
    )
    got: dict = {}
    for batch in get_savable_loader(ds):
        tokens = batch.tokens[0].tolist()
        offsets = batch.cu_seqlens[0].tolist()
        for (pointer, part), a, b in zip(members(batch), offsets, offsets[1:]):
            start = part[0] if part else 0
            got.setdefault(pointer, []).append((start, tokens[a:b]))
    plain = get_val_dataset(mix, split_part="train", worker_config=wc, batch_size=None)
    texts = {}
    for s in get_savable_loader(plain):
        ((pointer, _),) = pointer_parts(s.__restore_key__)
        texts[pointer_target(pointer)] = list(s.text.encode())
    assert set(got) == set(texts)
    for pointer, pieces in got.items():
        joined = [t for _, piece in sorted(pieces) for t in piece]
        assert joined == texts[pointer], pointer


def test_a_select_hook_that_breaks_the_piece_rules_is_an_error():
    leaves = [MemoryLeaf(12), MemoryLeaf(12, name="whole")]
    spec = memory_spec(leaves, mode="weight", num_streams=1, weights=[1, 1])

    def build(select):
        stages = build_pointer_stages(spec, 0)
        stages.append(LoadStage(stages[-1], leaves, None, counting_policy("load")))
        stages.append(
            PackStage(
                stages[-1],
                4,
                select,
                lambda values: {"__restore_key__": ()},
                None,
                counting_policy("pack"),
                stream=0,
                num_streams=1,
                whole_sources=[False, True],
            )
        )
        return stages

    def cut_whole(values):
        whole = next(v for v in values if v["__key__"].startswith("whole"))
        return [[SamplePiece(whole, 0, 1)]]

    with pytest.raises(ValueError, match="pack_whole"):
        take(build(cut_whole)[-1], 1)

    def out_of_order(values):
        return [[SamplePiece(values[0], 1, 2)]]

    with pytest.raises(ValueError, match="in order"):
        take(build(out_of_order)[-1], 1)

    def cut_in_two(values):  # pieces of one sample in two groups: restores exactly
        mem = [v for v in values if v["__key__"].startswith("mem")]
        return [[SamplePiece(mem[0], 0, 1)], [SamplePiece(mem[0], 1, 2)], mem[1:2]]

    states = assert_resumes_exactly(lambda: build(cut_in_two), range(0, 12, 3), 12)
    assert any("Piece" in json.dumps(s[-1]["reading"]) for s in states)
