"""Text with workers: loader throughput with 0 and 2 workers next to the tar-parse limit.

Issue 15, goal 2: with 2 workers the loader should reach at least 1.7x its 0-worker rate and at least
0.8 of the 2-process tar-parse rate (``bench_raw``'s "tar read + UTF-8 decode"). Each loader run is a
fresh process that does what a user's loop does (``get_train_dataset`` + ``get_loader``, batch 32,
shuffle buffer 100, slices of 100), takes ``--warmup`` samples, then times ``--samples`` samples.
Besides wall-clock rates it reports the CPU time per batch of the main process and of the workers
(from ``/proc/<pid>/task/*/schedstat``): on a machine shared with other work the rates are noisy,
the CPU per batch much less so, and on two cores the 2-worker rate is bounded by
``2 cores / (main + workers CPU per batch)``. The workers' CPU is also given for their main threads
alone (their pipelines; the rest is mostly the queues' feeder threads, which pickle and send), and
from it what 2 workers would reach if sending cost nothing.

Each round also runs two 0-worker loaders side by side in two fresh processes ("2 x 0"): the work
of two workers on two cores with nothing sent between processes. Its combined rate is the ceiling
of any 2-worker design on this machine, and it tells how much CPU per batch the transfer (pickling
in the workers, unpickling and torch's bookkeeping in the main process) may cost for 2 workers to
reach 1.7x the 0-worker rate.

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
READY = "READY"
SIDE_BY_SIDE = "2 x 0"  # the label of two 0-worker loaders running at once


def cpu_ns(pid: int | str) -> int:
    """CPU time (ns) of every thread of process ``pid`` so far."""
    return sum(thread_cpu_ns(pid))


def thread_cpu_ns(pid: int | str) -> tuple[int, int]:
    """CPU time (ns) so far of process ``pid``'s main thread and of all its other threads (in a
    worker: the queue's feeder thread, which pickles and sends what the main thread made)."""
    main = others = 0
    task_dir = f"/proc/{pid}/task"
    main_tid = str(os.getpid()) if pid == "self" else str(pid)
    for thread in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{thread}/schedstat") as file:
                ns = int(file.read().split()[0])
        except OSError:
            continue  # the thread ended meanwhile
        if thread == main_tid:
            main += ns
        else:
            others += ns
    return main, others


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


def run_loader(root: str, workers: int, warmup: int, samples: int, gated: bool = False) -> dict:
    """One loader run in this process: rates and CPU per batch over the timed samples. ``gated``:
    after the warm-up, say ``READY`` and wait for a line on stdin before timing, so that runs side
    by side time the same moments."""
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
    if gated:
        print(READY, flush=True)
        sys.stdin.readline()
    workers_pids = child_pids(os.getpid())
    main_before = cpu_ns("self")
    workers_before = [thread_cpu_ns(pid) for pid in workers_pids]
    start = time.perf_counter()
    timed = batches = 0
    while timed < samples:
        timed += len(next(iterator).text)
        batches += 1
    end = time.perf_counter()
    seconds = end - start
    main_cpu = cpu_ns("self") - main_before
    workers_after = [thread_cpu_ns(pid) for pid in workers_pids]
    workers_pipeline_cpu = sum(a[0] - b[0] for a, b in zip(workers_after, workers_before))
    workers_cpu = workers_pipeline_cpu + sum(
        a[1] - b[1] for a, b in zip(workers_after, workers_before)
    )
    return {
        "workers": workers,
        "first_batch_seconds": first_batch_seconds,
        "samples_per_second": timed / seconds,
        "main_cpu_us_per_batch": main_cpu / 1e3 / batches,
        "workers_cpu_us_per_batch": workers_cpu / 1e3 / batches,
        # the workers' main threads only: their pipelines, without the feeder threads' sending
        "workers_pipeline_cpu_us_per_batch": workers_pipeline_cpu / 1e3 / batches,
        "timed_samples": timed,
        "timed_from": start,  # perf_counter is system-wide on Linux: comparable across processes
        "timed_to": end,
    }


def run_in_subprocess(root: str, workers: int, warmup: int, samples: int) -> dict:
    """One loader run in a fresh process (``root``: the workloads' root)."""
    return run_side_by_side(root, workers, warmup, samples, copies=1)[0]


def run_side_by_side(root: str, workers: int, warmup: int, samples: int, copies: int) -> list:
    """``copies`` loader runs, each in its own fresh process, timed from the same moment."""
    command = [sys.executable, os.path.abspath(__file__), "--root", root, "--child", str(workers)]
    command += ["--warmup", str(warmup), "--samples", str(samples)]
    if copies > 1:
        command.append("--gated")
    children = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(copies)
    ]
    if copies > 1:
        for child in children:  # all warmed up ...
            if child.stdout.readline().strip() != READY:
                raise RuntimeError(f"loader run failed before timing:\n{child.stderr.read()}")
        for child in children:  # ... then all go
            child.stdin.write("go\n")
            child.stdin.flush()
    results = []
    for child in children:
        output, errors = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"loader run with {workers} workers failed:\n{errors}")
        line = next(line for line in output.splitlines() if line.startswith(RESULT_PREFIX))
        results.append(json.loads(line[len(RESULT_PREFIX) :]))
    return results


