"""Scheduled blends and online reweighting through real loaders: window proportions, order
independent of ranks and workers, exact (and elastic) restore anywhere in a schedule and after
weight changes, the blend report."""

from __future__ import annotations

import json

import pytest

from energon import WorkerConfig, get_savable_loader, get_train_dataset, redistribute_states
from energon.plan.schedules import WeightSchedule
from tests.helpers.datasets import make_text_dataset

L = 4  # logical streams in every test


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("blendsched")
    make_text_dataset(root / "a", num_samples=55, num_shards=5)
    make_text_dataset(root / "b", num_samples=30, num_shards=3, seed=1)
    return root


def config(root, name, weight_a, weight_b="1", head=""):
    path = root / name
    path.write_text(
        f"""
__class__: MetadatasetV2
{head}
splits:
  train:
    blend:
      - weight: {weight_a}
        path: ./a
        subflavors: {{src: a}}
      - weight: {weight_b}
        path: ./b
        subflavors: {{src: b}}
"""
    )
    return path


LINEAR = "{linear: {start: 1000, end: 7000, from: 0.1, to: 3.0}}"
STEP = "{step: [[0, 1.0], [2500, 0.2], [5500, 4.0]]}"


def loader(path, *, rank=0, world_size=1, num_workers=0, state=None, **kwargs):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    options = dict(
        batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=10, num_streams=L
    )
    options.update(kwargs)
    ld = get_savable_loader(get_train_dataset(path, worker_config=wc, **options))
    ld.restore_state_rank(state)
    return ld


def sources(batch):
    return [sf["src"] for sf in batch.__subflavors__]


def keys(batch):
    return tuple(batch.__key__)


def take(it, n, what=keys):
    return [what(next(it)) for _ in range(n)]


def global_order(path, steps, *, world_size=1, num_workers=0, what=keys, **kwargs):
    """The job's global sequence of micro-batches: step k holds rank 0's, rank 1's, ... k-th."""
    per_rank = [
        take(
            iter(loader(path, rank=r, world_size=world_size, num_workers=num_workers, **kwargs)),
            steps,
            what,
        )
        for r in range(world_size)
    ]
    return [per_rank[r][k] for k in range(steps) for r in range(world_size)]


def share_of_a(ds, start, end):
    """The schedule's normalised weight of source a at each global sample in [start, end)."""
    shares = []
    for t in range(start, end):
        w = ds.spec.mixture.weights_at(t)
        shares.append(w[0] / sum(w))
    return shares


def requested_a(ds, start, end):
    """Sum of the schedule's normalised weight of source a over global samples [start, end)."""
    return sum(share_of_a(ds, start, end), 0.0)


@pytest.mark.parametrize("schedule", [LINEAR, STEP], ids=["linear", "step"])
@pytest.mark.parametrize(
    "world_size,num_workers,batch_size",
    [(1, 0, 1), (2, 1, 1), (4, 0, 1), (2, 0, 4)],
)
def test_every_window_of_1000_samples_follows_the_schedule(
    root, schedule, world_size, num_workers, batch_size
):
    path = config(root, f"w_{schedule[1:5]}.yaml", schedule)
    samples = 9000
    order = global_order(
        path,
        samples // batch_size // world_size,
        world_size=world_size,
        num_workers=num_workers,
        batch_size=batch_size,
        what=sources,
    )
    flat = [s for batch in order for s in batch]
    assert len(flat) == samples
    shares = share_of_a(loader(path).dataset, 0, samples)  # once, not per window
    for start in range(0, samples - 999, 250):
        observed = flat[start : start + 1000].count("a")
        requested = sum(shares[start : start + 1000], 0.0)
        assert abs(observed - requested) <= 20, (start, observed, requested)


def test_the_order_depends_on_the_logical_streams_only(root):
    path = config(root, "layout.yaml", LINEAR)
    options = dict(batch_size=2, shuffle_buffer_size=7)
    reference = global_order(path, 600, **options)
    for world_size, num_workers in [(2, 1), (4, 0), (1, 2), (2, 2)]:
        got = global_order(
            path, 600 // world_size, world_size=world_size, num_workers=num_workers, **options
        )
        assert got == reference, (world_size, num_workers)


