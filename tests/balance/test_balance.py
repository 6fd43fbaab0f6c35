"""Compute-balanced steps (energon.balance): costs from metadata, the split, and real loader runs
(exactly once, determinism across layouts, restore, elastic restore, blends, grouping)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from energon import (
    ErrorBudget,
    ErrorBudgetExceeded,
    StateError,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
)
from energon.balance import Balance, BalanceCostError, MultimodalCost, SampleCost, balance_costs
from energon.balance.assign import compose_steps, straggler_ratio
from energon.balance.table import CostTable
from energon.demo.vlm import VlmTaskEncoder, write_vlm_shards
from energon.pipeline.pointers_native import library as native_pointers
from energon.samples import TextSample
from energon.samples.padding import is_padding
from energon.source.meta import SampleMeta, meta_reader
from energon.state import redistribute_states
from energon.task_encoder.cooking import basic_sample_keys
from energon.task_encoder.packing import PackingTaskEncoder
from tests.helpers.damage import spoil_text_payloads
from tests.helpers.distributed import run_ranks

NUM_SAMPLES = 240  # 4 logical streams x 60, 12 micro-batches of 5 each
BATCH = 5


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vlm")
    write_vlm_shards(root, num_samples=NUM_SAMPLES, num_shards=6, seed=3, text_median_chars=300)
    return root


def rank_loader(
    path,
    rank,
    world_size,
    num_workers=0,
    *,
    balance=None,
    error_handler=None,
    task_encoder=None,
    shuffle_buffer_size=8,
    **kw,
):
    """One rank's savable loader of ``path``, balanced (``Balance(max_length=4096, window=4)``
    unless ``balance``) with the VLM encoder unless ``task_encoder``."""
    wc = WorkerConfig(
        rank=rank,
        world_size=world_size,
        num_workers=num_workers,
        global_error_handler=error_handler,
    )
    ds = get_train_dataset(
        str(path),
        worker_config=wc,
        batch_size=BATCH,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=10,
        task_encoder=task_encoder or VlmTaskEncoder(),
        balance=balance or Balance(max_length=4096, window=4),
        **kw,
    )
    return get_savable_loader(ds)


def loaders(path, world_size, num_workers=0, *, num_streams=4, **kw):
    """Every rank's loader (:func:`rank_loader`), in rank order."""
    return [
        rank_loader(path, rank, world_size, num_workers, num_streams=num_streams, **kw)
        for rank in range(world_size)
    ]


def keys_of(batch) -> list[str]:
    return [s.__key__ for s in batch.samples]


def run_steps(its, steps) -> list[list[list[str]]]:
    """[step][rank] -> the keys of that rank's batch."""
    return [[keys_of(next(it)) for it in its] for _ in range(steps)]


# -- costs ---------------------------------------------------------------------------------------


def test_metadata_cost_matches_the_encoded_length(vlm):
    """The built-in cost counts from the index exactly the tokens the encoder makes of the data."""
    (loader,) = loaders(vlm, 1, balance=Balance(max_length=100_000))
    batch = next(iter(loader))
    ds = loader.dataset
    table = CostTable(ds.spec.leaves, MultimodalCost())
    reader = meta_reader(ds.spec.leaves[0])
    index_of = {reader.key(i): i for i in range(len(ds.spec.sources[0]))}
    assert batch.samples
    for sample in batch.samples:
        index = index_of[sample.__key__]
        cost = table.cost(0, index)
        assert cost.tokens == int(sample.tokens.shape[0])
        assert cost == MultimodalCost()(SampleMeta(reader, 0, index))  # bulk == point queries
    assert any(s.images for s in batch.samples) or any(s.video_frames for s in batch.samples)


def test_cost_without_media_metadata_estimates_images_from_their_bytes(vlm):
    (loader,) = loaders(vlm, 1)
    reader = meta_reader(loader.dataset.spec.leaves[0])
    index = next(i for i in range(NUM_SAMPLES) if "img0.jpg" in reader.part_sizes(i))
    with_media = SampleMeta(reader, 0, index)
    without = SampleMeta(reader, 0, index)
    without._cache["media"] = {}
    text_only = SampleMeta(reader, 0, index)
    text_only._cache["parts"] = {"txt": reader.part_sizes(index)["txt"]}
    cost = MultimodalCost()
    assert with_media.media and cost(with_media).tokens > cost(text_only).tokens
    assert cost(without).tokens > cost(text_only).tokens


