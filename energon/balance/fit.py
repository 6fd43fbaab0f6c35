"""Fitting the balance cost function to measured step times, so that the cost is measured, not
guessed.

A training step (or a forward pass) over a batch of samples takes, to a good approximation,

    seconds = overhead + per_text_token * T + per_media_token * M + attention * sum(n_i ** 2)

with ``T`` the batch's text tokens, ``M`` its media tokens (image patches, video frames, audio),
and ``n_i`` each sample's sequence length: linear layers scale with the tokens (a media token may
cost more than a text token: a vision encoder runs on it), variable-length attention with the
square of each sample's own length. :func:`fit_cost` fits the four coefficients to measured
``(samples, seconds)`` pairs by non-negative least squares on relative errors (timing noise
grows with the step); :meth:`CostFit.cost_function` turns
the fit into a cost function for :class:`~energon.balance.Balance` (the overhead is per step, not
per sample, so it does not enter a sample's cost). See docs/task-encoders.md, "A cost model from
measurements", and ``tools/examples/fit_balance_cost.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from energon.balance.cost import MultimodalCost, SampleCost
from energon.source.meta import SampleMeta

TERMS = ("overhead", "per_text_token", "per_media_token", "attention")


@dataclasses.dataclass(frozen=True)
class FittedCost:
    """A :class:`~energon.balance.cost.CostFunction` with measured coefficients: a sample of
    ``t`` text and ``m`` media tokens (counted from its metadata by ``counter``) costs
    ``per_text_token * t + per_media_token * m + attention * (t + m) ** 2`` seconds."""

    per_text_token: float
    per_media_token: float
    attention: float
    counter: MultimodalCost = dataclasses.field(default_factory=MultimodalCost)

    def __call__(self, meta: SampleMeta) -> SampleCost:
        text, media = self.counter.token_counts(meta)
        return SampleCost(text + media, self.cost_of_counts(text, media))

    def cost_of_counts(self, text: int, media: int) -> float:
        n = text + media
        return self.per_text_token * text + self.per_media_token * media + self.attention * n * n

    def config(self) -> dict[str, Any]:
        return {
            "per_text_token": self.per_text_token,
            "per_media_token": self.per_media_token,
            "attention": self.attention,
            "counter": self.counter.config(),
        }


@dataclasses.dataclass(frozen=True)
class CostFit:
    """The fitted coefficients (seconds), and how well they explain the measurements."""

    overhead: float  # per step, whatever it holds
    per_text_token: float
    per_media_token: float
    attention: float  # per squared token of one sample
    r2: float  # share of the variance of the step times that the fit explains
    median_error: float  # median |predicted - measured| / measured
    steps: int  # measurements fitted

    def predict(self, samples: Sequence[tuple[int, int]]) -> float:
        """Seconds for a step over ``samples`` (``(text tokens, media tokens)`` each)."""
        return float(features([samples])[0] @ np.array(self.coefficients()))

    def coefficients(self) -> tuple[float, float, float, float]:
        return (self.overhead, self.per_text_token, self.per_media_token, self.attention)

    def cost_function(self, counter: MultimodalCost | None = None) -> FittedCost:
        """The per-sample cost for ``Balance(cost=...)`` (``counter`` counts a sample's tokens
        from its metadata, as your encoder makes them; default ``MultimodalCost()``)."""
        return FittedCost(
            self.per_text_token,
            self.per_media_token,
            self.attention,
            counter or MultimodalCost(),
        )

    def __str__(self) -> str:
        return (
            f"step seconds = {self.overhead:.4g} + {self.per_text_token:.4g} x text tokens + "
            f"{self.per_media_token:.4g} x media tokens + {self.attention:.4g} x sum(length^2) "
            f"(R^2 {self.r2:.4f}, median error {self.median_error:.1%}, {self.steps} steps)"
        )


def features(batches: Sequence[Sequence[tuple[int, int]]]) -> np.ndarray:
    """``[steps, 4]``: 1, text tokens, media tokens and the sum of squared sample lengths of
    each batch (``(text tokens, media tokens)`` per sample)."""
    out = np.zeros((len(batches), len(TERMS)), dtype=np.float64)
    for row, samples in enumerate(batches):
        counts = np.asarray(samples, dtype=np.float64).reshape(-1, 2)
        lengths = counts.sum(axis=1)
        out[row] = (1.0, counts[:, 0].sum(), counts[:, 1].sum(), (lengths * lengths).sum())
    return out


def fit_cost(batches: Sequence[Sequence[tuple[int, int]]], seconds: Sequence[float]) -> CostFit:
    """Fits the step-time model to measurements: ``batches[k]`` lists the ``(text tokens,
    media tokens)`` of each sample of step ``k``, which took ``seconds[k]``. Coefficients are
    non-negative (a term that does not help the fit gets 0); vary the batches (short and long
    samples, with and without media) so that the terms can be told apart."""
    if len(batches) != len(seconds):
        raise ValueError(f"fit_cost: {len(batches)} batches but {len(seconds)} step times")
    if len(batches) < len(TERMS):
        raise ValueError(f"fit_cost needs at least {len(TERMS)} measured steps, got {len(batches)}")
    x = features(batches)
    y = np.asarray(seconds, dtype=np.float64)
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise ValueError("fit_cost: step times must be positive seconds")
    # relative errors: timing noise grows with the step (weights 1 / seconds)
    coefficients = nonnegative_least_squares(x / y[:, None], np.ones_like(y))
    predicted = x @ coefficients
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - predicted) ** 2).sum()) / spread if spread > 0 else 1.0
    median_error = float(np.median(np.abs(predicted - y) / y))
    return CostFit(*(float(c) for c in coefficients), r2, median_error, len(y))


def nonnegative_least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ``|x c - y|`` over ``c >= 0``, exactly, by least squares on every subset of the
    (four) columns: the optimum is the unconstrained fit of its non-zero columns."""
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    scaled = x / scale
    best, best_residual = np.zeros(x.shape[1]), float(np.sum(y * y))
    columns = range(x.shape[1])
    for size in range(1, x.shape[1] + 1):
        for subset in itertools.combinations(columns, size):
            c, *_ = np.linalg.lstsq(scaled[:, subset], y, rcond=None)
            if (c < 0).any():
                continue
            residual = float(np.sum((scaled[:, subset] @ c - y) ** 2))
            if residual < best_residual * (1 - 1e-12):
                best_residual = residual
                best = np.zeros(x.shape[1])
                best[list(subset)] = c
    return best / scale
