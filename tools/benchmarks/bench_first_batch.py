"""Time to the first batch, energon against the reference: ``python tools/benchmarks/bench_first_batch.py``.

The workloads of ``bench_loader.py`` (captioning: 20,000 JPEGs with captions in 40 shards; text:
200,000 texts in 20 shards), prepared the same way, loaded as a training script would
(``get_train_dataset(path, batch_size=32, shuffle_buffer_size=100, max_samples_per_sequence=100,
worker_config=WorkerConfig(rank=0, world_size=1, num_workers=N))`` + ``get_loader``) with 0 and 2
workers. Every measurement is a fresh process: ``import torch`` and ``import energon`` (or
``megatron.energon``) are timed apart and not counted; reported is the build of the dataset plus
the first ``next()`` of the loader. The two tools alternate within each round on the same files
(``--rounds``, median reported, every value listed), so both see the same load; the load average
is printed with each line. The reference (Megatron-Energon 7.4.1 in ``.cache/ref-venv``) runs as a
black box.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import _REPO_ROOT, ensure_workload, machine_summary, print_markdown_table  # noqa: E402
from bench_loader import prepare_workload  # noqa: E402

REF_PYTHON = os.path.join(_REPO_ROOT, ".cache", "ref-venv", "bin", "python")

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    tool, path, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if tool == "energon":
        from energon import WorkerConfig, get_loader, get_train_dataset
    else:
        from megatron.energon import WorkerConfig, get_loader, get_train_dataset
    t0 = time.perf_counter()
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = get_train_dataset(path, worker_config=wc, batch_size=32, shuffle_buffer_size=100,
                           max_samples_per_sequence=100)
    t1 = time.perf_counter()
    batch = next(iter(get_loader(ds)))
    t2 = time.perf_counter()
    keys = batch.__key__ if hasattr(batch, "__key__") else batch["__key__"]
    print(json.dumps({"build": t1 - t0, "first": t2 - t1, "size": len(keys)}))
    sys.stdout.flush()
    os._exit(0)
    """
)


def measure(tool: str, path: str, workers: int, timeout: float) -> dict:
    """One fresh process of ``tool``: build and first-batch seconds."""
    env = dict(os.environ)
    python = REF_PYTHON if tool == "reference" else sys.executable
    if tool == "energon":
        env["PYTHONPATH"] = _REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [python, "-c", CHILD, tool, path, str(workers)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tool} on {path} with {workers} workers:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["size"] == 32, result
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="bench_data", help="workload cache directory")
    parser.add_argument("--workload", default="captioning,text")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if not os.path.exists(REF_PYTHON):
        sys.exit(f"the reference's venv is missing: {REF_PYTHON} (tests/helpers/ref_venv.py)")
    print(machine_summary(), flush=True)
    rows = []
    for name in args.workload.split(","):
        workload = ensure_workload(name, args.root)
        prepare_workload(workload)
        for workers in [int(w) for w in args.workers.split(",")]:
            times: dict[str, list[float]] = {"energon": [], "reference": []}
            for _ in range(args.rounds):
                for tool in times:
                    result = measure(tool, workload.path, workers, args.timeout)
                    times[tool].append(result["build"] + result["first"])
                    print(
                        f"{name} {workers} workers {tool}: build {result['build']:.3f} s, "
                        f"first batch {result['first']:.3f} s "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
            energon, reference = (statistics.median(times[t]) for t in ("energon", "reference"))
            rows.append(
                [
                    name,
                    workers,
                    f"{energon:.3f} ({' / '.join(f'{t:.3f}' for t in times['energon'])})",
                    f"{reference:.3f} ({' / '.join(f'{t:.3f}' for t in times['reference'])})",
                    f"{energon / reference:.2f}",
                ]
            )
    print(machine_summary(), flush=True)
    print_markdown_table(
        ["workload", "workers", "energon s", "reference s", "energon / reference"], rows
    )


if __name__ == "__main__":
    main()