def test_user_cost_function_must_return_a_sample_cost(vlm):
    (loader,) = loaders(vlm, 1, balance=Balance(max_length=4096, cost=lambda meta: "x"))
    with pytest.raises(TypeError, match="SampleCost"):
        next(iter(loader))


def test_a_sample_lacking_the_field_the_cost_function_reads_gets_one_line(vlm):
    """A cost function that reads a part the sample does not have: one line naming the field,
    the sample key and the dataset, not a bare KeyError from planning."""

    def png_cost(meta):  # every sample here has jpgs (or none), never a png
        return SampleCost(1, meta.media["png"].width)

    (loader,) = loaders(vlm, 1, balance=Balance(max_length=4096, cost=png_cost))
    with pytest.raises(BalanceCostError) as info:
        next(iter(loader))
    message = str(info.value)
    assert "\n" not in message
    assert "field 'png'" in message and str(vlm) in message and "png_cost" in message
    key = message.split("sample ", 1)[1].split("'")[1]
    assert key in {meta_reader(loader.dataset.spec.leaves[0]).key(i) for i in range(NUM_SAMPLES)}


class TextOnly(VlmTaskEncoder):
    """Encodes to a TextSample: no ``tokens`` for Balance.length to count."""

    def encode_sample(self, sample):
        return TextSample(**basic_sample_keys(sample), text="caption")


def test_an_encoded_sample_without_tokens_gets_one_line_naming_the_field(vlm):
    (loader,) = loaders(vlm, 1, task_encoder=TextOnly())
    with pytest.raises(BalanceCostError) as info:
        next(iter(loader))
    message = str(info.value)
    assert "\n" not in message and "field 'tokens'" in message and "Balance.length" in message
    assert str(vlm) in message and "'TextSample' object has no attribute" in message


# -- the split -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_split_is_a_deterministic_near_even_partition(seed):
    rng = random.Random(seed)
    costs = [rng.lognormvariate(6, 1.2) for _ in range(rng.randint(40, 200))]
    shares = balance_costs(costs, 8)
    assert sorted(i for share in shares for i in share) == list(range(len(costs)))
    assert shares == balance_costs(list(costs), 8)
    loads = [sum(costs[i] for i in share) for share in shares]
    # no split beats the heaviest single sample or the mean
    assert max(loads) <= 1.05 * max(max(costs), sum(costs) / 8)
    naive = [sum(costs[i] for i in range(r, len(costs), 8)) for r in range(8)]
    assert straggler_ratio(loads) < straggler_ratio(naive)


@pytest.mark.parametrize("seed", range(5))
def test_windows_put_a_heavy_sample_with_heavy_work(seed):
    """A sample several times a rank's even share no longer makes its step straggle: the window's
    steps are composed so that every step is within 5%, each sample exactly once."""
    rng = random.Random(seed)
    costs = [rng.lognormvariate(7, 1.0) for _ in range(8 * 16 * 8)]
    costs[rng.randrange(8 * 16)] = 4 * sum(costs) / (8 * 8)  # 4x a rank's even share
    steps = compose_steps(costs, 8, 8)
    assert steps == compose_steps(list(costs), 8, 8)
    assert sorted(i for step in steps for share in step for i in share) == list(range(len(costs)))
    for step in steps:
        assert straggler_ratio([sum(costs[i] for i in share) for share in step]) <= 1.05
    alone = balance_costs(costs[: 8 * 16], 8)  # its own step balanced alone cannot do it
    assert straggler_ratio([sum(costs[i] for i in share) for share in alone]) > 1.5


# -- loader runs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("world_size", "num_workers"), [(4, 0), (2, 2)])
def test_every_sample_exactly_once_per_epoch_and_even_costs(vlm, world_size, num_workers):
    # (no shuffle buffer: one would carry a few samples over the epoch boundary, as always)
    its = [iter(lo) for lo in loaders(vlm, world_size, num_workers, shuffle_buffer_size=None)]
    steps = NUM_SAMPLES // BATCH // world_size
    seen: Counter[str] = Counter()
    for _ in range(steps):
        batches = [next(it) for it in its]
        costs = batches[0].step_costs
        assert all(b.step_costs == costs for b in batches)  # every rank computed the same split
        assert [b.rank_cost for b in batches] == costs
        assert straggler_ratio(costs) < 1.2
        for b in batches:
            assert is_padding(b) in (False, [False] * len(b.__key__))
            seen.update(keys_of(b))
            _check_packed_layout(b)
    assert len(seen) == NUM_SAMPLES and set(seen.values()) == {1}


