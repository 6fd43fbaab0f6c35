"""The stages behind a stream's pointers: load, task-encoder hooks, packing, grouping, batching.

Each is a :class:`~energon.pipeline.stage.Stage`. Buffers hold items whose restore keys
(:mod:`energon.pipeline.keys`) can regenerate them, so states hold keys, never decoded data, and
restoring re-reads only what sat in buffers. A hook that is a generator and was interrupted between
outputs is saved as (its input, outputs already emitted) and resumed by re-running it. A regenerated
item sees the ``current_sample_index`` / ``current_batch_index`` its original was made with.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Generator, Hashable
from typing import Any

from energon import debug_log
from energon import state_fields as fields
from energon.decode.image import set_images_deferred
from energon.decode.pending import any_pending, materialize_pending
from energon.decode.sample_decoder import SampleDecoder
from energon.decode.threads import DecodeWindow, window_open
from energon.errors import ErrorPolicy, SampleException, SkipSample, StateError
from energon.observe import probe as _probe
from energon.observe.probe import (
    BATCH,
    DECODE,
    ENCODE,
    INDEX,
    POSITION,
    READ,
    SAMPLES,
    SOURCE,
    STAGE,
)
from energon.pipeline.keys import (
    Key,
    as_key,
    attach_restore_key,
    batch_key,
    batch_members,
    map_key,
    map_parts,
    pointer_target,
)
from energon.pipeline.stage import Item, Stage, StageState, Value
from energon.task_encoder.base import hook_context

Hook = Callable[[Value], Value]  # a task-encoder hook: value -> value, or a generator of values
Batcher = Callable[[list[Value]], Value]


class LoadStage(Stage):
    """Reads and decodes the sample a pointer names (and cooks crude samples); failures follow the
    error policy. ``leaves[i]`` and ``cooks[i]`` belong to source ``i`` of the stream."""

    def __init__(
        self,
        upstream: Stage,
        leaves: list[Any],
        decoder: SampleDecoder | None,
        policy: ErrorPolicy,
        cooks: list[Hook | None] | None = None,
        epoch_of: Callable[[int], tuple[int, int]] | None = None,
        defer_images: bool = False,
        decode_threads: int = 1,
        reads: Callable[[], tuple[int, ...]] | None = None,
    ) -> None:
        self.upstream = upstream
        self.leaves = leaves
        self.decoder = decoder
        self.policy = policy
        self.cooks = cooks or [None] * len(leaves)
        self.epoch_of = epoch_of  # source -> its reader's (epoch, position) (debug logs only)
        # float images may stay uint8 until batched (energon.decode.pending): only when the
        # library's batch stage is all that sees the samples
        self.defer_images = defer_images
        # a batch's JPEGs are decoded on this many threads (energon.decode.threads): only where
        # decoded images stay pending until the batch, which waits for them anyway
        self.decode_threads = decode_threads if defer_images else 1
        # samples read per source (the error account's reads_now), taken with each sample read
        # ahead: a failure noticed later is counted as of then, as next() would have
        self.reads = reads
        self._idle_windows = 0  # batches in a row that handed no image to a thread
        self._loaded = 0  # debug logs only
        # samples a lost worker died on, to skip (the account's own list, changed in place)
        self.lost: list[dict[str, Any]] = getattr(policy.account, "lost_pending", [])

    def next(self) -> Item:
        while True:
            _, key = self.upstream.next()
            source, index = pointer_target(key)
            if self.lost and self.policy.account.skip_lost(key, source, index):
                continue
            # the stats probe's hot path, inlined (probe.switch / probe.back): stage read, the
            # sample (the watchdog names it), one more sample read; a clock only in timed items
            hot = _probe.HOT
            previous = hot[STAGE]
            hot[STAGE] = READ
            hot[SOURCE] = source
            hot[INDEX] = index
            hot[SAMPLES] += 1
            if _probe.TIMING:
                _probe.ACTIVE.switched(previous)
            try:
                previous_deferral = set_images_deferred(self.defer_images)
                try:
                    sample = self._load(key, source, index)
                finally:
                    set_images_deferred(previous_deferral)
            except SampleException as e:
                _probe.back(previous, READ)
                self.policy.failed(e, keys=(key,))
                continue
            hot[STAGE] = previous
            if _probe.TIMING:
                _probe.ACTIVE.switched(READ)
            self.policy.succeeded()
            self._loaded += 1
            debug_log.emit(1, self._log_record, sample, key)
            return sample, key

    def next_items(self, count: int) -> list[Item]:
        """``count`` samples whose images are decoded on threads while the next ones are read.

        Reading, building, the error policy and the debug log see the samples one by one and in
        order, as in :meth:`next`; a sample whose threaded decode did not produce its image is
        loaded again as :meth:`next` would (then its value, or its error, is the ordinary one)."""
        if self.decode_threads <= 1:
            return super().next_items(count)
        items: list[Item] = []
        ended = threaded = False
        while len(items) < count and not ended:
            started = []
            for _ in range(count - len(items)):
                try:
                    _, key = self.upstream.next()
                except StopIteration:
                    ended = True
                    break
                if self.lost and self.policy.account.skip_lost(key, *pointer_target(key)):
                    continue
                started.append(self._start(key))
            for load in started:
                threaded = threaded or load.window.submitted
                item = self._finish(load)
                if item is not None:
                    items.append(item)
        self._idle_windows = 0 if threaded else self._idle_windows + 1
        if self._idle_windows >= _IDLE_WINDOWS:
            self.decode_threads = 1  # no JPEGs here (text, PNGs): a window only costs time
        return items

    def _start(self, key: Key) -> _Started:
        """Read and build the sample ``key`` names, its JPEGs handed to decode threads."""
        source, index = pointer_target(key)
        hot = _probe.HOT
        hot[SOURCE] = source
        hot[INDEX] = index
        hot[SAMPLES] += 1
        window = DecodeWindow(self.decode_threads)
        reads = self.reads() if self.reads is not None else None
        return _Started(key, self._read(key, window, source, index), window, reads)

    def _finish(self, load: _Started) -> Item | None:
        """The loaded item once its decodes are done, or None (failed: the policy decides)."""
        key, sample = load.key, load.sample
        if not isinstance(sample, SampleException):
            previous = _probe.switch(DECODE)
            decoded = load.window.succeeded()
            _probe.back(previous, DECODE)
            if not decoded:  # loaded again as next() would, decoded on this thread
                sample = self._read(key, None)
        if isinstance(sample, SampleException):
            self.policy.failed(sample, keys=(key,), reads=load.reads)
            return None
        self.policy.succeeded()
        self._loaded += 1
        debug_log.emit(1, self._log_record, sample, key)
        return sample, key

    def _read(
        self, key: Key, window: DecodeWindow | None, source: int | None = None, index: int = 0
    ) -> Value | SampleException:
        """The sample ``key`` names (or its error) with images deferred to the batch, their
        JPEGs handed to ``window``'s threads (None: decoded on this thread); ``source`` and
        ``index`` as for :meth:`_load`."""
        previous = _probe.switch(READ)
        previous_window = window_open(window)
        previous_deferral = set_images_deferred(True)
        try:
            return self._load(key, source, index)
        except SampleException as e:
            return e
        finally:
            set_images_deferred(previous_deferral)
            window_open(previous_window)
            _probe.back(previous, READ)

    def _log_record(self, sample: Value, key: Key) -> dict[str, Any]:
        """The reference's debug-log record of one sample read (reading order, before shuffling)."""
        sources = (
            sample.get("__sources__")
            if isinstance(sample, dict)
            else getattr(sample, "__sources__", None)
        )
        keys = debug_log.batch_keys(sample)
        source, index = pointer_target(key)
        epoch, epoch_count = self.epoch_of(source) if self.epoch_of is not None else (None, None)
        return {
            "t": "WebdatasetSampleLoaderDataset._slices_iter.yield",
            "index": index,
            "key": keys[0] if keys else None,
            "shard": sources[0].shard_name if sources else None,
            "count": self._loaded,
            "epoch": epoch,
            "epoch_count": epoch_count,
        }

    def state(self) -> StageState:
        return self.counters()

    def restore(self, state: StageState) -> None:
        self.restore_counters(state)

    def skip_items(self, count: int) -> int | None:
        if self.lost:
            return None  # a pending lost sample takes a pointer without giving a sample
        return count  # one sample per pointer (when nothing fails to load)

    def rebuild(self, key: Key) -> Value:
        if self.upstream is not None:  # (a load stage without pointer stages: energon.balance)
            self.upstream.check_key(key)  # a key from a saved state or a restore key: check it
        return self._load(key)

    def _load(self, key: Key, source: int | None = None, index: int = 0) -> Value:
        """The sample ``key`` points to (``source``, ``index``: its target, when known)."""
        if source is None:
            source, index = pointer_target(key)
        sample = self.leaves[source].load(index, self.decoder, key)
        cook = self.cooks[source]
        if cook is None:
            return sample
        try:
            return cook(sample)
        except (SampleException, SkipSample):
            raise
        except Exception as e:
            raise SampleException(
                f"cooking sample {sample.get('__key__')!r} failed: {type(e).__name__}: {e}"
            ) from e


