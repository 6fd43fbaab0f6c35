"""The pointer part of a stream: which sample comes next, without reading any data.

:func:`build_pointer_stages` builds the first stages of a logical stream: the
:class:`PointerSource` (one :class:`~energon.plan.reader.SliceReader` per source, mixed by a
:class:`~energon.plan.mixing.Schedule`), the :class:`ShuffleBuffer` and, when cursor edits exclude
samples, the :class:`ExcludeFilter`. Their items are pointer keys ``(kind, source, index)``, their
states are a few integers and keys. ``build_stream`` puts the loading
and task-encoder stages behind them; anything that must know the order without reading samples (the
ledger: which samples step N saw) can run these stages alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from energon import debug_log
from energon import state_fields as fields
from energon.errors import StateError
from energon.pipeline.blend_by import SampleSizes
from energon.pipeline.keys import Key, as_key, checked_pointer, pointer_key, pointer_target
from energon.pipeline.snapshot import PointerState
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Item, Stage, StageState, Value
from energon.plan.edits import Exclusion
from energon.plan.mixing import QuotaSchedule, Schedule, SizeWeightedSchedule, WeightedSchedule
from energon.plan.reader import ReaderProgress, ReadObserver, SliceReader
from energon.plan.rng import CounterRng, stable_seed
from energon.plan.sharding import slice_bounds, stream_count, stream_range

DEFAULT_PARALLEL_SLICES = 16


class PointerSource(Stage):
    """Sample pointers of one stream: its sources' readers, one after the other (no schedule) or
    interleaved by a blend schedule. ``kinds[i]`` is the kind of source ``i``'s leaf; it tags the
    pointer keys.

    Blend weights changed online start at an item boundary of the stream: whoever drives the
    stream calls :meth:`begin_item` with the number of the item it is about to make, before pulling
    that item's pointers (``Stream.next`` does; a simulation that runs the pointer stages alone
    must do the same, else it only sees the configured weights). ``item_clock`` is False when
    there is nothing to tell.
    """

    def __init__(
        self,
        readers: list[SliceReader],
        schedule: Schedule | None = None,
        *,
        kinds: Sequence[str],
        repeat: bool = True,
        sizes: SampleSizes | None = None,
    ) -> None:
        if len(kinds) != len(readers):
            raise ValueError(f"{len(readers)} readers but {len(kinds)} source kinds")
        self.readers = readers
        self.schedule = schedule
        self.kinds = list(kinds)
        self.repeat = repeat
        self.sizes = sizes  # a blend weighted by size: the schedule hears each pick's size
        self._current = 0
        self._passes = 0
        self.item_clock = bool(getattr(schedule, "changes", None))
        self._log_later: list[dict] = []  # debug-log records due after the last read's sample

    def begin_item(self, item: int) -> None:
        """The stream is about to make its item number ``item`` (see the class docstring)."""
        if self.item_clock:
            self.schedule.begin_item(item)  # type: ignore[union-attr]

    def next(self) -> Item:
        source, index = self._next_pointer()
        key = pointer_key(self.kinds[source], source, index)
        return key, key

    def _next_pointer(self) -> tuple[int, int]:
        if self.schedule is None:
            while self._current < len(self.readers):
                try:
                    return self._current, self._read(self._current)
                except StopIteration:
                    self._current += 1
            raise StopIteration
        if self.schedule.done:
            if not self.repeat:
                raise StopIteration
            self.schedule.reset()
            self._passes += 1
        source = self.schedule.next()
        index = self._read(source)
        if self.sizes is not None:
            self.schedule.record(self.sizes.size(source, index))  # type: ignore[attr-defined]
        return source, index

    def _read(self, source: int) -> int:
        reader = self.readers[source]
        if not debug_log.logs(1):
            return reader.next()
        for record in self._log_later:  # the end of an epoch, logged after its last sample
            debug_log.emit(2, lambda r=record: r)
        before = reader.progress()
        try:
            return reader.next()
        finally:
            self._log_later = log_reader_events(reader, before, reader.progress())

    def state(self) -> PointerState:
        return {
            "current": self._current,
            "passes": self._passes,
            "schedule": self.schedule.state() if self.schedule is not None else None,
            "readers": [r.state() for r in self.readers],
        }

    def restore(self, state: PointerState) -> None:  # type: ignore[override]
        where = "pointers"
        self._current = fields.int_field(state, "current", where, high=len(self.readers))
        self._passes = fields.int_field(state, "passes", where, default=0)
        schedule = state.get("schedule")  # optional: a blend's (checked by its restore)
        if self.schedule is not None and schedule is not None:
            self.schedule.restore(schedule, f"{where}.schedule")
        readers = fields.list_field(state, "readers", where)
        if len(readers) != len(self.readers):
            raise fields.bad_field(
                f"{where}.readers", readers, f"{len(self.readers)} reader states"
            )
        for i, (reader, reader_state) in enumerate(zip(self.readers, readers)):
            reader.restore(reader_state, f"{where}.readers[{i}]")

    def check_key(self, key: Key) -> None:
        """A pointer this stream's readers can hand out: its source's kind, an index inside the
        stream's range of that source."""
        kind, source, index = checked_pointer(key)
        if not 0 <= source < len(self.readers) or kind != self.kinds[source]:
            raise StateError(
                f"restore key {key!r} names source {source} of kind {kind!r}, but this stream's "
                f"sources are {list(enumerate(self.kinds))}"
            )
        reader = self.readers[source]
        start, end = int(reader.bounds[0]), int(reader.bounds[-1])
        if not start <= index < end:
            raise StateError(
                f"restore key {key!r} points outside this stream's samples {start}..{end - 1} of "
                f"source {source}"
            )

    def epoch_of(self, source: int) -> tuple[int, int]:
        """The epoch source ``source``'s reader is in, and how far (for debug logs)."""
        progress = self.readers[source].progress()
        return progress.epoch, progress.position

    def rebuild(self, key: Key) -> Key:
        return key


