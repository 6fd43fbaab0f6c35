"""What one rank spends per step on balanced planning, alone and with a shared plan store:
``python tools/benchmarks/bench_shared_plans.py --ranks 8,64,512,1024,4096``.

For each simulated rank count ``R`` (one rank's executor, 0 workers, the VLM mix of
``bench_balance.py``: batch 16, shuffle buffer 64, ``Balance(16384, window=8)``):

- **local** (today's default): a rank plans every window itself: the pointer simulation of all
  ranks' micro-batches, their costs from the index and the composition. Per step: the CPU of
  planning one window (after a first, warm one) over its 8 steps.
- **shared** (``Balance(plan_store=DIR)``): each window is planned by one rank and published;
  a rank plans one window in ``R`` and reads its shares of every window. Per step:
  (plan + publish) / (R x 8), plus reading the window (open, map, header) / 8, plus reading
  its share and the step's costs (``StoredWindow.share`` / ``rank_costs``), measured on the last
  rank of the window just published.

The per-step **state bookkeeping** (the snapshots of every logical stream that a rank's items
carry so that a state can be saved at any step: made by ``BalancedExecutor._item_meta``, sent
from a worker (pickled) and kept by ``LoaderPosition.record``) is not planning; it is printed in
its own columns. Every stream's snapshots are one mapping per window's start or end, shared by
its items; read from a store they stay in the file (pickled as its path) until a state is saved.
CPU time (``time.process_time``), the best of ``--plans`` windows planned and ``--reads``
repeats of the reads; the load average printed.
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import tempfile
import time

from bench_balance import dataset_root

from energon import WorkerConfig, get_train_dataset
from energon.balance import Balance
from energon.demo.vlm import VlmTaskEncoder
from energon.loader.position import LoaderPosition

MAX_LENGTH = 16384
WINDOW = 8


def executor(path: str, ranks: int, rank: int, batch: int, store: str):
    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=rank, world_size=ranks, num_workers=0),
        batch_size=batch,
        shuffle_buffer_size=64,
        max_samples_per_sequence=32,
        task_encoder=VlmTaskEncoder(),
        balance=Balance(MAX_LENGTH, window=WINDOW, plan_store=store),
    )
    return dataset.executor(0)


def cpu(fn):
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def bookkeeping(executor, window, ranks: int) -> None:
    """A window's steps as a rank's loader keeps them: each item's snapshots made
    (``_item_meta``; the window's shared mapping made afresh), sent from a loader worker (pickled
    and unpickled, one item a message) and recorded by the main process
    (``LoaderPosition.record``)."""
    executor._shared = []
    position = LoaderPosition()
    rank = executor.layout.rank
    for step in range(WINDOW):
        meta = executor._item_meta(window, step, step * ranks + rank)
        position.record(pickle.loads(pickle.dumps(meta)), rank, ranks)


def best(repeats: int, fn) -> float:
    return min(cpu(fn)[0] for _ in range(repeats))


def planned(path: str, ranks: int, batch: int, store: str, plans: int) -> dict:
    """Rank 0 plans windows 1 ... ``plans`` (after a warm one) and publishes them: the best CPU
    seconds, and what the last window's first and last ranks get (to check the reads)."""
    planner = executor(path, ranks, 0, batch, store)
    planner.plan_window(0)  # warm: opens the index, builds the streams
    plan_s = publish_s = float("inf")
    for index in range(1, plans + 1):
        seconds, window = cpu(lambda: planner.plan_window(index))  # noqa: B023
        plan_s = min(plan_s, seconds)
        publish_s = min(publish_s, cpu(lambda: planner.plans.publish(window))[0])  # noqa: B023
    return {
        "plan": plan_s,
        "publish": publish_s,
        "items": best(plans, lambda: bookkeeping(planner, window, ranks)),
        "first": window.first,
        "shares": [
            (window.share(s, r), list(window.rank_costs(s)))
            for s in range(WINDOW)
            for r in (0, ranks - 1)
        ],
    }


def measure(path: str, ranks: int, batch: int, reads: int, plans: int) -> dict[str, float]:
    """CPU seconds per step of one rank count's parts (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="energon-plans-") as store:
        return measure_in(path, ranks, batch, reads, plans, store)


def measure_in(path: str, ranks: int, batch: int, reads: int, plans: int, store: str):
    """:func:`measure` with the plan store ``store``."""
    plan = planned(path, ranks, batch, store, plans)
    gc.collect()  # a reading rank holds no planned window (its collector scans less)
    reader = executor(path, ranks, ranks - 1, batch, store)
    store_of = reader.plans.store
    open_s = min(cpu(lambda: store_of.read(plan["first"]))[0] for _ in range(reads))
    stored = store_of.read(plan["first"])

    def read_steps():
        for step in range(stored.steps):
            stored.share(step, ranks - 1)
            stored.rank_costs(step)[ranks - 1]  # its own cost (all ranks' only when read)

    steps_s = min(cpu(read_steps)[0] for _ in range(reads))
    read = [
        (stored.share(s, r), list(stored.rank_costs(s)))
        for s in range(WINDOW)
        for r in (0, ranks - 1)
    ]
    assert read == plan["shares"], "the stored window differs from the planned one"
    items_s = best(reads, lambda: bookkeeping(reader, stored, ranks))
    return {
        "local": plan["plan"] / WINDOW,
        "share": (plan["plan"] + plan["publish"]) / (ranks * WINDOW),
        "read": (open_s + steps_s) / WINDOW,
        "item_local": plan["items"] / WINDOW,
        "item_shared": items_s / WINDOW,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/energon-bench")
    parser.add_argument("--samples", type=int, default=8192, help="at least the ranks")
    parser.add_argument("--ranks", default="8,64,512")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reads", type=int, default=20, help="repeats of the reads (best)")
    parser.add_argument("--plans", type=int, default=3, help="windows planned (best)")
    args = parser.parse_args()
    path = dataset_root(args.root, args.samples, progress=True)
    print(
        "| ranks | local: ms per step | shared: planning share | reading its slice | "
        "shared: ms per step | x first (shared) | local / shared | "
        "state bookkeeping ms per step: local / shared | load |"
    )
    print("| --: | --: | --: | --: | --: | --: | --: | --: | --: |")
    first = None
    for ranks in [int(r) for r in args.ranks.split(",")]:
        m = measure(path, ranks, args.batch, args.reads, args.plans)
        shared = m["share"] + m["read"]
        first = first or shared
        print(
            f"| {ranks} | {m['local'] * 1e3:.2f} | {m['share'] * 1e3:.3f} | "
            f"{m['read'] * 1e3:.3f} | {shared * 1e3:.3f} | {shared / first:.2f} | "
            f"{m['local'] / shared:.0f} | {m['item_local'] * 1e3:.2f} / "
            f"{m['item_shared'] * 1e3:.2f} | {os.getloadavg()[0]:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
