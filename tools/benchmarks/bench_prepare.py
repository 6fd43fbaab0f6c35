"""Preparation benchmark: energon's ``prepare_dataset()``, the ``energon prepare`` CLI and the
reference's ``energon prepare`` CLI on the same shards, in the same run, alternating.

    python tools/benchmarks/bench_prepare.py [--workloads text,captioning] [--rounds 3]

Each method prepares hard links of the workload's shards in a scratch folder (next to the
workload, so the links share its file system), so the workload's own index is never touched.
Before every timed run the scratch folder's ``.nv-meta`` and ``.tar.idx`` files are removed, so
each method does the full work. The methods take turns in an order that rotates every round, which
spreads a busy neighbour's load over all of them; the table reports medians and the range.
The reference is run as a black box (its console script, non-interactive flags).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    _REPO_ROOT,
    DEFAULT_ROOT,
    Timer,
    Workload,
    ensure_workload,
    machine_summary,
    print_markdown_table,
)

from energon.prepare.dataset import prepare_dataset  # noqa: E402

# Flags that make both CLIs run without a question: one "train" split with every shard, no
# dataset.yaml (asking for a sample type is interactive), overwrite without asking.
CLI_FLAGS = [
    "--non-interactive",
    "--no-progress",
    "--split-ratio",
    "1,0,0",
    "--force-overwrite",
    "--skip-dataset-yaml",
]
DEFAULT_REFERENCE_CLI = os.path.join(_REPO_ROOT, ".cache", "ref-venv", "bin", "energon")


@dataclass
class MethodTimes:
    """The seconds of every round of one method, and the load average before each."""

    name: str
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def spread(self) -> str:
        return f"{min(self.seconds):.2f}-{max(self.seconds):.2f}"


def link_shards(workload: Workload, scratch: str) -> None:
    """Hard-link the shards (not their .tar.idx) so a method's index lands in ``scratch`` only."""
    for shard in workload.shards:
        target = os.path.join(scratch, shard)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(os.path.join(workload.path, shard), target)


def clear_preparation(scratch: str) -> None:
    """Remove what any method wrote, so the next one starts from bare shards."""
    shutil.rmtree(os.path.join(scratch, ".nv-meta"), ignore_errors=True)
    for index in glob.glob(os.path.join(scratch, "**", "*.tar.idx"), recursive=True):
        os.remove(index)


def warm_page_cache(workload: Workload) -> None:
    """Read every shard once: all methods then find the bytes in memory, not only the first."""
    for path in workload.shard_paths:
        with open(path, "rb") as shard:
            while shard.read(16 * 1024 * 1024):
                pass


def run_cli(command: list[str]) -> None:
    """Run a CLI with no input (stdin closed: a question fails instead of hanging)."""
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )


def check_prepared(scratch: str, method: str) -> None:
    """A method that wrote nothing would look fast: every run must leave an index behind."""
    if not os.path.exists(os.path.join(scratch, ".nv-meta", "index.sqlite")):
        raise RuntimeError(f"{method} left no .nv-meta/index.sqlite in {scratch}")


def methods_for(
    scratch: str, energon_cli: str, reference_cli: str
) -> dict[str, Callable[[], None]]:
    """The three ways to prepare ``scratch``, by the name the table shows."""
    return {
        "energon prepare_dataset()": lambda: prepare_dataset(
            scratch, split_parts_ratio=[("train", 1.0)], progress=False
        ),
        "energon CLI": lambda: run_cli([energon_cli, "prepare", *CLI_FLAGS, scratch]),
        "reference CLI": lambda: run_cli([reference_cli, "prepare", *CLI_FLAGS, scratch]),
    }


def bench_workload(
    workload: Workload, rounds: int, energon_cli: str, reference_cli: str
) -> tuple[list[MethodTimes], list[float]]:
    """Time every method ``rounds`` times on one scratch copy; returns times and load averages."""
    scratch = tempfile.mkdtemp(prefix=".prepare-bench-", dir=os.path.dirname(workload.path))
    try:
        link_shards(workload, scratch)
        warm_page_cache(workload)
        methods = methods_for(scratch, energon_cli, reference_cli)
        times = {name: MethodTimes(name) for name in methods}
        loads = []
        names = list(methods)
        for round_index in range(rounds):
            loads.append(os.getloadavg()[0])
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            for name in order:
                clear_preparation(scratch)
                with Timer() as timer:
                    methods[name]()
                check_prepared(scratch, name)
                times[name].seconds.append(timer.seconds)
                print(f"  {workload.name} round {round_index + 1} {name}: {timer.seconds:.2f} s")
        return list(times.values()), loads
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def table_row(workload: Workload, times: list[MethodTimes], loads: list[float]) -> list[object]:
    library, cli, reference = times
    return [
        f"{workload.spec.num_shards} shards x {workload.spec.num_samples:,} {workload.kind}",
        f"{library.median:.2f} ({library.spread()})",
        f"{cli.median:.2f} ({cli.spread()})",
        f"{reference.median:.2f} ({reference.spread()})",
        round(reference.median / library.median, 1),
        round(reference.median / cli.median, 1),
        f"{min(loads):.2f}-{max(loads):.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="text,captioning")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", default=DEFAULT_ROOT, help="workload cache directory")
    parser.add_argument(
        "--energon-cli", default=os.path.join(os.path.dirname(sys.executable), "energon")
    )
    parser.add_argument("--reference-cli", default=DEFAULT_REFERENCE_CLI)
    args = parser.parse_args()
    rows = []
    for name in args.workloads.split(","):
        workload = ensure_workload(name, args.root)
        times, loads = bench_workload(workload, args.rounds, args.energon_cli, args.reference_cli)
        rows.append(table_row(workload, times, loads))
    print(machine_summary())
    print(f"median of {args.rounds} rounds (min-max), seconds; CLI flags: {' '.join(CLI_FLAGS)}")
    print_markdown_table(
        (
            "data",
            "energon prepare_dataset() s",
            "energon CLI s",
            "reference CLI s",
            "reference / library",
            "reference / energon CLI",
            "load avg (1 min) at round start",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
