"""Time-bounded loader runs in fresh processes, with the CPU of the main process and of its workers:
the shared part of bench_worker_scaling.py and bench_gpu_decode.py (runs on machines lent for a
few minutes, where each measurement must fit a wall-clock budget known in advance).

A run iterates ``get_loader(get_train_dataset(...))`` as a training loop does, takes batches for
``warm_seconds`` after the first one (worker start, first buffers), then counts samples for
``seconds``. CPU time comes from ``/proc/<pid>/task/*/schedstat`` of every thread of the main
process and of its descendants (the workers), read right before and after the timed part.

Results go to a JSON file section by section (:func:`record`), each measurement as soon as it is
done, under a file lock, so that a run stopped half-way keeps what it measured.

``python tools/benchmarks/bench_timed.py --make captioning|text PATH --samples N --shards S``
writes and prepares a workload (energon.demo's generators, as bench_common's workloads).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from bench_common import process_tree  # noqa: E402  (stdlib only: energon.demo loads lazily)

RESULT_PREFIX = "BENCH_TIMED_RESULT "
BATCH_SIZE = 32
DATASET_YAML = {
    "captioning": "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
    "field_map:\n  image: jpg\n  caption: txt\n",
    "text": "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n"
    "field_map:\n  text: txt\n",
}


def stamp(message: str) -> None:
    """A progress line with the UTC time (the device runs are budgeted by the clock)."""
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {message}", flush=True)


# -- data ------------------------------------------------------------------------------------------


def make_dataset(kind: str, path: str, samples: int, shards: int, processes: int) -> float:
    """Write and prepare a captioning or text workload at ``path``; returns seconds taken."""
    from energon.demo import write_captioning_shards, write_text_shards
    from energon.prepare.dataset import prepare_dataset

    started = time.perf_counter()
    writer = write_captioning_shards if kind == "captioning" else write_text_shards
    writer(path, num_samples=samples, num_shards=shards, processes=processes)
    prepare_dataset(
        path, split_parts_ratio=[("train", 1.0), ("val", 0), ("test", 0)], progress=False
    )
    with open(os.path.join(path, ".nv-meta", "dataset.yaml"), "w") as file:
        file.write(DATASET_YAML[kind])
    return time.perf_counter() - started


# -- CPU accounting --------------------------------------------------------------------------------


def process_cpu_ns(pid: int) -> int:
    """CPU time (ns) of all live threads of ``pid`` so far (0 if it is gone)."""
    total = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat") as file:
                total += int(file.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def cpu_snapshot() -> tuple[int, dict[int, int]]:
    """(this process's CPU ns, {descendant pid: CPU ns})."""
    return process_cpu_ns(os.getpid()), {p: process_cpu_ns(p) for p in process_tree()[1:]}


# -- one timed run ---------------------------------------------------------------------------------


def timed_run(
    batches: Iterator[Any],
    count: Callable[[Any], int],
    warm_seconds: float,
    seconds: float,
    use: Callable[[Any], None] = lambda batch: None,
    finish: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Iterate ``batches`` (``use`` each), warm up, then time ``seconds``; ``finish`` runs before
    the clock stops (e.g. a CUDA synchronize)."""
    started = time.perf_counter()
    first = next(batches)
    use(first)
    first_batch_seconds = time.perf_counter() - started
    warm_until = time.perf_counter() + warm_seconds
    while time.perf_counter() < warm_until:
        use(next(batches))
    finish()
    main_before, workers_before = cpu_snapshot()
    start = time.perf_counter()
    samples = batches_seen = 0
    while time.perf_counter() - start < seconds:
        batch = next(batches)
        use(batch)
        samples += count(batch)
        batches_seen += 1
    finish()
    wall = time.perf_counter() - start
    main_after, workers_after = cpu_snapshot()
    main_cpu = (main_after - main_before) / 1e9
    workers_cpu = sum(ns - workers_before.get(pid, 0) for pid, ns in workers_after.items()) / 1e9
    total_cpu = main_cpu + workers_cpu
    return {
        "first_batch_s": round(first_batch_seconds, 3),
        "timed_s": round(wall, 3),
        "samples": samples,
        "batches": batches_seen,
        "samples_per_s": round(samples / wall, 1),
        "cpu_ms_per_sample": round(1e3 * total_cpu / max(samples, 1), 4),
        "main_cpu_ms_per_sample": round(1e3 * main_cpu / max(samples, 1), 4),
        "main_cpu_share": round(main_cpu / total_cpu, 4) if total_cpu else None,
        "main_cores_busy": round(main_cpu / wall, 3),  # 1.0: the main process is a full core
        "workers_cores_busy": round(workers_cpu / wall, 3),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def run_child(
    script: str, spec: dict[str, Any], timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script --child JSON`` in a fresh process (``env``: extra environment variables);
    its result (or the error) as a dict."""
    command = [sys.executable, script, "--child", json.dumps(spec)]
    # its own process group: a run stopped on time takes its loader's workers with it
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {**spec, "error": f"stopped after {timeout:.0f} s"}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return {**spec, **json.loads(line[len(RESULT_PREFIX) :])}
    tail = (stderr or stdout).strip().splitlines()[-6:]
    return {**spec, "error": f"exit {child.returncode}: " + " | ".join(tail)}


def run_child_in_time(
    script: str,
    spec: dict[str, Any],
    deadline: float | None,
    start_cost: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """:func:`run_child` if the time left before ``deadline`` covers the run (``spec``'s warm and
    timed seconds plus ``start_cost``), stopped at 4x that; else a row saying it was skipped."""
    needed = spec["seconds"] + spec["warm"] + start_cost
    left = time_left(deadline)
    if left < needed:
        return {**spec, "error": f"skipped: {left:.0f} s left, a run needs ~{needed:.0f}"}
    return run_child(script, spec, timeout=min(left, 4 * needed), env=env)


def print_result(result: dict[str, Any]) -> None:
    """What a child prints for :func:`run_child`."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# -- results ---------------------------------------------------------------------------------------


def record(path: str | None, section: str, value: Any) -> None:
    """Set ``section`` of the JSON file at ``path`` to ``value`` (read, update, atomic rename),
    under a lock, so that concurrent writers keep each other's sections."""
    if not path:
        return
    lock_path = os.path.join(tempfile.gettempdir(), os.path.basename(path) + ".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as file:
                data = json.load(file)
        except (OSError, ValueError):
            data = {}
        data[section] = value
        with open(path + ".tmp", "w") as file:
            json.dump(data, file, indent=1)
        os.replace(path + ".tmp", path)


def time_left(deadline: float | None) -> float:
    """Seconds until ``deadline`` (a time.time() value; None: unbounded)."""
    return float("inf") if deadline is None else deadline - time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make", nargs=2, metavar=("KIND", "PATH"), required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--processes", type=int, default=None)
    args = parser.parse_args()
    kind, path = args.make
    seconds = make_dataset(kind, path, args.samples, args.shards, args.processes or args.shards)
    stamp(f"made {kind} at {path}: {args.samples} samples in {seconds:.1f} s")


if __name__ == "__main__":
    main()