_LOADER = "WebdatasetSampleLoaderDataset"  # the reference's name of a reader, in its debug logs


def log_reader_events(
    reader: SliceReader, before: ReaderProgress, after: ReaderProgress
) -> list[dict]:
    """The reference's debug-log records of what one ``reader.next()`` did: the start of an epoch
    (level 1, and ``RepeatDataset.repeat`` at level 2 when a repeating pass goes on) and each
    slice it finished (level 2) are logged now; the record of the epoch's end (level 2) is
    returned, to be logged after the sample handed out, where the reference logs it."""
    count = reader.yielded
    if before.started and after.epoch == before.epoch:
        finished = (after.opened - len(after.open_remaining)) - (
            before.opened - len(before.open_remaining)
        )
        for _ in range(finished):
            debug_log.emit(2, _exhausted, reader, after, count)
        if finished and not after.open_remaining and after.opened == reader.num_slices:
            return [_all_exhausted(after, count)]
        return []
    if before.started:
        debug_log.emit(
            2, lambda: {"t": "RepeatDataset.repeat", "offset": before.epoch, "repeats": None}
        )
    debug_log.emit(1, _iter_record, reader)
    debug_log.emit(1, _next_epoch_record, reader, after, count - after.position)
    return []


def _iter_record(reader: SliceReader) -> dict:
    return {
        "t": f"{_LOADER}.__iter__",
        "slice_offsets": [int(b) for b in reader.bounds],
        "parallel_slice_iters": reader.parallel_slices,
        "shuffle_over_epochs": reader.shuffle_over_epochs,
    }


def _next_epoch_record(reader: SliceReader, progress: ReaderProgress, count: int) -> dict:
    return {
        "t": f"{_LOADER}._slices_iter.next_epoch",
        "pending_slice_indexes": [int(s) for s in reader.slice_order(progress.epoch)][
            ::-1
        ],  # a stack: the last opens first
        "count": count,
        "epoch": progress.epoch,
        "epoch_count": 0,
        "probs": [0.0] * reader.parallel_slices,
        "shuffle_over_epochs": reader.shuffle_over_epochs,
    }


