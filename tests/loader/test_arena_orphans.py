"""Workers whose main process was killed (OOM killer, SIGKILL) end, and leave no shared memory.

A worker over its arena budget waits for the main process to free a block; if the main process
dies meanwhile, nobody ever frees one. The worker must notice, finish, and remove the files of its
blocks that the main process never mapped.
"""

from __future__ import annotations

import glob
import os
import select
import signal
import subprocess
import sys
import time

from tests.helpers.paths import REPO_ROOT

# The main process: a tight arena (blocks even for the small test batches, budget 0, one batch
# per message), 2 workers, and a loop that keeps 4 batches and then stops taking any, so that both
# workers wait for a block. It prints its workers' pids and sleeps until it is killed.
_MAIN = """
import sys, time
import energon.loader.data_loader as data_loader
import energon.memory.batch_arena as batch_arena
from energon import WorkerConfig, get_loader, get_train_dataset

batch_arena.MIN_BYTES = 1024
data_loader.GROUP_MAX_ITEMS = 0
dataset = get_train_dataset(
    sys.argv[1],
    worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
    batch_size=4,
    shuffle_buffer_size=5,
    max_samples_per_sequence=5,
)
loader = get_loader(dataset)
iterator = iter(loader)
kept = [next(iterator) for _ in range(4)]
pool = loader._transport.source.pool
pids = [pool.pid(worker) for worker in range(pool.num_workers)]
print(" ".join(map(str, pids)), flush=True)
time.sleep(600)
"""

# Bounds with a wide margin: a batch of the test set takes milliseconds; a worker sees its main
# process gone at once (its pipes to it end; the arena checks its parent while it waits).
WAIT_BEFORE_KILL_SECONDS = 3
START_SECONDS = 300  # the main process's start and first batch (a few seconds on a busy machine)
EXIT_SECONDS = 60


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_waiting_for_a_block_end_when_the_main_process_is_killed(captioning_ds):
    env = {**os.environ, "ENERGON_ARENA_MIB_PER_WORKER": "0", "PYTHONPATH": str(REPO_ROOT)}
    main = subprocess.Popen(
        [sys.executable, "-c", _MAIN, str(captioning_ds)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        poll = select.poll()  # (select.select refuses descriptors past 1023)
        poll.register(main.stdout, select.POLLIN)
        assert poll.poll(START_SECONDS * 1000), f"no worker ids printed in {START_SECONDS} s"
        workers = [int(pid) for pid in main.stdout.readline().split()]
        assert len(workers) == 2, "the main process did not start its workers"
        time.sleep(WAIT_BEFORE_KILL_SECONDS)  # the workers now wait for a block
        assert all(_running(pid) for pid in workers)
        main.send_signal(signal.SIGKILL)
        main.wait(timeout=EXIT_SECONDS)
        deadline = time.monotonic() + EXIT_SECONDS
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in workers if _running(pid)]
    finally:
        main.kill()
        main.wait()
    for pid in left:  # do not leave them spinning after a failed test
        os.kill(pid, signal.SIGKILL)
    assert left == [], "workers kept waiting for a block after their main process died"
    assert glob.glob(f"/dev/shm/energon-{main.pid}-*") == []
