"""Ready-made sequence packing for token samples: first-fit or best-fit decreasing into a maximum
length, or filling every pack to the brim by splitting samples across packs.

Use it from a task encoder's packing hooks (or subclass :class:`PackingTaskEncoder`)::

    packer = SequencePacker(max_length=2048, over_length="split")  # or algorithm="best_fit",
                                                                   # or split=True
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

``algorithm`` places whole samples, longest first: ``"first_fit"`` into the first pack with room
(the default, as before), ``"best_fit"`` into the pack with the least room that still fits.
``split=True`` fills packs in buffer order instead and cuts a sample that does not fit the room
left (at least ``min_piece`` tokens of it): its head ends the pack, its rest starts the next one
(:class:`~energon.samples.piece.SamplePiece`; the rest of a sample longer than a pack fills whole
packs first). Samples of datasets marked ``pack_whole`` are never cut: they go whole into the
fullest pack they fit. The last, not yet full pack of a buffer stays in the buffer to be filled by
the next samples (unless it is the only one, or the pass ends).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from energon.samples import Sample
from energon.samples.piece import SamplePiece
from energon.structs import edataclass
from energon.task_encoder.base import (
    DefaultTaskEncoder,
    last_packing_round,
    may_split,
    stateless,
)

OVER_LENGTH_POLICIES = ("truncate", "split", "drop")
ALGORITHMS = ("first_fit", "best_fit")


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
    pieces: int = 0  # members that are part of a sample cut across packs (split=True)

    @property
    def fill(self) -> float:
        """Fraction of the packs' capacity holding real tokens."""
        return self.tokens / max(1, self.packs * self._max_length) if self._max_length else 0.0

    _max_length: int = 0


def _token_length(sample: Any) -> int:
    tokens = sample["tokens"] if isinstance(sample, dict) else sample.tokens
    return int(tokens.shape[0]) if hasattr(tokens, "shape") else len(tokens)


class SequencePacker:
    """Packing of samples into bins of ``max_length`` tokens (see the module docstring)."""

    def __init__(
        self,
        max_length: int,
        *,
        length: Callable[[Any], int] = _token_length,
        over_length: str = "truncate",
        algorithm: str = "first_fit",
        split: bool = False,
        min_piece: int = 1,
    ) -> None:
        if over_length not in OVER_LENGTH_POLICIES:
            raise ValueError(
                f"over_length must be one of {OVER_LENGTH_POLICIES}, got {over_length!r}"
            )
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if not isinstance(min_piece, int) or not 1 <= min_piece <= max_length:
            raise ValueError(f"min_piece must be an integer in 1..max_length, got {min_piece!r}")
        self.max_length = max_length
        self.sample_length = length
        self.over_length = over_length
        self.algorithm = algorithm
        self.split = split
        self.min_piece = min_piece
        self.stats = PackingStats(_max_length=max_length)

    def length(self, sample: Any) -> int:
        """Tokens of a sample, or of the part of it a :class:`SamplePiece` holds."""
        if isinstance(sample, SamplePiece):
            end = sample.stop if sample.stop is not None else self.sample_length(sample.sample)
            return end - sample.start
        return self.sample_length(sample)

    def select(self, samples: Sequence[Any]) -> list[list[Any]]:
        r"""Groups that each fit ``max_length``; over-long samples get their own group (or none).
        With ``split=True`` groups may hold :class:`SamplePiece`\ s (see the module docstring)."""
        if self.split:
            return _Filler(self, samples).groups()
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
            i = self._fitting_bin(space, n)
            if i is None:
                bins.append([sample])
                space.append(self.max_length - n)
            else:
                bins[i].append(sample)
                space[i] -= n
        return bins

    def _fitting_bin(self, space: Sequence[int], n: int) -> int | None:
        """The bin a sample of ``n`` tokens goes into: the first with room (first fit) or the one
        with the least room that fits (best fit; the first of equals); None: a new bin."""
        if self.algorithm == "first_fit":
            return next((i for i, free in enumerate(space) if n <= free), None)
        fitting = [(free, i) for i, free in enumerate(space) if n <= free]
        return min(fitting)[1] if fitting else None

    def pack(self, samples: Sequence[Any]) -> Iterator[PackedSequence]:
        """One packed sample per group; an over-long sample yields one chunk per ``max_length``
        tokens with ``over_length="split"`` (or its first ``max_length`` tokens with truncate).
        A :class:`SamplePiece` member contributes the tokens it holds."""
        if len(samples) == 1 and self.length(samples[0]) > self.max_length:
            yield from self._over_length(samples[0])
            return
        segments = []
        for sample in samples:
            if isinstance(sample, SamplePiece):
                self.stats.pieces += 1
                segments.append((sample.sample, sample.start, sample.start + self.length(sample)))
            else:
                segments.append((sample, 0, self.length(sample)))
        yield self._pack_segments(segments)

    def pack_one(self, samples: Sequence[Any]) -> PackedSequence:
        """The one packed sample of a group, for a ``pack_selected_samples`` that is no generator
        (the ledger can then describe its steps). Every group packs into one sample, except an
        over-long sample split into chunks (``over_length="split"`` without ``split=True``)."""
        packed = list(self.pack(samples))
        if len(packed) != 1:
            raise ValueError(
                f"a group packed into {len(packed)} samples: use pack() (a generator) for "
                "over_length='split' without split=True"
            )
        return packed[0]

    def _over_length(self, sample: Any) -> Iterator[PackedSequence]:
        n = self.length(sample)
        if self.over_length == "truncate" or (self.over_length == "split" and self.split):
            # (with split=True only samples that must stay whole get here: never cut them)
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


