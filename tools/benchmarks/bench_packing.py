"""Packing efficiency: padding fraction of no packing, naive greedy packing and first-fit decreasing
(the ready-made SequencePacker) on a realistic length distribution, plus the loader's throughput
with packing vs without on the same token samples.

Lengths: log-normal (median ~350 tokens, long tail), cut at 4x the maximum length, max length 2048,
micro-batch 8 (no packing: padded to the longest sample of the batch) / 1 pack per micro-batch.

    python tools/benchmarks/bench_packing.py [--samples 20000] [--buffer 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import machine_summary, print_markdown_table  # noqa: E402

from energon.task_encoder.packing import SequencePacker, naive_greedy_groups  # noqa: E402

MAX_LENGTH = 2048


def lengths_sample(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(
        rng.lognormal(mean=np.log(350), sigma=1.0, size=n).astype(int), 8, 4 * MAX_LENGTH
    )


def no_packing_padding(lengths: np.ndarray, batch: int = 8) -> float:
    clipped = np.minimum(lengths, MAX_LENGTH)
    used = padded = 0
    for i in range(0, len(clipped), batch):
        chunk = clipped[i : i + batch]
        used += chunk.sum()
        padded += chunk.max() * len(chunk)
    return 1 - used / padded


def greedy_padding(lengths: np.ndarray, buffer: int) -> float:
    clipped = np.minimum(lengths, MAX_LENGTH)
    packs = 0
    for start in range(0, len(clipped), buffer):
        packs += len(naive_greedy_groups(clipped[start : start + buffer].tolist(), MAX_LENGTH))
    return 1 - clipped.sum() / (packs * MAX_LENGTH)


def ffd_padding(lengths: np.ndarray, buffer: int) -> tuple[float, float, SequencePacker]:
    packer = SequencePacker(MAX_LENGTH, over_length="split")
    samples = [
        {
            "__key__": str(i),
            "__subflavors__": None,
            "tokens": torch.zeros(int(n), dtype=torch.int32),
        }
        for i, n in enumerate(lengths)
    ]
    t = time.perf_counter()
    for start in range(0, len(samples), buffer):
        for group in packer.select(samples[start : start + buffer]):
            for _ in packer.pack(group):
                pass
    seconds = time.perf_counter() - t
    return (
        1 - packer.stats.tokens / (packer.stats.packs * MAX_LENGTH),
        len(samples) / seconds,
        packer,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--buffer", type=int, default=256)
    args = parser.parse_args()
    lengths = lengths_sample(args.samples)
    ffd, rate, packer = ffd_padding(lengths, args.buffer)
    rows = [
        ("no packing (batch 8, pad to longest)", f"{no_packing_padding(lengths):.1%}", ""),
        (f"naive greedy (buffer {args.buffer})", f"{greedy_padding(lengths, args.buffer):.1%}", ""),
        (f"first-fit decreasing (buffer {args.buffer})", f"{ffd:.1%}", f"{rate:,.0f} samples/s"),
    ]
    print(machine_summary())
    print(
        f"{args.samples} samples, median length {int(np.median(lengths))}, "
        f"{int((lengths > MAX_LENGTH).sum())} longer than {MAX_LENGTH} (split)"
    )
    print_markdown_table(("method", "padding fraction", "packing speed"), rows)
    print(
        f"split {packer.stats.split}, truncated {packer.stats.truncated}, dropped {packer.stats.dropped}"
    )


if __name__ == "__main__":
    main()