def working_on(source: int, index: int, position: int) -> None:
    """Publish the sample this process is about to handle (for stages that load outside a
    :class:`LoadStage`) for the micro-batch at global ``position``: the watchdog names it, and a
    lost worker's recovery skips it."""
    hot = _probe.HOT
    hot[STAGE], hot[SOURCE], hot[INDEX], hot[POSITION] = READ, source, index, position


#: batches in a row without a JPEG for the decode threads after which a load stage stops trying
_IDLE_WINDOWS = 8


@dataclasses.dataclass(slots=True)
class _Started:
    """A sample read ahead by :meth:`LoadStage.next_items`: built, its decodes maybe running."""

    key: Key
    sample: Value | SampleException
    window: DecodeWindow
    reads: tuple[int, ...] | None  # samples read per source when it was read


def call_hook(
    fn: Callable[..., Value], sample_index: int, *args: Any, stage: int = ENCODE
) -> Value:
    """Call a hook with ``current_sample_index`` set to ``sample_index``; its time counts as
    ``stage`` in the worker's stats (:mod:`energon.observe.probe`)."""
    previous = hook_context.sample_index
    hook_context.sample_index = sample_index
    hot = _probe.HOT  # probe.switch / probe.back inlined: this runs for every sample
    previous_stage = hot[STAGE]
    hot[STAGE] = stage
    if _probe.TIMING:
        _probe.ACTIVE.switched(previous_stage)
    try:
        return fn(*args)
    finally:
        hot[STAGE] = previous_stage
        if _probe.TIMING:
            _probe.ACTIVE.switched(stage)
        hook_context.sample_index = previous