def _exhausted(reader: SliceReader, progress: ReaderProgress, count: int) -> dict:
    return {
        "t": f"{_LOADER}._slices_iter.exhausted",
        "remaining": reader.num_slices - progress.opened,
        "count": count,
        "epoch": progress.epoch,
        "epoch_count": progress.position,
        # one entry per parallel slot, as the reference's slot table
        "probs": [float(r) for r in progress.open_remaining]
        + [0.0] * (reader.parallel_slices - len(progress.open_remaining)),
    }


def _all_exhausted(progress: ReaderProgress, count: int) -> dict:
    return {
        "t": f"{_LOADER}._slices_iter.all_exhausted",
        "count": count,
        "epoch": progress.epoch,
        "epoch_count": progress.position,
    }


class ShuffleBuffer(Stage):
    """Keeps up to ``size`` items of its upstream (by key) and emits a uniformly random one each
    step, rebuilt from its key."""

    def __init__(self, upstream: Stage, size: int, rng: CounterRng) -> None:
        self.upstream = upstream
        self.size = size
        self.rng = rng
        self._buffer: list[Key] = []
        self._exhausted = False

    def next(self) -> Item:
        while not self._exhausted and len(self._buffer) < self.size:
            try:
                _, key = self.upstream.next()
            except StopIteration:
                self._exhausted = True
                break
            self._buffer.append(key)
        if not self._buffer:
            self._exhausted = False  # the next pass (validation restart) may refill
            raise StopIteration
        i = self.rng.randbelow(len(self._buffer))
        key = self._buffer[i]
        self._buffer[i] = self._buffer[-1]
        self._buffer.pop()
        return self.upstream.rebuild(key), key

    def state(self) -> StageState:
        return {
            "buffer": list(self._buffer),
            "rng": self.rng.counter,
            "exhausted": self._exhausted,
        }

    def restore(self, state: StageState) -> None:
        where = "shuffle"
        buffer = fields.list_field(state, "buffer", where, max_len=self.size)
        self._buffer = [as_key(k) for k in buffer]
        for key in self._buffer:
            self.upstream.check_key(key)
        self.rng.counter = fields.int_field(state, "rng", where)
        self._exhausted = fields.bool_field(state, "exhausted", where)

    def put_back(self, keys: list[Key], counter: int) -> None:
        """Take the contents and rng counter of a copy of this buffer that was stepped elsewhere
        (the ledger's C stepper), unchecked: its keys came from this stream's own readers, and
        checking them as :meth:`restore` checks a saved state's would cost more than the copy
        saved (the balanced executor hands its buffers back every window)."""
        if len(keys) > self.size:
            raise ValueError(f"{len(keys)} keys do not fit a shuffle buffer of {self.size}")
        self._buffer = keys
        self.rng.counter = counter

    def rebuild(self, key: Key) -> Value:
        return self.upstream.rebuild(key)


class ExcludeFilter(Stage):
    """Drops the pointers that cursor edits excluded (``exclusions[i]``: source ``i``'s).

    It sits behind the shuffle buffer, so everything before it runs exactly as without the edit:
    the samples that are not excluded come in the same order as before, only the excluded ones are
    missing (see :mod:`energon.plan.edits`). Its state counts the dropped pointers.
    """

    def __init__(self, upstream: Stage, exclusions: Sequence[Exclusion | None]) -> None:
        self.upstream = upstream
        self.exclusions = list(exclusions)
        self.dropped = 0
        self.recent: list[Key] = []  # dropped pointers, for whoever watches (not state)

    def next(self) -> Item:
        while True:
            value, key = self.upstream.next()
            source, index = pointer_target(key)
            exclusion = self.exclusions[source]
            if exclusion is not None and exclusion.contains(index):
                self.dropped += 1
                self.recent.append(key)
                del self.recent[:-64]
                continue
            return value, key

    def state(self) -> StageState:
        return {"dropped": self.dropped}

    def restore(self, state: StageState) -> None:
        self.dropped = fields.int_field(state, "dropped", "exclude")

    def rebuild(self, key: Key) -> Value:
        return self.upstream.rebuild(key)