RESTORE_OPTIONS = dict(batch_size=2, shuffle_buffer_size=5)


@pytest.fixture(scope="module")
def restore_reference(root):
    """The uninterrupted run every restore below must continue exactly (computed once: the ten
    cases share it)."""
    path = config(root, "restore.yaml", LINEAR, STEP)
    return path, take(iter(loader(path, **RESTORE_OPTIONS)), 4000)


@pytest.mark.parametrize("split", [1, 333, 700, 1900, 3600])
@pytest.mark.parametrize("workers", [(0, 2), (2, 0)])
def test_restore_anywhere_in_the_schedule_is_exact(restore_reference, split, workers):
    """Interrupt points before, inside and after the ramp, restored into another worker count."""
    path, reference = restore_reference
    options = RESTORE_OPTIONS
    first = loader(path, num_workers=workers[0], **options)
    it = iter(first)
    assert take(it, split) == reference[:split]
    state = json.loads(json.dumps(first.save_state_rank()))
    second = loader(path, num_workers=workers[1], state=state, **options)
    assert take(iter(second), 4000 - split) == reference[split:]


def test_elastic_restore_mid_schedule_onto_other_world_sizes(root):
    path = config(root, "elastic.yaml", STEP)
    options = dict(batch_size=2, shuffle_buffer_size=5)
    reference = global_order(path, 1500, **options)
    loaders = [loader(path, rank=r, world_size=2, **options) for r in range(2)]
    its = [iter(ld) for ld in loaders]
    before = [keys(next(its[r])) for _ in range(700) for r in range(2)]
    assert before == reference[:1400]
    states = json.loads(json.dumps([ld.save_state_rank() for ld in loaders]))
    for new_world in (3, 1):
        new_states = redistribute_states(states, new_world)
        resumed = [
            iter(loader(path, rank=r, world_size=new_world, state=new_states[r], **options))
            for r in range(new_world)
        ]
        after = [keys(next(resumed[r])) for _ in range(99 // new_world) for r in range(new_world)]
        assert after == reference[1400 : 1400 + len(after)]


# -- online reweighting -------------------------------------------------------------------------


def test_a_change_now_is_the_change_planned_from_the_start(root):
    """set_blend_weights between steps gives the sequence of a loader that had the change from the
    start, with or without workers running ahead (they restart at the change)."""
    path = config(root, "online.yaml", "1")
    options = dict(batch_size=2, shuffle_buffer_size=5)
    planned = loader(path, **options)
    assert planned.set_blend_weights([9, 1], from_sample=2 * 150) == 150
    reference = take(iter(planned), 400)
    for num_workers in (0, 2):
        ld = loader(path, num_workers=num_workers, **options)
        it = iter(ld)
        got = take(it, 150)
        assert ld.set_blend_weights([9, 1]) == 150
        got += take(it, 250)
        assert got == reference, num_workers
    unchanged = take(iter(loader(path, **options)), 400)
    assert unchanged[:150] == reference[:150] and unchanged[150:] != reference[150:]


def test_online_changes_follow_the_new_weights_and_go_back_to_the_config(root):
    path = config(root, "online_mix.yaml", STEP)
    ld = loader(path, batch_size=1)
    it = iter(ld)
    take(it, 1000, sources)
    ld.set_blend_weights({str(root / "a") + " [train]": 1.0})  # b left out: weight 0
    only_a = [s for batch in take(it, 400, sources) for s in batch]
    assert only_a.count("b") <= L  # at most the picks already made when the change came
    assert only_a[L:] == ["a"] * (400 - L)
    ld.set_blend_weights(None)  # back to the configured schedule: 1:5 until 5500, then 4:1
    rest = [s for batch in take(it, 6600, sources) for s in batch]
    assert abs(rest[1100:4100].count("a") - 3000 / 6) <= 20
    assert abs(rest[-2000:].count("a") - 2000 * 0.8) <= 20
    changes = ld.save_state_rank()["weight_changes"]
    assert [c["position"] for c in changes] == [1000, 1400]
    assert changes[1]["weights"] is None


@pytest.mark.parametrize("save_at", [120, 180, 260])
def test_a_resumed_run_repeats_every_change(root, save_at):
    """Changes at 150 (now) and at sample 2 * 230 (planned ahead), a schedule given online;
    states saved before, between and after them restore the same sequence (also elastically)."""
    path = config(root, "resume.yaml", LINEAR)
    options = dict(batch_size=2, shuffle_buffer_size=5)

    def run(ld, it, start, end, states):
        out = []
        for step in range(start, end):
            if step == 150:
                ld.set_blend_weights([1, 4])
            if step == 100:
                ld.set_blend_weights(
                    [WeightSchedule.linear(400, 600, 1.0, 0.0), 1.0], from_sample=2 * 230
                )
            if step == save_at:
                states.append(json.loads(json.dumps(ld.save_state_rank())))
            out.append(keys(next(it)))
        return out

    states: list = []
    first = loader(path, num_workers=2, **options)
    reference = run(first, iter(first), 0, 400, states)
    (state,) = states
    resumed = loader(path, state=state, **options)
    assert run(resumed, iter(resumed), save_at, 400, []) == reference[save_at:]
    assert len(state.get("weight_changes", [])) == (2 if save_at > 150 else 1)

    # the same run on 2 ranks, resumed on 3: identical global sequence
    ranks = [loader(path, rank=r, world_size=2, **options) for r in range(2)]
    its = [iter(ld) for ld in ranks]
    order = []
    for step in range(130):
        for ld in ranks:
            if step == 75:  # global micro-batch 150
                ld.set_blend_weights([1, 4])
            if step == 50:
                ld.set_blend_weights(
                    [WeightSchedule.linear(400, 600, 1.0, 0.0), 1.0], from_sample=2 * 230
                )
        order += [keys(next(it)) for it in its]
    assert order == reference[:260]
    states = redistribute_states([ld.save_state_rank() for ld in ranks], 3)
    resumed = [
        iter(loader(path, rank=r, world_size=3, state=states[r], **options)) for r in range(3)
    ]
    after = [keys(next(resumed[r])) for _ in range(45) for r in range(3)]
    assert after == reference[260:395]


def test_from_step_uses_the_global_batch_size(root):
    path = config(root, "steps.yaml", "1")
    ld = loader(path, batch_size=2, global_batch_size=8)
    assert ld.set_blend_weights([1, 0], from_step=10) == 40  # sample 80 = micro-batch 40
    with pytest.raises(ValueError, match="global batch size"):
        loader(path, batch_size=2).set_blend_weights([1, 0], from_step=10)


def test_set_blend_weights_rejects_what_it_cannot_do(root):
    path = config(root, "errors.yaml", "1")
    ld = loader(path, batch_size=2)
    it = iter(ld)
    take(it, 10)
    with pytest.raises(ValueError, match="consumed up to micro-batch 10"):
        ld.set_blend_weights([1, 1], from_sample=2 * 9)
    with pytest.raises(ValueError, match="multiple of the micro-batch size"):
        ld.set_blend_weights([1, 1], from_sample=41)
    with pytest.raises(ValueError, match="3 weights given for the blend's 2 sources"):
        ld.set_blend_weights([1, 1, 1])
    with pytest.raises(KeyError, match="unknown blend source"):
        ld.set_blend_weights({"nope": 1.0})
    with pytest.raises(ValueError, match="must be a number >= 0"):
        ld.set_blend_weights([1, -1])
    # issue 33: the change starts at the next micro-batch (10, sample 20), not at sample 0
    with pytest.raises(
        ValueError, match="micro-batch 10, global sample 20.*all 0 at global sample 20"
    ):
        ld.set_blend_weights([0, 0])
    stepped = loader(path, batch_size=2, global_batch_size=8)
    with pytest.raises(ValueError, match=r"from step 40: .*all 0 at global sample 320"):
        stepped.set_blend_weights([0, 0], from_step=40)
    single = loader(root / "a", batch_size=2)
    with pytest.raises(ValueError, match="weight blend"):
        single.set_blend_weights([1.0])
    mismatched = ld.save_state_rank()
    other = loader(path, batch_size=2)
    other.set_blend_weights([2, 1], from_sample=2 * 50)
    with pytest.raises(Exception, match="disagree on the blend weight changes"):
        redistribute_states(
            [
                dict(mismatched, rank=0, world_size=2),
                dict(other.save_state_rank(), rank=1, world_size=2),
            ],
            1,
        )


# -- the report ---------------------------------------------------------------------------------


def test_blend_report_shows_requested_against_observed_per_window(root):
    path = config(root, "report.yaml", LINEAR)
    ld = loader(path, batch_size=4, num_workers=2)
    it = iter(ld)
    take(it, 2000)
    report = ld.blend_report()
    assert [r["name"] for r in report] == [f"{root / 'a'} [train]", f"{root / 'b'} [train]"]
    assert report[0]["schedule"].startswith("linear(1000: 0.1, 7000: 3")
    assert sum(r["consumed"] for r in report) >= 8000
    assert abs(report[0]["observed"] - report[0]["requested"]) < 0.005
    windows = report.windows
    assert windows[0].start == 0 and windows[-1].end >= 8000
    ds = ld.dataset
    for w in windows[1:-1]:  # the first and last hold only part of a window of picks
        assert w.picks >= 900
        requested = requested_a(ds, w.start, w.end) / 1000
        assert abs(w.requested[0] - requested) < 0.02, w
        assert abs(w.observed[0] - w.requested[0]) < 0.02, w
    assert report.max_deviation() < 0.03
    assert "requested" in report.table()
    ld.set_blend_weights([1, 1])
    assert ld.blend_report().changes == [c.config() for c in ld.dataset.spec.weight_changes]
    page = report.html("t")
    assert (
        page.count("<polyline") == 4
        and "<script" in page
        and "http" not in page.split("<svg", 1)[1].split('xmlns="http://www.w3.org/2000/svg"', 1)[1]
    )


def test_changes_registered_out_of_order_start_where_they_say(root):
    path = config(root, "order.yaml", STEP)
    options = dict(batch_size=2, shuffle_buffer_size=5)
    planned = loader(path, **options)
    planned.set_blend_weights([1, 3], from_sample=2 * 40)
    planned.set_blend_weights([5, 1], from_sample=2 * 60)
    planned.set_blend_weights([5, 1], from_sample=2 * 60)  # the same again: nothing changes
    reference = take(iter(planned), 120)
    ld = loader(path, num_workers=2, **options)
    it = iter(ld)
    got = take(it, 40)
    ld.set_blend_weights([5, 1], from_sample=2 * 60)  # later first
    ld.set_blend_weights([1, 3])  # then now (micro-batch 40)
    got += take(it, 80)
    assert got == reference
    assert [c.position for c in ld.dataset.spec.weight_changes] == [40, 60]


def test_the_ledger_describes_schedules_and_online_changes(root):
    """The ledger (no data read) names the samples the loader delivered under a weight schedule,
    also after an online change recorded in the state it is given."""
    from energon.ledger.ledger import Ledger

    path = config(root, "ledger.yaml", STEP)
    options = dict(batch_size=2, shuffle_buffer_size=5, world_size=2)
    ranks = [loader(path, rank=r, **options) for r in range(2)]
    its = [iter(ld) for ld in ranks]
    delivered = []
    for step in range(60):
        if step == 20:
            for ld in ranks:
                ld.set_blend_weights([1, 6])
        delivered.append([keys(next(it)) for it in its])
    states = [json.loads(json.dumps(ld.save_state_rank())) for ld in ranks]
    wc = WorkerConfig(rank=0, world_size=2, num_workers=0)
    dataset = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=5,
        max_samples_per_sequence=10,
        num_streams=L,
    )
    ledger = Ledger(dataset, states=states)
    described = [
        [tuple(s.key for out in r.outputs for s in out) for r in ledger.describe_step(step)]
        for step in (0, 19, 20, 45, 59)
    ]
    assert described == [delivered[step] for step in (0, 19, 20, 45, 59)]
