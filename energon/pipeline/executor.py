"""Executes the micro-batch positions of one rank (or one of its workers) in order.

For each position ``m`` it asks stream ``m % L`` for its batch ``m // L``. A stream whose batches are
split over several executors (when the layout does not divide the stream count) is computed by each of
them, and each keeps only its own batches: correct, just slower. A stream already past a position
(its snapshot says the batch was consumed before a restore) skips it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from energon import debug_log
from energon.pipeline.keys import Key, attach_restore_key, stream_key
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Value
from energon.pipeline.stream import Stream, build_stream
from energon.worker import Layout


@dataclasses.dataclass(slots=True)
class ItemMeta:
    """What travels with each item from a worker to the main process (pickled with every batch by
    torch's DataLoader, so it stays small): the item's global position, its stream, the stream's
    snapshot right after it, and whether the value holds shared-memory arena references."""

    position: int
    stream: int
    snapshot: StreamSnapshot
    arena: bool = False
    worker: int = 0  # the rank's worker that made it (debug logs)
    key: Key | None = None  # the item's restore key, when the loader keeps a journal

    def __reduce__(self) -> tuple:
        # positional arguments: smaller and faster to pickle than the slots' name -> value mapping
        return ItemMeta, (
            self.position,
            self.stream,
            self.snapshot,
            self.arena,
            self.worker,
            self.key,
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
    ) -> None:
        self.spec = spec
        self.keys = keys  # put each item's restore key into its ItemMeta (journals)
        self.layout = layout
        self.snapshots = snapshots or {}
        self.end = end
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
        num_streams = self.spec.num_streams
        mine = set(self.layout.streams())
        exhausted: set[int] = set()
        for m in self.layout.positions(self.end):
            stream_id, index = m % num_streams, m // num_streams
            if stream_id in exhausted:
                if exhausted >= mine:
                    return  # a finite pass whose streams all ended
                continue
            stream = self.stream(stream_id)
            if stream.emitted > index:
                continue
            try:
                while stream.emitted < index:
                    stream.next()
                value, key = stream.next()
            except StopIteration:
                exhausted.add(stream_id)
                continue
            loader_key = stream_key(stream_id, index, key)
            attach_restore_key(value, loader_key)
            self._log_item(value)
            yield (
                value,
                ItemMeta(
                    m,
                    stream_id,
                    stream.state(),
                    worker=self.layout.worker,
                    key=loader_key if self.keys else None,
                ),
            )