def _check_packed_layout(batch):
    """cu_seqlens covers the flattened [P, max_length] batch; positions restart per segment."""
    packs, length = batch.tokens.shape
    assert int(batch.cu_seqlens[-1]) == packs * length
    flat_pos = batch.position_ids.reshape(-1)
    flat_pad = batch.padding_mask.reshape(-1)
    real = 0
    for start, end in zip(batch.cu_seqlens[:-1].tolist(), batch.cu_seqlens[1:].tolist()):
        if flat_pad[start]:
            assert flat_pad[start:end].all()
            continue
        assert flat_pos[start:end].tolist() == list(range(end - start))
        real += end - start
    assert real == sum(int(s.tokens.shape[0]) for s in batch.samples) == int((~flat_pad).sum())
    assert torch.equal(batch.loss_mask.bool(), ~batch.padding_mask)


def test_same_steps_with_and_without_workers(vlm):
    """The order is a function of (config, seed, streams, ranks): workers do not change it."""
    plain = run_steps([iter(lo) for lo in loaders(vlm, 2, 0)], 6)
    workers = run_steps([iter(lo) for lo in loaders(vlm, 2, 2)], 6)
    assert plain == workers


def _planned_windows(path, world_size, windows, **kw):
    """What rank 0 plans for ``windows`` windows: pools, costs, steps, streams' snapshots."""
    executor = loaders(path, world_size, **kw)[0].dataset.executor(0)
    planned = [executor._window(i) for i in range(windows)]
    return [(w.pool, w.costs, w.plan, w.start, w.end) for w in planned]


@pytest.mark.skipif(native_pointers() is None, reason="no C compiler: only the Python path")
@pytest.mark.parametrize("blend", [False, True])
def test_windows_planned_in_c_equal_the_python_stages(vlm, tmp_path, monkeypatch, blend):
    """Planning steps the pointer stages in C (the ledger's stepper) where it reproduces them:
    the same pointers, costs, steps and snapshots as the Python stages, over many epochs."""
    path = vlm
    if blend:
        other = tmp_path / "other"
        write_vlm_shards(other, num_samples=60, num_shards=2, seed=5)
        path = tmp_path / "blend.yaml"
        path.write_text(
            "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
            f"    blend:\n      - weight: 3\n        path: {vlm}\n"
            f"      - weight: 1\n        path: {other}\n"
        )
    fast = _planned_windows(path, 3, 12)
    monkeypatch.setenv("ENERGON_NO_NATIVE", "1")
    slow = _planned_windows(path, 3, 12)
    assert fast == slow


def test_planned_costs_at_once_equal_one_by_one(vlm):
    """CostTable.planned_costs (a shard at a time, numpy) gives each sample's own value."""
    balance = Balance(max_length=300, over_length="split")
    spec = loaders(vlm, 1, balance=balance)[0].dataset.spec
    table = CostTable(spec.leaves, balance.cost, balance.planned_cost)
    rng = random.Random(4)
    indices = [rng.randrange(NUM_SAMPLES) for _ in range(500)]
    one_by_one = [balance.planned_cost(table.cost(0, i)) for i in indices]
    assert table.planned_costs([0] * len(indices), indices) == one_by_one
    with pytest.raises(IndexError, match="out of range"):
        table.planned_costs([0], [NUM_SAMPLES])