def build_pointer_stages(
    spec: PipelineSpec,
    stream_id: int,
    observers: Sequence[ReadObserver | None] | None = None,
) -> list[Stage]:
    """The pointer stages of stream ``stream_id``: its pointer source, then its shuffle buffer (in
    training, when the spec asks for one), then the exclusion filter (when cursor edits exclude
    samples). ``observers[i]`` hears which samples of source ``i`` come soon (prefetching); without
    observers nothing outside the plan is touched."""
    stages: list[Stage] = [pointer_source(spec, stream_id, observers)]
    if spec.training and spec.shuffle_buffer_size and spec.shuffle_buffer_size > 1:
        rng = CounterRng(stable_seed(spec.seed, "shuffle-buffer", stream_id))
        stages.append(ShuffleBuffer(stages[-1], spec.shuffle_buffer_size, rng))
    exclusions = spec.exclusions()
    if any(e is not None for e in exclusions):
        stages.append(ExcludeFilter(stages[-1], exclusions))
    return stages


def pointer_source(
    spec: PipelineSpec,
    stream_id: int,
    observers: Sequence[ReadObserver | None] | None = None,
) -> PointerSource:
    """One reader per source over this stream's range, mixed as the spec's mode says."""
    ranges = [
        stream_range(source.start, source.end, spec.num_streams, rotation, stream_id)
        for source, rotation in zip(spec.sources, spec.source_rotations())
    ]
    mixing = spec.training and spec.mode in ("weight", "repetitions")
    readers = []
    ids = spec.source_ids()
    for i, (source, (start, end)) in enumerate(zip(spec.sources, ranges)):
        bounds = slice_bounds(start, end, source.leaf.shard_starts, spec.max_samples_per_sequence)
        parallel = spec.parallel_shard_iters
        if parallel is None:
            parallel = DEFAULT_PARALLEL_SLICES if spec.training else 1
        if spec.training and spec.mode == "weight":
            # a blend keeps about as many slices open in total as a single dataset would
            parallel = max(1, round(parallel * source.weight))
        readers.append(
            SliceReader(
                bounds,
                seed=stable_seed(spec.seed, "reader", ids[i], stream_id),
                shuffle=spec.training,
                shuffle_over_epochs=source.shuffle_over_epochs if spec.training else None,
                parallel_slices=parallel,
                repeat=spec.repeat or mixing,
                excluded=source.leaf.excluded,
                observer=observers[i] if observers is not None else None,
            )
        )
    schedule = blend_schedule(spec, stream_id, [r.num_samples > 0 for r in readers])
    sizes = None
    if isinstance(schedule, SizeWeightedSchedule):
        blend_by = spec.blend_by
        sizes = SampleSizes(
            spec.leaves,
            blend_by.function,  # type: ignore[arg-type]
            blend_by.name,
            ranges,
            bounds=[reader.bounds for reader in readers],
        )
    return PointerSource(
        readers, schedule, kinds=spec.pointer_kinds(), repeat=spec.repeat, sizes=sizes
    )


def blend_schedule(
    spec: PipelineSpec, stream_id: int, present: Sequence[bool] | None = None
) -> Schedule | None:
    """The schedule that picks the source of each sample of stream ``stream_id`` (None: the
    stream reads its sources one after the other). Needs only the spec (``energon blend-plan``
    runs it without readers, except for a blend weighted by size, whose picks depend on the sizes
    read); ``present[i]``: the stream has samples of source ``i`` (computed from the spec if not
    given)."""
    if not spec.training:
        return None
    if spec.mode == "weight":
        if present is None:
            present = [
                stream_count(length, spec.num_streams, rotation, stream_id) > 0
                for length, rotation in zip(map(len, spec.sources), spec.source_rotations())
            ]
        # per-stream, per-source phases: streams do not pick their sources in lock-step
        phase_rng = CounterRng(stable_seed(spec.seed, "blend-phase", stream_id))
        kind = SizeWeightedSchedule if spec.blend_by.by_size else WeightedSchedule
        return kind(
            spec.blend_weights(),
            phases=[phase_rng.random() for _ in spec.sources],
            stream=stream_id,
            num_streams=spec.num_streams,
            present=present,
            changes=spec.weight_changes,
        )
    if spec.mode == "repetitions":
        return QuotaSchedule(spec.stream_quotas(stream_id))
    return None
