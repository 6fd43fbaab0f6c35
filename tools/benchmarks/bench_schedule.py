"""Weight schedules: per-sample cost of a scheduled blend against the same blend with fixed weights.

The blend is the text workload's three thirds (subset ranges), so every configuration reads the
same bytes; only the weights differ:

- fixed: 1 : 1 : 1;
- linear: the first third's weight moves linearly from 0.5 to 2 and the second's along a cosine
  from 2 to 0.5 over ten times the measured samples (the weights change all the time: the worst
  case), the third stays 1;
- step: a piecewise-constant schedule with a new value every 10,000 samples.

The three loaders run side by side and take turns of ``--chunk`` batches, ``--rounds`` times in
rotating order. What is measured is CPU time (of the main process and the loader's workers), not
wall-clock time, so that other jobs on a shared machine do not count; the overhead is the median
over rounds of (scheduled CPU time / fixed CPU time) of the same round, and "samples/s" is samples
per CPU second. A second table times the schedule alone (picks per CPU second of
``WeightedSchedule.next()``, no data), which is the whole difference between the configurations. A third table times an online change: the first
batch after ``loader.set_blend_weights`` (where the loader restarts its workers) against an
ordinary batch (wall-clock).

    python tools/benchmarks/bench_schedule.py [--workers 0,2] [--chunk 100] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    ensure_workload,
    loader_worker_pids,
    machine_summary,
    print_markdown_table,
)

from energon import Blender, WorkerConfig, get_loader, get_train_dataset  # noqa: E402
from energon.plan.mixing import WeightedSchedule  # noqa: E402
from energon.plan.schedules import FlatWeights, WeightSchedule  # noqa: E402
from energon.prepare.dataset import prepare_dataset  # noqa: E402

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
BATCH = 32
THIRDS = ((0, 33.333), (33.333, 66.667), (66.667, 100))
KINDS = ("fixed", "linear", "step")


def weights(kind: str, horizon: int) -> list:
    if kind == "fixed":
        return [1.0, 1.0, 1.0]
    if kind == "linear":
        return [
            WeightSchedule.linear(0, horizon, 0.5, 2.0),
            WeightSchedule.cosine(0, horizon, 2.0, 0.5),
            1.0,
        ]
    ups = [(t, 1.0 + (t // 10_000) % 3) for t in range(0, horizon, 10_000)]
    downs = [(t, 1.0 + (t // 10_000 + 1) % 3) for t in range(0, horizon, 10_000)]
    return [WeightSchedule.step(ups), 1.0, WeightSchedule.step(downs)]


def blend(root: str, kind: str, horizon: int) -> Blender:
    return Blender(
        [
            {"path": root, "weight": w, "subset": {"range": [f"{a}%", f"{b}%"]}}
            for w, (a, b) in zip(weights(kind, horizon), THIRDS)
        ]
    )


def open_loader(path, workers: int):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=BATCH,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
    )
    loader = get_loader(ds)
    it = iter(loader)
    for _ in range(20):  # warm up: workers started, buffers full
        next(it)
    return loader, it


def cpu_seconds(loader) -> float:
    """CPU time of this process and of the loader's worker processes so far (nanosecond counters
    of /proc/PID/schedstat): other jobs on the machine do not inflate it."""
    total = 0
    for pid in ["self", *loader_worker_pids(loader)]:
        with open(f"/proc/{pid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def interleaved(root: str, workers: int, rounds: int, chunk: int) -> dict[str, list[float]]:
    """CPU seconds per chunk of ``chunk`` batches, for each configuration, round after round: the
    loaders run side by side and take turns, in rotating order."""
    horizon = 10 * (rounds * chunk + 20) * BATCH
    loaders = {kind: open_loader(blend(root, kind, horizon), workers) for kind in KINDS}
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for r in range(rounds):
        for kind in KINDS[r % 3 :] + KINDS[: r % 3]:
            loader, it = loaders[kind]
            t = cpu_seconds(loader)
            for _ in range(chunk):
                next(it)
            seconds[kind].append(cpu_seconds(loader) - t)
    return seconds


def change_latency(root: str, workers: int, changes: int) -> tuple[float, float]:
    """Median wall-clock seconds of the batch right after ``set_blend_weights`` (the loader
    restarts its workers there) and of an ordinary batch, over ``changes`` changes."""
    loader, it = open_loader(blend(root, "fixed", 1), workers)
    after, ordinary = [], []
    for i in range(changes):
        for _ in range(10):
            t = time.perf_counter()
            next(it)
            ordinary.append(time.perf_counter() - t)
        loader.set_blend_weights([1.0 + i % 2, 1.0, 1.0])
        t = time.perf_counter()
        next(it)
        after.append(time.perf_counter() - t)
    return statistics.median(after), statistics.median(ordinary)


def picks_per_second(kind: str, picks: int) -> float:
    function = FlatWeights(
        tuple(
            w if isinstance(w, WeightSchedule) else WeightSchedule.constant(w)
            for w in weights(kind, picks * 16)
        )
    )
    schedule = WeightedSchedule(function, [0.2, 0.5, 0.8], stream=3, num_streams=16)
    t = time.process_time()
    for _ in range(picks):
        schedule.next()
    return picks / (time.process_time() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--chunk", type=int, default=100, help="batches per turn")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--root", default="bench_data")
    args = parser.parse_args()
    root = ensure_workload("text", args.root).path
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False)
    yaml_path = os.path.join(root, ".nv-meta", "dataset.yaml")
    if not os.path.exists(yaml_path):
        with open(yaml_path, "w") as f:
            f.write(TEXT_YAML)
    print(machine_summary())
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        seconds = interleaved(root, workers, args.rounds, args.chunk)
        fixed = statistics.median(seconds["fixed"])
        for kind in KINDS[1:]:
            ratios = [a / b for a, b in zip(seconds[kind], seconds["fixed"])]
            rows.append(
                (
                    workers,
                    kind,
                    f"{args.chunk * BATCH / fixed:,.0f}",
                    f"{args.chunk * BATCH / statistics.median(seconds[kind]):,.0f}",
                    f"{(statistics.median(ratios) - 1) * 100:+.1f}%",
                    f"{(_quantile(ratios, 0.25) - 1) * 100:+.1f}% .. "
                    f"{(_quantile(ratios, 0.75) - 1) * 100:+.1f}%",
                )
            )
    print_markdown_table(
        (
            "workers",
            "schedule",
            "fixed samples/CPU-s",
            "scheduled samples/CPU-s",
            "overhead (median of rounds)",
            "middle half of rounds",
        ),
        rows,
    )
    print_markdown_table(
        ("workers", "batch after set_blend_weights ms (median of 10)", "ordinary batch ms"),
        [
            (w, f"{a * 1e3:.1f}", f"{b * 1e3:.2f}")
            for w in (int(w) for w in args.workers.split(","))
            for a, b in [change_latency(root, w, 10)]
        ],
    )
    picks = 200_000
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for r in range(5):
        for kind in KINDS[r % 3 :] + KINDS[: r % 3]:
            rates[kind].append(picks_per_second(kind, picks))
    medians = [statistics.median(rates[kind]) for kind in KINDS]
    print_markdown_table(
        ("schedule", "picks/s (median of 5, CPU time)", "us per pick"),
        [(k, f"{m:,.0f}", f"{1e6 / m:.2f}") for k, m in zip(KINDS, medians)],
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


if __name__ == "__main__":
    main()
