"""How the balanced composition of one window grows with the number of ranks:
``python tools/benchmarks/bench_compose_ranks.py --ranks 8,64,512,4096``.

Every rank runs :func:`energon.balance.assign.compose_steps` on the whole window (all ranks'
samples) to find its own share, so its CPU per step is the composition's cost divided by the
window's steps. Synthetic log-normal costs, ``--batch`` samples per rank and step, ``--steps``
steps per window; CPU time (``time.process_time``, the best of ``--repeat`` runs) with the load
average. The last columns compare with the first rank count of ``--ranks``: per step (what a
rank spends) and per sample (how far the composition is from linear in the window).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from energon.balance.assign import compose_steps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,64,512")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(
        "| ranks | CPU-s per window | ms per step, on every rank | x first | us per sample | x first | load |"
    )
    print("| --: | --: | --: | --: | --: | --: | --: |")
    first: tuple[float, float] | None = None
    for ranks in [int(r) for r in args.ranks.split(",")]:
        costs = rng.lognormal(0, 1, size=ranks * args.batch * args.steps).tolist()
        spent = min(timed_compose(costs, ranks, args.steps) for _ in range(args.repeat))
        per_step, per_sample = spent / args.steps, spent / len(costs)
        first = first or (per_step, per_sample)
        print(
            f"| {ranks} | {spent:.3f} | {per_step * 1e3:.2f} | {per_step / first[0]:.0f} | "
            f"{per_sample * 1e6:.2f} | {per_sample / first[1]:.2f} | {os.getloadavg()[0]:.1f} |",
            flush=True,
        )


def timed_compose(costs: list[float], ranks: int, steps: int) -> float:
    """CPU seconds of one composition of the window."""
    start = time.process_time()
    compose_steps(costs, ranks, steps)
    return time.process_time() - start


if __name__ == "__main__":
    main()
