"""Lost workers (issue 40): a worker that dies on a sample (SIGKILL, a real segfault, os._exit) or
is stuck on it is replaced at its exact position; the training loop gets the batches of a run in
which that one sample was skipped, batch for batch; budgets end runs that keep losing workers;
states saved during a recovery restore to the same continuation.

The reference of every comparison is a run without workers whose task encoder skips the poison
sample (``SkipSample``): what the loop "would have seen minus that sample". The kills are counted
events (the worker kills itself on the chosen key); nothing waits for time to pass except the
stall tests, whose worker sleeps far beyond their deadline.
"""

from __future__ import annotations

import json
import logging

import pytest

from energon import (
    Ledger,
    WorkerConfig,
    WorkerRecovery,
    get_savable_loader,
    get_train_dataset,
)
from energon.cli.checkpoint import describe
from energon.errors import WorkerRecoveryError
from energon.loader.recovery import Recovery, WorkerGone
from tests.helpers.distributed import run_ranks
from tests.helpers.poison import Poison

BATCHES = 20
STALL = 2.0  # seconds on one sample before on_stall="skip" stops a worker (the sleep is 600)


def _quiet(*_args):
    """The error handler of these runs: the policy counts, nothing is printed."""


def loader(path, num_workers, te, *, recovery=None, rank=0, world_size=1, **options):
    wc = WorkerConfig(
        rank=rank, world_size=world_size, num_workers=num_workers, global_error_handler=_quiet
    )
    kwargs = dict(batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=8, num_streams=2)
    kwargs.update(options)
    made = get_savable_loader(
        get_train_dataset(str(path), worker_config=wc, task_encoder=te, **kwargs)
    )
    if recovery is not None:
        made.recovery = recovery
    return made


def batches(it, count):
    """(stream, keys) of the next ``count`` batches."""
    out = []
    for _, batch in zip(range(count), it):
        out.append((batch.__restore_key__[1], list(batch.__key__)))
    return out


def by_stream(delivered):
    streams: dict[int, list[str]] = {}
    for stream, keys in delivered:
        streams.setdefault(stream, []).extend(keys)
    return streams


def poison_key(path, **options) -> str:
    """A sample of the 6th batch of a clean run (its 2nd sample)."""
    return batches(iter(loader(path, 0, Poison(), **options)), 6)[5][1][1]


CAUSES = {
    "sigkill": "killed by signal SIGKILL",
    "segfault": "killed by signal SIGSEGV",
    "exit": "exited with code 3",
}


