"""Moving a simulated stream forward fast.

A simulated stream (:mod:`energon.ledger.simulate`) is the real chain of stages, so it can be
stepped item by item, exactly, but at Python speed. :class:`SimulatedStream` jumps: every stage
behind the pointer stages says how many upstream items ``count`` of its own items take
(``Stage.skip_items``; a batch of 8 takes 8 samples, a 1:1 hook one) and moves its counters; then
only the pointer stages run, pointer by pointer, in C where possible
(:class:`~energon.pipeline.pointers_native.NativePointers`, else the Python stages). Where a
stage cannot say (packing, grouping: they buffer and decide from what they see) the stream is
stepped item by item. Either way the stream ends up in exactly the state the item-by-item run reaches (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from energon.pipeline.error_account import lost_sample_entry
from energon.pipeline.keys import Key, pointer_key, pointer_target, pointers_of
from energon.pipeline.pointers import ExcludeFilter, PointerSource
from energon.pipeline.pointers_native import NativePointers
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stages import LoadStage
from energon.pipeline.stream import Stream, build_stream
from energon.plan.reader import SliceReader

Counts = Sequence[np.ndarray | None]  # per source: exposure counts over its leaf (or None)


class SimulatedStream:
    """One logical stream of a simulated spec (``spec`` from ``simulated_spec``)."""

    def __init__(
        self,
        spec: PipelineSpec,
        stream_id: int,
        snapshot: StreamSnapshot | None = None,
        *,
        native: bool = True,
    ) -> None:
        self.spec = spec
        self.stream_id = stream_id
        self.native = native
        self.stream: Stream = build_stream(spec, stream_id)
        stages = self.stream.stages
        self.pointer_stages = next(i for i, s in enumerate(stages) if isinstance(s, LoadStage))
        self._orders: dict[tuple[int, int], np.ndarray] = {}  # (reader id, epoch) -> slice order
        self.excluded: list[Key] = []  # pointers the exclusion filter dropped making the last item
        # samples a lost loader worker died on, skipped making the last item (energon.loader.recovery)
        self.lost: list[Key] = []
        if snapshot is not None:
            self.restore(snapshot)

    def restore(self, snapshot: StreamSnapshot) -> None:
        self.stream.restore(snapshot)

    @property
    def emitted(self) -> int:
        """Items the stream has emitted (its next item has this number)."""
        return self.stream.emitted

    def snapshot(self) -> StreamSnapshot:
        return self.stream.state()

    def next(self) -> Key:
        """The restore key of the next item (StopIteration at the end of a finite pass)."""
        watched = self._exclude_filter()
        if watched is not None:
            watched.recent.clear()
        account = self.stream.account
        pending = list(account.lost_pending) if account is not None else []
        _, key = self.stream.next()
        self.excluded = list(watched.recent) if watched is not None else []
        if pending:
            self.lost = [
                pointer_key("lost", e["source"], e["index"])
                for e in pending
                if e not in account.lost_pending
            ]
        else:
            self.lost = []
        return key

    def add_lost(self, entries: Sequence[dict]) -> None:
        """Samples on which the loader lost workers after this stream's snapshot (known from
        later states): the stream skips them where the loader's did."""
        account = self.stream.account
        if account is None:
            return
        known = {e["error"] for e in (*account.lost_pending, *account.lost_history)}
        for entry in entries:
            if entry["error"] not in known:
                account.lost_pending.append(lost_sample_entry(**entry))
                known.add(entry["error"])

    def _exclude_filter(self) -> ExcludeFilter | None:
        last = self.stream.stages[self.pointer_stages - 1]
        return last if isinstance(last, ExcludeFilter) else None

    def skip(self, count: int, counts: Counts | None = None) -> None:
        """Move forward by ``count`` items without describing them; ``counts[s][i] += 1`` for every
        sample ``i`` of source ``s`` they hold (exposure counting)."""
        if count <= 0:
            return
        for chunk in self._chunks_within_weight_regimes(count):
            self._skip(chunk, counts)

    def _chunks_within_weight_regimes(self, count: int) -> list[int]:
        """``count`` split where blend weights changed online take effect (an item boundary of
        the stream): each chunk runs under one set of weights, announced before it starts."""
        source = self.stream.stages[0]
        if not isinstance(source, PointerSource) or not source.item_clock:
            return [count]
        starts = source.schedule.change_items  # type: ignore[union-attr]
        first, end = self.stream.emitted, self.stream.emitted + count
        cuts = sorted({first, end, *(s for s in starts if first < s < end)})
        return [b - a for a, b in zip(cuts, cuts[1:])]

    def _skip(self, count: int, counts: Counts | None) -> None:
        source = self.stream.stages[0]
        if isinstance(source, PointerSource):
            source.begin_item(self.stream.emitted)
        needed = self._skip_behind_pointers(count)
        if needed is None:
            for _ in range(count):
                key = self.next()
                if counts is not None:
                    add_counts(counts, pointers_of(key))
            return
        self._advance_pointers(needed, counts)
        self.stream.emitted += count

    def _skip_behind_pointers(self, count: int) -> int | None:
        """Move the stages behind the pointer stages ``count`` items on; the pointers they take
        (None, and nothing changed, where a stage cannot say)."""
        saved = self.stream.state()
        needed: int | None = count
        for stage in reversed(self.stream.stages[self.pointer_stages :]):
            needed = stage.skip_items(needed)
            if needed is None:
                self.stream.restore(saved)
                return None
        return needed

    def _advance_pointers(self, count: int, counts: Counts | None) -> None:
        stages = self.stream.stages[: self.pointer_stages]
        fast = NativePointers.attach(stages) if self.native else None
        if fast is not None:
            fast.advance(count, counts=counts)
            fast.write_back()
            return
        last = stages[-1]
        if counts is None:
            for _ in range(count):
                last.next()
            return
        for _ in range(count):
            _, key = last.next()
            add_counts(counts, [key])

    def read_epoch(self, pointer: Key, in_flight: int | None) -> int | None:
        """The epoch of its reader in which ``pointer`` (just emitted) was read, or None where
        the state cannot tell (see :func:`read_epoch`)."""
        source, index = pointer_target(pointer)
        reader = self.stream.stages[0].readers[source]  # type: ignore[attr-defined]
        return read_epoch(reader, index, in_flight, self._orders)


