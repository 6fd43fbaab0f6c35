"""Observability costs and estimates: the overhead of ``loader.stats()`` (the per-stage probe in the
workers) and how close ``energon simulate --measure``'s throughput estimate comes to a real loader.

1. Overhead: the same loader run (same data, same order) with stats on and off, alternated and
   repeated; medians of samples/s. The goal is < 1% (noise on a shared machine can be larger than
   that: compare the spread of the repeats).
2. Estimate: the measured samples/s of one worker against a real loader with one worker
   (``num_workers=1``, so the main process mostly waits), as a ratio; the goal is within 30%.

``--cpu-overhead`` instead measures the overhead as CPU time, robust to a busy machine: three
loaders over the same data run side by side (stats and watchdog off; stats on, watchdog off; the
default, both on) and take turns of ``--chunk`` batches, ``--rounds`` times in rotating order. A
loader's CPU time per round is its main process's CPU time during its turn plus its workers' CPU
time from its turn's start to its next turn's start (so the work its workers do ahead, during the
other loaders' turns, counts too); from /proc/PID/schedstat, so other jobs on the machine do not
count. The overhead is the median over rounds of (CPU time on / CPU time off) of the same round.

Usage: python tools/benchmarks/bench_observe.py [--workload captioning-small] [--repeats 5]
       python tools/benchmarks/bench_observe.py --cpu-overhead --workload text --workers 0,2 \
           [--root /work/bench_data] [--chunk 100] [--rounds 40] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
import timeit
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    DEFAULT_ROOT,
    ensure_workload,
    loader_worker_pids,
    machine_summary,
    print_markdown_table,
)
from bench_loader import ensure_dataset_yaml, prepare_workload  # noqa: E402

from energon import WorkerConfig, get_loader, get_savable_loader, get_train_dataset  # noqa: E402
from energon.preflight.measure import measure  # noqa: E402
from energon.preflight.simulate import SimulationSettings  # noqa: E402


def _dataset(path: str, workers: int, batch_size: int):
    """The benchmark's training dataset: shuffle buffer and slices of 100, one rank."""
    return get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=batch_size,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
    )


def loader_rate(path: str, *, stats: bool, batches: int, batch_size: int, workers: int) -> float:
    ds = _dataset(path, workers, batch_size)
    loader = get_savable_loader(ds, watchdog_timeout_seconds=None if not stats else 60)
    loader.collect_stats = stats
    it = iter(loader)
    next(it)  # start-up is not throughput
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds = time.perf_counter() - start
    del it, loader
    return batches * batch_size / seconds


CONFIGS = ("off", "stats", "default")  # stats and watchdog off / stats only / both (the default)


def open_loader(path: str, config: str, workers: int, batch_size: int):
    ds = _dataset(path, workers, batch_size)
    loader = get_loader(ds, watchdog_timeout_seconds=60 if config == "default" else None)
    loader.collect_stats = config != "off"
    it = iter(loader)
    for _ in range(20):  # warm up: workers started, queues full
        next(it)
    return loader, it


def _cpu(pid: int | str) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def worker_cpu(loader) -> float:
    """CPU seconds of the loader's worker processes so far."""
    return sum(_cpu(pid) for pid in loader_worker_pids(loader))


def cpu_overhead(path: str, workers: int, rounds: int, chunk: int, batch_size: int):
    """CPU seconds per round of each configuration (the first round only starts the clocks)."""
    loaders = {c: open_loader(path, c, workers, batch_size) for c in CONFIGS}
    seconds: dict[str, list[float]] = {c: [] for c in CONFIGS}
    last_workers: dict[str, float] = {}
    for r in range(rounds + 1):
        for config in CONFIGS[r % 3 :] + CONFIGS[: r % 3]:
            loader, it = loaders[config]
            at_start = worker_cpu(loader)
            main = _cpu("self")
            for _ in range(chunk):
                next(it)
            main = _cpu("self") - main
            if config in last_workers:
                seconds[config].append(main + at_start - last_workers[config])
            last_workers[config] = at_start
    return seconds


