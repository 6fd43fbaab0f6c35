"""The stages of one logical stream, from sample pointers to batches.

Items are ``(value, key)`` pairs. A key is a plain tuple recipe that regenerates the value:
``("Webdataset", leaf, index)`` for a loaded sample, ``("Map", name, sample_index, sub, inner_key,
batch_index)`` for the output of a hook (``batch_index``: the ``current_batch_index`` it ran under),
``("Batch", batch_number, (member keys...))`` for a batch. Buffers hold keys, never decoded data, so
states stay small and restoring re-reads only what sat in buffers; a regenerated item sees the same
``current_sample_index`` / ``current_batch_index`` as the original.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from energon import debug_log
from energon.errors import ErrorPolicy, SampleException, SkipSample
from energon.plan.reader import SliceReader
from energon.plan.rng import CounterRng
from energon.task_encoder.base import hook_context

Item = tuple[Any, tuple]


def attach_restore_key(value: Any, key: tuple) -> None:
    """Record ``key`` on samples/batches that carry a ``__restore_key__``."""
    if isinstance(value, dict):
        if "__restore_key__" in value:
            value["__restore_key__"] = key
    elif hasattr(value, "__restore_key__"):
        try:
            value.__restore_key__ = key
        except (AttributeError, TypeError):
            pass


def as_key(data: Any) -> tuple:
    """Keys come back from JSON as lists; turn them into tuples again, recursively."""
    if isinstance(data, list | tuple):
        return tuple(as_key(x) for x in data)
    return data


class PointerSource:
    """Sample pointers of one stream: its sources' readers, one after the other (no schedule) or
    interleaved by a blend schedule. Keys are ``("Webdataset", source index, sample index)``."""

    def __init__(
        self, readers: list[SliceReader], schedule: Any = None, *, repeat: bool = True
    ) -> None:
        self.readers = readers
        self.schedule = schedule
        self.repeat = repeat
        self._current = 0
        self._passes = 0

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        source, index = self._next_pointer()
        key = ("Webdataset", source, index)
        return key, key

    def _next_pointer(self) -> tuple[int, int]:
        if self.schedule is None:
            while self._current < len(self.readers):
                try:
                    return self._current, next(self.readers[self._current])
                except StopIteration:
                    self._current += 1
            raise StopIteration
        if self.schedule.finite and self.schedule.done:
            if not self.repeat:
                raise StopIteration
            self.schedule.reset()
            self._passes += 1
        source = self.schedule.next()
        return source, next(self.readers[source])

    def state(self) -> dict[str, Any]:
        return {
            "current": self._current,
            "passes": self._passes,
            "schedule": self.schedule.state() if self.schedule is not None else None,
            "readers": [r.state() for r in self.readers],
        }

    def restore(self, state: dict[str, Any]) -> None:
        self._current = int(state["current"])
        self._passes = int(state.get("passes", 0))
        if self.schedule is not None and state.get("schedule") is not None:
            self.schedule.restore(state["schedule"])
        for reader, reader_state in zip(self.readers, state["readers"]):
            reader.restore(reader_state)

    def consumed(self) -> list[int]:
        """Samples handed out so far per source."""
        return [reader.yielded for reader in self.readers]

    def epoch_of(self, source: int) -> int:
        """The epoch source ``source``'s reader is in (for debug logs)."""
        return self.readers[source].epoch

    def rebuild(self, key: tuple) -> Any:
        return key


