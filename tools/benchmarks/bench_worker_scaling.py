"""Workers on many cores: samples/s with 0, 1, 2, 4, 8, ... workers and the main process's share.

Each worker count runs in a fresh process, the way a training script iterates the loader
(``get_train_dataset(path, batch_size=32, shuffle_buffer_size=100, max_samples_per_sequence=100)``,
default decoding: float32 ``torchrgb`` images), for a fixed time after a warm-up (bench_timed.py).
Reported per run: samples/s, the scaling against linear (``rate(w) / (w * rate(1))``), CPU per
sample, and the main process's CPU (share of the total and how much of one core it keeps busy: at
1.0 the main process is the limit). Where CUDA is available the loader pins each batch in the main
process, as it does for a training loop; that copy is part of the main process's CPU.
``--hide-gpu`` runs with ``CUDA_VISIBLE_DEVICES=""`` (no pinning: what the pinning costs).

A dataset path that holds no prepared dataset is generated there first (``--samples``; the
device script makes bigger ones itself). The results are printed as JSON and as a markdown table.

Usage: python tools/benchmarks/bench_worker_scaling.py --dataset captioning=PATH --dataset text=PATH
           [--workers 0,1,2,4,8,14] [--seconds 2.5] [--warm 1.0] [--json out.json] [--deadline T]
           [--samples captioning=2000,text=60000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_timed import (  # noqa: E402
    BATCH_SIZE,
    make_dataset,
    print_result,
    record,
    run_child_in_time,
    stamp,
    timed_run,
)

START_COST_SECONDS = 6.0  # process start, imports, workers: what a run adds to its timed part


def child(spec: dict[str, Any]) -> None:
    """One run in this (fresh) process."""
    from energon import WorkerConfig, get_loader, get_train_dataset

    dataset = get_train_dataset(
        spec["path"],
        batch_size=BATCH_SIZE,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=spec["workers"]),
    )
    field = "image" if spec["kind"] == "captioning" else "text"
    result = timed_run(
        iter(get_loader(dataset)),
        lambda batch: len(getattr(batch, field)),
        spec["warm"],
        spec["seconds"],
    )
    print_result(result)


def with_scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds ``vs_linear`` = rate / (workers * rate with 1 worker) to each row with workers."""
    one = next((r.get("samples_per_s") for r in rows if r["workers"] == 1), None)
    for row in rows:
        rate = row.get("samples_per_s")
        if one and rate and row["workers"] > 0:
            row["vs_linear"] = round(rate / (row["workers"] * one), 3)
    return rows


def run_workload(args: argparse.Namespace, kind: str, path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for workers in [int(w) for w in args.workers.split(",")]:
        spec = {"kind": kind, "path": path, "workers": workers}
        spec |= {"seconds": args.seconds, "warm": args.warm}
        env = {"CUDA_VISIBLE_DEVICES": ""} if args.hide_gpu else None
        script = os.path.abspath(__file__)
        rows.append(run_child_in_time(script, spec, args.deadline, START_COST_SECONDS, env))
        stamp(f"{kind} {workers} workers: {_brief(rows[-1])}")
        section = f"scaling_{kind}" + ("_gpu_hidden" if args.hide_gpu else "")
        record(args.json, section, with_scaling(rows))
    return rows


def _brief(row: dict[str, Any]) -> str:
    if "error" in row:
        return row["error"]
    return (
        f"{row['samples_per_s']:.0f} samples/s, main {row['main_cores_busy']:.2f} cores "
        f"({100 * (row['main_cpu_share'] or 0):.0f}% of CPU), {row['cpu_ms_per_sample']} ms CPU"
    )


_TABLE_COLUMNS = (
    ("samples_per_s", "samples/s"),
    ("vs_linear", "vs linear"),
    ("cpu_ms_per_sample", "CPU ms/sample"),
    ("main_cpu_ms_per_sample", "main CPU ms/sample"),
    ("main_cpu_share", "main share of CPU"),
    ("main_cores_busy", "main cores busy"),
)


def markdown_table(kind: str, rows: list[dict[str, Any]]) -> str:
    """One row per worker count (the page of docs/benchmarks.md shows this table)."""
    header = "| workload | workers | " + " | ".join(name for _, name in _TABLE_COLUMNS) + " |"
    lines = [header, "| --- | --: |" + " --: |" * len(_TABLE_COLUMNS)]
    for row in rows:
        values = (
            [row.get("error", "")]
            if "error" in row
            else ["" if row.get(key) is None else f"{row[key]:g}" for key, _ in _TABLE_COLUMNS]
        )
        lines.append(f"| {kind} | {row['workers']} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def ensure_dataset(kind: str, path: str, samples: int) -> None:
    """Generate and prepare ``path`` unless a prepared dataset is there."""
    if os.path.exists(os.path.join(path, ".nv-meta", "dataset.yaml")):
        return
    stamp(f"making {samples} {kind} samples in {path}")
    processes = max(1, min(4, (os.cpu_count() or 1) - 1))
    make_dataset(kind, path, samples, shards=max(1, samples // 500), processes=processes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", action="append", default=[], help="KIND=PATH (prepared)")
    parser.add_argument("--workers", default="0,1,2,4,8,14")
    parser.add_argument("--seconds", type=float, default=2.5, help="timed seconds per run")
    parser.add_argument("--warm", type=float, default=1.0, help="warm-up seconds per run")
    parser.add_argument("--hide-gpu", action="store_true", help="CUDA_VISIBLE_DEVICES=''")
    parser.add_argument("--json", default=None, help="record results in this JSON file")
    parser.add_argument("--deadline", type=float, default=None, help="time.time() to stop by")
    parser.add_argument(
        "--samples", default="captioning=2000,text=60000", help="sizes of generated datasets"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    stamp(f"worker scaling on {os.cpu_count()} cores, load {os.getloadavg()}")
    sizes = {k: int(v) for k, _, v in (item.partition("=") for item in args.samples.split(","))}
    tables = []
    for item in args.dataset:
        kind, _, path = item.partition("=")
        if kind not in ("captioning", "text"):
            raise SystemExit(f"--dataset {item!r}: KIND must be captioning or text")
        ensure_dataset(kind, path, sizes.get(kind, 2000))
        rows = with_scaling(run_workload(args, kind, path))
        print(json.dumps(rows))
        tables.append(markdown_table(kind, rows))
    print(f"\n{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} (1 min) at the end\n")
    print("\n\n".join(tables))
    stamp(f"done at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