def _count_probe_calls(path: str, batch_size: int, batches: int, all_timed: bool):
    """Calls of ``Probe.switched`` and ``Probe.cycle`` per sample in a real loader without
    workers (stats on). With every item timed, each stage switch calls ``switched`` once, so its
    count is the number of stage switches per sample."""
    from energon.observe import probe

    counts: collections.Counter[str] = collections.Counter()
    originals = {name: getattr(probe.Probe, name) for name in ("switched", "cycle")}

    def counting(name: str, fn):
        def call(*args):
            counts[name] += 1
            return fn(*args)

        return call

    timed_first = probe.TIMED_FIRST
    for name, fn in originals.items():
        setattr(probe.Probe, name, counting(name, fn))
    if all_timed:
        probe.TIMED_FIRST = 1 << 60
    try:
        loader, it = open_loader(path, "stats", 0, batch_size)
        counts.clear()  # after the warm-up: steady state
        for _ in range(batches):
            next(it)
        del loader, it
    finally:
        for name, fn in originals.items():
            setattr(probe.Probe, name, fn)
        probe.TIMED_FIRST = timed_first
    samples = batches * batch_size
    return {name: counts[name] / samples for name in originals}


def hot_path_cost(path: str, batch_size: int, batches: int = 300) -> dict[str, Any]:
    """The probe's own CPU cost per sample, free of the machine's noise: how often each piece of
    probe code runs per sample (counted in a real loader), times what one run costs (the fastest
    of many timings of the same code in this process, in thread CPU time). The pieces: a stage
    switch as the stages inline it (enter and leave: integer stores, a flag test), the per-sample
    stores of the sample being read, and, with stats on only, the clock of timed items
    (``Probe.switched``) and the item boundary (``Probe.cycle``)."""
    from energon.observe import probe

    switches = _count_probe_calls(path, batch_size, batches, all_timed=True)["switched"] / 2
    calls = _count_probe_calls(path, batch_size, batches, all_timed=False)
    board = probe.Board(1, ["x"])
    probe.activate(board, 0)
    active = probe.ACTIVE
    active.timing = False
    probe.install(active)

    def inlined_switch() -> None:  # what LoadStage, SampleDecoder.decode and call_hook do
        hot = probe.HOT
        previous = hot[probe.STAGE]
        hot[probe.STAGE] = probe.DECODE
        if probe.TIMING:
            probe.ACTIVE.switched(previous)
        hot[probe.STAGE] = previous
        if probe.TIMING:
            probe.ACTIVE.switched(probe.DECODE)

    def sample_stores() -> None:  # LoadStage, once per sample
        hot = probe.HOT
        hot[probe.SOURCE] = 0
        hot[probe.INDEX] = 5
        hot[probe.SAMPLES] += 1

    def best_ns(fn, number: int = 20_000) -> float:
        # CPU time of this thread (time the scheduler gave others does not count), fastest of many
        timings = timeit.repeat(fn, number=number, repeat=25, timer=time.thread_time)
        return min(timings) / number * 1e9

    empty = best_ns(lambda: None)
    rows = [
        ("stage switch (enter + leave)", switches, best_ns(inlined_switch) - empty),
        ("sample stores", 1.0, best_ns(sample_stores) - empty),
        (
            "Probe.switched (timed items)",
            calls["switched"],
            best_ns(lambda: active.switched(2)) - empty,
        ),
        ("Probe.cycle (item boundary)", calls["cycle"], best_ns(active.cycle) - empty),
    ]
    probe.deactivate(active)
    board.close()
    return rows


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main_cpu_overhead(args) -> None:
    workload = ensure_workload(args.workload, args.root)
    ensure_dataset_yaml(workload)
    if not os.path.exists(os.path.join(workload.path, ".nv-meta", "index.sqlite")):
        prepare_workload(workload)
    print(machine_summary())
    rows = []
    off_rate = []  # samples per CPU second, stats off, per worker count
    for workers in [int(w) for w in args.workers.split(",")]:
        seconds = cpu_overhead(workload.path, workers, args.rounds, args.chunk, args.batch_size)
        off = statistics.median(seconds["off"])
        samples = args.chunk * args.batch_size
        off_rate.append(samples / off)
        for config in CONFIGS[1:]:
            ratios = [a / b for a, b in zip(seconds[config], seconds["off"])]
            rows.append(
                (
                    workers,
                    config,
                    f"{samples / off:,.0f}",
                    f"{samples / statistics.median(seconds[config]):,.0f}",
                    f"{(statistics.median(ratios) - 1) * 100:+.2f}%",
                    f"{(_quantile(ratios, 0.25) - 1) * 100:+.1f}% .. "
                    f"{(_quantile(ratios, 0.75) - 1) * 100:+.1f}%",
                    len(ratios),
                )
            )
    rows_hot = hot_path_cost(workload.path, args.batch_size)
    sample_ns = 1e9 / off_rate[0] if off_rate else float("nan")
    total = sum(calls * ns for _, calls, ns in rows_hot)
    stats_on = sum(calls * ns for _, calls, ns in rows_hot[2:])
    print_markdown_table(
        ("probe code", "runs per sample", "ns per run", "ns per sample"),
        [(n, f"{c:.3f}", f"{ns:.0f}", f"{c * ns:.0f}") for n, c, ns in rows_hot],
    )
    print(
        f"probe cost per sample: {total:.0f} ns, of which {stats_on:.0f} ns only with stats on; "
        f"a sample costs {sample_ns / 1e3:.1f} us of CPU (stats off, {args.workers.split(',')[0]} "
        f"workers): {100 * total / sample_ns:.2f}% in all, {100 * stats_on / sample_ns:.2f}% "
        f"added by stats on"
    )
    print_markdown_table(
        (
            "workers",
            "on",
            "off: samples/CPU-s",
            "on: samples/CPU-s",
            "overhead (median of rounds)",
            "middle half of rounds",
            "rounds",
        ),
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="captioning-small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", default="2", help="one count; a list with --cpu-overhead")
    parser.add_argument("--cpu-overhead", action="store_true")
    parser.add_argument("--root", default=DEFAULT_ROOT, help="where the workloads are")
    parser.add_argument("--chunk", type=int, default=100, help="batches per turn (--cpu-overhead)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds (--cpu-overhead)")
    args = parser.parse_args()
    if args.cpu_overhead:
        main_cpu_overhead(args)
        return
    args.workers = int(args.workers)
    workload = ensure_workload(args.workload, args.root)
    ensure_dataset_yaml(workload)
    if not os.path.exists(os.path.join(workload.path, ".nv-meta", "index.sqlite")):
        prepare_workload(workload)
    path = workload.path
    print(machine_summary())

    on, off = [], []
    for _ in range(args.repeats):  # alternate, so drifts of the machine hit both alike
        common = dict(batches=args.batches, batch_size=args.batch_size, workers=args.workers)
        off.append(loader_rate(path, stats=False, **common))
        on.append(loader_rate(path, stats=True, **common))
    med_on, med_off = statistics.median(on), statistics.median(off)
    print_markdown_table(
        ["run", "median samples/s", "min", "max", "repeats"],
        [
            ["stats off", f"{med_off:.0f}", f"{min(off):.0f}", f"{max(off):.0f}", len(off)],
            ["stats on", f"{med_on:.0f}", f"{min(on):.0f}", f"{max(on):.0f}", len(on)],
        ],
    )
    print(f"overhead of stats: {100 * (med_off - med_on) / med_off:+.2f}% (median vs. median)")

    # the probe's own cost, free of the machine's noise (see hot_path_cost), against the busy
    # time per sample of a real worker
    rows_hot = hot_path_cost(path, args.batch_size, batches=args.batches)
    total = sum(calls * ns for _, calls, ns in rows_hot)
    ds = _dataset(path, 1, args.batch_size)
    loader = get_savable_loader(ds)
    for _ in zip(range(args.batches), loader):
        pass
    capacity = loader.stats()["workers"][0]["busy_samples_per_second"]
    del loader
    print(
        f"probe: {total:.0f} ns per sample; a worker's busy time per sample "
        f"{1e6 / capacity:.0f} us: {100 * total * capacity / 1e9:.2f}% of it"
    )

    settings = SimulationSettings(world_size=1, num_workers=1, batch_size=args.batch_size)
    estimates, reals = [], []
    for _ in range(args.repeats):
        estimates.append(measure(path, settings, samples=256).samples_per_second_per_worker)
        reals.append(
            loader_rate(
                path, stats=True, batches=args.batches, batch_size=args.batch_size, workers=1
            )
        )
    est, real = statistics.median(estimates), statistics.median(reals)
    print_markdown_table(
        ["one worker", "median samples/s"],
        [["simulate --measure estimate", f"{est:.0f}"], ["real loader, 1 worker", f"{real:.0f}"]],
    )
    ratio = est / real
    print(f"estimate / real: {ratio:.2f} ({'within' if abs(ratio - 1) <= 0.3 else 'outside'} 30%)")


if __name__ == "__main__":
    main()
