"""How the balanced composition of one window grows with the number of ranks:
``python tools/benchmarks/bench_compose_ranks.py --ranks 8,64,512``.

Every rank runs :func:`energon.balance.assign.compose_steps` on the whole window (all ranks'
samples) to find its own share, so its CPU per step is the composition's cost divided by the
window's steps. Synthetic log-normal costs, ``--batch`` samples per rank and step, ``--steps``
steps per window; CPU time (``time.process_time``) with the load average.
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
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for ranks in [int(r) for r in args.ranks.split(",")]:
        costs = rng.lognormal(0, 1, size=ranks * args.batch * args.steps).tolist()
        start = time.process_time()
        compose_steps(costs, ranks, args.steps)
        spent = time.process_time() - start
        print(
            f"{ranks} ranks: {spent:.3f} CPU-s per window, {spent / args.steps * 1e3:.2f} ms per "
            f"step on every rank, {spent / len(costs) * 1e6:.2f} us per sample "
            f"(load {os.getloadavg()[0]:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
