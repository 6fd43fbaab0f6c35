"""The straggler bound of balanced windows, measured over many windows of synthetic costs.

    python tools/benchmarks/bench_balance_bound.py --windows 100

For each cost family (log-normal and Pareto: heavy-tailed; bimodal: images among short texts;
uniform) and window shape (ranks x steps x samples per rank and step), ``--windows`` windows of
random costs are composed with ``energon.balance.compose_steps`` and each step's straggler ratio
(heaviest rank over the mean) is measured. Reported: how many windows can level their ranks
(``energon.balance.bound.can_level``), how many of their steps are above 1.05 (the bound says
none), the worst step of the other windows, how many steps leave a rank without a sample, and the
CPU time of composing per sample. Run it with another tree first on ``PYTHONPATH`` to compare
releases (a tree without ``energon.balance.bound`` is measured with the same condition).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if not any(os.path.isdir(os.path.join(p, "energon")) for p in sys.path if p):
    sys.path.insert(0, _REPO_ROOT)  # a checkout without energon installed

from energon.balance.assign import compose_steps, straggler_ratio  # noqa: E402

try:
    from energon.balance.bound import can_level
except ImportError:  # a tree from before the bound: the same condition, written out

    def can_level(costs, num_ranks, num_steps):
        light = sum(costs) / (num_ranks * num_steps * 10)
        return sum(c for c in costs if c <= light) >= (num_ranks - 1) * max(costs)


def costs_of(family: str, n: int, rng: random.Random) -> list[float]:
    if family == "log-normal":
        return [rng.lognormvariate(6, 1.2) for _ in range(n)]
    if family == "Pareto":
        return [100 * rng.paretovariate(1.2) for _ in range(n)]
    if family == "bimodal":
        return [
            rng.uniform(3000, 6000) if rng.random() < 0.3 else rng.uniform(50, 150)
            for _ in range(n)
        ]
    return [rng.uniform(1, 1000) for _ in range(n)]


SHAPES = [(4, 8, 4), (4, 8, 8), (8, 8, 16), (4, 1, 16), (2, 4, 8), (64, 8, 16)]


def measure(family: str, shape: tuple[int, int, int], windows: int) -> tuple:
    ranks, steps, per_rank = shape
    level = over = empty = 0
    worst_level = worst_other = 1.0
    cpu = 0.0
    for seed in range(windows):
        costs = costs_of(family, ranks * steps * per_rank, random.Random(seed))
        start = time.process_time()
        composed = compose_steps(costs, ranks, steps)
        cpu += time.process_time() - start
        ratios = [straggler_ratio([sum(costs[i] for i in s) for s in step]) for step in composed]
        empty += sum(any(not share for share in step) for step in composed)
        if can_level(costs, ranks, steps):
            level += 1
            over += sum(r > 1.05 for r in ratios)
            worst_level = max(worst_level, max(ratios))
        else:
            worst_other = max(worst_other, max(ratios))
    per_sample = 1e6 * cpu / (windows * ranks * steps * per_rank)
    return (
        family,
        f"{ranks} x {steps} x {per_rank}",
        f"{level} of {windows}",
        f"{over} (worst {worst_level:.3f})",
        f"{worst_other:.3f}" if level < windows else "-",
        empty,
        f"{per_sample:.1f}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=100)
    args = parser.parse_args()
    print(
        f"load average {os.getloadavg()[0]:.1f}; compose_steps from {sys.modules['energon'].__file__}"
    )
    rows = [
        measure(family, shape, args.windows)
        for family in ("log-normal", "Pareto", "bimodal", "uniform")
        for shape in SHAPES
    ]
    header = (
        "costs",
        "ranks x steps x samples",
        "windows that can level",
        "their steps > 1.05",
        "worst step, other windows",
        "steps with an empty rank",
        "CPU µs per sample",
    )
    print("| " + " | ".join(header) + " |")
    print("| --- | --- |" + " --: |" * (len(header) - 2))
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