def test_balancing_beats_the_plain_split(vlm):
    """Same positions, same samples per step: the balanced split is more even than one
    micro-batch per rank."""
    its = [iter(lo) for lo in loaders(vlm, 4, shuffle_buffer_size=None)]
    table = CostTable(its and loaders(vlm, 1)[0].dataset.spec.leaves, MultimodalCost())
    reader = meta_reader(table.leaves[0])
    index_of = {reader.key(i): i for i in range(NUM_SAMPLES)}
    balanced, plain = [], []
    for _ in range(6):
        batches = [next(it) for it in its]
        balanced.append(straggler_ratio(batches[0].step_costs))
        pool = sorted(k for b in batches for k in keys_of(b))  # plan order: key order here
        plain.append(
            straggler_ratio(
                [
                    sum(table.cost(0, index_of[k]).cost for k in pool[r * BATCH : (r + 1) * BATCH])
                    for r in range(4)
                ]
            )
        )
    assert max(balanced) < min(1.1, max(plain))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_restore_each_rank_exactly_even_a_step_apart(vlm, num_workers):
    reference = run_steps([iter(lo) for lo in loaders(vlm, 2, num_workers)], 8)
    first = loaders(vlm, 2, num_workers)
    its = [iter(lo) for lo in first]
    for _ in range(3):
        for it in its:
            next(it)
    next(its[0])  # rank 0 is one step ahead when the states are saved
    states = [json.loads(json.dumps(lo.save_state_rank())) for lo in first]
    second = loaders(vlm, 2, num_workers)
    for lo, st in zip(second, states):
        lo.restore_state_rank(st)
    its = [iter(lo) for lo in second]
    assert [keys_of(next(its[0])) for _ in range(4)] == [s[0] for s in reference[4:8]]
    assert [keys_of(next(its[1])) for _ in range(5)] == [s[1] for s in reference[3:8]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_restore_mid_window_is_exact(vlm, num_workers):
    """Saved after any step of a window (JSON round trip), every rank resumes with exactly the
    steps of an uninterrupted run: the state holds the window's start, the restore replans it."""
    balance = Balance(max_length=4096, window=3)
    reference = run_steps([iter(lo) for lo in loaders(vlm, 2, num_workers, balance=balance)], 7)
    for saved_after in (1, 2, 3, 4):
        first = loaders(vlm, 2, num_workers, balance=balance)
        run_steps([iter(lo) for lo in first], saved_after)
        states = [json.loads(json.dumps(lo.save_state_rank())) for lo in first]
        second = loaders(vlm, 2, num_workers, balance=balance)
        for lo, st in zip(second, states):
            lo.restore_state_rank(st)
        rest = run_steps([iter(lo) for lo in second], 7 - saved_after)
        assert rest == reference[saved_after:], f"saved after step {saved_after}"


def test_elastic_restore_delivers_every_sample_once(vlm):
    first = loaders(vlm, 4, shuffle_buffer_size=None)
    its = [iter(lo) for lo in first]
    seen: Counter[str] = Counter()
    for _ in range(4):  # one whole window
        for it in its:
            seen.update(keys_of(next(it)))
    states = redistribute_states([lo.save_state_rank() for lo in first], 2)
    second = loaders(vlm, 2, shuffle_buffer_size=None)
    for lo, st in zip(second, states):
        lo.restore_state_rank(st)
    its = [iter(lo) for lo in second]
    for _ in range((NUM_SAMPLES // BATCH - 4 * 4) // 2):
        batches = [next(it) for it in its]
        assert straggler_ratio(batches[0].step_costs) < 1.2
        for b in batches:
            seen.update(keys_of(b))
    assert len(seen) == NUM_SAMPLES and set(seen.values()) == {1}


def drain(its) -> list[list[list[str]]]:
    """[step][rank] -> keys, until the (finite) pass ends; every rank ends at the same step."""
    steps = []
    while True:
        batches = []
        for it in its:
            try:
                batches.append(next(it))
            except StopIteration:
                assert not batches, "the ranks ended at different steps"
                return steps
        assert len({tuple(b.step_costs) for b in batches}) == 1  # every rank planned the same
        steps.append([keys_of(b) for b in batches])


def finite(path, world_size, num_workers=0, **kw):
    """Loaders of one pass over the data (repeat=False), no shuffle buffer: the pass holds
    every sample exactly once."""
    return loaders(path, world_size, num_workers, shuffle_buffer_size=None, repeat=False, **kw)


def restored(path, states, num_workers=0, **kw):
    out = finite(path, states[0]["world_size"], num_workers, **kw)
    for lo, st in zip(out, states):
        lo.restore_state_rank(json.loads(json.dumps(st)))
    return out


def count(steps) -> Counter[str]:
    return Counter(k for step in steps for keys in step for k in keys)


@pytest.mark.parametrize(
    ("first_workers", "saved_after", "new_world", "new_workers"),
    [(0, 5, 2, 0), (0, 7, 3, 0), (2, 6, 3, 0), (0, 5, 3, 2)],
)
def test_elastic_restore_mid_window_delivers_every_sample_once(
    vlm, first_workers, saved_after, new_world, new_workers
):
    """Saved on 4 ranks inside a window (window 4: step 5 is the second window's first step),
    restored on 2 or 3: the new ranks first finish the window's undelivered samples (its tail),
    then go on with their own windows; the pass holds every sample exactly once."""
    first = finite(vlm, 4, first_workers)
    before = run_steps([iter(lo) for lo in first], saved_after)
    states = redistribute_states([lo.save_state_rank() for lo in first], new_world)
    assert states[0]["balance_tail"] == {"start": 16, "layers": [[4, saved_after - 4]]}
    after = drain([iter(lo) for lo in restored(vlm, states, new_workers)])
    tail = -(-(8 - saved_after) * 4 // new_world)
    assert all(max(map(len, step)) > 0 for step in after[:tail])
    seen = count(before) + count(after)
    assert len(seen) == NUM_SAMPLES and set(seen.values()) == {1}


@pytest.mark.parametrize("num_streams", [4, 2])
def test_merge_onto_the_same_ranks_keeps_the_steps(vlm, num_streams):
    """Merged for as many ranks as saved them, a state inside a window continues with exactly
    the steps of an uninterrupted run (with 2 streams and window 8 the snapshots lag 7 steps of
    2 ranks behind the position: still a valid state)."""
    balance = Balance(max_length=4096, window=8 if num_streams == 2 else 4)
    kw = {"balance": balance, "num_streams": num_streams}
    reference = run_steps([iter(lo) for lo in loaders(vlm, 2, **kw)], 12)
    first = loaders(vlm, 2, **kw)
    run_steps([iter(lo) for lo in first], 7)
    unmerged = [lo.save_state_rank() for lo in first]
    for states in (redistribute_states(unmerged, 2), unmerged):
        second = loaders(vlm, 2, **kw)
        for lo, st in zip(second, states):
            lo.restore_state_rank(st)
        assert run_steps([iter(lo) for lo in second], 5) == reference[7:]


def test_elastic_tail_may_start_before_position_zero(vlm):
    """2 ranks saved after step 1 of the first window, 5 ranks take the rest in 2 steps: the
    tail's positions (origin 8 - 2 * 5) start below 0 and the pass is still exact."""
    first = finite(vlm, 2)
    before = run_steps([iter(lo) for lo in first], 1)
    states = redistribute_states([lo.save_state_rank() for lo in first], 5)
    assert states[0]["origin"] == -2
    after = drain([iter(lo) for lo in restored(vlm, states)])
    seen = count(before) + count(after)
    assert len(seen) == NUM_SAMPLES and set(seen.values()) == {1}


def test_elastic_restore_mid_window_is_deterministic(vlm):
    """The same merged states give the same steps, with or without workers."""
    first = finite(vlm, 4)
    run_steps([iter(lo) for lo in first], 6)
    states = redistribute_states([lo.save_state_rank() for lo in first], 3)
    once = drain([iter(lo) for lo in restored(vlm, states)])
    again = drain([iter(lo) for lo in restored(vlm, states)])
    with_workers = drain([iter(lo) for lo in restored(vlm, states, 2)])
    assert once == again == with_workers


@pytest.mark.parametrize("tail_steps_run", [2, 7])
def test_elastic_tail_saves_and_restores_again(vlm, tail_steps_run):
    """States of a restored tail are exact on a restore with the same ranks, and elastic again:
    inside the tail (2 of its 4 steps) or after it, inside a normal window (7 steps)."""
    first = finite(vlm, 4)
    before = run_steps([iter(lo) for lo in first], 5)
    second = restored(vlm, redistribute_states([lo.save_state_rank() for lo in first], 3))
    its = [iter(lo) for lo in second]
    middle = run_steps(its, tail_steps_run)
    saved = [lo.save_state_rank() for lo in second]
    if tail_steps_run < 4:  # the tail: ceil(3 * 4 / 3) = 4 steps
        assert saved[0]["balance_tail"] == {"start": 16, "layers": [[4, 1]]}
    else:  # past it: counted from the window's end, as if never interrupted
        assert "balance_tail" not in saved[0] and saved[0]["origin"] == 32
        assert saved[0]["consumed"] == tail_steps_run - 4
    rest = drain(its)
    assert drain([iter(lo) for lo in restored(vlm, saved)]) == rest
    third = drain([iter(lo) for lo in restored(vlm, redistribute_states(saved, 2))])
    seen = count(before) + count(middle) + count(third)
    assert len(seen) == NUM_SAMPLES and set(seen.values()) == {1}


def test_elastic_tail_state_is_validated(vlm):
    first = finite(vlm, 4)
    run_steps([iter(lo) for lo in first], 5)
    states = redistribute_states([lo.save_state_rank() for lo in first], 3)
    bad = [dict(states[0], balance_tail={"start": 16, "layers": [[4, 9]]})]
    with pytest.raises(StateError, match=r"balance_tail.layers\[0\]\[1\]"):
        restored(vlm, [*bad, *states[1:]])
    bad = [dict(states[0], origin=states[0]["origin"] + 3)]
    with pytest.raises(StateError, match="end of the tail"):
        restored(vlm, [*bad, *states[1:]])
    other = [dict(states[0], balance_tail={"start": 16, "layers": [[4, 2]]}, origin=23)]
    with pytest.raises(StateError, match="disagree on loader state field 'balance_tail'"):
        redistribute_states([*other, *states[1:]], 2)


def test_elastic_restore_refuses_states_of_different_steps(vlm):
    first = loaders(vlm, 2)
    its = [iter(lo) for lo in first]
    for it in its:
        next(it)
    next(its[0])
    with pytest.raises(StateError, match="same step"):
        redistribute_states([lo.save_state_rank() for lo in first], 4)


def test_blend_and_groups(vlm, tmp_path):
    other = tmp_path / "other"
    write_vlm_shards(other, num_samples=120, num_shards=2, seed=9, video_fraction=0.5)
    (tmp_path / "blend.yaml").write_text(
        f"""__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 2
        path: {vlm}
      - weight: 1
        path: {other}
"""
    )

    def has_video(meta) -> bool:
        return "mp4" in meta.part_sizes

    its = [
        iter(lo)
        for lo in loaders(
            tmp_path / "blend.yaml", 2, balance=Balance(max_length=4096, group=has_video)
        )
    ]
    datasets = set()
    for _ in range(10):
        batches = [next(it) for it in its]
        assert straggler_ratio(batches[0].step_costs) < 1.2
        for b in batches:
            for pack in _packs(b):
                assert len({s.video_frames > 0 for s in pack}) == 1  # one group per pack
            datasets.update(str(s.__sources__[0].dataset_path) for s in b.samples)
    assert len(datasets) == 2


def _packs(batch):
    """The members of each pack of a batch, from its segments."""
    out, members = [], iter(batch.samples)
    length = batch.tokens.shape[1]
    bounds = batch.cu_seqlens.tolist()
    for row in range(batch.tokens.shape[0]):
        pack = []
        for start in bounds[:-1]:
            if (
                row * length <= start < (row + 1) * length
                and not batch.padding_mask.reshape(-1)[start]
            ):
                pack.append(next(members))
        out.append(pack)
    return out


@pytest.mark.parametrize("policy", ["truncate", "split", "drop"])
def test_over_long_samples_follow_the_packer_policy_and_are_counted(vlm, policy):
    """Samples longer than max_length are truncated, split or dropped as SequencePacker does,
    each batch counts them, and the plan counts only what is trained on of them."""
    length = 256
    cost = MultimodalCost()
    balance = Balance(max_length=length, over_length=policy, window=2)
    its = [iter(lo) for lo in loaders(vlm, 2, balance=balance, shuffle_buffer_size=None)]
    over = 0
    for _ in range(4):
        batches = [next(it) for it in its]
        for b in batches:
            n_over = sum(int(s.tokens.shape[0]) > length for s in b.samples)
            counted = getattr(
                b, {"truncate": "truncated", "split": "split", "drop": "dropped"}[policy]
            )
            assert counted == n_over or (policy == "drop" and n_over == 0)
            assert b.truncated + b.split + b.dropped == counted
            over += counted
            assert len(keys_of(b)) == len(set(keys_of(b)))  # a split sample is listed once
            real = int((~b.padding_mask).sum())
            kept = sum(min(int(s.tokens.shape[0]), length) for s in b.samples)
            assert real == (
                kept if policy != "split" else sum(int(s.tokens.shape[0]) for s in b.samples)
            )
            trained = [int(s.tokens.shape[0]) for s in b.samples]
            if policy == "truncate":
                expected = sum(cost.cost_of_tokens(min(n, length)) for n in trained)
            elif policy == "split":
                expected = sum(
                    cost.cost_of_tokens(min(length, n - start))
                    for n in trained
                    for start in range(0, n, length)
                )
            else:
                expected = sum(cost.cost_of_tokens(n) for n in trained)
            assert b.rank_cost == pytest.approx(expected)
    assert over > 0


@pytest.mark.parametrize(("world_size", "num_workers"), [(3, 0), (2, 2)])
def test_validation_is_balanced_once_and_even(vlm, world_size, num_workers):
    """A balanced validation pass: every sample exactly once, every rank the same number of
    batches (each takes part in every step), balanced steps, and the next pass is the same."""
    from energon import get_loader, get_val_dataset

    passes = []
    for rank in range(world_size):
        wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
        ds = get_val_dataset(
            str(vlm),
            split_part="train",
            worker_config=wc,
            batch_size=BATCH,
            task_encoder=VlmTaskEncoder(),
            balance=Balance(max_length=4096, window=4),
        )
        loader = get_loader(ds)
        passes.append([[keys_of(b) for b in loader] for _ in range(2)])
        assert len(loader) == len(passes[-1][0])
    counts = {len(p) for rank in passes for p in rank}
    assert len(counts) == 1  # even: every rank, every pass
    for n in range(2):
        keys = [k for rank in passes for batch in rank[n] for k in batch]
        assert sorted(keys) == sorted(set(keys)) and len(keys) == NUM_SAMPLES
    assert all(rank[0] == rank[1] for rank in passes)


def test_packing_is_refused(vlm):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    no_shuffle = dict(shuffle_buffer_size=None, max_samples_per_sequence=None)
    with pytest.raises(ValueError, match="batch_size"):
        get_train_dataset(
            str(vlm),
            worker_config=wc,
            batch_size=None,
            balance=Balance(max_length=64),
            **no_shuffle,
        )
    with pytest.raises(ValueError, match="packing_buffer_size"):
        get_train_dataset(
            str(vlm),
            worker_config=wc,
            batch_size=2,
            packing_buffer_size=4,
            task_encoder=PackingTaskEncoder(64),
            balance=Balance(max_length=64),
            **no_shuffle,
        )


def _gloo_rank(rank, world_size, path):
    import torch.distributed as dist

    loader = rank_loader(path, rank, world_size, num_workers=2)
    out = []
    it = iter(loader)
    for _ in range(4):
        batch = next(it)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, (batch.rank_cost, keys_of(batch)))
        assert [g[0] for g in gathered] == batch.step_costs  # the same split on every rank
        out.append(keys_of(batch))
    state = loader.save_state_global(dst_rank=0)
    return {"keys": out, "state": state if rank == 0 else None}


def test_real_ranks_agree_without_communicating(vlm):
    results = run_ranks(2, _gloo_rank, str(vlm))
    keys = [k for r in results for step in r["keys"] for k in step]
    assert len(keys) == len(set(keys)) == 4 * 2 * BATCH  # one whole window
    assert len(results[0]["state"]) == 2


# -- errors ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def damaged_vlm(tmp_path_factory):
    """The VLM mix with the text of every 6th sample spoiled (invalid UTF-8: decoding fails)."""
    root = tmp_path_factory.mktemp("damaged")
    write_vlm_shards(root, num_samples=NUM_SAMPLES, num_shards=6, seed=3, text_median_chars=300)
    spoiled: dict[str, int] = {}
    for shard in sorted(root.glob("*.tar")):
        spoiled.update(spoil_text_payloads(shard, lambda i, key: int(key) % 6 == 0))
    assert len(spoiled) == NUM_SAMPLES // 6
    return root, set(spoiled)


def quiet(*_args):
    """An error handler that only lets the policy count."""


def test_skipped_samples_are_reported_and_budgeted(damaged_vlm):
    """A sample whose decode fails is skipped, counted in error_report() of the rank that planned
    to load it (and nowhere else), kept across save/restore, and checked against the budget."""
    root, spoiled = damaged_vlm
    world = 2
    ranks = loaders(root, world, shuffle_buffer_size=None, error_handler=quiet)
    its = [iter(lo) for lo in ranks]
    seen: set[str] = set()
    skipped_by_rank0 = []  # after each step
    for _ in range(NUM_SAMPLES // BATCH // world):  # one epoch: 3 windows of 4 steps
        for it in its:
            seen.update(keys_of(next(it)))
        skipped_by_rank0.append(ranks[0].error_report()["skipped"])
    assert seen.isdisjoint(spoiled) and len(seen) == NUM_SAMPLES - len(spoiled)
    reports = [lo.error_report() for lo in ranks]
    assert sum(r["skipped"] for r in reports) == len(spoiled)
    assert all(r["skipped"] > 0 for r in reports)
    examples = [e for r in reports for e in r["sources"][0]["examples"]]
    assert examples and all(e["key"] is None or e["key"] in spoiled for e in examples)
    # the counts are part of each rank's state
    states = [json.loads(json.dumps(lo.save_state_rank())) for lo in ranks]
    restored = loaders(root, world, shuffle_buffer_size=None, error_handler=quiet)
    for lo, st in zip(restored, states):
        lo.restore_state_rank(st)
    assert [lo.error_report()["skipped"] for lo in restored] == [r["skipped"] for r in reports]
    # ... and against the budget: a per-rank cap below what one rank skips in an epoch stops it
    capped = loaders(
        root,
        world,
        shuffle_buffer_size=None,
        error_handler=quiet,
        error_budget=ErrorBudget(max_skipped=3),
    )
    it = iter(capped[0])
    stopped_at = next(step for step, n in enumerate(skipped_by_rank0) if n > 3)
    for _ in range(stopped_at):
        next(it)
    with pytest.raises(ErrorBudgetExceeded, match="max_skipped=3"):
        next(it)  # at the very step whose skips go over the budget


def test_elastic_merge_adds_up_every_ranks_error_counts(damaged_vlm):
    """Each rank counts the samples it lost; an elastic merge keeps all ranks' counts (once:
    new rank 0 reports them), mid-window too, and the pass ends with every failure counted once."""
    root, spoiled = damaged_vlm
    first = finite(root, 2, error_handler=quiet)
    before = run_steps([iter(lo) for lo in first], 5)
    skipped = [lo.error_report()["skipped"] for lo in first]
    assert all(skipped)
    states = redistribute_states([lo.save_state_rank() for lo in first], 3)
    second = restored(root, states, error_handler=quiet)
    assert [lo.error_report()["skipped"] for lo in second] == [sum(skipped), 0, 0]
    after = drain([iter(lo) for lo in second])
    assert sum(lo.error_report()["skipped"] for lo in second) == len(spoiled)
    seen = count(before) + count(after)
    assert seen.keys().isdisjoint(spoiled) and len(seen) == NUM_SAMPLES - len(spoiled)
    assert set(seen.values()) == {1}


# -- ledger ----------------------------------------------------------------------------------------


def test_ledger_describes_what_each_rank_got(vlm, tmp_path):
    """`energon ledger` (and the Ledger API) name the samples each rank got at a balanced step,
    from the configuration alone and from a state saved mid-window."""
    from click.testing import CliRunner

    from energon.cli.main import main as cli
    from energon.ledger.ledger import Ledger

    world = 2
    ranks = loaders(vlm, world)
    its = [iter(lo) for lo in ranks]
    delivered = run_steps(its, 6)
    ledger = Ledger(ranks[0].dataset)
    for step in range(6):
        records = ledger.describe_step(step)
        assert [r.rank for r in records] == [0, 1]
        assert [sorted(s.key for s in r.samples) for r in records] == [
            sorted(keys) for keys in delivered[step]
        ]
        assert all(len(out) == 1 for r in records for out in r.outputs)
    # exposures count whole windows (exact there), and say so otherwise
    from energon.ledger.exposure import export_exposures

    with pytest.raises(ValueError, match="multiples of Balance.window=4"):
        export_exposures(ledger, str(tmp_path / "exp"), until_step=6, progress=False)
    summary = export_exposures(ledger, str(tmp_path / "exp"), until_step=4, progress=False)
    assert summary["datasets"][0]["exposures"] == sum(
        len(k) for step in delivered[:4] for k in step
    )
    # the command line, from a state saved after step 5 (inside the second window)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps([lo.save_state_rank() for lo in ranks]))
    later = run_steps(its, 2)
    result = CliRunner().invoke(
        cli,
        [
            "ledger",
            str(vlm),
            "--state",
            str(state_file),
            "--steps",
            "6:8",
            "--format",
            "json",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    described = json.loads(result.output)["micro_batches"]
    got = [
        [sorted(s["key"] for out in m["outputs"] for s in out) for m in described if m["step"] == n]
        for n in (6, 7)
    ]
    assert got == [[sorted(keys) for keys in step] for step in later]


def test_ledger_refuses_states_of_an_elastic_tail(vlm, tmp_path):
    """The ledger plans windows from position 0 for its ranks: states inside a tail, or counted
    from another window grid after one, are refused with a clear message (API and CLI)."""
    from click.testing import CliRunner

    from energon.cli.main import main as cli
    from energon.ledger.ledger import Ledger

    first = loaders(vlm, 4)  # training as configured on the command line: repeating
    run_steps([iter(lo) for lo in first], 5)
    second = loaders(vlm, 3)
    for lo, st in zip(second, redistribute_states([lo.save_state_rank() for lo in first], 3)):
        lo.restore_state_rank(st)
    its = [iter(lo) for lo in second]
    run_steps(its, 2)
    inside = [lo.save_state_rank() for lo in second]
    with pytest.raises(StateError, match="tail of an elastic restore"):
        Ledger(second[0].dataset, states=inside)
    run_steps(its, 3)
    past = [lo.save_state_rank() for lo in second]
    with pytest.raises(StateError, match="origin 32.*counts its windows from elsewhere"):
        Ledger(second[0].dataset, states=past)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(inside))
    result = CliRunner().invoke(
        cli, ["ledger", str(vlm), "--state", str(state_file), "--step", "0", "--no-progress"]
    )
    assert result.exit_code != 0 and "tail of an elastic restore" in result.output
