"""Compute-balanced steps across data-parallel ranks vs today's per-rank packing.

Builds a synthetic VLM mix with real encoded media (log-normal text lengths, 0-8 JPEG images of
mixed sizes, 10% short MP4 videos; `energon.demo.vlm`), prepared with media metadata, and runs R
data-parallel ranks (one loader each, in this process) two ways over the same global steps:

- plain: each rank takes its own micro-batch of B samples (positions r, r+R, ...) and packs it
  with SequencePacker (first-fit decreasing, max_length);
- balanced: `balance=Balance(max_length, window=W)`: the R micro-batches of each of W steps are
  pooled, composed into W steps of R near-equal shares by their metadata cost, and each rank
  packs its share.

Both see exactly the same samples per window of W steps (checked). Reported per step: the
straggler ratio (max over ranks / mean of the step's true cost: tokens + attention * tokens^2 of
the encoded samples), the worst step, and the padding fraction of the packs. Then the cost of
balancing: both sets of loaders (0 workers, in this process) side by side take turns of one
window each, in alternating order; a turn's CPU time (time.process_time: this process's threads
only, so other jobs on the machine do not count) per sample, and the median over rounds of the
per-round ratio balanced / plain. With `--workers N` the loaders run N workers per rank and the
CPU time measured is that of each configuration's worker processes (/proc/PID/schedstat), which do
all the planning, loading and encoding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench_common import loader_worker_pids, machine_summary, print_markdown_table
from tqdm import tqdm

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.balance import Balance, MultimodalCost
from energon.balance.assign import straggler_ratio
from energon.demo.vlm import VlmTaskEncoder, write_vlm_shards
from energon.format.layout import DATASET_YAML_FILENAME, nv_meta_dir
from energon.task_encoder.packing import SequencePacker


def dataset_root(root: str, samples: int, progress: bool) -> str:
    path = os.path.join(root, f"vlm-mix-{samples}")
    if not (nv_meta_dir(path) / DATASET_YAML_FILENAME).exists():
        if progress:
            print(f"writing {samples} VLM samples to {path} ...")
        write_vlm_shards(path, num_samples=samples, num_shards=max(1, samples // 250), seed=1)
    return path


class ListBatches(VlmTaskEncoder):
    """Plain micro-batches as lists of samples (packed by the benchmark like a packing hook)."""

    def batch(self, samples: list) -> list:
        return samples


def make_loaders(path: str, ranks: int, batch: int, balance: Balance | None, workers: int = 0):
    return [
        get_savable_loader(
            get_train_dataset(
                path,
                worker_config=WorkerConfig(rank=r, world_size=ranks, num_workers=workers),
                batch_size=batch,
                shuffle_buffer_size=64,
                max_samples_per_sequence=32,
                task_encoder=VlmTaskEncoder() if balance else ListBatches(),
                balance=balance,
            )
        )
        for r in range(ranks)
    ]


def sample_costs(samples, cost: MultimodalCost, max_length: int) -> list[float]:
    """True costs of encoded samples (their token counts, truncated to ``max_length``)."""
    out = []
    for s in samples:
        n = min(max_length, int(s.tokens.shape[0]))
        out.append(n + cost.attention_weight * n * n)
    return out


def true_cost(samples, cost: MultimodalCost, max_length: int) -> float:
    return sum(sample_costs(samples, cost, max_length))


def padding_of(packs: int, tokens: int, max_length: int) -> tuple[int, int]:
    return packs * max_length - tokens, packs * max_length


def compare(path: str, ranks: int, batch: int, args, progress: bool):
    cost = MultimodalCost()
    max_length = args.max_length
    plain_its = [iter(lo) for lo in make_loaders(path, ranks, batch, None)]
    balance = Balance(max_length, window=args.window)
    bal_its = [iter(lo) for lo in make_loaders(path, ranks, batch, balance)]
    packer = SequencePacker(max_length)
    out = {"plain": [], "balanced": [], "bound": [], "samples": []}
    pad = {"plain": [0, 0], "balanced": [0, 0]}
    plain_keys: list[str] = []
    bal_keys: list[str] = []
    for step in tqdm(range(args.steps), disable=not progress, desc="steps"):
        plain = [next(it) for it in plain_its]
        balanced = [next(it) for it in bal_its]
        plain_keys += [s.__key__ for b in plain for s in b]
        bal_keys += [s.__key__ for b in balanced for s in b.samples]
        if (step + 1) % args.window == 0:
            assert sorted(plain_keys) == sorted(bal_keys), "same samples per window"
            plain_keys, bal_keys = [], []
        out["plain"].append(straggler_ratio([true_cost(b, cost, max_length) for b in plain]))
        rank_costs = [true_cost(b.samples, cost, max_length) for b in balanced]
        out["balanced"].append(straggler_ratio(rank_costs))
        # what balancing each step alone could reach at best: heaviest sample of the plain step
        plain_costs = [c for b in plain for c in sample_costs(b, cost, max_length)]
        out["bound"].append(max(1.0, max(plain_costs) / (sum(plain_costs) / ranks)))
        out["samples"].append(sum(len(b.samples) for b in balanced))
        for b in plain:
            packs = [p for g in packer.select(list(b)) for p in packer.pack(g)]
            tokens = sum(int(p.tokens.shape[0]) for p in packs)
            wasted, total = padding_of(len(packs), tokens, max_length)
            pad["plain"][0] += wasted
            pad["plain"][1] += total
        for b in balanced:
            wasted = int(b.padding_mask.sum())
            pad["balanced"][0] += wasted
            pad["balanced"][1] += b.padding_mask.numel()
    return out, {k: w / t for k, (w, t) in pad.items()}


def cpu_per_sample(path: str, args, progress: bool) -> dict[str, list[float]]:
    """CPU seconds per sample of all ranks' loaders, plain and balanced taking turns of one
    window each (alternating which goes first); one value per round and configuration."""
    max_length = args.max_length
    packer = SequencePacker(max_length)
    balance = Balance(max_length, window=args.window)
    loaders = {
        "plain": make_loaders(path, args.ranks, args.batch, None, args.workers),
        "balanced": make_loaders(path, args.ranks, args.batch, balance, args.workers),
    }
    configs = {name: [iter(lo) for lo in los] for name, los in loaders.items()}

    def cpu(name: str) -> float:
        """Without workers: this process's CPU time; with workers: the CPU time of the config's
        worker processes (/proc/PID/schedstat; they do all the loading and planning)."""
        if not args.workers:
            return time.process_time()
        total = 0
        for lo in loaders[name]:
            for pid in loader_worker_pids(lo):
                with open(f"/proc/{pid}/schedstat") as f:
                    total += int(f.read().split()[0])
        return total / 1e9

    def turn(name: str) -> float:
        count = 0
        start = cpu(name)
        for _ in range(args.window):
            for it in configs[name]:
                b = next(it)
                if name == "plain":  # the work of a packing hook
                    members = list(b)
                    _ = [p for g in packer.select(members) for p in packer.pack(g)]
                    count += len(members)
                else:
                    count += len(b.samples)
        return (cpu(name) - start) / count

    for name in configs:
        turn(name)  # start-up (index opening, first window) not counted
    out: dict[str, list[float]] = {"plain": [], "balanced": []}
    for r in tqdm(range(args.rounds), disable=not progress, desc="cpu rounds"):
        order = ("plain", "balanced") if r % 2 == 0 else ("balanced", "plain")
        for name in order:
            out[name].append(turn(name))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="bench_data")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--window", type=int, default=8, help="Balance.window (global steps)")
    parser.add_argument("--max-length", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=9, help="CPU-time rounds (0: skip)")
    parser.add_argument("--workers", type=int, default=0, help="loader workers (CPU rounds)")
    parser.add_argument("--skip-straggler", action="store_true", help="only the CPU rounds")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    progress = not args.no_progress
    path = dataset_root(args.root, args.samples, progress)
    print(machine_summary())
    if not args.skip_straggler:
        straggler_report(path, args, progress)
    if args.rounds < 1:
        return
    cpu = cpu_per_sample(path, args, progress)
    ratio = statistics.median(b / p for b, p in zip(cpu["balanced"], cpu["plain"]))
    who = (
        f"{args.workers} workers per rank: their CPU" if args.workers else "0 workers: process CPU"
    )
    print_markdown_table(
        (f"all ranks' loaders ({who})", "CPU ms per sample (median)", "rounds"),
        [
            (
                name,
                f"{1000 * statistics.median(cpu[name]):.2f}",
                " ".join(f"{1000 * x:.2f}" for x in cpu[name]),
            )
            for name in ("plain", "balanced")
        ],
    )
    ratios = " ".join(f"{b / p:.3f}" for b, p in zip(cpu["balanced"], cpu["plain"]))
    print(f"per-round ratios balanced / plain: {ratios}")
    print(
        f"cost of balancing (median of per-round CPU ratios balanced / plain - 1): {ratio - 1:+.1%}"
    )


def straggler_report(path: str, args, progress: bool) -> None:
    ratios, padding = compare(path, args.ranks, args.batch, args, progress)
    rows = []
    for name in ("plain", "balanced"):
        r = sorted(ratios[name])
        rows.append(
            (
                "per-rank SequencePacker (today)" if name == "plain" else "balanced",
                f"{statistics.median(r):.3f}",
                f"{r[int(0.9 * (len(r) - 1))]:.3f}",
                f"{r[-1]:.3f}",
                f"{sum(x > 1.05 for x in r)} of {len(r)}",
                f"{padding[name]:.1%}",
            )
        )
    print(
        f"{args.ranks} ranks x {args.batch} samples per step, {args.steps} steps, window "
        f"{args.window}, max_length {args.max_length}"
    )
    print_markdown_table(
        ("packing", "straggler ratio median", "p90", "worst step", "steps > 1.05", "padding"),
        rows,
    )
    worst = max(range(args.steps), key=lambda i: ratios["balanced"][i])
    print(
        f"worst balanced step: {worst} at {ratios['balanced'][worst]:.4f} "
        f"({ratios['samples'][worst]} samples); steps whose heaviest sample exceeds 1.05 of a "
        f"rank's mean share (no per-step split could be within 1.05): "
        f"{[(i, round(b, 3)) for i, b in enumerate(ratios['bound']) if b > 1.05]}; "
        f"samples per balanced step: {min(ratios['samples'])}..{max(ratios['samples'])}"
    )


if __name__ == "__main__":
    main()
