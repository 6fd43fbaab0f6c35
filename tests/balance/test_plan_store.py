"""Shared balanced planning (``Balance(plan_store=...)``, energon.balance.plans / .store): the
plans read from a store are bit-identical to those every rank plans alone, with 0 and 2
workers, on real gloo ranks, across save and restore mid-window; a damaged file or another
run's plans are never used."""

from __future__ import annotations

import hashlib
import json
import pickle
import warnings

import pytest

from energon import PlanStoreError
from energon.balance import Balance, publish_plans
from energon.balance.assign import compose_steps
from energon.balance.store import PlanStore
from tests.balance.plan_cases import CASES, case_costs, case_name
from tests.balance.test_balance import keys_of, loaders, rank_loader, vlm  # noqa: F401 (fixture)
from tests.balance.test_plan_identical import DIGESTS
from tests.helpers.distributed import run_ranks


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[12], CASES[19]], ids=case_name)
def test_stored_shares_are_the_composition_bit_for_bit(tmp_path, case):
    """A window written to the store and read back share by share gives the composition whose
    digest was pinned before (tests/balance/fixtures), and the shares' float64 costs exactly."""
    kind, ranks, steps, per_rank, seed = case
    costs = case_costs(kind, ranks * steps * per_rank, seed)
    plan = compose_steps(costs, ranks, steps)
    shares = [[[(i, 0, ("webdataset", 0, i)) for i in share] for share in step] for step in plan]
    rank_costs = [[sum(costs[i] for i in share) for share in step] for step in plan]
    store = PlanStore(tmp_path, {"case": case_name(case)}, ranks, None)
    snapshot = {"emitted": 3, "stages": [{"n": 1}]}
    store.write(64, ["webdataset"], shares, rank_costs, {0: snapshot}, {0: snapshot})
    stored = store.read(64)
    read = [
        [[key[2] for *_, key in stored.share(s, r)] for r in range(ranks)] for s in range(steps)
    ]
    assert hashlib.sha256(json.dumps(read).encode()).hexdigest() == DIGESTS[case_name(case)]
    assert [stored.rank_costs(s) for s in range(steps)] == rank_costs


def _balance(store, wait=600.0):
    return Balance(max_length=4096, window=4, plan_store=str(store), plan_wait=wait)


def _steps(its, steps):
    """[step][rank] -> (keys, this rank's cost, every rank's costs)."""
    out = []
    for _ in range(steps):
        batches = [next(it) for it in its]
        out.append([(keys_of(b), b.rank_cost, b.step_costs) for b in batches])
    return out


def _states(ranks):
    return [json.loads(json.dumps(lo.save_state_rank())) for lo in ranks]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shared_plans_equal_local_plans_and_restore_mid_window(vlm, tmp_path, num_workers):  # noqa: F811
    """3 ranks (2 with workers), windows of 4 steps: 6 steps, the states (inside the second window), 3 more
    steps after a restore: the same batches, costs and states as planning on every rank. With
    0 workers the ranks run in this one process, so a rank waits in vain for a window's
    planner (plan_wait=0: it plans the window itself, warns, and publishes it)."""
    world = 2 if num_workers else 3
    local = loaders(vlm, world, num_workers)
    expected = _steps([iter(lo) for lo in local], 6)
    expected_states = _states(local)
    wait = 0.0 if num_workers == 0 else 600.0
    shared = loaders(vlm, world, num_workers, balance=_balance(tmp_path, wait))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _steps([iter(lo) for lo in shared], 6) == expected
    assert _states(shared) == expected_states
    if num_workers == 0:
        assert any("was not published" in str(w.message) for w in caught)
    (run,) = [d for d in tmp_path.iterdir()]
    assert len(list(run.glob("window-*.plan"))) >= 2  # (workers may plan ahead)
    local_again = loaders(vlm, world, num_workers)
    for lo, state in zip(local_again, expected_states):
        lo.restore_state_rank(state)
    expected_after = _steps([iter(lo) for lo in local_again], 3)
    restored = loaders(vlm, world, num_workers, balance=_balance(tmp_path, wait))
    for lo, state in zip(restored, expected_states):
        lo.restore_state_rank(state)
    assert _steps([iter(lo) for lo in restored], 3) == expected_after


