"""How close ``energon simulate --measure``'s one-worker estimate comes to a real loader with one
worker, on a benchmark workload (docs/benchmarks.md, "Observability").

    python tools/benchmarks/bench_measure.py --workload text --root bench_data
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))

from bench_common import DEFAULT_ROOT, ensure_workload  # noqa: E402
from bench_observe import loader_rate  # noqa: E402

from energon.preflight.measure import measure  # noqa: E402
from energon.preflight.simulate import SimulationSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="text")
    parser.add_argument("--root", default=DEFAULT_ROOT, help="workload cache directory")
    parser.add_argument("--samples", default="256,1024", help="sizes of the measured sample")
    parser.add_argument("--batches", type=int, default=100, help="batches of the real loader")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = ensure_workload(args.workload, args.root, progress=False).path
    settings = SimulationSettings(world_size=1, num_workers=1, batch_size=32)
    sizes = [int(n) for n in args.samples.split(",")]
    estimates: dict[int, list[float]] = {n: [] for n in sizes}
    reals: list[float] = []
    for _ in range(args.repeats):  # alternate, so that both see the same load
        for n in sizes:
            estimates[n].append(measure(path, settings, samples=n).samples_per_second_per_worker)
        reals.append(loader_rate(path, stats=True, batches=args.batches, batch_size=32, workers=1))
    real = statistics.median(reals)
    print(f"real loader, 1 worker: {real:.0f} samples/s (median of {args.repeats})")
    for n in sizes:
        estimate = statistics.median(estimates[n])
        print(
            f"estimate from {n} samples: {estimate:.0f} samples/s, estimate / real {estimate / real:.2f}"
        )


if __name__ == "__main__":
    main()