@pytest.mark.parametrize(
    ("how", "num_workers"), [("sigkill", 1), ("segfault", 1), ("exit", 1), ("sigkill", 2)]
)
def test_dead_worker_is_replaced_and_only_its_sample_is_missing(text_ds, how, num_workers, caplog):
    clean = batches(iter(loader(text_ds, 0, Poison())), BATCHES + 2)
    key = clean[5][1][1]
    expected = batches(iter(loader(text_ds, 0, Poison([key]))), BATCHES)
    run = loader(text_ds, num_workers, Poison([key], how))
    with caplog.at_level(logging.WARNING, logger="energon.recovery"):
        got = batches(iter(run), BATCHES)
    assert got == expected
    # per logical stream: the uninterrupted run's samples, minus that one
    clean_streams = by_stream(clean)
    for stream, keys in by_stream(got).items():
        assert keys == [k for k in clean_streams[stream] if k != key][: len(keys)]
    (loss,) = run.worker_losses()
    assert CAUSES[how] in loss["cause"] and loss["action"] == "replaced; sample skipped"
    assert loss["sample"]["key"] == key and loss["stream"] == clean[5][0]
    assert loss["sample"]["shard"].endswith(".tar") and loss["sample"]["byte_offset"] >= 0
    report = run.error_report()
    assert report["skipped"] == 1
    (source,) = report["sources"]
    assert source["reasons"] == {"WorkerLostError": 1}
    (example,) = source["examples"]
    assert example["key"] == key and example["shard"] == loss["sample"]["shard"]
    assert example["offset"] == loss["sample"]["byte_offset"]
    assert any(key in r.getMessage() and "replaced" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("per", ["sample", "batch"])
def test_stuck_worker_is_stopped_reported_and_replaced(text_ds, per):
    key = poison_key(text_ds)
    expected = batches(iter(loader(text_ds, 0, Poison([key]))), BATCHES)
    recovery = WorkerRecovery(on_stall="skip", stall_timeout_seconds=STALL, stall_timeout_per=per)
    run = loader(text_ds, 1, Poison([key], "sleep"), recovery=recovery)
    assert batches(iter(run), BATCHES) == expected
    (loss,) = run.worker_losses()
    assert "stuck for" in loss["cause"] and f"on one {per}" in loss["cause"]
    assert loss["sample"]["key"] == key
    (report,) = run.watchdog_reports()
    assert "stage encode" in report and key in report
    assert "encode_sample" in report.split("stacks:")[1]  # the stuck worker's own stack


def test_fail_on_timeout_still_fails_instead_of_replacing(text_ds):
    """The watchdog kills the workers when it fails: that is no loss to recover from."""
    from energon.errors import WatchdogTimeout

    key = poison_key(text_ds)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=1, global_error_handler=_quiet)
    ds = get_train_dataset(
        str(text_ds),
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=8,
        max_samples_per_sequence=8,
        num_streams=2,
        task_encoder=Poison([key], "sleep"),
    )
    run = get_savable_loader(
        ds,
        watchdog_timeout_seconds=STALL,
        watchdog_initial_timeout_seconds=60,
        fail_on_timeout=True,
    )
    with pytest.raises(WatchdogTimeout):
        batches(iter(run), BATCHES)
    assert run.worker_losses() == []


def _expect_recovery_error(run, *fragments):
    with pytest.raises(WorkerRecoveryError) as info:
        batches(iter(run), BATCHES * 3)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    return message


def test_recovery_off_raises_naming_the_sample_and_iterating_again_resumes(text_ds):
    key = poison_key(text_ds)
    expected = batches(iter(loader(text_ds, 0, Poison([key]))), BATCHES)
    run = loader(text_ds, 1, Poison([key]), recovery=WorkerRecovery(replace=False))
    delivered = []
    with pytest.raises(WorkerRecoveryError) as info:
        for batch in run:
            delivered += [(batch.__restore_key__[1], list(batch.__key__))]
    for fragment in ("recovery is off", key, "SIGKILL"):
        assert fragment in str(info.value)
    run.recovery = WorkerRecovery()  # the loader starts its workers again where the loop stood
    delivered += batches(iter(run), BATCHES - len(delivered))
    assert delivered == expected
    assert [loss["action"][:12] for loss in run.worker_losses()] == ["not replaced", "replaced; sa"]


@pytest.mark.parametrize(
    ("budget", "fragment"),
    [
        ("max_restarts_per_source", "max_restarts_per_source=1"),
        ("max_restarts_per_pass", "max_restarts_per_pass=1"),
    ],
)
def test_budgets_end_recovery_with_one_error_listing_the_losses(text_ds, budget, fragment):
    clean = batches(iter(loader(text_ds, 0, Poison())), 12)
    keys = [clean[3][1][0], clean[10][1][2]]
    run = loader(text_ds, 1, Poison(keys), recovery=WorkerRecovery(**{budget: 1}))
    message = _expect_recovery_error(run, fragment, *keys)
    assert "1. worker 0" in message and "2. worker 0" in message
    assert [loss["sample"]["key"] for loss in run.worker_losses()] == keys