def add_counts(counts: Counts, pointers: Sequence[Key]) -> None:
    for pointer in pointers:
        source, index = pointer_target(pointer)
        array = counts[source]
        if array is not None:
            array[index] += 1


def read_epoch(
    reader: SliceReader,
    index: int,
    in_flight: int | None,
    orders: dict[tuple[int, int], np.ndarray] | None = None,
) -> int | None:
    """The epoch in which ``reader`` handed out ``index``, judged from its state right after.

    Sample ``index`` was read in the reader's current epoch iff its slice was opened in this
    epoch's order and the slice's cursor is past it. Otherwise it was read in the previous epoch,
    provided fewer samples than one epoch can sit between the reader and the output
    (``in_flight``: shuffle buffer, packing buffer, the batch; None: unbounded, as in grouping
    buckets). Readers that draw slices with replacement can read a slice twice per epoch: None.
    """
    state = reader.state()
    epoch = int(state["epoch"])
    if not state["started"] or reader.over_epochs == -1:
        return None
    slice_index = int(np.searchsorted(reader.bounds, index, side="right")) - 1
    cache = orders if orders is not None else {}
    order = cache.get((id(reader), epoch))
    if order is None:
        order = cache[(id(reader), epoch)] = reader.slice_order(epoch)
    opened = bool(np.any(order[: int(state["pos"])] == slice_index))
    if opened:
        cursor = next((c for s, c in state["active"] if s == slice_index), None)
        if cursor is None or index < cursor:
            return epoch
    if epoch == 0 or in_flight is None or reader.num_samples - len(reader.excluded) <= in_flight:
        return None
    return epoch - 1
