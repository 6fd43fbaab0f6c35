"""Executes the micro-batch positions of one rank (or one of its workers) in order.

For each position ``m`` it asks stream ``m % L`` for its batch ``m // L``. A stream whose batches are
split over several executors (when the layout does not divide the stream count) is computed by each of
them, and each keeps only its own batches: correct, just slower. A stream already past a position
(its snapshot says the batch was consumed before a restore) skips it.

In a planned validation pass (``fill_to_end``) every position below ``end`` is delivered: one whose
stream has run out becomes a *hole* (an :class:`ItemMeta` with ``hole=True`` and no value), which the
loader turns into a flagged filler item. After its last position the executor checks that its streams
have nothing left, so an encoder that yields more than the plan counted is an error, never a silent
loss. Without ``fill_to_end`` streams simply run until they end.

When a finite stream ends, the executor sends its final snapshot (``ended=True``, no value, no
position consumed), so that samples that failed after the stream's last item are counted too. It
does so only when it is the stream's one executor (``world_size x num_workers`` divides the stream
count, the default): a shared stream's final snapshot could overtake another executor's items.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from energon import debug_log
from energon.errors import FatalSampleError
from energon.observe import probe as _probe
from energon.observe.probe import PLAN, POSITION, WAIT
from energon.pipeline.keys import Key, attach_restore_key, stream_key
from energon.pipeline.snapshot import PackedSnapshot, StreamSnapshot
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Value
from energon.pipeline.stream import Stream, build_stream
from energon.samples import padding
from energon.worker import Layout


@dataclasses.dataclass(slots=True)
class ItemMeta:
    """What travels with each item from a worker to the main process (pickled with every batch by
    torch's DataLoader, so it stays small): the item's global position, its stream, the stream's
    snapshot right after it, whether the value holds shared-memory arena references or anything to
    pin, and whether the position is a hole that the loader fills (the value is then None)."""

    position: int
    stream: int
    snapshot: StreamSnapshot | PackedSnapshot  # packed once it crossed from a worker
    arena: bool = False
    worker: int = 0  # the rank's worker that made it (debug logs)
    key: Key | None = None  # the item's restore key, when the loader keeps a journal
    hole: bool = False
    ended: bool = False  # the stream's final snapshot: no value, no position consumed
    # snapshots of further streams the item advanced (balanced steps: energon.balance)
    others: dict[int, StreamSnapshot | PackedSnapshot] | None = None
    # the value holds something to page-lock (with CUDA; see energon.loader.workers.messages.Group)
    pin: bool = False
    # every stream's snapshot at a balanced window's start or end: one mapping shared by the
    # window's items (pickled once per group, recorded once); ``others`` and ``snapshot`` win
    window_streams: Mapping[int, StreamSnapshot | PackedSnapshot] | None = None

    def __reduce__(self) -> tuple:
        # positional arguments: smaller and faster to pickle than the slots' name -> value mapping;
        # the snapshot travels packed (the main process unpacks only those it reads)
        snapshot = self.snapshot
        if isinstance(snapshot, dict):
            snapshot = PackedSnapshot.pack(snapshot)
        return ItemMeta, (
            self.position,
            self.stream,
            snapshot,
            self.arena,
            self.worker,
            self.key,
            self.hole,
            self.ended,
            self.others,
            self.pin,
            self.window_streams,
        )


class Executor:
    def __init__(
        self,
        spec: PipelineSpec,
        layout: Layout,
        snapshots: dict[int, StreamSnapshot] | None = None,
        end: int | None = None,
        build: Callable[[int], Stream] | None = None,
        keys: bool = False,
        fill_to_end: bool = False,
        board: str | None = None,
    ) -> None:
        self.spec = spec
        self.board = board  # the loader's stats board (energon.observe.probe), if any
        self.keys = keys  # put each item's restore key into its ItemMeta (journals)
        self.layout = layout
        self.snapshots = snapshots or {}
        self.end = end
        self.fill_to_end = fill_to_end and end is not None
        executors = layout.world_size * max(1, layout.num_workers)
        self._streams_are_mine = spec.num_streams % executors == 0
        self.build = build if build is not None else (lambda s: build_stream(self.spec, s))
        self.streams: dict[int, Stream] = {}
        self._items = 0

    def _log_item(self, value: Value) -> None:
        """Debug log (level 1): the keys of every item this executor produced."""
        index = self._items
        self._items += 1
        layout = self.layout
        debug_log.emit(
            1,
            lambda: {
                "t": "yield_batch",
                "w": layout.rank * layout.num_workers + layout.worker,
                "m": "train" if self.spec.training else "val",
                "idx": index,
                "keys": debug_log.batch_keys(value),
            },
        )

    def stream(self, stream_id: int) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            stream = self.build(stream_id)
            snapshot = self.snapshots.get(stream_id)
            if snapshot is not None:
                stream.restore(snapshot)
            self.streams[stream_id] = stream
        return stream

    def __iter__(self) -> Iterator[tuple[Value, ItemMeta]]:
        """The items, with this executor's time and progress on the loader's stats board."""
        if self.board is None:  # stats off; the stages must not write into another loader's board
            _probe.install(_probe.OFF)
            for entry in self._items_in_order():
                yield entry
                if _probe.ACTIVE is not _probe.OFF:  # another loader ran in this process
                    _probe.install(_probe.OFF)
            return
        _probe.activate(self.board, self.layout.worker)
        probe = _probe.ACTIVE
        probe.enter(PLAN)
        try:
            for entry in self._items_in_order():
                if entry[0] is not None:
                    probe.produced()
                probe.enter(WAIT)
                yield entry
                if _probe.ACTIVE is not probe:  # another loader ran in this process
                    _probe.install(probe)
                probe.cycle()  # an item boundary: the next item may be timed
                probe.enter(PLAN)
            probe.enter(WAIT)
        finally:
            probe.finish()

    def _items_in_order(self) -> Iterator[tuple[Value, ItemMeta]]:
        num_streams = self.spec.num_streams
        mine = set(self.layout.streams())
        ended: set[int] = set()
        for m in self.layout.positions(self.end):
            stream_id, index = m % num_streams, m // num_streams
            if stream_id in ended:
                if ended >= mine:
                    return  # a finite pass whose streams all ended
                continue
            _probe.HOT[POSITION] = m  # the item being made, should the process die on it
            stream = self.stream(stream_id)
            if stream.emitted > index:
                continue
            item = _item_at(stream, index)
            if item is None:
                if self.fill_to_end:
                    yield None, self._meta(m, stream, hole=True)
                else:
                    ended.add(stream_id)
                    if self._streams_are_mine:
                        yield None, self._meta(m, stream, ended=True)
                continue
            value, key = item
            loader_key = stream_key(stream_id, index, key)
            attach_restore_key(value, loader_key)
            padding.mark(value, False)
            self._log_item(value)
            yield value, self._meta(m, stream, key=loader_key if self.keys else None)
        if self.fill_to_end:
            yield from self._check_streams_ended()

    def _meta(
        self,
        position: int,
        stream: Stream,
        hole: bool = False,
        ended: bool = False,
        key: Key | None = None,
    ) -> ItemMeta:
        return ItemMeta(
            position,
            stream.stream_id,
            stream.state(),
            worker=self.layout.worker,
            key=key,
            hole=hole,
            ended=ended,
        )

    def _check_streams_ended(self) -> Iterator[tuple[Value, ItemMeta]]:
        """A planned pass: a stream with items beyond its planned count would lose them; the
        others send their final snapshots."""
        num_streams = self.spec.num_streams
        for stream_id, stream in self.streams.items():
            planned = -(-(self.end - stream_id) // num_streams)  # positions of it below `end`
            if _item_at(stream, max(planned, stream.emitted)) is not None:
                raise FatalSampleError(
                    f"validation stream {stream_id} produced more items than the {planned} "
                    "planned from its sample count: a task encoder hook returned "
                    "several outputs per input (a generator) without being a generator function. "
                    "Write it with `yield` (energon then agrees the pass length at run time), so "
                    "that no output is dropped."
                )
            if self._streams_are_mine:
                yield None, self._meta(self.end, stream, ended=True)


def _item_at(stream: Stream, index: int) -> tuple[Value, Any] | None:
    """Item ``index`` of ``stream`` (skipping items before it, which other executors own), or None
    when the stream ends first."""
    try:
        while stream.emitted < index:
            stream.next()
        return stream.next()
    except StopIteration:
        return None
