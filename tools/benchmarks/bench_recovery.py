"""How long a lost worker costs the training loop: from a worker's death to the next batch, with 2
workers on the captioning workload, against the normal time between batches of the same run.

Each round runs the same loader twice, one after the other: a *baseline* without a kill, and a run
whose task encoder kills its worker (SIGKILL) on one chosen sample, halfway through (the sample of
the clean run's batch ``--batches / 2``). The dying worker writes the time of its death (the
system's monotonic clock, which every process shares) to a file right before it kills itself. The
main process notes when each batch reaches the loop. Reported, medians over the rounds:

- ``normal interval``: median time between batches of the baseline (p95 in brackets);
- ``death -> next batch``: from the death to the next batch the loop gets (it may have been made
  before the death: a worker works ahead);
- ``death -> its batch``: from the death to the batch the dead worker was making (its position
  in the plan, the same in both runs), made again by the replacement without the sample;
- ``longest wait``: the longest the loop waited for one batch, with the kill and in the baseline;
- ``run time``: the whole run with the kill against the baseline (the work the dead worker had
  done ahead is done again).

Usage: python tools/benchmarks/bench_recovery.py [--root bench_data] [--workload captioning]
           [--batches 200] [--batch-size 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

import torch.utils.data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import DEFAULT_ROOT, ensure_workload, machine_summary  # noqa: E402
from bench_loader import prepare_workload  # noqa: E402

from energon import (  # noqa: E402
    DefaultTaskEncoder,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
)


class KillOnce(DefaultTaskEncoder):
    """Kills its worker on sample ``key``, after writing the time to ``note`` (one kill: the
    replacement skips the sample)."""

    def __init__(self, key: str | None = None, note: str | None = None) -> None:
        super().__init__()
        self.key, self.note = key, note

    def encode_sample(self, sample):
        if sample.__key__ == self.key and torch.utils.data.get_worker_info() is not None:
            with open(self.note, "w") as f:
                f.write(repr(time.monotonic()))
            os.kill(os.getpid(), signal.SIGKILL)
        return sample


def run(path: str, batches: int, batch_size: int, encoder: KillOnce) -> tuple[list, list]:
    """(keys, return time) of each batch of a 2-worker loader, from the first batch on."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=batch_size,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        task_encoder=encoder,
    )
    loader = get_savable_loader(ds)
    keys, times = [], []
    for _, batch in zip(range(batches), loader):
        times.append(time.monotonic())
        keys.append(list(batch.__key__))
    return keys, times


def one_round(path: str, batches: int, batch_size: int, key: str, at: int) -> dict[str, float]:
    _, base = run(path, batches, batch_size, KillOnce())
    with tempfile.TemporaryDirectory() as folder:
        note = os.path.join(folder, "death")
        _, times = run(path, batches, batch_size, KillOnce(key, note))
        with open(note) as f:
            death = float(f.read())
    after = [t for t in times if t > death]
    intervals = [b - a for a, b in zip(base, base[1:])]
    kill_intervals = [b - a for a, b in zip(times, times[1:])]
    return {
        "normal": statistics.median(intervals),
        "normal_p95": sorted(intervals)[int(0.95 * (len(intervals) - 1))],
        "next": after[0] - death,
        "own": times[at] - death,
        "longest_kill": max(kill_intervals),
        "longest_base": max(intervals),
        "run_kill": times[-1] - times[0],
        "run_base": base[-1] - base[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--workload", default="captioning")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    workload = ensure_workload(args.workload, args.root)
    prepare_workload(workload)
    clean, _ = run(workload.path, args.batches, args.batch_size, KillOnce())
    at = args.batches // 2
    key = clean[at][len(clean[at]) // 2]
    results = [
        one_round(workload.path, args.batches, args.batch_size, key, at) for _ in range(args.rounds)
    ]

    def med(name: str) -> float:
        return statistics.median(r[name] for r in results) * 1e3

    print(f"# {machine_summary()}")
    print(
        f"workload {args.workload}, 2 workers, micro-batch {args.batch_size}, {args.batches} "
        f"batches, kill at batch {at} (sample {key}), {args.rounds} rounds (medians, ms)"
    )
    print(f"normal interval between batches: {med('normal'):.1f} (p95 {med('normal_p95'):.1f})")
    print(f"death -> next batch: {med('next'):.1f}")
    print(f"death -> the batch the dead worker was making: {med('own'):.1f}")
    print(
        f"longest wait for one batch: {med('longest_kill'):.1f} (baseline {med('longest_base'):.1f})"
    )
    print(f"run time: {med('run_kill'):.0f} with the kill, {med('run_base'):.0f} without")


if __name__ == "__main__":
    main()