def test_plans_published_before_training_are_read_at_once(vlm, tmp_path):  # noqa: F811
    """publish_plans() plans the windows ahead in one process; the ranks then never wait."""
    (planner,) = loaders(vlm, 1, balance=_balance(tmp_path))
    planner_ds = loaders(vlm, 2, balance=_balance(tmp_path))[0].dataset
    assert publish_plans(planner_ds, steps=8, progress=False) == 2
    assert publish_plans(planner_ds, steps=8, progress=False) == 0  # already there
    expected = _steps([iter(lo) for lo in loaders(vlm, 2)], 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a wait that ran out would warn
        shared = loaders(vlm, 2, balance=_balance(tmp_path, wait=0.0))
        assert _steps([iter(lo) for lo in shared], 8) == expected
    with pytest.raises(ValueError, match="plan_store"):
        publish_plans(loaders(vlm, 2)[0].dataset, steps=4, progress=False)


def test_another_run_or_a_damaged_file_is_never_used(vlm, tmp_path):  # noqa: F811
    spec = loaders(vlm, 2, balance=_balance(tmp_path))[0].dataset.spec
    other = loaders(vlm, 2, balance=_balance(tmp_path), num_streams=2)[0].dataset.spec
    assert PlanStore(tmp_path, spec.config(), 2, None).directory != (
        PlanStore(tmp_path, other.config(), 2, None).directory
    )
    assert PlanStore(tmp_path, spec.config(), 2, None).directory != (
        PlanStore(tmp_path, spec.config(), 4, None).directory
    )
    publish_plans(loaders(vlm, 2, balance=_balance(tmp_path))[0].dataset, 4, progress=False)
    (path,) = tmp_path.glob("*/window-*.plan")
    path.write_bytes(path.read_bytes()[:40])
    (loader, _) = loaders(vlm, 2, balance=_balance(tmp_path))
    with pytest.raises(PlanStoreError, match="damaged"):
        next(iter(loader))


def _gloo_rank(rank, world_size, path, store):
    """Local plans, then shared plans with a save and restore inside the second window: the
    same batches and states on each real rank (rank 0 plans window 0, rank 1 window 1)."""

    def loader(shared):
        balance = _balance(store) if shared else Balance(max_length=4096, window=4)
        return rank_loader(path, rank, world_size, balance=balance)

    runs = []
    for shared in (False, True):
        first = loader(shared)
        steps = _steps([iter(first)], 6)
        state = json.loads(json.dumps(first.save_state_rank()))
        again = loader(shared)
        again.restore_state_rank(state)
        runs.append((steps, state, _steps([iter(again)], 3)))
    assert runs[0] == runs[1]
    return sorted(p.name for p in store.glob("*/window-*.plan"))


def test_real_ranks_share_plans(vlm, tmp_path):  # noqa: F811
    results = run_ranks(2, _gloo_rank, str(vlm), tmp_path)
    assert results[0] == results[1] and len(results[0]) == 3


def test_stored_snapshots_travel_as_the_files_path_whatever_the_streams(tmp_path):
    """The streams' snapshots that every item of a stored window carries (ItemMeta.window_streams)
    pickle to the file's path, not to the streams' bytes (a step's bookkeeping stays O(1) at
    thousands of streams), and read back the stored snapshots; a loader position that keeps them
    whole gives the snapshots it would have kept stream by stream, newer ones winning."""
    from energon.loader.position import LoaderPosition
    from energon.pipeline.executor import ItemMeta
    from energon.pipeline.snapshot import PackedSnapshot
    from energon.pipeline.stored_streams import packed_streams

    sizes = {}
    for streams in (3, 300):
        store = PlanStore(tmp_path, {"streams": streams}, 2, None)
        start = {s: {"emitted": s, "stages": [{"n": s}]} for s in range(streams)}
        end = {s: {"emitted": s + 1, "stages": [{"n": -s}]} for s in range(streams)}
        store.write(0, ["webdataset"], [[[], []]], [[0.0, 0.0]], start, end)
        packed = packed_streams(store.read(0).end)
        sizes[streams] = len(pickle.dumps(packed))
        again = pickle.loads(pickle.dumps(packed))
        assert len(again) == streams and 1 in again and streams not in again
        assert {s: again[s].unpack() for s in again} == end
    assert sizes[300] < sizes[3] + 8 < 400  # the path and a count: not 300 snapshots

    newer = {"emitted": 9, "stages": [{"n": 9}]}
    position = LoaderPosition()
    position.restore({"origin": 0, "consumed": 0, "pass_offset": 0, "streams": [[0, start[0]]]})
    metas = []  # the steps of one window, sent together: one mapping; own streams 0, 1, 0
    for step in range(3):
        meta = ItemMeta(step, step % 2, PackedSnapshot.pack(newer) if step == 1 else end[0])
        meta.window_streams = again
        metas.append(meta)
    for meta in pickle.loads(pickle.dumps(metas)):
        position.record(meta, 0, 1)
    assert position.snapshots == {**end, 1: newer}
