"""Sequence packing in a stream: :class:`PackStage`, and the pieces of samples split across packs.

A buffer of encoded samples is split into groups by the task encoder's ``select_samples_to_pack``;
each group becomes one sample (or several) through ``pack_selected_samples``. A group may hold a
:class:`~energon.samples.piece.SamplePiece` instead of a buffered sample: that part of the sample
goes into the pack, and the rest of it stays in the buffer, first in line for the next call
(:class:`_Selection` checks and applies the cuts). Datasets marked ``pack_whole`` are never cut:
the hook can ask :func:`~energon.task_encoder.base.may_split`, and a cut of one is an error.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any

from energon import state_fields as fields
from energon.errors import ErrorPolicy, SkipSample
from energon.observe.probe import BATCH
from energon.pipeline.keys import (
    Key,
    as_key,
    attach_restore_key,
    is_piece,
    pack_key,
    pack_parts,
    piece_key,
    piece_parts,
    pointer_target,
    pointers_of,
)
from energon.pipeline.stage import Item, Stage, StageState, Value
from energon.pipeline.stages import (
    Batcher,
    Hook,
    _nth_output,
    _OpenGenerator,
    _rebuild_items,
    _replay,
    call_hook,
)
from energon.samples.piece import SamplePiece
from energon.task_encoder.base import PackingRound, hook_context


class PackStage(Stage):
    """Sequence packing: a buffer of encoded samples is split into groups by
    ``select_samples_to_pack``; each group becomes one sample via ``pack_selected_samples``.

    The buffers hold items whose keys can regenerate them, so the state is keys only, and a packed
    sample's ``__restore_key__`` (set by energon even if the hook leaves it empty) names its members;
    a member that is part of a sample has a ``("Piece", start, stop, key)`` key.
    ``whole_sources[i]``: the samples of source ``i`` must not be split (``pack_whole``).
    """

    def __init__(
        self,
        upstream: Stage,
        buffer_size: int,
        select: Callable[[list[Value]], list[list[Value]]],
        pack: Batcher,
        postencode: Hook | None,
        policy: ErrorPolicy,
        *,
        stream: int,
        num_streams: int,
        empty_rounds_tolerance: int = 10,
        view: Callable[[Value, Key], Any] | None = None,
        whole_sources: Sequence[bool] = (),
    ) -> None:
        self.upstream = upstream
        self.whole_sources = list(whole_sources)  # per source: never split across packs
        self.view = view  # what select sees of an item (its SampleMeta for @uses_sample_meta)
        self.buffer_size = buffer_size
        self.select = select
        self.pack = pack
        self.postencode = postencode
        self.policy = policy
        self.stream = stream
        self.num_streams = num_streams
        self.empty_rounds_tolerance = empty_rounds_tolerance
        self._reading: list[Item] = []
        self._pending: list[list[Item]] = []
        self._packs = 0
        self._rounds = 0
        self._exhausted = False
        self._open: _OpenGenerator | None = None

    def next(self) -> Item:
        empty_rounds = 0
        while True:
            if self._open is not None:
                packed = self._next_open(self._open)
                if packed is not None:
                    return packed
                continue
            if self._pending:
                packed = self._pack_group(self._pending.pop(0))
                if packed is not None:
                    return packed
                continue
            self._fill()
            if not self._reading:
                self._exhausted = False  # the next (validation) pass may refill
                raise StopIteration
            if self._select_groups():
                empty_rounds = 0
                continue
            empty_rounds += 1
            if self._exhausted:
                self.policy.skipped += len(self._reading)
                self._reading = []  # the rest of a finished source that no group wants
            elif empty_rounds > self.empty_rounds_tolerance:
                raise RuntimeError(
                    f"select_samples_to_pack returned no group {empty_rounds} times in a row for a full "
                    f"buffer of {len(self._reading)} samples"
                )

    def _fill(self) -> None:
        while not self._exhausted and len(self._reading) < self.buffer_size:
            try:
                self._reading.append(self.upstream.next())
            except StopIteration:
                self._exhausted = True

    def _select_groups(self) -> bool:
        """Move the groups chosen by the hook from the reading buffer to the pending list; the
        rests of samples it cut stay in the buffer, first."""
        seen = [self._seen(value, key) for value, key in self._reading]
        whole = [self._whole(key) for _, key in self._reading]
        index = self._rounds * self.num_streams + self.stream
        self._rounds += 1
        hook_context.packing = PackingRound(
            frozenset(id(s) for s, w in zip(seen, whole) if w), self._exhausted
        )
        try:
            groups = call_hook(self.select, index, seen, stage=BATCH)
        except Exception as e:
            self.policy.failed(e, None, keys=[k for _, k in self._reading])
            self.policy.skipped += len(self._reading) - 1
            self._reading = []
            return True
        finally:
            hook_context.packing = None
        selection = _Selection(seen, self._reading, whole)
        pending = [items for items in map(selection.group, groups) if items]
        self._reading = selection.left()
        self._pending = pending
        return bool(pending)

    def _seen(self, value: Value, key: Key) -> Any:
        """What the hook sees of a buffered item: the value, or its view (``@uses_sample_meta``);
        a piece of a sample as a :class:`SamplePiece` of either."""
        if self.view is None:
            return value
        if is_piece(key):
            start, stop, inner = piece_parts(key)
            return SamplePiece(self.view(value.sample, inner), start, stop)
        return self.view(value, key)

    def _whole(self, key: Key) -> bool:
        if not self.whole_sources:
            return False
        source, _ = pointer_target(pointers_of(key)[0])
        return self.whole_sources[source]

    def _member(self, key: Key) -> Value:
        """A member of a pack (or a buffered item) regenerated from its key."""
        if is_piece(key):
            start, stop, inner = piece_parts(key)
            return SamplePiece(self.upstream.rebuild(inner), start, stop)
        return self.upstream.rebuild(key)

    def _hook_index(self, pack_index: int) -> int:
        return pack_index * self.num_streams + self.stream

    def _pack_group(self, group: list[Item]) -> Item | None:
        """Start packing a group; a generator packer may emit several packed samples."""
        members = tuple(k for _, k in group)
        index = self._packs
        self._packs += 1
        try:
            result = self._pack_values(index, [v for v, _ in group])
        except SkipSample:
            return None
        except Exception as e:
            self.policy.failed(e, None, keys=members)
            return None
        if inspect.isgenerator(result):
            self._open = _OpenGenerator(result, self._hook_index(index), index, members)
            return self._next_open(self._open)
        self.policy.succeeded()
        key = pack_key(index, 0, members)
        attach_restore_key(result, key)
        return result, key

    def _next_open(self, open_gen: _OpenGenerator) -> Item | None:
        try:
            value = call_hook(next, open_gen.hook_index, open_gen.gen)
        except StopIteration:
            self._open = None
            self.policy.succeeded()
            return None
        except Exception as e:
            self._open = None
            self.policy.failed(e, None, keys=open_gen.inputs)
            return None
        key = pack_key(open_gen.index, open_gen.emitted, open_gen.inputs)
        open_gen.emitted += 1
        attach_restore_key(value, key)
        return value, key

    def _pack_values(self, index: int, values: list[Value]) -> Value:
        hook_index = self._hook_index(index)
        if self.postencode is not None:
            values = [call_hook(self.postencode, hook_index, v) for v in values]
        return call_hook(self.pack, hook_index, values, stage=BATCH)

    def state(self) -> StageState:
        open_pack = None
        if self._open is not None:
            open_pack = [self._open.index, self._open.emitted, list(self._open.inputs)]
        return {
            "reading": [k for _, k in self._reading],
            "pending": [[k for _, k in group] for group in self._pending],
            "open": open_pack,
            "packs": self._packs,
            "rounds": self._rounds,
            "exhausted": self._exhausted,
            **self.counters(),
        }

    def restore(self, state: StageState) -> None:
        where, size = "pack", self.buffer_size
        members = types.SimpleNamespace(rebuild=self._member)
        self._reading = _rebuild_items(members, state.get("reading"), f"{where}.reading", size)
        pending = fields.list_field(state, "pending", where, max_len=size)
        self._pending = [
            _rebuild_items(members, keys, f"{where}.pending[{i}]", size)
            for i, keys in enumerate(pending)
        ]
        if len(self._reading) + sum(map(len, self._pending)) > size:
            raise fields.bad_field(where, "buffers", f"at most {size} buffered samples")
        self._packs = fields.int_field(state, "packs", where)
        self._rounds = fields.int_field(state, "rounds", where)
        self._exhausted = fields.bool_field(state, "exhausted", where)
        self.restore_counters(state)
        self._open = None
        open_pack = state.get("open")
        if open_pack is not None:
            if not isinstance(open_pack, list | tuple) or len(open_pack) != 3:
                raise fields.bad_field(f"{where}.open", open_pack, "[index, emitted, members]")
            index, emitted, members = open_pack
            fields.as_int(index, f"{where}.open[0]")
            if not isinstance(members, list | tuple) or len(members) > self.buffer_size:
                raise fields.bad_field(f"{where}.open[2]", members, "the keys of a pack's members")
            members = tuple(map(as_key, members))
            gen = self._replay(index, members, emitted, f"{where}.open[1]")
            if not inspect.isgenerator(gen):
                raise fields.bad_field(
                    f"{where}.open", open_pack, "None (the packer is no generator)"
                )
            self._open = _OpenGenerator(gen, self._hook_index(index), index, members, emitted)

    def _replay(self, index: int, members: tuple[Key, ...], skip: int, where: str) -> Value:
        """Re-run the packer on the members (regenerated from their keys), skipping ``skip``
        outputs of a generator packer."""
        result = self._pack_values(index, [self._member(k) for k in members])
        if inspect.isgenerator(result):
            _replay(result, skip, self._hook_index(index), where)
        return result

    def rebuild(self, key: Key) -> Value:
        index, sub, members = pack_parts(key)
        result = self._pack_values(index, [self._member(k) for k in members])
        if inspect.isgenerator(result):
            result = _nth_output(result, sub, self._hook_index(index), key)
        attach_restore_key(result, key)
        return result


class _Selection:
    """The groups ``select_samples_to_pack`` returned, as buffered items: a buffered sample as it
    is, a :class:`SamplePiece` of one as a piece cut off it. Pieces of a sample must be cut in
    order from where it starts; what is left of a cut sample stays in the buffer (first, in the
    order of the cuts), then the samples no group took, in their order."""

    def __init__(self, seen: list[Any], items: list[Item], whole: list[bool]) -> None:
        self.seen = seen
        self.items = items
        self.whole = whole
        self.by_id = {id(value): i for i, value in enumerate(seen)}
        self.by_sample = {
            id(value.sample): i for i, value in enumerate(seen) if isinstance(value, SamplePiece)
        }
        self.next_unit: dict[int, int | None] = {}  # item -> first unit not taken (None: none left)

    def group(self, values: list[Any]) -> list[Item]:
        return [self.member(value) for value in values]

    def member(self, value: Any) -> Item:
        i = self.by_id.get(id(value))
        if i is None and isinstance(value, SamplePiece):
            i = self.by_id.get(id(value.sample), self.by_sample.get(id(value.sample)))
            if i is not None:
                return self._cut(i, value)
        if i is None or i in self.next_unit:
            raise ValueError(
                "select_samples_to_pack must return samples of the buffer (or SamplePieces of "
                "them), each at most once"
            )
        self.next_unit[i] = None
        return self.items[i]

    def _extent(self, i: int) -> tuple[int, int | None, Key, Value]:
        """(start, stop, key of the whole sample, the sample) of buffered item ``i``."""
        value, key = self.items[i]
        if is_piece(key):
            start, stop, inner = piece_parts(key)
            return start, stop, inner, value.sample
        return 0, None, key, value

    def _cut(self, i: int, piece: SamplePiece) -> Item:
        start, stop, whole_key, sample = self._extent(i)
        expected = self.next_unit.get(i, start)
        if expected is None or piece.start != expected:
            raise ValueError(
                f"select_samples_to_pack cut {piece.start}..{piece.stop} off a sample whose "
                f"untaken part starts at {expected}: pieces of a sample go in order, each at most once"
            )
        end = piece.stop
        if stop is not None and (end is None or end > stop):
            raise ValueError(f"a piece {piece.start}..{end} reaches past its sample's end {stop}")
        if end == stop:  # the whole untaken rest
            self.next_unit[i] = None
            if piece.start == start:
                return self.items[i]
            return SamplePiece(sample, piece.start, stop), piece_key(piece.start, stop, whole_key)
        if self.whole[i]:
            raise ValueError(
                f"select_samples_to_pack split sample {whole_key!r}, but its dataset is marked "
                "pack_whole (never split): ask energon.task_encoder.may_split(sample) first"
            )
        self.next_unit[i] = end
        return SamplePiece(sample, piece.start, end), piece_key(piece.start, end, whole_key)

    def left(self) -> list[Item]:
        """What stays in the buffer: the rests of cut samples, then the untouched ones."""
        rests = []
        for i, unit in self.next_unit.items():
            if unit is not None:
                _, stop, whole_key, sample = self._extent(i)
                rests.append((SamplePiece(sample, unit, stop), piece_key(unit, stop, whole_key)))
        return rests + [item for i, item in enumerate(self.items) if i not in self.next_unit]