def _in_batch(batch_index: int | None, fn: Callable[..., Value], *args: Any) -> Value:
    """``fn(*args)`` with ``current_batch_index`` set to ``batch_index`` (if known)."""
    if batch_index is None:
        return fn(*args)
    previous = hook_context.batch_index
    hook_context.batch_index = batch_index
    try:
        return fn(*args)
    finally:
        hook_context.batch_index = previous


def _rebuild_items(
    upstream: Stage, keys: Any, where: str, max_len: int | None = None
) -> list[Item]:
    """Buffered items of a saved state, regenerated from their keys through the upstream stages."""
    if not isinstance(keys, list | tuple):
        raise fields.bad_field(where, keys, "a list of restore keys")
    if max_len is not None and len(keys) > max_len:
        raise fields.bad_field(where, f"{len(keys)} keys", f"at most {max_len}")
    items = []
    for data in keys:
        key = as_key(data)
        items.append((upstream.rebuild(key), key))
    return items


def _replay(gen: Generator, skip: int, hook_index: int, where: str) -> None:
    """Advance a re-run generator hook past the ``skip`` outputs it had already emitted."""
    fields.as_int(skip, where, 0, fields.MAX_REPLAY)
    for done in range(skip):
        try:
            call_hook(next, hook_index, gen)
        except StopIteration:
            raise StateError(
                f"loader state field {where!r} says {skip} outputs were emitted, but the hook "
                f"makes only {done} for that input (the state is damaged, or the hook changed)"
            ) from None


def _rebuild_batch(
    upstream: Stage, batcher: Batcher, key: Key, stream: int, num_streams: int
) -> Value:
    """A batch regenerated from its key; the batcher sees the ``current_sample_index`` it had."""
    members = [upstream.rebuild(k) for k in batch_members(key)]
    batch = call_hook(batcher, key[1] * num_streams + stream, members, stage=BATCH)
    attach_restore_key(batch, key)
    return batch


def _nth_output(gen: Generator, sub: int, hook_index: int, key: Key) -> Value:
    """Output ``sub`` of a re-run generator hook (the one restore key ``key`` names)."""
    _replay(gen, sub, hook_index, f"restore key {key!r}")
    try:
        return call_hook(next, hook_index, gen)
    except StopIteration:
        raise StateError(
            f"restore key {key!r} names output {sub} of a generator hook that makes only {sub} "
            "for that input (the state is damaged, or the hook changed)"
        ) from None


@dataclasses.dataclass(slots=True)
class _OpenGenerator:
    """A generator hook between two outputs: what it was called on and how far it got."""

    gen: Generator
    hook_index: int  # current_sample_index while it runs
    index: int  # the sample index (map) or pack index (pack) of its outputs' keys
    inputs: Key  # the input key (map) or the tuple of member keys (pack)
    emitted: int = 0


class MapStage(Stage):
    """Applies a hook (value or generator; ``SkipSample`` drops) and numbers its inputs.

    ``sample_index = inputs_seen * num_streams + stream`` is the deterministic, layout-independent
    ``current_sample_index``.
    """

    def __init__(
        self,
        upstream: Stage,
        fn: Hook,
        name: str,
        policy: ErrorPolicy,
        *,
        stream: int,
        num_streams: int,
        identity: bool = False,
    ) -> None:
        self.upstream = upstream
        self.fn = fn
        self.name = name
        self.policy = policy
        self.stream = stream
        self.num_streams = num_streams
        # the hook returns its input (the library's encode_sample): it never fails, skips or
        # yields, so items may be asked of the upstream several at a time (next_items)
        self.identity = identity
        self._inputs = 0
        self._open: _OpenGenerator | None = None

    def next(self) -> Item:
        while True:
            if self._open is not None:
                item = self._next_from_open(self._open)
                if item is not None:
                    return item
                continue
            item = self._map(*self.upstream.next())
            if item is not None:
                return item

    def next_items(self, count: int) -> list[Item]:
        if not self.identity:
            return super().next_items(count)
        items = [self._map(value, key) for value, key in self.upstream.next_items(count)]
        if any(item is None for item in items):  # cannot happen with an identity hook
            raise AssertionError(f"{self.name} is marked identity but dropped a sample")
        return items  # type: ignore[return-value]

    def _map(self, value: Value, key: Key) -> Item | None:
        """The hook's result for one input, or None (failed, skipped, or a generator opened)."""
        sample_index = self._inputs * self.num_streams + self.stream
        self._inputs += 1
        try:
            result = call_hook(self.fn, sample_index, value)
        except SkipSample:
            return None
        except Exception as e:
            self.policy.failed(e, value, keys=(key,))
            return None
        if inspect.isgenerator(result):
            self._open = _OpenGenerator(result, sample_index, sample_index, key)
            return None
        self.policy.succeeded()
        out_key = map_key(self.name, sample_index, 0, key, hook_context.batch_index)
        attach_restore_key(result, out_key)
        return result, out_key

    def _next_from_open(self, open_gen: _OpenGenerator) -> Item | None:
        try:
            value = call_hook(next, open_gen.hook_index, open_gen.gen)
        except StopIteration:
            self._open = None
            self.policy.succeeded()
            return None
        except SkipSample:
            self._open = None
            return None
        except Exception as e:
            self._open = None
            self.policy.failed(e, keys=(open_gen.inputs,))
            return None
        out_key = map_key(
            self.name,
            open_gen.index,
            open_gen.emitted,
            open_gen.inputs,
            hook_context.batch_index,
        )
        open_gen.emitted += 1
        attach_restore_key(value, out_key)
        return value, out_key

    def skip_items(self, count: int) -> int | None:
        if self._open is not None or inspect.isgeneratorfunction(self.fn):
            return None  # how many outputs a generator yields depends on the data
        self._inputs += count
        return count

    def state(self) -> StageState:
        pending = None
        if self._open is not None:
            pending = [self._open.inputs, self._open.index, self._open.emitted]
        return {"inputs": self._inputs, "pending": pending, **self.counters()}

    def restore(self, state: StageState) -> None:
        where = f"map[{self.name}]"
        self._inputs = fields.int_field(state, "inputs", where)
        self.restore_counters(state)
        self._open = None
        pending = state.get("pending")
        if pending is not None:
            if not isinstance(pending, list | tuple) or len(pending) != 3:
                raise fields.bad_field(f"{where}.pending", pending, "[key, index, emitted]")
            in_key, sample_index, emitted = pending
            in_key = as_key(in_key)
            fields.as_int(sample_index, f"{where}.pending[1]")
            gen = call_hook(self.fn, sample_index, self.upstream.rebuild(in_key))
            if not inspect.isgenerator(gen):
                raise fields.bad_field(
                    f"{where}.pending", pending, "None (the hook is no generator)"
                )
            _replay(gen, emitted, sample_index, f"{where}.pending[2]")
            self._open = _OpenGenerator(gen, sample_index, sample_index, in_key, emitted)

    def rebuild(self, key: Key) -> Value:
        sample_index, sub, in_key, batch_index = map_parts(key)
        return _in_batch(batch_index, self._regenerate, key, sample_index, sub, in_key)

    def _regenerate(self, key: Key, sample_index: int, sub: int, in_key: Key) -> Value:
        result = call_hook(self.fn, sample_index, self.upstream.rebuild(in_key))
        if inspect.isgenerator(result):
            result = _nth_output(result, sub, sample_index, key)
        attach_restore_key(result, key)
        return result


class ConstantSize:
    """A batch-size schedule that is the same for every batch (its sums need no loop)."""

    __slots__ = ("size",)

    def __init__(self, size: int | None) -> None:
        self.size = size

    def __call__(self, batch: int) -> int | None:
        return self.size


class BatchStage(Stage):
    """Collects consecutive items into batches (sizes from a schedule) and calls the batcher."""

    def __init__(
        self,
        upstream: Stage,
        sizes: Callable[[int], int],
        batcher: Batcher,
        policy: ErrorPolicy,
        *,
        drop_last: bool = False,
        stream: int = 0,
        num_streams: int = 1,
        deferred_images: bool = False,
    ) -> None:
        self.upstream = upstream
        self.sizes = sizes
        self.batcher = batcher
        self.policy = policy
        self.drop_last = drop_last
        self.stream = stream
        self.num_streams = num_streams
        # the samples may hold PendingImages: none may leave this stage (energon.decode.pending)
        self.deferred_images = deferred_images
        self._batches = 0

    def next(self) -> Item:
        while True:
            size = self.sizes(self._batches)
            items = self.upstream.next_items(max(1, size))
            values = [value for value, _ in items]
            keys = [key for _, key in items]
            if not values or (self.drop_last and len(values) < size):
                raise StopIteration
            key = batch_key(self._batches, tuple(keys))
            hook_index = self._batches * self.num_streams + self.stream
            self._batches += 1
            try:
                batch = call_hook(self.batcher, hook_index, values, stage=BATCH)
                if self.deferred_images and any_pending():
                    batch = materialize_pending(batch)
            except Exception as e:
                if self.deferred_images and any_pending():
                    values = materialize_pending(values)
                self.policy.failed(e, values, keys=keys)
                continue
            self.policy.succeeded()
            attach_restore_key(batch, key)
            return batch, key

    def state(self) -> StageState:
        return {"batches": self._batches, **self.counters()}

    def restore(self, state: StageState) -> None:
        self._batches = fields.int_field(state, "batches", "batch")
        self.restore_counters(state)

    def skip_items(self, count: int) -> int | None:
        if isinstance(self.sizes, ConstantSize) and self.sizes.size is not None:
            consumed = self.sizes.size * count
        else:
            consumed = sum(map(self.sizes, range(self._batches, self._batches + count)))
        self._batches += count
        return consumed

    def rebuild(self, key: Key) -> Value:
        return _rebuild_batch(self.upstream, self.batcher, key, self.stream, self.num_streams)


def _key_data(key: Hashable) -> Any:
    """A hashable group key as JSON-able data (tuples become lists)."""
    if isinstance(key, tuple):
        return [_key_data(k) for k in key]
    return key


@dataclasses.dataclass(slots=True)
class _Bucket:
    """Items of one group waiting for their batch."""

    size: int  # the group's batch size
    since: int  # inputs seen when the bucket opened
    items: list[Item] = dataclasses.field(default_factory=list)


class GroupBatchStage(Stage):
    """Batches of samples that share a group key (``batch_group_criterion``), each group with its
    own batch size. A bucket whose oldest sample has waited ``max_wait`` samples is flushed early."""

    def __init__(
        self,
        upstream: Stage,
        criterion: Callable[[Value], tuple[Hashable, int | None]],
        batcher: Batcher,
        policy: ErrorPolicy,
        *,
        batch_size: int | None,
        drop_last: bool = False,
        max_wait: int | None = None,
        stream: int = 0,
        num_streams: int = 1,
        view: Callable[[Value, Key], Any] | None = None,
    ) -> None:
        self.upstream = upstream
        # what the criterion sees of an item (its SampleMeta for @uses_sample_meta)
        self.view = view
        self.criterion = criterion
        self.batcher = batcher
        self.policy = policy
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.max_wait = max_wait
        self.stream = stream
        self.num_streams = num_streams
        self._buckets: dict[Hashable, _Bucket] = {}
        self._ready: list[list[Item]] = []
        self._seen = 0
        self._batches = 0

    def next(self) -> Item:
        while True:
            if self._ready:
                batch = self._make_batch(self._ready.pop(0))
                if batch is not None:
                    return batch
                continue
            try:
                value, key = self.upstream.next()
            except StopIteration:
                self._flush_all()
                if not self._ready:
                    raise
                continue
            self._add(value, key)

    def _add(self, value: Value, key: Key) -> None:
        index = self._seen * self.num_streams + self.stream
        self._seen += 1
        try:
            seen = value if self.view is None else self.view(value, key)
            group, size = call_hook(self.criterion, index, seen, stage=BATCH)
        except Exception as e:
            self.policy.failed(e, value, keys=(key,))
            return
        if (size is None) == (self.batch_size is None):
            raise ValueError(
                "batch_group_criterion must return a batch size exactly when batch_size is None "
                f"(got {size!r} with batch_size={self.batch_size!r})"
            )
        size = size or self.batch_size
        group = as_key(_key_data(group))
        bucket = self._buckets.get(group)
        if bucket is None:
            bucket = self._buckets[group] = _Bucket(size, self._seen)
        elif bucket.size != size:
            raise ValueError(f"group {group!r} changed its batch size from {bucket.size} to {size}")
        bucket.items.append((value, key))
        if len(bucket.items) >= size:
            self._ready.append(self._buckets.pop(group).items)
        self._flush_stale()

    def _flush_stale(self) -> None:
        if self.max_wait is None:
            return
        for group in [g for g, b in self._buckets.items() if self._seen - b.since >= self.max_wait]:
            self._ready.append(self._buckets.pop(group).items)

    def _flush_all(self) -> None:
        for group in list(self._buckets):
            items = self._buckets.pop(group).items
            if not self.drop_last:
                self._ready.append(items)

    def _make_batch(self, items: list[Item]) -> Item | None:
        key = batch_key(self._batches, tuple(k for _, k in items))
        hook_index = self._batches * self.num_streams + self.stream
        self._batches += 1
        try:
            batch = call_hook(self.batcher, hook_index, [v for v, _ in items], stage=BATCH)
        except Exception as e:
            self.policy.failed(e, None, keys=[k for _, k in items])
            return None
        self.policy.succeeded()
        attach_restore_key(batch, key)
        return batch, key

    def state(self) -> StageState:
        return {
            "buckets": [
                [_key_data(g), b.size, b.since, [k for _, k in b.items]]
                for g, b in self._buckets.items()
            ],
            "ready": [[k for _, k in items] for items in self._ready],
            "seen": self._seen,
            "batches": self._batches,
            **self.counters(),
        }

    def restore(self, state: StageState) -> None:
        where = "group"
        self._seen = fields.int_field(state, "seen", where)
        self._batches = fields.int_field(state, "batches", where)
        self._buckets = {}
        held = 0  # buffered samples: at most the samples seen
        for i, bucket in enumerate(fields.list_field(state, "buckets", where, self._seen)):
            at = f"{where}.buckets[{i}]"
            if not isinstance(bucket, list | tuple) or len(bucket) != 4:
                raise fields.bad_field(at, bucket, "[group, size, since, keys]")
            group, size, since, keys = bucket
            size = fields.as_int(size, f"{at}[1]", low=1)
            since = fields.as_int(since, f"{at}[2]", high=self._seen)
            items = _rebuild_items(self.upstream, keys, f"{at}[3]", size - 1)
            held += len(items)
            self._buckets[as_key(group)] = _Bucket(size, since, items)
        ready = fields.list_field(state, "ready", where, self._seen)
        self._ready = [
            _rebuild_items(self.upstream, keys, f"{where}.ready[{i}]", self._seen)
            for i, keys in enumerate(ready)
        ]
        if held + sum(map(len, self._ready)) > self._seen:
            raise fields.bad_field(f"{where}.seen", self._seen, "at least the buffered samples")
        self.restore_counters(state)

    def rebuild(self, key: Key) -> Value:
        return _rebuild_batch(self.upstream, self.batcher, key, self.stream, self.num_streams)
