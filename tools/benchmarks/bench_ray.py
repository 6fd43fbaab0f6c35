"""Ray actors against local worker processes: the same loader, the same 2 logical streams, run by 2
local workers or by 2 Ray actors on this machine, in alternating rounds.

Per workload (captioning: JPEG + caption; text) and executor, after ``--warmup`` batches (actor
start-up is not counted: it is paid once per loader, and actors are kept between rounds), the
loop takes a fixed number of batches as fast as it can (``--batches``, per workload: long enough
that what the workers made ahead, up to 2 x 2 x 32 batches for the actors, is a small part).
Reported, medians over the rounds:

- ``samples/s`` of each executor and their ratio (Ray / local);
- ``added wall us/batch``: the difference of the wall time per batch (Ray - local);
- ``CPU us/batch``: CPU time per batch of this process (receiving, unpickling, ordering; the Ray
  driver's threads included) and of the whole process tree (this process, the local workers or
  the actors, and Ray's own processes: raylet, GCS, object store), for both executors: the
  difference of the tree's is the CPU that Ray adds per batch;
- ``restart``: one round more in which actor 1 is killed with ``ray.kill`` after half the
  batches: the run's wall time minus the median of the clean Ray rounds (the time lost to one
  actor restart: a new actor process, its imports, and the items the lost actor had made ahead
  and must make again), and the longest wait for one batch in that run.

The cluster is a private one-machine Ray instance (``ray.init(address="local")`` with ``--cpus``
logical CPUs; its processes are this process's descendants, so the tree's CPU includes them)
unless ``--address`` names one. Workloads are generated and prepared before Ray starts. Usage:

    python tools/benchmarks/bench_ray.py [--root bench_data] [--workloads captioning,text]
        [--batches captioning=300,text=3000] [--warmup 20] [--batch-size 32] [--rounds 3]
        [--address ADDR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import DEFAULT_ROOT, ensure_workload, machine_summary, process_tree  # noqa: E402
from bench_loader import prepare_workload  # noqa: E402

from energon import RayWorkers, WorkerConfig, get_savable_loader, get_train_dataset  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def make_loader(path: str, batch_size: int, workers: RayWorkers | None):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=batch_size,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
    )
    loader = get_savable_loader(ds)
    loader.workers = workers
    return loader


def tree_cpu() -> dict[int, float]:
    """CPU seconds (all threads, user + system) of this process and each live descendant."""
    out = {}
    for pid in process_tree():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def timed_run(loader, warmup: int, batches: int, kill_at: int | None = None) -> dict[str, float]:
    """Wall time, CPU time (this process; the tree) and longest wait of ``batches`` batches after
    ``warmup`` ones; with ``kill_at``, actor 1 is killed with ray.kill after that many."""
    import ray

    it = iter(loader)
    for _ in range(warmup):
        next(it)
    longest = 0.0
    tree = tree_cpu()
    wall, cpu = time.perf_counter(), time.process_time()
    last = wall
    for i in range(batches):
        if i == kill_at:
            name = next(w for w in loader.stats()["workers"] if w["worker"] == 1)["actor"]
            ray.kill(ray.get_actor(name.split()[2]))
        next(it)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = tree_cpu()
    return {
        "wall": wall,
        "cpu": cpu,
        "tree": sum(seconds - tree.get(pid, 0.0) for pid, seconds in after.items()),
        "longest": longest,
    }


def one_workload(name: str, batches: int, args: argparse.Namespace) -> list[str]:
    path = os.path.join(args.root, name)
    ray_workers = RayWorkers(num_actors=2, address=args.address, keep_actors=True)
    runs: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    for _ in range(args.rounds):
        for kind in ("local", "ray"):
            loader = make_loader(path, args.batch_size, ray_workers if kind == "ray" else None)
            runs[kind].append(timed_run(loader, args.warmup, batches))
            loader.close()
    killed = make_loader(path, args.batch_size, RayWorkers(num_actors=2, address=args.address))
    restart = timed_run(killed, args.warmup, batches, kill_at=batches // 2)
    losses = killed.worker_losses()
    killed.close()

    def med(kind: str, field: str) -> float:
        return statistics.median(r[field] for r in runs[kind])

    def per_batch(kind: str, field: str) -> str:
        return f"{med(kind, field) / batches * 1e6:,.0f}"

    samples = batches * args.batch_size
    local_rate, ray_rate = samples / med("local", "wall"), samples / med("ray", "wall")
    added = (med("ray", "wall") - med("local", "wall")) / batches * 1e6
    added_cpu = (med("ray", "tree") - med("local", "tree")) / batches * 1e6
    clean = med("ray", "wall")
    return [
        f"{name} ({batches} batches): local {local_rate:,.0f} samples/s, Ray {ray_rate:,.0f} "
        f"samples/s, ratio {ray_rate / local_rate:.2f}; added wall {added:,.0f} us/batch",
        f"{name}: CPU us/batch: this process {per_batch('local', 'cpu')} (local) vs "
        f"{per_batch('ray', 'cpu')} (Ray); whole tree {per_batch('local', 'tree')} (local) vs "
        f"{per_batch('ray', 'tree')} (Ray): Ray adds {added_cpu:,.0f} us of CPU per batch",
        f"{name}: one actor killed (ray.kill) after {batches // 2} batches: run "
        f"{restart['wall']:.2f} s vs {clean:.2f} s clean (lost {restart['wall'] - clean:.2f} s), "
        f"longest wait for a batch {restart['longest']:.2f} s (clean "
        f"{med('ray', 'longest'):.3f} s); losses: {[(x['worker'], x['action']) for x in losses]}",
    ]


def batch_counts(text: str) -> dict[str, int]:
    """``captioning=300,text=3000`` -> {"captioning": 300, "text": 3000}."""
    return {name: int(count) for name, count in (part.split("=") for part in text.split(","))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--workloads", default="captioning,text")
    parser.add_argument("--batches", default="captioning=300,text=3000")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--address", default=None, help="a Ray cluster (default: a private one)")
    parser.add_argument("--cpus", type=int, default=4, help="logical CPUs of the private cluster")
    args = parser.parse_args()
    names, counts = args.workloads.split(","), batch_counts(args.batches)
    for name in names:  # before Ray: forked preparation workers would inherit its handlers
        prepare_workload(ensure_workload(name, args.root))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private instance on this machine
    import ray

    if args.address is None:
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=args.address, log_to_driver=False)
    print(f"# {machine_summary()}; load before: {os.getloadavg()}")
    print(
        f"2 local workers vs 2 Ray actors, 2 logical streams, micro-batch {args.batch_size}, "
        f"{args.warmup} warm-up batches, {args.rounds} rounds (medians)"
    )
    for name in names:
        batches = counts.get(name, counts.get(name.removesuffix("-small"), 300))
        for line in one_workload(name, batches, args):
            print(line, flush=True)
    print(f"# load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
