"""Text with workers: loader throughput with 0 and 2 workers next to the tar-parse limit.

Issue 15, goal 2: with 2 workers the loader should reach at least 1.7x its 0-worker rate and at least
0.8 of the 2-process tar-parse rate (``bench_raw``'s "tar read + UTF-8 decode"). Each loader run is a
fresh process that does what a user's loop does (``get_train_dataset`` + ``get_loader``, batch 32,
shuffle buffer 100, slices of 100), takes ``--warmup`` samples, then times ``--samples`` samples.
Besides wall-clock rates it reports the CPU time per batch of the main process and of the workers
(from ``/proc/<pid>/task/*/schedstat``): on a machine shared with other work the rates are noisy,
the CPU per batch much less so, and on two cores the 2-worker rate is bounded by
``2 cores / (main + workers CPU per batch)``.

Usage: python tools/benchmarks/bench_text_workers.py [--root bench_data] [--runs 3] [--samples 60000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    DEFAULT_ROOT,
    ensure_workload,
    machine_summary,
    print_markdown_table,
)
from bench_raw import TEXT_DECODE, measure_text  # noqa: E402

BATCH_SIZE = 32
RESULT_PREFIX = "BENCH_TEXT_WORKERS "


def cpu_ns(pid: int | str) -> int:
    """CPU time (ns) of every thread of process ``pid`` so far."""
    total = 0
    task_dir = f"/proc/{pid}/task"
    for thread in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{thread}/schedstat") as file:
                total += int(file.read().split()[0])
        except OSError:
            pass  # the thread ended meanwhile
    return total


def child_pids(parent: int) -> list[int]:
    """Direct children of ``parent`` (the loader's workers)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(entry))
    return children


def run_loader(root: str, workers: int, warmup: int, samples: int) -> dict:
    """One loader run in this process: rates and CPU per batch over the timed samples."""
    from energon import WorkerConfig, get_loader, get_train_dataset

    dataset = get_train_dataset(
        root,
        batch_size=BATCH_SIZE,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
    )
    started = time.perf_counter()
    iterator = iter(get_loader(dataset))
    seen = len(next(iterator).text)
    first_batch_seconds = time.perf_counter() - started
    while seen < warmup:
        seen += len(next(iterator).text)
    workers_pids = child_pids(os.getpid())
    main_before = cpu_ns("self")
    workers_before = sum(cpu_ns(pid) for pid in workers_pids)
    start = time.perf_counter()
    timed = batches = 0
    while timed < samples:
        timed += len(next(iterator).text)
        batches += 1
    seconds = time.perf_counter() - start
    main_cpu = cpu_ns("self") - main_before
    workers_cpu = sum(cpu_ns(pid) for pid in workers_pids) - workers_before
    return {
        "workers": workers,
        "first_batch_seconds": first_batch_seconds,
        "samples_per_second": timed / seconds,
        "main_cpu_us_per_batch": main_cpu / 1e3 / batches,
        "workers_cpu_us_per_batch": workers_cpu / 1e3 / batches,
    }


def run_in_subprocess(root: str, workers: int, warmup: int, samples: int) -> dict:
    """One loader run in a fresh process (``root``: the workloads' root)."""
    command = [sys.executable, os.path.abspath(__file__), "--root", root, "--child", str(workers)]
    command += ["--warmup", str(warmup), "--samples", str(samples)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loader run with {workers} workers failed:\n{done.stderr}")
    output = done.stdout
    line = next(line for line in output.splitlines() if line.startswith(RESULT_PREFIX))
    return json.loads(line[len(RESULT_PREFIX) :])


def cpu_bound_rate(workers: int, main_cpu_us: float, workers_cpu_us: float) -> float:
    """The rate if the CPU time per batch were all that counted: one core without workers, the
    main process and the workers sharing two cores with them (what a quiet 2-core machine allows)."""
    cores = 1 if workers == 0 else min(2, workers + 1)
    return cores * BATCH_SIZE * 1e6 / (main_cpu_us + workers_cpu_us)


def median_of(rows: list[dict], workers: int, field: str) -> float:
    return statistics.median(row[field] for row in rows if row["workers"] == workers)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="where the workloads live")
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration (median)")
    parser.add_argument("--warmup", type=int, default=320, help="samples before timing")
    parser.add_argument("--samples", type=int, default=60_000, help="timed samples per run")
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    workload = ensure_workload("text", args.root)
    if args.child is not None:
        result = run_loader(workload.path, args.child, args.warmup, args.samples)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    if not os.path.exists(os.path.join(workload.path, ".nv-meta", "dataset.yaml")):
        from bench_loader import prepare_workload

        prepare_workload(workload)
    print(machine_summary())
    worker_counts = [int(w) for w in args.workers.split(",")]
    rows = []
    raws: dict[int, list[float]] = {1: [], 2: []}
    for run in range(args.runs):
        for workers in worker_counts:  # alternate, so that background load hits all alike
            rows.append(
                {"run": run, **run_in_subprocess(args.root, workers, args.warmup, args.samples)}
            )
        for raw in measure_text(workload, args.samples, (1, 2), [TEXT_DECODE]):
            raws[raw.processes].append(raw.samples_per_second)
    print_markdown_table(
        ("run", "workers", "TTFB s", "samples/s", "main CPU us/batch", "workers CPU us/batch"),
        [
            (
                r["run"],
                r["workers"],
                r["first_batch_seconds"],
                r["samples_per_second"],
                r["main_cpu_us_per_batch"],
                r["workers_cpu_us_per_batch"],
            )
            for r in rows
        ],
    )
    raw1, raw2 = statistics.median(raws[1]), statistics.median(raws[2])
    print(
        f"\ntar parse (tar read + UTF-8 decode), median: 1 process {raw1:,.0f} / 2 processes {raw2:,.0f} samples/s"
    )
    summary = []
    for workers in worker_counts:
        rate = median_of(rows, workers, "samples_per_second")
        main_cpu = median_of(rows, workers, "main_cpu_us_per_batch")
        workers_cpu = median_of(rows, workers, "workers_cpu_us_per_batch")
        summary.append(
            (
                workers,
                rate,
                main_cpu,
                workers_cpu,
                cpu_bound_rate(workers, main_cpu, workers_cpu),
                rate / (raw1 if workers == 0 else raw2),
            )
        )
    print_markdown_table(
        (
            "workers",
            "median samples/s",
            "main CPU us/batch",
            "workers CPU us/batch",
            "CPU-bound samples/s",
            "/ tar parse (1 or 2 procs)",
        ),
        summary,
    )
    if 0 in worker_counts and 2 in worker_counts:
        ratios = [
            b["samples_per_second"] / a["samples_per_second"]
            for a, b in zip(
                [r for r in rows if r["workers"] == 0], [r for r in rows if r["workers"] == 2]
            )
        ]
        print(f"\n2 workers / 0 workers per run: {', '.join(f'{x:.2f}' for x in ratios)}")


if __name__ == "__main__":
    main()