class _Filler:
    """One call of :meth:`SequencePacker.select` with ``split=True``.

    Packs are filled in order: ``current`` is the first pack that is not full. A sample that may
    be split goes into it, and when it does not fit the room left, its head fills the room and its
    rest goes on into the next pack that is not full (a new one at the end). A sample that must
    stay whole goes into the fullest pack it fits (a new one at the end if none). The packs from
    ``current`` on that are not full stay in the buffer for the next call, unless nothing else
    would be emitted or the pass ends.
    """

    def __init__(self, packer: SequencePacker, samples: Sequence[Any]) -> None:
        self.packer = packer
        self.samples = samples
        self.packs: list[list[Any]] = [[]]
        self.room: list[int] = [packer.max_length]
        self.current = 0

    def groups(self) -> list[list[Any]]:
        for sample in self.samples:
            if may_split(sample):
                self._fill(sample, self.packer.length(sample))
            else:
                self._place_whole(sample, self.packer.length(sample))
        packs = [(i, pack) for i, pack in enumerate(self.packs) if pack]
        ready = [pack for i, pack in packs if i < self.current or self.room[i] == 0]
        if ready and not last_packing_round():
            return ready  # the open packs stay in the buffer
        return [pack for _, pack in packs]

    def _fill(self, sample: Any, n: int) -> None:
        """A sample that may be split, into the current pack and on."""
        packer = self.packer
        piece = None
        while True:
            room = self.room[self.current]
            if n <= room:
                self._add(self.current, sample if piece is None else piece, n)
                if self.room[self.current] == 0:
                    self._advance()
                return
            if room >= packer.min_piece:
                if piece is None:
                    piece = sample if isinstance(sample, SamplePiece) else SamplePiece(sample, 0)
                head, piece = piece.cut(room)
                self._add(self.current, head, room)
                n -= room
            self._advance()

    def _place_whole(self, sample: Any, n: int) -> None:
        """A sample that must not be split: the fullest pack it fits, else a new one."""
        packer = self.packer
        if n > packer.max_length:
            if packer.over_length == "drop":
                packer.stats.dropped += 1
                return
            self._add(self._new_pack(), sample, packer.max_length)  # pack() truncates it
            return
        fitting = [(room, i) for i, room in enumerate(self.room) if n <= room]
        target = min(fitting)[1] if fitting else self._new_pack()
        self._add(target, sample, n)
        if target == self.current and self.room[target] == 0:
            self._advance()

    def _advance(self) -> None:
        """Move ``current`` to the next pack that is not full (a new one at the end)."""
        self.current += 1
        while self.current < len(self.packs) and self.room[self.current] < self.packer.min_piece:
            self.current += 1
        if self.current == len(self.packs):
            self._new_pack()

    def _new_pack(self) -> int:
        self.packs.append([])
        self.room.append(self.packer.max_length)
        return len(self.packs) - 1

    def _add(self, i: int, sample: Any, n: int) -> None:
        self.packs[i].append(sample)
        self.room[i] -= n


class PackingTaskEncoder(DefaultTaskEncoder):
    """A task encoder that packs token samples with :class:`SequencePacker` (set ``packer``)."""

    def __init__(
        self,
        max_length: int,
        *,
        over_length: str = "truncate",
        algorithm: str = "first_fit",
        split: bool = False,
        min_piece: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.packer = SequencePacker(
            max_length,
            over_length=over_length,
            algorithm=algorithm,
            split=split,
            min_piece=min_piece,
        )

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