def side_by_side_row(results: list[dict]) -> dict:
    """Runs side by side as one row: all their samples over the time from the first start to the
    last end; their CPU per batch averages."""
    seconds = max(r["timed_to"] for r in results) - min(r["timed_from"] for r in results)
    return {
        "workers": SIDE_BY_SIDE,
        "first_batch_seconds": max(r["first_batch_seconds"] for r in results),
        "samples_per_second": sum(r["timed_samples"] for r in results) / seconds,
        "main_cpu_us_per_batch": statistics.mean(r["main_cpu_us_per_batch"] for r in results),
        "workers_cpu_us_per_batch": 0.0,
        "workers_pipeline_cpu_us_per_batch": 0.0,
    }


def cpu_bound_rate(workers: int, main_cpu_us: float, workers_cpu_us: float) -> float:
    """The rate if the CPU time per batch were all that counted: one core without workers, the
    main process and the workers sharing two cores with them (what a quiet 2-core machine allows)."""
    cores = 1 if workers == 0 else 2 if workers == SIDE_BY_SIDE else min(2, workers + 1)
    return cores * BATCH_SIZE * 1e6 / (main_cpu_us + workers_cpu_us)


def median_of(rows: list[dict], workers: int | str, field: str) -> float:
    return statistics.median(row[field] for row in rows if row["workers"] == workers)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="where the workloads live")
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration (median)")
    parser.add_argument("--warmup", type=int, default=320, help="samples before timing")
    parser.add_argument("--samples", type=int, default=60_000, help="timed samples per run")
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument(
        "--no-side-by-side",
        action="store_true",
        help="skip the two 0-worker loaders at once (the ceiling of any 2-worker design)",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gated", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    workload = ensure_workload("text", args.root)
    if args.child is not None:
        result = run_loader(workload.path, args.child, args.warmup, args.samples, args.gated)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    if not os.path.exists(os.path.join(workload.path, ".nv-meta", "dataset.yaml")):
        from bench_loader import prepare_workload

        prepare_workload(workload)
    print(machine_summary())
    worker_counts: list[int | str] = [int(w) for w in args.workers.split(",")]
    if not args.no_side_by_side:
        worker_counts.append(SIDE_BY_SIDE)
    rows = []
    raws: dict[int, list[float]] = {1: [], 2: []}
    for run in range(args.runs):
        for workers in worker_counts:  # alternate, so that background load hits all alike
            if workers == SIDE_BY_SIDE:
                both = run_side_by_side(args.root, 0, args.warmup, args.samples, copies=2)
                rows.append({"run": run, **side_by_side_row(both)})
            else:
                result = run_in_subprocess(args.root, workers, args.warmup, args.samples)
                rows.append({"run": run, **result})
        for raw in measure_text(workload, args.samples, (1, 2), [TEXT_DECODE]):
            raws[raw.processes].append(raw.samples_per_second)
    print_markdown_table(
        (
            "run",
            "workers",
            "TTFB s",
            "samples/s",
            "main CPU us/batch",
            "workers CPU us/batch",
            "of which their main threads",
        ),
        [
            (
                r["run"],
                r["workers"],
                r["first_batch_seconds"],
                r["samples_per_second"],
                r["main_cpu_us_per_batch"],
                r["workers_cpu_us_per_batch"],
                r["workers_pipeline_cpu_us_per_batch"],
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
                rate / (raw1 if workers == 0 else raw2),  # 2 x 0 uses two processes
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
        print_pipeline_bound(rows)
    if 0 in worker_counts and SIDE_BY_SIDE in worker_counts:
        print_transfer_budget(rows)


def print_pipeline_bound(rows: list[dict]) -> None:
    """What 2 workers would reach if sending their batches cost nothing: two cores over the CPU
    per batch of the workers' main threads (their pipelines), against the 0-worker loader of the
    same round."""
    alone = [r for r in rows if r["workers"] == 0]
    with_workers = [r for r in rows if r["workers"] == 2]
    bounds = [
        2 * a["main_cpu_us_per_batch"] / b["workers_pipeline_cpu_us_per_batch"]
        for a, b in zip(alone, with_workers)
    ]
    median = (
        2
        * median_of(rows, 0, "main_cpu_us_per_batch")
        / median_of(rows, 2, "workers_pipeline_cpu_us_per_batch")
    )
    print(
        "2 workers if the transfer were free (2 x 0-worker CPU per batch / the workers' main"
        f" threads' CPU per batch): {median:.2f}x at the medians; per run"
        f" {', '.join(f'{x:.2f}x' for x in bounds)}"
    )


def print_transfer_budget(rows: list[dict]) -> None:
    """How far two independent pipelines get, and what that leaves for the transfer at 1.7x."""
    alone = median_of(rows, 0, "main_cpu_us_per_batch")
    side_by_side = median_of(rows, SIDE_BY_SIDE, "main_cpu_us_per_batch")
    ceiling = median_of(rows, SIDE_BY_SIDE, "samples_per_second") / median_of(
        rows, 0, "samples_per_second"
    )
    budget = 2 * alone / 1.7 - side_by_side
    print(
        f"\n2 x 0 (two 0-worker loaders at once, nothing sent between processes): {ceiling:.2f}x"
        f" the 0-worker rate; each pipeline costs {side_by_side:,.0f} us of CPU per batch next to"
        f" the other ({alone:,.0f} alone). For 2 workers to reach 1.7x on two cores, everything"
        f" the transfer adds (workers and main process together) must fit in {budget:,.0f} us per"
        " batch."
    )


if __name__ == "__main__":
    main()
