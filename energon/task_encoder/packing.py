"""Ready-made sequence packing for token samples: first-fit decreasing into a maximum length.

Use it from a task encoder's packing hooks (or subclass :class:`PackingTaskEncoder`)::

    packer = SequencePacker(max_length=2048, over_length="split")
    class MyEncoder(DefaultTaskEncoder):
        def select_samples_to_pack(self, samples):
            return packer.select(samples)
        @stateless
        def pack_selected_samples(self, samples):
            yield from packer.pack(samples)

A packed sample concatenates the ``tokens`` (and optional ``labels``, ``loss_mask``) of its members
and carries ``cu_seqlens`` (cumulative boundaries, for variable-length attention), ``position_ids``
restarting at each member, and ``seq_lengths``. Over-long samples are truncated, split into
``max_length`` chunks, or dropped, and counted in ``packer.stats``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from energon.samples import Sample
from energon.samples.edataclass import edataclass
from energon.task_encoder.base import DefaultTaskEncoder, stateless

OVER_LENGTH_POLICIES = ("truncate", "split", "drop")


@edataclass
class PackedSequence(Sample):
    tokens: torch.Tensor
    cu_seqlens: torch.Tensor
    position_ids: torch.Tensor
    seq_lengths: torch.Tensor
    labels: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None


@dataclasses.dataclass
class PackingStats:
    samples: int = 0
    packs: int = 0
    tokens: int = 0
    truncated: int = 0
    split: int = 0
    dropped: int = 0

    @property
    def fill(self) -> float:
        """Fraction of the packs' capacity holding real tokens."""
        return self.tokens / max(1, self.packs * self._max_length) if self._max_length else 0.0

    _max_length: int = 0


def _token_length(sample: Any) -> int:
    tokens = sample["tokens"] if isinstance(sample, dict) else sample.tokens
    return int(tokens.shape[0]) if hasattr(tokens, "shape") else len(tokens)


class SequencePacker:
    """First-fit decreasing packing of samples into bins of ``max_length`` tokens."""

    def __init__(
        self,
        max_length: int,
        *,
        length: Callable[[Any], int] = _token_length,
        over_length: str = "truncate",
    ) -> None:
        if over_length not in OVER_LENGTH_POLICIES:
            raise ValueError(
                f"over_length must be one of {OVER_LENGTH_POLICIES}, got {over_length!r}"
            )
        self.max_length = max_length
        self.length = length
        self.over_length = over_length
        self.stats = PackingStats(_max_length=max_length)

    def select(self, samples: Sequence[Any]) -> list[list[Any]]:
        """Groups that each fit ``max_length``; over-long samples get their own group (or none)."""
        bins: list[list[Any]] = []
        space: list[int] = []
        for sample in sorted(samples, key=self.length, reverse=True):
            n = self.length(sample)
            if n > self.max_length:
                if self.over_length == "drop":
                    self.stats.dropped += 1
                    continue
                bins.append([sample])
                space.append(0)
                continue
            for i, free in enumerate(space):
                if n <= free:
                    bins[i].append(sample)
                    space[i] -= n
                    break
            else:
                bins.append([sample])
                space.append(self.max_length - n)
        return bins

    def pack(self, samples: Sequence[Any]) -> Iterator[PackedSequence]:
        """One packed sample per group; an over-long sample yields one chunk per ``max_length``
        tokens with ``over_length="split"`` (or its first ``max_length`` tokens with truncate)."""
        if len(samples) == 1 and self.length(samples[0]) > self.max_length:
            yield from self._over_length(samples[0])
            return
        yield self._pack_segments([(s, 0, self.length(s)) for s in samples])

    def _over_length(self, sample: Any) -> Iterator[PackedSequence]:
        n = self.length(sample)
        if self.over_length == "truncate":
            self.stats.truncated += 1
            yield self._pack_segments([(sample, 0, self.max_length)])
            return
        self.stats.split += 1
        for start in range(0, n, self.max_length):
            yield self._pack_segments([(sample, start, min(n, start + self.max_length))])

    def _pack_segments(self, segments: list[tuple[Any, int, int]]) -> PackedSequence:
        lengths = [end - start for _, start, end in segments]
        fields = {}
        for name in ("tokens", "labels", "loss_mask"):
            parts = []
            for sample, start, end in segments:
                value = (
                    sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)
                )
                if value is None:
                    break
                parts.append(torch.as_tensor(value)[start:end])
            else:
                fields[name] = torch.cat(parts)
        first = segments[0][0]
        keys = [s["__key__"] if isinstance(s, dict) else s.__key__ for s, _, _ in segments]
        self.stats.samples += len(segments)
        self.stats.packs += 1
        self.stats.tokens += sum(lengths)
        return PackedSequence(
            __key__=",".join(keys),
            __restore_key__=(),
            __subflavors__=first.get("__subflavors__")
            if isinstance(first, dict)
            else first.__subflavors__,
            tokens=fields["tokens"],
            labels=fields.get("labels"),
            loss_mask=fields.get("loss_mask"),
            cu_seqlens=torch.tensor(
                [0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32
            ),
            position_ids=torch.cat([torch.arange(n) for n in lengths]),
            seq_lengths=torch.tensor(lengths, dtype=torch.int32),
        )


class PackingTaskEncoder(DefaultTaskEncoder):
    """A task encoder that packs token samples with :class:`SequencePacker` (set ``packer``)."""

    def __init__(self, max_length: int, *, over_length: str = "truncate", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.packer = SequencePacker(max_length, over_length=over_length)

    def select_samples_to_pack(self, samples: list[Any]) -> list[list[Any]]:
        return self.packer.select(samples)

    @stateless
    def pack_selected_samples(self, samples: list[Any]) -> Iterator[PackedSequence]:
        yield from self.packer.pack(samples)


def naive_greedy_groups(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Baseline for benchmarks: fill bins in arrival order, start a new bin when the next does not fit."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        n = min(n, max_length)
        if used + n > max_length and groups[-1]:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups
