"""The pointer part of a stream: which sample comes next, without reading any data.

:func:`build_pointer_stages` builds the first stages of a logical stream: the
:class:`PointerSource` (one :class:`~energon.plan.reader.SliceReader` per source, mixed by a
:class:`~energon.plan.mixing.Schedule`) and the :class:`ShuffleBuffer`. Their items are pointer keys
``(kind, source, index)``, their states are a few integers and keys. ``build_stream`` puts the loading
and task-encoder stages behind them; anything that must know the order without reading samples (the
ledger: which samples step N saw) can run these stages alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from energon import state_fields as fields
from energon.errors import StateError
from energon.pipeline.keys import Key, as_key, checked_pointer, pointer_key
from energon.pipeline.snapshot import PointerState
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Item, Stage, StageState, Value
from energon.plan.mixing import QuotaSchedule, Schedule, WeightedSchedule
from energon.plan.reader import ReadObserver, SliceReader
from energon.plan.rng import CounterRng, stable_seed
from energon.plan.sharding import slice_bounds, stream_ranges

DEFAULT_PARALLEL_SLICES = 16


class PointerSource(Stage):
    """Sample pointers of one stream: its sources' readers, one after the other (no schedule) or
    interleaved by a blend schedule. ``kinds[i]`` is the kind of source ``i``'s leaf; it tags the
    pointer keys."""

    def __init__(
        self,
        readers: list[SliceReader],
        schedule: Schedule | None = None,
        *,
        kinds: Sequence[str],
        repeat: bool = True,
    ) -> None:
        if len(kinds) != len(readers):
            raise ValueError(f"{len(readers)} readers but {len(kinds)} source kinds")
        self.readers = readers
        self.schedule = schedule
        self.kinds = list(kinds)
        self.repeat = repeat
        self._current = 0
        self._passes = 0

    def next(self) -> Item:
        source, index = self._next_pointer()
        key = pointer_key(self.kinds[source], source, index)
        return key, key

    def _next_pointer(self) -> tuple[int, int]:
        if self.schedule is None:
            while self._current < len(self.readers):
                try:
                    return self._current, self.readers[self._current].next()
                except StopIteration:
                    self._current += 1
            raise StopIteration
        if self.schedule.done:
            if not self.repeat:
                raise StopIteration
            self.schedule.reset()
            self._passes += 1
        source = self.schedule.next()
        return source, self.readers[source].next()

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
        if self.schedule is not None and state.get("schedule") is not None:
            self.schedule.restore(state["schedule"], f"{where}.schedule")
        readers = fields.list_field(state, "readers", where)
        if len(readers) != len(self.readers):
            raise fields.bad_field(
                f"{where}.readers", readers, f"{len(self.readers)} reader states"
            )
        for i, (reader, reader_state) in enumerate(zip(self.readers, readers)):
            reader.restore(reader_state, f"{where}.readers[{i}]")

    def check_key(self, key: Key) -> None:
        """A pointer this stream's readers can hand out: its source's kind, an index inside the
        stream's range of that source (or the source's padding index)."""
        kind, source, index = checked_pointer(key)
        if not 0 <= source < len(self.readers) or kind != self.kinds[source]:
            raise StateError(
                f"restore key {key!r} names source {source} of kind {kind!r}, but this stream's "
                f"sources are {list(enumerate(self.kinds))}"
            )
        reader = self.readers[source]
        start, end = int(reader.bounds[0]), int(reader.bounds[-1])
        if not (start <= index < end or (reader.padding and index == reader.pad_index)):
            raise StateError(
                f"restore key {key!r} points outside this stream's samples {start}..{end - 1} of "
                f"source {source}"
            )

    def epoch_of(self, source: int) -> int:
        """The epoch source ``source``'s reader is in (for debug logs)."""
        return self.readers[source].epoch

    def rebuild(self, key: Key) -> Key:
        return key


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

    def rebuild(self, key: Key) -> Value:
        return self.upstream.rebuild(key)


def build_pointer_stages(
    spec: PipelineSpec,
    stream_id: int,
    observers: Sequence[ReadObserver | None] | None = None,
) -> list[Stage]:
    """The pointer stages of stream ``stream_id``: its pointer source, then its shuffle buffer (in
    training, when the spec asks for one). ``observers[i]`` hears which samples of source ``i`` come
    soon (prefetching); without observers nothing outside the plan is touched."""
    stages: list[Stage] = [pointer_source(spec, stream_id, observers)]
    if spec.training and spec.shuffle_buffer_size and spec.shuffle_buffer_size > 1:
        rng = CounterRng(stable_seed(spec.seed, "shuffle-buffer", stream_id))
        stages.append(ShuffleBuffer(stages[-1], spec.shuffle_buffer_size, rng))
    return stages


def pointer_source(
    spec: PipelineSpec,
    stream_id: int,
    observers: Sequence[ReadObserver | None] | None = None,
) -> PointerSource:
    """One reader per source over this stream's range, mixed as the spec's mode says."""
    ranges = [
        stream_ranges(source.start, source.end, spec.num_streams, rotation)[stream_id]
        for source, rotation in zip(spec.sources, spec.source_rotations())
    ]
    padding = spec.stream_padding(stream_id)
    padded = next((i for i, (start, end) in enumerate(ranges) if end > start), 0)
    mixing = spec.training and spec.mode in ("weight", "repetitions")
    readers = []
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
                seed=stable_seed(spec.seed, "reader", i, stream_id),
                shuffle=spec.training,
                shuffle_over_epochs=source.shuffle_over_epochs if spec.training else None,
                parallel_slices=parallel,
                repeat=spec.repeat or mixing,
                excluded=source.leaf.excluded,
                padding=padding if i == padded else 0,
                pad_index=start if end > start else source.start,
                observer=observers[i] if observers is not None else None,
            )
        )
    return PointerSource(
        readers, _schedule(spec, stream_id, readers), kinds=spec.pointer_kinds(), repeat=spec.repeat
    )


def _schedule(spec: PipelineSpec, stream_id: int, readers: list[SliceReader]) -> Schedule | None:
    if not spec.training:
        return None
    if spec.mode == "weight":
        weights = [s.weight if r.num_samples else 0.0 for s, r in zip(spec.sources, readers)]
        # per-stream, per-source phases: streams do not pick their sources in lock-step
        phase_rng = CounterRng(stable_seed(spec.seed, "blend-phase", stream_id))
        return WeightedSchedule(weights, phases=[phase_rng.random() for _ in weights])
    if spec.mode == "repetitions":
        return QuotaSchedule([q[stream_id] for q in spec.source_stream_quotas()])
    return None
