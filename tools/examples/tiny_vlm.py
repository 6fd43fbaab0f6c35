"""A small vision-language transformer for CPU examples: image patches plus text tokens.

Each sample of ``energon.demo.vlm`` (``VlmSample``: text token ids, then one ``-1`` per vision
token; decoded images; a video's frame count) becomes one sequence: its JPEGs cut into 28x28
pixel patches (``MultimodalCost``'s ``ceil(w / 28) * ceil(h / 28)`` per image, projected by a
linear layer), one learned embedding per video token, then its text tokens. The sequences of a
batch are concatenated (no padding) and every layer's attention runs within each sample (as
variable-length attention over packed sequences does), so a step costs linear in the tokens and
patches plus the square of each sample's length. The loss is next-token prediction on the text.
Used by ``train_balanced_vlm.py`` and ``fit_balance_cost.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

# Runs from a source checkout without installing energon.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PATCH = 28
VOCAB = 1024


@dataclasses.dataclass
class SampleInput:
    """One sample as the model takes it (its sequence: vision tokens, then text)."""

    patches: torch.Tensor  # [image patches, 3 * PATCH * PATCH] float
    video_tokens: int
    text: torch.Tensor  # [text tokens] ids

    @property
    def text_tokens(self) -> int:
        return int(self.text.shape[0])

    @property
    def media_tokens(self) -> int:
        return int(self.patches.shape[0]) + self.video_tokens

    @property
    def length(self) -> int:
        return self.text_tokens + self.media_tokens


def image_patches(image: torch.Tensor) -> torch.Tensor:
    """``[ceil(h / 28) * ceil(w / 28), 3 * 28 * 28]`` patches of a ``[3, h, w]`` image (zero
    padded at the right and bottom edges)."""
    image = image.float() / 255.0 if not image.is_floating_point() else image
    _, h, w = image.shape
    padded = F.pad(
        image, (0, math.ceil(w / PATCH) * PATCH - w, 0, math.ceil(h / PATCH) * PATCH - h)
    )
    patches = padded.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH)  # [3, gh, gw, P, P]
    return patches.permute(1, 2, 0, 3, 4).reshape(-1, 3 * PATCH * PATCH)


def sample_input(sample, max_length: int) -> SampleInput:
    """A ``VlmSample`` as model input: its text ids and vision tokens (image patches, then video
    tokens), truncated to ``max_length`` tokens as the packer truncates its ``tokens`` (text
    first, then vision)."""
    tokens = sample.tokens[:max_length]
    text = tokens[tokens >= 0] % VOCAB
    vision = int((tokens < 0).sum())
    patches = [image_patches(im) for im in sample.images]
    patches = torch.cat(patches)[:vision] if patches else torch.zeros(0, 3 * PATCH * PATCH)
    return SampleInput(patches, vision - int(patches.shape[0]), text)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        n, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, dim // self.heads).unbind(1)
        parts, start = [], 0
        for length in lengths:  # attention within each sample only
            end = start + length
            seg = [t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            parts.append(F.scaled_dot_product_attention(*seg, is_causal=True)[0].transpose(0, 1))
            start = end
        x = x + self.out(torch.cat(parts).reshape(n, dim))
        return x + self.mlp(self.norm2(x))


class TinyVlm(nn.Module):
    def __init__(self, dim: int = 192, layers: int = 3, heads: int = 4) -> None:
        super().__init__()
        self.patch = nn.Linear(3 * PATCH * PATCH, dim)
        self.video = nn.Parameter(torch.randn(dim) * 0.02)
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, samples: list[SampleInput]) -> torch.Tensor:
        """The mean next-token loss over the text of ``samples``."""
        pieces, lengths, targets, text_at = [], [], [], []
        offset = 0
        for s in samples:
            pieces += [self.patch(s.patches), self.video.expand(s.video_tokens, -1)]
            pieces.append(self.embed(s.text))
            lengths.append(s.length)
            if s.text_tokens > 1:  # predict text token i + 1 from position i
                first = offset + s.media_tokens
                text_at.append(torch.arange(first, first + s.text_tokens - 1))
                targets.append(s.text[1:])
            offset += s.length
        x = torch.cat(pieces)
        for block in self.blocks:
            x = block(x, lengths)
        if not targets:
            return x.sum() * 0.0
        logits = self.head(self.norm(x[torch.cat(text_at)]))
        return F.cross_entropy(logits, torch.cat(targets))


def timed_step(model: TinyVlm, inputs: list[SampleInput], repeats: int = 1) -> float:
    """CPU seconds of this thread for forward + backward on ``inputs`` (best of ``repeats``)."""
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad()
        start = time.thread_time()
        model(inputs).backward()
        best = min(best, time.thread_time() - start)
    return best


def measure_steps(
    model: TinyVlm, samples: list, batches: int, rng: random.Random, max_length: int, repeats: int
) -> tuple[list[list[tuple[int, int]]], list[float]]:
    """``batches`` random batches of 1-8 of ``samples`` (``VlmSample``): each one's
    ``(text tokens, media tokens)`` per sample and its forward + backward CPU seconds, the
    input of ``energon.fit_cost``."""
    counts, seconds = [], []
    for _ in range(batches):
        chosen = rng.sample(samples, min(len(samples), rng.randint(1, 8)))
        inputs = [sample_input(s, max_length) for s in chosen]
        counts.append([(i.text_tokens, i.media_tokens) for i in inputs])
        seconds.append(timed_step(model, inputs, repeats))
    return counts, seconds
