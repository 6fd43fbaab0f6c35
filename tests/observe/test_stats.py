"""loader.stats(): exposed wait, per-stage worker time, samples/s, queue depths, per-source skips."""

from __future__ import annotations

import logging

import pytest

from energon import DefaultTaskEncoder, WorkerConfig, get_savable_loader, get_train_dataset
from energon.errors import SampleException
from energon.observe.probe import STAGES


class FailingEncoder(DefaultTaskEncoder):
    """Fails on every 7th sample (by key), so skips are counted."""

    def encode_sample(self, sample):
        if int(sample.__key__.rsplit("_", 1)[1]) % 7 == 0:
            raise SampleException("unlucky sample")
        return sample


def stats_loader(path, *, num_workers, batch_size, **options):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    dataset = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=batch_size,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        **options,
    )
    return get_savable_loader(dataset)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_count_what_the_workers_did(text_ds, num_workers):
    loader = stats_loader(
        text_ds, num_workers=num_workers, batch_size=4, task_encoder=FailingEncoder()
    )
    batches = 20
    it = iter(loader)
    for _ in range(batches):
        next(it)
    stats = loader.stats()
    assert stats["batches"] == batches
    assert 0 <= stats["wait_seconds"] <= stats["elapsed_seconds"]
    assert set(stats["stage_seconds"]) == set(STAGES)
    workers = stats["workers"]
    assert len(workers) == max(1, num_workers)
    # every delivered sample was read (plus those failing, those made ahead)
    loaded = sum(w["samples"] for w in workers)
    assert loaded >= batches * 4
    assert sum(w["items"] for w in workers) >= batches
    for w in workers:
        assert w["queue_depth"] >= 0
        assert w["seconds"]["read"] > 0 and w["seconds"]["encode"] > 0
        assert w["seconds"]["batch"] > 0
        assert w["samples_per_second"] > 0
    # the workers made exactly as many items as were delivered plus what waits in the queues
    assert sum(w["items"] - w["queue_depth"] for w in workers) == batches
    (source,) = stats["sources"]
    assert source["skipped"] > 0
    assert source["errors"] == {"SampleException": source["skipped"]}


def test_stats_off_leaves_stages_empty(text_ds):
    loader = stats_loader(text_ds, num_workers=1, batch_size=4)
    loader.collect_stats = False
    it = iter(loader)
    for _ in range(3):
        next(it)
    stats = loader.stats()
    assert stats["batches"] == 3
    assert stats["workers"] == []


def test_periodic_log_line(text_ds, caplog):
    loader = stats_loader(text_ds, num_workers=0, batch_size=2)
    loader.log_stats(every_seconds=0)  # every batch
    with caplog.at_level(logging.INFO, logger="energon.stats"):
        it = iter(loader)
        for _ in range(3):
            next(it)
    lines = [r.getMessage() for r in caplog.records if r.name == "energon.stats"]
    assert len(lines) == 3
    assert lines[-1].startswith("energon stats: 3 batches")
    quiet = stats_loader(text_ds, num_workers=0, batch_size=2)  # off by default
    with caplog.at_level(logging.INFO, logger="energon.stats"):
        caplog.clear()
        it = iter(quiet)
        next(it)
    assert not [r for r in caplog.records if r.name == "energon.stats"]


def test_a_process_that_never_closes_its_loader_leaves_no_board_behind(text_ds):
    """The shared stats board is removed at exit even when nothing closes the loader."""
    import os
    import subprocess
    import sys

    from tests.helpers.paths import REPO_ROOT

    script = f"""
from tests.observe.test_stats import stats_loader
loader = stats_loader({str(text_ds)!r}, num_workers=1, batch_size=2)
it = iter(loader)
next(it)
print(loader._monitor.board.folder)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    folder = out.stdout.strip().splitlines()[-1]
    assert folder.startswith(("/dev/shm", "/tmp")) and not os.path.exists(folder)


_KEPT: list = []


def _loader_in_a_child(path: str, queue) -> None:
    loader = stats_loader(path, num_workers=1, batch_size=2)
    it = iter(loader)
    next(it)
    # alive until the child ends: only the exit path can remove its board and arena files
    _KEPT.append((loader, it))
    queue.put(loader._monitor.board.folder)


def test_a_multiprocessing_child_leaves_no_shared_memory_behind(captioning_ds):
    """Forked multiprocessing children end with ``os._exit``, without running atexit; their stats
    boards and batch arenas are removed all the same."""
    import multiprocessing as mp
    import os

    context = mp.get_context("fork")  # a forked child ends with os._exit: no atexit
    queue = context.Queue()
    child = context.Process(target=_loader_in_a_child, args=(str(captioning_ds), queue))
    child.start()
    folder = queue.get(timeout=300)
    child.join(timeout=300)
    assert child.exitcode == 0 and not os.path.exists(folder)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"energon-{child.pid}-")]


def test_loaders_without_workers_in_one_process_count_only_their_own_samples(text_ds):
    """Without workers every loader runs its stages in the main process: each must write into its
    own board (a train and a validation loader side by side), and one with stats off into none."""
    first = stats_loader(text_ds, num_workers=0, batch_size=4)
    second = stats_loader(text_ds, num_workers=0, batch_size=2)
    off = stats_loader(text_ds, num_workers=0, batch_size=3)
    off.collect_stats = False
    its = [iter(first), iter(second), iter(off)]
    for turn in range(12):  # taking turns, a different number of batches each time
        for _ in range(turn % 3 + 1):
            next(its[turn % 3])
    taken = [sum(t % 3 + 1 for t in range(12) if t % 3 == i) for i in range(3)]
    for loader, batch_size, batches in ((first, 4, taken[0]), (second, 2, taken[1])):
        stats = loader.stats()
        assert stats["batches"] == batches
        (worker,) = stats["workers"]
        assert worker["samples"] == batches * batch_size  # no read-ahead without workers
        assert worker["items"] == batches
    assert off.stats()["workers"] == []
