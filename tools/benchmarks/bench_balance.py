"""Compute-balanced steps across data-parallel ranks vs today's per-rank packing.

Builds a synthetic VLM mix with real encoded media (log-normal text lengths, 0-8 JPEG images of
mixed sizes, 10% short MP4 videos; `energon.demo.vlm`), prepared with media metadata, and runs R
data-parallel ranks (one loader each, in this process) two ways over the same global steps:

- plain: each rank takes its own micro-batch of B samples (positions r, r+R, ...) and packs it
  with SequencePacker (first-fit decreasing, max_length);
- balanced: `balance=Balance(max_length)`: the R micro-batches of a step are pooled, split by
  their metadata cost and each rank packs its share.

Both see exactly the same samples per step (checked). Reported per step: the straggler ratio
(max over ranks / mean of the step's true cost: tokens + attention * tokens^2 of the encoded
samples) and the padding fraction of the packs; and the loader throughput of one rank either way
(repeated, alternating, medians).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench_common import machine_summary, print_markdown_table
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


def compare(path: str, ranks: int, batch: int, steps: int, max_length: int, progress: bool):
    cost = MultimodalCost()
    plain_its = [iter(lo) for lo in make_loaders(path, ranks, batch, None)]
    bal_its = [iter(lo) for lo in make_loaders(path, ranks, batch, Balance(max_length))]
    packer = SequencePacker(max_length)
    out = {"plain": [], "balanced": [], "bound": []}
    pad = {"plain": [0, 0], "balanced": [0, 0]}
    for _ in tqdm(range(steps), disable=not progress, desc="steps"):
        plain = [next(it) for it in plain_its]
        balanced = [next(it) for it in bal_its]
        plain_keys = sorted(s.__key__ for b in plain for s in b)
        bal_keys = sorted(s.__key__ for b in balanced for s in b.samples)
        assert plain_keys == bal_keys, "the two runs must see the same samples per step"
        out["plain"].append(straggler_ratio([true_cost(b, cost, max_length) for b in plain]))
        rank_costs = [true_cost(b.samples, cost, max_length) for b in balanced]
        out["balanced"].append(straggler_ratio(rank_costs))
        # no split beats the heaviest single sample: the best possible ratio of the step
        heaviest = max(c for b in balanced for c in sample_costs(b.samples, cost, max_length))
        mean = sum(rank_costs) / len(rank_costs)
        out["bound"].append(max(1.0, heaviest / mean))
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


def throughput(path: str, ranks: int, batch: int, steps: int, balance: Balance | None) -> float:
    """Samples per second of all ranks' loaders together, run one after the other in this
    process (a balanced rank loads a share of varying size, so one rank alone says little).
    Plain: micro-batches of B samples packed by SequencePacker (the work of a packing hook)."""
    its = [iter(lo) for lo in make_loaders(path, ranks, batch, balance)]
    packer = SequencePacker(balance.max_length if balance else 16384)
    for it in its:
        next(it)  # start-up not counted
    count = 0
    start = time.perf_counter()
    for _ in range(steps):
        for it in its:
            b = next(it)
            if balance is None:
                members = list(b)
                _ = [p for g in packer.select(members) for p in packer.pack(g)]
                count += len(members)
            else:
                count += len(b.samples)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="bench_data")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-length", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    progress = not args.no_progress
    path = dataset_root(args.root, args.samples, progress)
    print(machine_summary())
    ratios, padding = compare(path, args.ranks, args.batch, args.steps, args.max_length, progress)
    rows = []
    for name in ("plain", "balanced"):
        r = sorted(ratios[name])
        rows.append(
            (
                "per-rank SequencePacker (today)" if name == "plain" else "balanced",
                f"{statistics.median(r):.3f}",
                f"{r[int(0.9 * (len(r) - 1))]:.3f}",
                f"{r[-1]:.3f}",
                f"{padding[name]:.1%}",
            )
        )
    above = [(r, b) for r, b in zip(ratios["balanced"], ratios["bound"]) if r > 1.05]
    print(
        f"balanced steps above 1.05: {len(above)} of {len(ratios['balanced'])}; their best "
        f"possible ratios (heaviest sample / mean): {[round(b, 3) for _, b in above]}"
    )
    print(
        f"{args.ranks} ranks x {args.batch} samples per step, {args.steps} steps, "
        f"max_length {args.max_length}"
    )
    print_markdown_table(("packing", "straggler ratio median", "p90", "max", "padding"), rows)
    if args.repeats < 1:
        return
    rates = {"plain": [], "balanced": []}
    for _ in tqdm(range(args.repeats), disable=not progress, desc="throughput"):
        for name, balance in (("plain", None), ("balanced", Balance(args.max_length))):
            rates[name].append(throughput(path, args.ranks, args.batch, args.steps, balance))
    plain, balanced = (statistics.median(rates[k]) for k in ("plain", "balanced"))
    print_markdown_table(
        ("all ranks' loaders", "samples/s (median)", "runs"),
        [
            (
                "plain + SequencePacker",
                f"{plain:,.0f}",
                " ".join(f"{x:,.0f}" for x in rates["plain"]),
            ),
            ("balanced", f"{balanced:,.0f}", " ".join(f"{x:,.0f}" for x in rates["balanced"])),
        ],
    )
    print(f"throughput cost of balancing: {1 - balanced / plain:+.1%}")


if __name__ == "__main__":
    main()
