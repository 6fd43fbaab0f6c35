"""Packing efficiency: padding and the share of samples split across packs, for no packing, naive
greedy packing, first-fit decreasing (``SequencePacker``, today's packer), best-fit decreasing
(``algorithm="best_fit"``) and filling packs by splitting samples (``split=True``), on the same
length distributions, plus the speed of each packer.

Every packer runs in energon's real packing stage (``energon.pipeline.packing.PackStage``) over
the same samples in the same order with the same buffer, so buffers, rests of split samples and
packs kept open for the next buffer behave as in training; the pass ends with the last buffer
flushed. Two length distributions:

- text: log-normal token counts (median ~350, sigma 1), cut at 4x the pack length 2,048;
- image+text: log-normal text (median ~150) plus 0-4 images of 64, 256, 576 or 1,024 tokens
  each, cut at 4x the pack length 4,096.

A sample counts as split when its tokens land in more than one pack (today's packer splits only
samples longer than a pack, into chunks of their own).

    python tools/benchmarks/bench_packing.py [--samples 20000] [--buffer 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import machine_summary, print_markdown_table  # noqa: E402

from energon.errors import ErrorPolicy  # noqa: E402
from energon.pipeline.keys import pointer_parts, pointer_target  # noqa: E402
from energon.pipeline.packing import PackStage  # noqa: E402
from energon.pipeline.stage import Item, Stage  # noqa: E402
from energon.task_encoder.packing import SequencePacker, naive_greedy_groups  # noqa: E402


def text_lengths(n: int, max_length: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(350), 1.0, n).astype(int), 8, 4 * max_length)


def image_text_lengths(n: int, max_length: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    text = rng.lognormal(np.log(150), 1.0, n).astype(int)
    images = rng.integers(0, 5, n)
    per_image = rng.choice([64, 256, 576, 1024], size=(n, 4))
    vision = np.array([per_image[i, : images[i]].sum() for i in range(n)])
    return np.clip(text + vision, 8, 4 * max_length)


class _Samples(Stage):
    """The samples of one pass, in order: ``{"n": length}`` with pointer keys; the samples where
    ``whole`` is set come from source 1 (a dataset marked ``pack_whole``)."""

    def __init__(self, lengths: np.ndarray, whole: np.ndarray) -> None:
        self.lengths = lengths.tolist()
        self.source = whole.astype(int).tolist()
        self.position = 0

    def next(self) -> Item:
        if self.position >= len(self.lengths):
            raise StopIteration
        i = self.position
        self.position += 1
        return {"n": self.lengths[i]}, ("webdataset", self.source[i], i)

    def state(self) -> dict:
        return {"position": self.position}

    def restore(self, state: dict) -> None:
        self.position = state["position"]

    def rebuild(self, key: Any) -> Any:
        return {"n": self.lengths[key[2]]}


def _quiet_policy() -> ErrorPolicy:
    return ErrorPolicy("pack", lambda exc, sample=None, sources=None: None, tolerance=0)


def run_packer(
    packer: SequencePacker, lengths: np.ndarray, buffer: int, whole_share: float = 0.0
) -> tuple[float, float, float, int]:
    """(padding fraction, share of samples split, samples/s, packs) of one pass; a random
    ``whole_share`` of the samples belong to a dataset that must not be split."""
    whole = np.random.default_rng(2).random(len(lengths)) < whole_share

    def pack(members: list[Any]) -> int:
        return sum(packer.length(m) for m in members)  # the tokens of the pack

    stage = PackStage(
        _Samples(lengths, whole),
        buffer,
        packer.select,
        pack,
        None,
        _quiet_policy(),
        stream=0,
        num_streams=1,
        whole_sources=[False, True],
    )
    packs = tokens = 0
    packs_of: dict[int, int] = {}
    t = time.perf_counter()
    while True:
        try:
            used, key = stage.next()
        except StopIteration:
            break
        chunks = _chunks(used, packer.max_length)
        packs += len(chunks)
        tokens += used
        for pointer, _ in pointer_parts(key):
            index = pointer_target(pointer)[1]
            packs_of[index] = packs_of.get(index, 0) + len(chunks)
    seconds = time.perf_counter() - t
    assert tokens == int(lengths.sum()), "tokens lost or repeated"
    cut = [i for i, n in packs_of.items() if n > 1]
    assert not any(whole[i] and lengths[i] <= packer.max_length for i in cut), "a whole one cut"
    split = len(cut) / len(lengths)
    return 1 - tokens / (packs * packer.max_length), split, len(lengths) / seconds, packs


def _chunks(tokens: int, max_length: int) -> list[int]:
    """An over-long sample packed on its own becomes chunks of ``max_length`` (over_length="split")."""
    return [max_length] * (tokens // max_length) + (
        [tokens % max_length] if tokens % max_length else []
    )


def no_packing_padding(lengths: np.ndarray, max_length: int, batch: int = 8) -> float:
    clipped = np.minimum(lengths, max_length)
    used = padded = 0
    for i in range(0, len(clipped), batch):
        chunk = clipped[i : i + batch]
        used += chunk.sum()
        padded += chunk.max() * len(chunk)
    return 1 - used / padded


def greedy_padding(lengths: np.ndarray, max_length: int, buffer: int) -> float:
    clipped = np.minimum(lengths, max_length)
    packs = 0
    for start in range(0, len(clipped), buffer):
        packs += len(naive_greedy_groups(clipped[start : start + buffer].tolist(), max_length))
    return 1 - clipped.sum() / (packs * max_length)


def _length(sample: dict) -> int:
    return sample["n"]


def _packer(max_length: int, **options: Any) -> SequencePacker:
    return SequencePacker(max_length, length=_length, over_length="split", **options)


PACKERS: dict[str, tuple[Callable[[int], SequencePacker], float]] = {
    "first-fit decreasing (today)": (lambda m: _packer(m), 0.0),
    "best-fit decreasing": (lambda m: _packer(m, algorithm="best_fit"), 0.0),
    "split across packs": (lambda m: _packer(m, split=True), 0.0),
    "split, pieces >= 64 tokens": (lambda m: _packer(m, split=True, min_piece=64), 0.0),
    "split, 30% of samples pack_whole": (lambda m: _packer(m, split=True), 0.3),
}


def measure(name: str, lengths: np.ndarray, max_length: int, buffer: int) -> list[tuple]:
    rows = [
        (
            name,
            "no packing (batch 8, pad to longest)",
            f"{no_packing_padding(lengths, max_length):.1%}",
            "",
            "",
            "",
        ),
        (name, "naive greedy", f"{greedy_padding(lengths, max_length, buffer):.1%}", "", "", ""),
    ]
    for label, (make, whole_share) in PACKERS.items():
        padding, split, rate, packs = run_packer(make(max_length), lengths, buffer, whole_share)
        rows.append((name, label, f"{padding:.1%}", f"{split:.1%}", f"{packs:,}", f"{rate:,.0f}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--buffer", type=int, default=256)
    args = parser.parse_args()
    text = text_lengths(args.samples, 2048)
    vlm = image_text_lengths(args.samples, 4096)
    rows = measure("text, max 2,048", text, 2048, args.buffer)
    rows += measure("image+text, max 4,096", vlm, 4096, args.buffer)
    print(machine_summary())
    for name, lengths, m in (("text", text, 2048), ("image+text", vlm, 4096)):
        print(
            f"{name}: {args.samples} samples, median {int(np.median(lengths))} tokens, "
            f"{int((lengths > m).sum())} longer than {m}; packing buffer {args.buffer}"
        )
    print_markdown_table(
        ("lengths", "method", "padding", "samples split", "packs", "packing samples/s"), rows
    )


if __name__ == "__main__":
    main()