class ShuffleBuffer:
    """Keeps up to ``size`` pointers and emits a uniformly random one each step."""

    def __init__(self, upstream: Any, size: int, rng: CounterRng) -> None:
        self.upstream = upstream
        self.size = size
        self.rng = rng
        self._buffer: list[tuple] = []
        self._exhausted = False

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        while not self._exhausted and len(self._buffer) < self.size:
            try:
                _, key = next(self.upstream)
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

    def state(self) -> dict[str, Any]:
        return {
            "buffer": list(self._buffer),
            "rng": self.rng.counter,
            "exhausted": self._exhausted,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self._buffer = [as_key(k) for k in state["buffer"]]
        self.rng.counter = int(state["rng"])
        self._exhausted = bool(state["exhausted"])

    def rebuild(self, key: tuple) -> Any:
        return self.upstream.rebuild(key)


class LoadStage:
    """Reads and decodes the sample a pointer names (and cooks crude samples); failures follow the
    error policy."""

    def __init__(
        self,
        upstream: Any,
        leaves: list[Any],
        decoder: Any,
        policy: ErrorPolicy,
        cooks: list[Callable[[Any], Any] | None] | None = None,
        epoch_of: Callable[[int], int] | None = None,
    ) -> None:
        self.upstream = upstream
        self.leaves = leaves
        self.decoder = decoder
        self.policy = policy
        self.cooks = cooks or [None] * len(leaves)
        self.epoch_of = epoch_of
        self._loaded = 0  # for debug logs only

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        while True:
            _, key = next(self.upstream)
            try:
                sample = self.rebuild(key)
            except SampleException as e:
                self.policy.failed(e)
                continue
            self.policy.succeeded()
            self._loaded += 1
            debug_log.emit(1, self._log_record, sample, key)
            return sample, key

    def _log_record(self, sample: Any, key: tuple) -> dict[str, Any]:
        """The reference's record of one sample read (reading order, before shuffling)."""
        sources = (
            sample.get("__sources__")
            if isinstance(sample, dict)
            else getattr(sample, "__sources__", None)
        )
        keys = debug_log.batch_keys(sample)
        return {
            "t": "WebdatasetSampleLoaderDataset._slices_iter.yield",
            "index": key[2],
            "key": keys[0] if keys else None,
            "shard": sources[0].shard_name if sources else None,
            "count": self._loaded,
            "epoch": self.epoch_of(key[1]) if self.epoch_of is not None else None,
        }

    def state(self) -> dict[str, Any]:
        return {"skipped": self.policy.skipped}

    def restore(self, state: dict[str, Any]) -> None:
        self.policy.skipped = int(state.get("skipped", 0))

    def rebuild(self, key: tuple) -> Any:
        _, leaf, index = key
        sample = self.leaves[leaf].load(index, self.decoder, key)
        cook = self.cooks[leaf]
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


def _call_hook(fn: Callable[..., Any], sample_index: int, *args: Any) -> Any:
    previous = hook_context.sample_index
    hook_context.sample_index = sample_index
    try:
        return fn(*args)
    finally:
        hook_context.sample_index = previous


def _in_batch(batch_index: int | None, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with ``current_batch_index`` set to ``batch_index`` (if known)."""
    if batch_index is None:
        return fn(*args)
    previous = hook_context.batch_index
    hook_context.batch_index = batch_index
    try:
        return fn(*args)
    finally:
        hook_context.batch_index = previous


def _rebuild_items(upstream: Any, keys: list) -> list[Item]:
    """Buffered items of a saved state, regenerated from their keys through the upstream stages."""
    items = []
    for data in keys:
        key = as_key(data)
        items.append((upstream.rebuild(key), key))
    return items


def _rebuild_batch(
    upstream: Any, batcher: Callable[[list], Any], key: tuple, stream: int, num_streams: int
) -> Any:
    members = [upstream.rebuild(k) for k in key[2]]
    batch = _call_hook(batcher, key[1] * num_streams + stream, members)
    attach_restore_key(batch, key)
    return batch


class MapStage:
    """Applies a hook (value or generator; ``SkipSample`` drops) and numbers its inputs.

    ``sample_index = inputs_seen * num_streams + stream`` is the deterministic, layout-independent
    ``current_sample_index``. A generator interrupted between outputs is saved as
    (input key, sample index, outputs already emitted) and resumed by re-running it.
    """

    def __init__(
        self,
        upstream: Any,
        fn: Callable[[Any], Any],
        name: str,
        policy: ErrorPolicy,
        *,
        stream: int,
        num_streams: int,
    ) -> None:
        self.upstream = upstream
        self.fn = fn
        self.name = name
        self.policy = policy
        self.stream = stream
        self.num_streams = num_streams
        self._inputs = 0
        self._pending: tuple[Iterator, tuple, int, int] | None = None

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        while True:
            if self._pending is not None:
                item = self._next_from_pending()
                if item is not None:
                    return item
                continue
            value, key = next(self.upstream)
            sample_index = self._inputs * self.num_streams + self.stream
            self._inputs += 1
            try:
                result = self._call(value, sample_index)
            except SkipSample:
                continue
            except Exception as e:
                self.policy.failed(e, value)
                continue
            if inspect.isgenerator(result):
                self._pending = (result, key, sample_index, 0)
                continue
            self.policy.succeeded()
            out_key = ("Map", self.name, sample_index, 0, key, hook_context.batch_index)
            attach_restore_key(result, out_key)
            return result, out_key

    def _call(self, value: Any, sample_index: int) -> Any:
        return _call_hook(self.fn, sample_index, value)

    def _advance(self, gen: Iterator, sample_index: int) -> Any:
        return _call_hook(next, sample_index, gen)

    def _next_from_pending(self) -> Item | None:
        gen, in_key, sample_index, emitted = self._pending  # type: ignore[misc]
        try:
            value = self._advance(gen, sample_index)
        except StopIteration:
            self._pending = None
            self.policy.succeeded()
            return None
        except SkipSample:
            self._pending = None
            return None
        except Exception as e:
            self._pending = None
            self.policy.failed(e)
            return None
        self._pending = (gen, in_key, sample_index, emitted + 1)
        out_key = ("Map", self.name, sample_index, emitted, in_key, hook_context.batch_index)
        attach_restore_key(value, out_key)
        return value, out_key

    def state(self) -> dict[str, Any]:
        pending = None
        if self._pending is not None:
            _, in_key, sample_index, emitted = self._pending
            pending = [in_key, sample_index, emitted]
        return {"inputs": self._inputs, "pending": pending, "skipped": self.policy.skipped}

    def restore(self, state: dict[str, Any]) -> None:
        self._inputs = int(state["inputs"])
        self.policy.skipped = int(state.get("skipped", 0))
        self._pending = None
        if state.get("pending") is not None:
            in_key, sample_index, emitted = state["pending"]
            in_key = as_key(in_key)
            gen = self._call(self.upstream.rebuild(in_key), sample_index)
            for _ in range(emitted):
                self._advance(gen, sample_index)
            self._pending = (gen, in_key, sample_index, emitted)

    def rebuild(self, key: tuple) -> Any:
        _, _, sample_index, sub, in_key = key[:5]
        batch_index = key[5] if len(key) > 5 else None
        return _in_batch(batch_index, self._regenerate, key, sample_index, sub, in_key)

    def _regenerate(self, key: tuple, sample_index: int, sub: int, in_key: tuple) -> Any:
        result = self._call(self.upstream.rebuild(in_key), sample_index)
        if inspect.isgenerator(result):
            for _ in range(sub):
                self._advance(result, sample_index)
            result = self._advance(result, sample_index)
        attach_restore_key(result, key)
        return result


class BatchStage:
    """Collects consecutive items into batches (sizes from a schedule) and calls the batcher."""

    def __init__(
        self,
        upstream: Any,
        sizes: Callable[[int], int],
        batcher: Callable[[list], Any],
        policy: ErrorPolicy,
        *,
        drop_last: bool = False,
        max_batches: int | None = None,
        stream: int = 0,
        num_streams: int = 1,
    ) -> None:
        self.upstream = upstream
        self.sizes = sizes
        self.batcher = batcher
        self.policy = policy
        self.drop_last = drop_last
        self.max_batches = max_batches
        self.stream = stream
        self.num_streams = num_streams
        self._batches = 0

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        while True:
            if self.max_batches is not None and self._batches >= self.max_batches:
                raise StopIteration
            size = self.sizes(self._batches)
            values, keys = [], []
            for value, key in self.upstream:
                values.append(value)
                keys.append(key)
                if len(values) >= size:
                    break
            if not values or (self.drop_last and len(values) < size):
                raise StopIteration
            key = ("Batch", self._batches, tuple(keys))
            index = self._batches * self.num_streams + self.stream
            self._batches += 1
            try:
                batch = _call_hook(self.batcher, index, values)
            except Exception as e:
                self.policy.failed(e, values)
                continue
            self.policy.succeeded()
            attach_restore_key(batch, key)
            return batch, key

    def state(self) -> dict[str, Any]:
        return {"batches": self._batches, "skipped": self.policy.skipped}

    def restore(self, state: dict[str, Any]) -> None:
        self._batches = int(state["batches"])
        self.policy.skipped = int(state.get("skipped", 0))

    def rebuild(self, key: tuple) -> Any:
        return _rebuild_batch(self.upstream, self.batcher, key, self.stream, self.num_streams)


def _key_data(key: Any) -> Any:
    """A hashable group key as JSON-able data (tuples become lists)."""
    if isinstance(key, tuple):
        return [_key_data(k) for k in key]
    return key


class PackStage:
    """Sequence packing: a buffer of encoded samples is split into groups by
    ``select_samples_to_pack``; each group becomes one sample via ``pack_selected_samples``.

    The buffers hold items whose keys can regenerate them, so the state is keys only, and a packed
    sample's ``__restore_key__`` (set by energon even if the hook leaves it empty) names its members.
    """

    def __init__(
        self,
        upstream: Any,
        buffer_size: int,
        select: Callable[[list], list[list]],
        pack: Callable[[list], Any],
        postencode: Callable[[Any], Any] | None,
        policy: ErrorPolicy,
        *,
        stream: int,
        num_streams: int,
        empty_rounds_tolerance: int = 10,
    ) -> None:
        self.upstream = upstream
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
        self._open: tuple[Iterator, int, tuple, int] | None = None

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        empty_rounds = 0
        while True:
            if self._open is not None:
                packed = self._next_open()
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
                self._reading.append(next(self.upstream))
            except StopIteration:
                self._exhausted = True

    def _select_groups(self) -> bool:
        """Move the groups chosen by the hook from the reading buffer to the pending list."""
        by_id = {id(value): (value, key) for value, key in self._reading}
        index = self._rounds * self.num_streams + self.stream
        self._rounds += 1
        try:
            groups = _call_hook(self.select, index, [value for value, _ in self._reading])
        except Exception as e:
            self.policy.failed(e, None)
            self.policy.skipped += len(self._reading) - 1
            self._reading = []
            return True
        chosen: set[int] = set()
        pending = []
        for group in groups:
            items = []
            for value in group:
                if id(value) not in by_id or id(value) in chosen:
                    raise ValueError(
                        "select_samples_to_pack must return samples of the buffer, each at most once"
                    )
                chosen.add(id(value))
                items.append(by_id[id(value)])
            if items:
                pending.append(items)
        self._reading = [item for item in self._reading if id(item[0]) not in chosen]
        self._pending = pending
        return bool(pending)

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
            self.policy.failed(e, None)
            return None
        if inspect.isgenerator(result):
            self._open = (result, index, members, 0)
            return self._next_open()
        self.policy.succeeded()
        key = ("Pack", index, 0, members)
        attach_restore_key(result, key)
        return result, key

    def _next_open(self) -> Item | None:
        gen, index, members, emitted = self._open  # type: ignore[misc]
        try:
            value = _call_hook(next, index * self.num_streams + self.stream, gen)
        except StopIteration:
            self._open = None
            self.policy.succeeded()
            return None
        except Exception as e:
            self._open = None
            self.policy.failed(e, None)
            return None
        self._open = (gen, index, members, emitted + 1)
        key = ("Pack", index, emitted, members)
        attach_restore_key(value, key)
        return value, key

    def _pack_values(self, index: int, values: list[Any]) -> Any:
        hook_index = index * self.num_streams + self.stream
        if self.postencode is not None:
            values = [_call_hook(self.postencode, hook_index, v) for v in values]
        return _call_hook(self.pack, hook_index, values)

    def state(self) -> dict[str, Any]:
        open_pack = None
        if self._open is not None:
            _, index, members, emitted = self._open
            open_pack = [index, emitted, list(members)]
        return {
            "reading": [k for _, k in self._reading],
            "pending": [[k for _, k in group] for group in self._pending],
            "open": open_pack,
            "packs": self._packs,
            "rounds": self._rounds,
            "exhausted": self._exhausted,
            "skipped": self.policy.skipped,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self._reading = _rebuild_items(self.upstream, state["reading"])
        self._pending = [_rebuild_items(self.upstream, keys) for keys in state["pending"]]
        self._packs = int(state["packs"])
        self._rounds = int(state["rounds"])
        self._exhausted = bool(state["exhausted"])
        self.policy.skipped = int(state.get("skipped", 0))
        self._open = None
        if state.get("open") is not None:
            index, emitted, members = state["open"]
            members = tuple(map(as_key, members))
            self._open = (self._replay(index, members, emitted), index, members, emitted)

    def _replay(self, index: int, members: tuple, skip: int) -> Any:
        """Re-run the packer on the members (regenerated from their keys), skipping ``skip``
        outputs of a generator packer."""
        result = self._pack_values(index, [self.upstream.rebuild(k) for k in members])
        if inspect.isgenerator(result):
            for _ in range(skip):
                _call_hook(next, index * self.num_streams + self.stream, result)
        return result

    def rebuild(self, key: tuple) -> Any:
        _, index, sub, members = key
        result = self._replay(index, members, sub)
        if inspect.isgenerator(result):
            result = _call_hook(next, index * self.num_streams + self.stream, result)
        attach_restore_key(result, key)
        return result


class GroupBatchStage:
    """Batches of samples that share a group key (``batch_group_criterion``), each group with its
    own batch size. A bucket whose oldest sample has waited ``max_wait`` samples is flushed early."""

    def __init__(
        self,
        upstream: Any,
        criterion: Callable[[Any], tuple[Any, int | None]],
        batcher: Callable[[list], Any],
        policy: ErrorPolicy,
        *,
        batch_size: int | None,
        drop_last: bool = False,
        max_wait: int | None = None,
        stream: int = 0,
        num_streams: int = 1,
    ) -> None:
        self.upstream = upstream
        self.criterion = criterion
        self.batcher = batcher
        self.policy = policy
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.max_wait = max_wait
        self.stream = stream
        self.num_streams = num_streams
        self._buckets: dict[Any, dict[str, Any]] = {}
        self._ready: list[list[Item]] = []
        self._seen = 0
        self._batches = 0

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        while True:
            if self._ready:
                batch = self._make_batch(self._ready.pop(0))
                if batch is not None:
                    return batch
                continue
            try:
                value, key = next(self.upstream)
            except StopIteration:
                self._flush_all()
                if not self._ready:
                    raise
                continue
            self._add(value, key)

    def _add(self, value: Any, key: tuple) -> None:
        index = self._seen * self.num_streams + self.stream
        self._seen += 1
        try:
            group, size = _call_hook(self.criterion, index, value)
        except Exception as e:
            self.policy.failed(e, value)
            return
        if (size is None) == (self.batch_size is None):
            raise ValueError(
                "batch_group_criterion must return a batch size exactly when batch_size is None "
                f"(got {size!r} with batch_size={self.batch_size!r})"
            )
        size = size or self.batch_size
        group = as_key(_key_data(group))
        bucket = self._buckets.setdefault(group, {"size": size, "items": [], "since": self._seen})
        if bucket["size"] != size:
            raise ValueError(
                f"group {group!r} changed its batch size from {bucket['size']} to {size}"
            )
        bucket["items"].append((value, key))
        if len(bucket["items"]) >= size:
            self._ready.append(self._buckets.pop(group)["items"])
        self._flush_stale()

    def _flush_stale(self) -> None:
        if self.max_wait is None:
            return
        for group in [
            g for g, b in self._buckets.items() if self._seen - b["since"] >= self.max_wait
        ]:
            self._ready.append(self._buckets.pop(group)["items"])

    def _flush_all(self) -> None:
        for group in list(self._buckets):
            items = self._buckets.pop(group)["items"]
            if not self.drop_last:
                self._ready.append(items)

    def _make_batch(self, items: list[Item]) -> Item | None:
        key = ("Batch", self._batches, tuple(k for _, k in items))
        index = self._batches * self.num_streams + self.stream
        self._batches += 1
        try:
            batch = _call_hook(self.batcher, index, [v for v, _ in items])
        except Exception as e:
            self.policy.failed(e, None)
            return None
        self.policy.succeeded()
        attach_restore_key(batch, key)
        return batch, key

    def state(self) -> dict[str, Any]:
        return {
            "buckets": [
                [_key_data(g), b["size"], b["since"], [k for _, k in b["items"]]]
                for g, b in self._buckets.items()
            ],
            "ready": [[k for _, k in items] for items in self._ready],
            "seen": self._seen,
            "batches": self._batches,
            "skipped": self.policy.skipped,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self._buckets = {}
        for group, size, since, keys in state["buckets"]:
            items = _rebuild_items(self.upstream, keys)
            self._buckets[as_key(group)] = {"size": size, "items": items, "since": since}
        self._ready = [_rebuild_items(self.upstream, keys) for keys in state["ready"]]
        self._seen = int(state["seen"])
        self._batches = int(state["batches"])
        self.policy.skipped = int(state.get("skipped", 0))

    def rebuild(self, key: tuple) -> Any:
        return _rebuild_batch(self.upstream, self.batcher, key, self.stream, self.num_streams)
