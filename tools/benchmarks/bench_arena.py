"""What the workers' batch-memory budget (``ENERGON_ARENA_MIB_PER_WORKER``) costs and saves.

Captioning with 2 workers through the public API (batch 32, shuffle buffer 100, slices of 100,
default float ``torchrgb``), each run a fresh process, the default budget and a budget so large
that it never binds alternating round by round. Two loops:

* ``free``: the loop takes batches as fast as the loader makes them (the issue harness's loop);
* ``step``: after each batch the loop sleeps for a training step of random length (uniform in
  0..2x ``--step-ms``; a sleep leaves the CPUs to the workers, as a GPU step does). With bounded
  prefetch the question is whether a long step followed by short ones starves the loop.

Reported per budget: batches/s (median of the rounds), the share of the loop's time spent waiting
for data and peak PSS of main + workers (sampled from ``/proc`` every 0.25 s).

    python tools/benchmarks/bench_arena.py [--root bench_data] [--rounds 3] [--batches 120]
                                           [--step-ms 60] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    DEFAULT_ROOT,
    PeakMemoryProbe,
    ensure_workload,
    machine_summary,
    markdown_table,
    mib,
    write_docs_section,
)
from bench_loader import prepare_workload  # noqa: E402

SECTION = "Workers' batch memory"
RESULT_PREFIX = "BENCH_ARENA "
DEFAULT_BUDGET_MIB = 256
UNBOUNDED_MIB = 1 << 16  # more than 8 blocks of any batch: the budget never binds
WARMUP_BATCHES = 10


def run_loop(root: str, batches: int, step_ms: float) -> dict[str, float]:
    """One loop in this process (the budget comes from the environment)."""
    from energon import WorkerConfig, get_loader, get_train_dataset

    rng = random.Random(0)  # the same steps for every budget
    with PeakMemoryProbe(interval_seconds=0.25, pss_interval_seconds=0.25) as probe:
        dataset = get_train_dataset(
            root,
            batch_size=32,
            shuffle_buffer_size=100,
            max_samples_per_sequence=100,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        )
        iterator = iter(get_loader(dataset))
        for _ in range(WARMUP_BATCHES):
            next(iterator)
        waited = 0.0
        began = time.perf_counter()
        for _ in range(batches):
            asked = time.perf_counter()
            batch = next(iterator)
            waited += time.perf_counter() - asked
            if step_ms:
                time.sleep(rng.uniform(0, 2 * step_ms) / 1000)
            del batch
        seconds = time.perf_counter() - began
    return {
        "batches_per_second": batches / seconds,
        "waited_fraction": waited / seconds,
        "peak_pss_mib": mib(probe.peak_pss_total),
    }


def run_in_subprocess(args: argparse.Namespace, budget_mib: int, step_ms: float) -> dict:
    env = dict(os.environ, ENERGON_ARENA_MIB_PER_WORKER=str(budget_mib))
    command = [sys.executable, os.path.abspath(__file__), "--run-one", "--root", args.root]
    command += ["--batches", str(args.batches), "--step-ms", str(step_ms)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise RuntimeError(f"run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="workload cache directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=120, help="timed batches per run")
    parser.add_argument("--step-ms", type=float, default=60, help="mean training step (ms)")
    parser.add_argument("--write-docs", action="store_true", help="refresh docs/benchmarks.md")
    parser.add_argument("--run-one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workload = ensure_workload("captioning", args.root, progress=not args.run_one)
    if args.run_one:
        result = run_loop(workload.path, args.batches, args.step_ms)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    prepare_workload(workload)
    loads = [machine_summary()]
    budgets = (DEFAULT_BUDGET_MIB, UNBOUNDED_MIB)
    loops = (("free", 0.0), ("step", args.step_ms))
    results: dict[tuple[str, int], list[dict]] = {
        (loop, budget): [] for loop, _ in loops for budget in budgets
    }
    for round_index in range(args.rounds):
        for loop, step_ms in loops:
            for budget in budgets:
                result = run_in_subprocess(args, budget, step_ms)
                results[loop, budget].append(result)
                print(f"# round {round_index + 1} {loop} budget {budget} MiB: {result}", flush=True)
        loads.append(machine_summary())
    rows = []
    for loop, step_ms in loops:
        for budget in budgets:
            runs = results[loop, budget]
            rates = [r["batches_per_second"] for r in runs]
            rows.append(
                (
                    loop if not step_ms else f"step {step_ms:.0f} ms (0-{2 * step_ms:.0f})",
                    "default (256)" if budget == DEFAULT_BUDGET_MIB else "unbounded",
                    f"{statistics.median(rates):.2f} ({' / '.join(f'{x:.2f}' for x in rates)})",
                    f"{statistics.median(r['waited_fraction'] for r in runs):.0%}",
                    f"{max(r['peak_pss_mib'] for r in runs):,.0f}",
                )
            )
    headers = ("loop", "budget MiB per worker", "batches/s (median; runs)", "loop waiting")
    headers += ("peak PSS main + workers MiB",)
    text = "\n".join(
        [
            f"Command: `python tools/benchmarks/bench_arena.py --rounds {args.rounds} --batches "
            f"{args.batches} --step-ms {args.step_ms:g}` (machine: {'; '.join(loads)}).",
            "",
            markdown_table(headers, rows),
        ]
    )
    print(text)
    if args.write_docs:
        write_docs_section(
            SECTION, __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0] + "\n\n" + text
        )


if __name__ == "__main__":
    main()