def test_budgets_count_a_sample_once_and_in_a_row_only_at_the_same_place():
    """The decisions alone (no process): a sample met again in a later epoch does not count
    against the budgets again; losses further on are not in a row."""
    recovery = Recovery(
        WorkerRecovery(max_restarts_per_source=1), 2, lambda s, i: {"key": f"k{i}"}, _quiet
    )

    def lose(index, position):
        slot = {"pid": 7, "stage": "decode", "source": 0, "index": index, "position": position}
        return recovery.lost(WorkerGone(0, "worker 0 (pid 7)", "was killed", 7), slot)

    assert lose(5, 10).entry["index"] == 5
    assert lose(5, 30).stream == 0  # the same sample, an epoch later: not charged
    with pytest.raises(WorkerRecoveryError, match="max_restarts_per_source=1"):
        lose(6, 40)
    assert [loss.again for loss in recovery.losses] == [False, True, False]
    recovery = Recovery(WorkerRecovery(), 2, lambda s, i: {}, _quiet)
    for position in (10, 10):
        lose(index=1, position=position)
    with pytest.raises(WorkerRecoveryError, match="3 times in a row"):
        lose(index=2, position=9)
    recovery.new_pass()
    lose(index=3, position=50)  # a new pass starts counting afresh


class PoisonBatch(Poison):
    """Kills its worker whenever a batch holds the poison key: the sample the worker read last
    is not the cause, so every replacement dies again at the same place."""

    def encode_sample(self, sample):
        return sample

    def encode_batch(self, batch):
        for key in batch.__key__:
            self.check(key)
        return batch


def test_a_worker_lost_again_and_again_is_not_retried_forever(text_ds):
    key = poison_key(text_ds)
    run = loader(text_ds, 1, PoisonBatch([key]))
    message = _expect_recovery_error(run, "3 times in a row", "max_restarts_in_a_row=2")
    assert "1. worker 0" in message and "3. worker 0" in message
    assert len(run.worker_losses()) == 3


def test_state_saved_during_a_recovery_restores_the_same_continuation(text_ds):
    """States saved right after the loss was seen (the lost worker's delivered batches not all
    taken yet, the replacement not heard from) and a few batches later restore to the same
    batches, and the sample stays skipped (restored runs fail if they read it)."""
    key = poison_key(text_ds)
    run = loader(text_ds, 1, Poison([key]))
    it = iter(run)
    states, delivered = [], []
    while len(delivered) < BATCHES:
        delivered += batches(it, 1)
        if run.worker_losses() and len(states) < 3:
            states.append((len(delivered), run.save_state_rank()))
    assert len(states) == 3 and states[0][0] < 8, "the loss is seen at the 6th batch or soon after"
    for taken, state in states:
        again = loader(text_ds, 1, Poison([key], main="raise"))
        again.restore_state_rank(json.loads(json.dumps(state)))
        assert batches(iter(again), BATCHES - taken) == delivered[taken:]
        assert again.worker_losses() == []
    # `energon checkpoint info` lists the lost sample, and the ledger shows where it was skipped
    info = "\n".join(describe([states[0][1]]))
    assert "lost sample" in info and key in info
    _ledger_shows_the_skip(text_ds, states[-1][1], delivered, key)


def _ledger_shows_the_skip(path, state, delivered, key):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        str(path),
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=8,
        max_samples_per_sequence=8,
        num_streams=2,
        task_encoder=Poison(),
    )
    records = Ledger(ds, states=[state]).describe_positions(range(len(delivered)))
    assert [[s.key for s in r.samples] for r in records] == [keys for _, keys in delivered]
    lost = [(r.position, s.key) for r in records for s in r.lost]
    assert len(lost) == 1 and lost[0][1] == key


def _rank_run(rank, world_size, path, key):
    expected = batches(iter(loader(path, 0, Poison([key]), rank=rank, world_size=world_size)), 10)
    run = loader(path, 1, Poison([key]), rank=rank, world_size=world_size)
    got = batches(iter(run), 10)
    return {
        "same": got == expected,
        "losses": [loss["sample"]["key"] for loss in run.worker_losses()],
    }


def test_two_ranks_each_recover_their_own_workers(text_ds):
    key = poison_key(text_ds, world_size=2, rank=0)
    results = run_ranks(2, _rank_run, str(text_ds), key)
    assert results == [{"same": True, "losses": [key]}, {"same": True, "losses": []}]
