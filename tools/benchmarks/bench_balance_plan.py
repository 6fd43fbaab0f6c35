"""CPU cost of planning balanced windows (``BalancedExecutor._window``), per pointer.

Plans ``--windows`` consecutive windows of one rank's executor (0 workers) of the VLM mix of
``bench_balance.py`` (batch 16, shuffle buffer 64, ``Balance(16384, window=8)``) for each rank
count of ``--ranks``, and reports the CPU time (``time.thread_time``, median over the windows) per
pointer planned: the
pointer simulation of every rank's micro-batches, the costs from the index, the composition.
The fast paths (the ledger's C pointer stepper) can be switched off in the same run
(``ENERGON_NO_NATIVE=1``: "python" rows) to compare; both must plan the same windows (checked).
``--profile`` prints a cProfile of the last configuration's planning. ``--loader-share R``:
planning's share of R balanced loaders' CPU (0 workers, ``--steps`` steps through the public API
after a warm window: loading, decoding, packing included; planning: the CPU time of the thread
that runs each window's ``BalancedExecutor._plan``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

from bench_balance import dataset_root, make_loaders

from energon import WorkerConfig, get_train_dataset
from energon.balance import Balance
from energon.demo.vlm import VlmTaskEncoder
from energon.pipeline.balanced_executor import BalancedExecutor

MAX_LENGTH = 16384


def executor(path: str, ranks: int, batch: int):
    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=ranks, num_workers=0),
        batch_size=batch,
        shuffle_buffer_size=64,
        max_samples_per_sequence=32,
        task_encoder=VlmTaskEncoder(),
        balance=Balance(MAX_LENGTH, window=8),
    )
    return dataset.executor(0)


def plan(path: str, ranks: int, batch: int, windows: int, native: bool):
    """(CPU seconds per pointer: the median over the windows, the planned windows' pools and plans). Timed on windows that are
    dropped once planned, as the loader drops them (kept ones would make the garbage collector's
    scans grow); the windows compared are planned again by another executor."""
    if native:
        os.environ.pop("ENERGON_NO_NATIVE", None)
    else:
        os.environ["ENERGON_NO_NATIVE"] = "1"
    ex = executor(path, ranks, batch)
    ex._window(0)  # warm: opens the index, builds the native library
    per_pointer = []
    for i in range(1, windows + 1):
        start = time.thread_time()
        pointers = len(ex._window(i).pool)
        per_pointer.append((time.thread_time() - start) / pointers)
    again = executor(path, ranks, batch)
    planned = [again._window(i) for i in range(windows + 1)]
    return statistics.median(per_pointer), [(w.pool, w.costs, w.plan, w.end) for w in planned]


def loader_share(path: str, ranks: int, batch: int, steps: int) -> tuple[float, float]:
    """(CPU ms per sample of ``ranks`` balanced loaders, the fraction of it spent planning):
    ``steps`` steps after a warm window, process CPU time, planning timed around each
    ``BalancedExecutor._plan``."""
    planning = [0.0]
    plan_window = BalancedExecutor._plan

    def timed(self, *args):
        start = time.thread_time()  # the planning thread only (decoding threads run meanwhile)
        try:
            return plan_window(self, *args)
        finally:
            planning[0] += time.thread_time() - start

    loaders = make_loaders(path, ranks, batch, Balance(MAX_LENGTH, window=8))
    its = [iter(loader) for loader in loaders]
    for _ in range(8):  # the first window: start-up
        for it in its:
            next(it)
    BalancedExecutor._plan = timed  # type: ignore[method-assign]
    try:
        start, samples = time.process_time(), 0
        for _ in range(steps):
            for it in its:
                samples += len(next(it).samples)
        spent = time.process_time() - start
    finally:
        BalancedExecutor._plan = plan_window  # type: ignore[method-assign]
    return spent / samples * 1e3, planning[0] / spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="/tmp/energon-bench")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--ranks", default="8,64")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--python-only", action="store_true", help="only the Python path")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--loader-share", type=int, default=0, help="ranks (0: skip)")
    parser.add_argument("--steps", type=int, default=16, help="steps of --loader-share")
    args = parser.parse_args()
    path = dataset_root(args.root, args.samples, progress=True)
    if args.loader_share:
        per_sample, share = loader_share(path, args.loader_share, args.batch, args.steps)
        print(
            f"{args.loader_share} balanced loaders: {per_sample:.2f} CPU ms per sample, "
            f"planning {share:.1%} of it"
        )
    print("| ranks | path | µs per pointer planned |")
    print("| --: | --- | --: |")
    for ranks in [int(r) for r in args.ranks.split(",")]:
        slow, slow_windows = plan(path, ranks, args.batch, args.windows, native=False)
        print(f"| {ranks} | python | {slow * 1e6:.1f} |")
        if not args.python_only:
            fast, fast_windows = plan(path, ranks, args.batch, args.windows, native=True)
            assert fast_windows == slow_windows, "the fast path planned other windows"
            print(f"| {ranks} | fast | {fast * 1e6:.1f} |")
    if args.profile:
        ex = executor(path, ranks, args.batch)
        ex._window(0)
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(1, args.windows + 1):
            ex._window(i)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
