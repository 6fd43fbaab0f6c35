"""Executes a rank's balanced steps: every rank plans each window of steps, each loads its share.

Global step ``j`` (counted from the state's ``origin``) covers the micro-batch positions
``origin + j*R ... origin + j*R + R - 1`` (``R`` ranks), which are, as always, micro-batches of
logical streams. Steps are planned a *window* (``Balance.window`` steps) at a time: every rank runs
the *pointer* stages of all the window's positions (no data read: cursors and a shuffle buffer of
keys), pools their ``batch_size`` pointers each, costs the pool from the index metadata
(:class:`~energon.balance.table.CostTable`), composes it into ``[step][rank]`` shares with
:func:`~energon.balance.assign.compose_steps` and then loads, encodes and packs only its own share
of each step: the parts :func:`~energon.pipeline.assembly.stream_parts` lists for the stream,
with the balanced packing where the list says ``balanced``. With workers, worker ``w`` takes the rank's steps ``w, w + W, ...`` (the loader's
round robin) and plans every window it takes a step of.

Each item's :class:`~energon.pipeline.executor.ItemMeta` carries the snapshots of all streams at
the start of the window that the *next* step belongs to (the window's start, or its end after its
last step), so a rank's state is enough to recompute the window and resume mid-window exactly
(the steps before the resume point are planned, not delivered). A merge of states saved after
the same whole window restores on any other ``R`` (windows are then counted from the new origin);
a merge of states saved inside a window starts with the window's *tail*
(:mod:`energon.balance.tail`): the window planned for the old ranks, the samples of its steps not
delivered composed into steps for the new ones; normal windows follow from the window's end.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from energon.balance.assign import compose_steps
from energon.balance.cost import MISSING_FIELD_ERRORS, cost_failure, dataset_name
from energon.balance.packed import layout_batch, pack_balanced
from energon.balance.plans import PlannedWindow, Window, WindowAt, plan_source
from energon.balance.store import StoredSnapshots
from energon.balance.table import CostTable
from energon.balance.tail import compose_tail, layers_of, tail_end, tail_steps
from energon.errors import (
    ErrorBudget,
    ErrorPolicy,
    SampleException,
    SkipSample,
    StateError,
    log_exception,
)
from energon.pipeline import assembly
from energon.pipeline.error_account import ErrorAccount
from energon.pipeline.executor import ItemMeta
from energon.pipeline.keys import Key, pointer_keys, pointer_target
from energon.pipeline.pointers import PointerSource, build_pointer_stages
from energon.pipeline.pointers_native import NativePointers, OrdersCache
from energon.pipeline.snapshot import (
    PackedSnapshot,
    StreamSnapshot,
    emitted,
    error_state,
    make_snapshot,
    stage_states,
)
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Value
from energon.pipeline.stages import LoadStage, call_hook, working_on
from energon.pipeline.stored_streams import packed_streams
from energon.pipeline.stream import cook_function
from energon.samples import padding
from energon.source.meta import SampleMeta
from energon.task_encoder.base import hook_context
from energon.task_encoder.packing import SequencePacker
from energon.worker import Layout


class PointerBatches:
    """A logical stream's pointer stages, read ``batch_size`` pointers (one micro-batch) at a
    time. Its snapshot has the layout of a full stream's (:mod:`energon.pipeline.snapshot`)."""

    def __init__(self, spec: PipelineSpec, stream_id: int) -> None:
        self.stream_id = stream_id
        self.batch_size = spec.batch_size or 1
        self.stages = build_pointer_stages(spec, stream_id)
        first = self.stages[0]
        self._source = first if isinstance(first, PointerSource) and first.item_clock else None
        self._kinds = first.kinds if isinstance(first, PointerSource) else []
        self._orders: OrdersCache = {}  # slice orders of the C stepper, kept between windows
        self._fast: NativePointers | None = None  # the C copy, while in step with the stages
        self.emitted = 0

    def next_batch(self) -> list[Key] | None:
        """The pointers of the stream's next micro-batch (None once a finite stream ended)."""
        self._fast = None  # the stages move on without it
        if self._source is not None:
            self._source.begin_item(self.emitted)
        keys: list[Key] = []
        sink = self.stages[-1]
        try:
            while len(keys) < self.batch_size:
                keys.append(sink.next()[1])
        except StopIteration:
            if not keys:
                return None
        self.emitted += 1
        return keys

    def skip_to(self, index: int) -> bool:
        """Read past the micro-batches before ``index`` (they belong to other executors); False
        when the stream ended first."""
        while self.emitted < index:
            if self.next_batch() is None:
                return False
        return True

    def batch_at(self, index: int) -> list[Key] | None:
        """Micro-batch ``index`` (``index >= emitted``; earlier ones belong to other executors)."""
        if not self.skip_to(index):
            return None
        return self.next_batch()

    def batches(self, first: int, count: int) -> list[list[Key] | None]:
        """Micro-batches ``first ... first + count - 1`` (``first >= emitted``), None for those
        after the end of a finite stream. Stepped in C where the ledger's stepper reproduces the
        stages exactly (fixed weights, endless readers), else by :meth:`batch_at`."""
        fast = self._fast or self._attach()
        if fast is None or first < self.emitted:
            return [self.batch_at(first + i) for i in range(count)]
        skipped = (first - self.emitted) * self.batch_size
        sources, indices = fast.advance(skipped + count * self.batch_size, keep_from=skipped)
        fast.write_back()
        self._fast = fast  # the stages now hold its state: the next window goes on from it
        self.emitted = first + count
        keys = pointer_keys(self._kinds, sources.tolist(), indices.tolist())
        size = self.batch_size
        return [keys[b * size : (b + 1) * size] for b in range(count)]

    def _attach(self) -> NativePointers | None:
        """A C copy of the pointer stages where it reproduces them (not with weights that change
        at item boundaries: :meth:`next_batch` tells the schedule each item)."""
        return NativePointers.attach(self.stages, self._orders) if self._source is None else None

    def state(self) -> StreamSnapshot:
        return make_snapshot(self.emitted, [stage.state() for stage in self.stages])

    def restore(self, snapshot: StreamSnapshot) -> None:
        self._fast = None
        for stage, state in zip(self.stages, stage_states(snapshot)):
            stage.restore(state)
        self.emitted = emitted(snapshot)


class RankFailures:
    """The samples this rank lost to errors, counted per logical stream like an unbalanced
    stream's :class:`~energon.pipeline.error_account.ErrorAccount` (so ``loader.error_report()``
    and the error budget see them): the account of the stream of the rank's own position at the
    step (``current``: the stream whose snapshot the step's item carries, so the loader sees the
    count change at once), checked against the samples of each source this rank loaded at such
    steps. The accounts travel in the streams' snapshots of the rank's state (each rank's own; an
    elastic merge keeps one rank's account per stream)."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.budget = spec.error_budget or ErrorBudget()
        self.leaves = spec.leaves
        self.current = 0
        self._accounts: dict[int, ErrorAccount] = {}
        self._loaded: dict[int, list[int]] = {}

    def account(self, stream_id: int) -> ErrorAccount:
        account = self._accounts.get(stream_id)
        if account is None:
            loaded = self._loaded[stream_id] = [0] * len(self.leaves)
            account = ErrorAccount(self.budget, self.leaves, loaded.__getitem__)
            self._accounts[stream_id] = account
        return account

    def loading(self, key: Key) -> None:
        """This rank starts loading ``key`` (the budget's rates count loads per source)."""
        self.account(self.current)
        self._loaded[self.current][pointer_target(key)[0]] += 1

    def failed(
        self,
        keys: Sequence[Any],
        exc: BaseException,
        sample: Any,
        reads: Sequence[int] | None = None,
    ) -> None:
        self.account(self.current).failed(keys, exc, sample, reads)

    def streams(self) -> list[int]:
        """The streams this rank keeps an account of."""
        return list(self._accounts)

    def with_errors(self, stream_id: int, snapshot: StreamSnapshot) -> StreamSnapshot:
        """``snapshot`` (pointer stages) with this rank's account of the stream."""
        account = self._accounts.get(stream_id)
        errors = account.state() if account is not None else error_state(snapshot)
        return make_snapshot(emitted(snapshot), stage_states(snapshot), errors)


class BalancedExecutor:
    """Yields ``(BalancedBatch, ItemMeta)`` for this rank's (worker's) steps, in order."""

    def __init__(
        self,
        spec: PipelineSpec,
        layout: Layout,
        snapshots: dict[int, StreamSnapshot] | None = None,
        end: int | None = None,
        origin: int = 0,
        tail: dict[str, Any] | None = None,
    ) -> None:
        if spec.balance is None:
            raise ValueError("BalancedExecutor needs a spec with balance set")
        self.spec = spec
        self.balance = spec.balance
        self.layout = layout
        self.snapshots = snapshots or {}
        self.end = end
        self.origin = origin
        self.tail = tail
        # steps of the tail (0: none), and where the normal windows are counted from
        self.tail_steps = 0
        self.window_origin = origin
        if tail is not None:
            size = self.balance.window
            self.tail_steps = tail_steps(tail, size, layout.world_size)
            self.window_origin = tail_end(tail, size)
            if self.window_origin != origin + self.tail_steps * layout.world_size:
                raise StateError(
                    f"balanced state: origin {origin} is not where the tail of "
                    f"{self.tail_steps} steps ends ({self.window_origin}; the state is damaged)"
                )
        self._current: PlannedWindow | None = None
        self._current_at: int | None = None  # the current window's first position (None: tail)
        self._shared: list[tuple[Mapping[int, StreamSnapshot], Mapping]] = []  # _window_streams
        self.plans = plan_source(self.balance, spec, layout.world_size, end)
        self.position = -1
        self.streams: dict[int, PointerBatches] = {}
        self.costs = CostTable(spec.leaves, spec.balance.cost, spec.balance.planned_cost)
        handler = spec.error_handler or log_exception
        self.failures = RankFailures(spec)
        for stream_id, snapshot in self.snapshots.items():  # (streams are built when stepped)
            self.failures.account(stream_id).restore(error_state(snapshot))
        tolerance = spec.failure_tolerance
        self._load_policy = ErrorPolicy("load_sample", handler, tolerance, self.failures)
        self._encode_policy = ErrorPolicy("encode_sample", handler, tolerance, self.failures)
        self._loader = LoadStage(
            None,  # type: ignore[arg-type]  # only rebuild() is used: keys come from the plan
            spec.leaves,
            spec.decoder,
            self._load_policy,
            [cook_function(spec, source) for source in spec.sources],
        )
        self._sample_hooks, self._batch_hooks = _hooks_around_packing(assembly.stream_parts(spec))
        self.packer = SequencePacker(
            self.balance.max_length,
            length=self.balance.length,
            over_length=self.balance.over_length,
        )

    def stream(self, stream_id: int) -> PointerBatches:
        stream = self.streams.get(stream_id)
        if stream is None:
            stream = PointerBatches(self.spec, stream_id)
            snapshot = self.snapshots.get(stream_id)
            if snapshot is not None:
                stream.restore(snapshot)
            self.streams[stream_id] = stream
        return stream

    def __iter__(self) -> Iterator[tuple[Value, ItemMeta]]:
        layout = self.layout
        ranks, workers = layout.world_size, max(1, layout.num_workers)
        size = self.balance.window
        offset = layout.base - self.origin
        if offset % ranks:
            raise StateError(
                f"balanced steps start at global steps: resume position {layout.base} is not "
                f"origin {self.origin} plus a multiple of {ranks} ranks"
            )
        k = 0
        while True:
            step = offset // ranks + layout.worker + k * workers  # global steps since origin
            first = self.origin + step * ranks
            if step < self.tail_steps:
                window, inner = self._tail_window(), step
            else:
                if self.end is not None and first >= self.end:
                    return
                index = (step - self.tail_steps) // size
                window = self._window(index)
                inner = step - self.tail_steps - index * size
            if inner >= window.steps:
                return
            own = first + layout.rank
            yield self._rank_batch(window, inner, own), self._item_meta(window, inner, own)
            k += 1

    def _item_meta(self, window: PlannedWindow, inner: int, own: int) -> ItemMeta:
        """The snapshots from which a restore recomputes the window of the step after ``inner``:
        the window's start, or its end after its last step. Every stream's snapshot there is one
        mapping shared by the window's items (``window_streams``: O(1) per step, whatever the
        number of streams); only the streams this rank keeps an error account of (the few it
        loads for) get a snapshot of their own in each item."""
        pointers = window.end if inner == window.steps - 1 else window.start
        shared = self._window_streams(pointers)
        own_stream = own % self.spec.num_streams
        accounted = {
            s: self.failures.with_errors(s, pointers[s])
            for s in self.failures.streams()
            if s in shared
        }
        snapshot = accounted.pop(own_stream, None) or shared[own_stream]
        return ItemMeta(
            own,
            own_stream,
            snapshot,
            worker=self.layout.worker,
            others=accounted or None,
            window_streams=shared,
        )

    def _window_streams(
        self, pointers: Mapping[int, StreamSnapshot]
    ) -> Mapping[int, StreamSnapshot | PackedSnapshot]:
        """Every stream's snapshot of ``pointers`` (a window's start or end), made once per
        window. Snapshots read from a plan store
        (:class:`~energon.balance.store.StoredSnapshots`) stay in the file, packed: O(1) here,
        pickled as the file's path, decoded only when a state is saved."""
        cached = next((shared for of, shared in self._shared if of is pointers), None)
        if cached is not None:
            return cached
        if isinstance(pointers, StoredSnapshots):
            cached = packed_streams(pointers)
        else:  # planned here: as costly as the planning, once per window
            cached = {s: self.failures.with_errors(s, snap) for s, snap in pointers.items()}
        self._shared = [(pointers, cached), *self._shared[:1]]  # a window's start and end
        return cached

    def _window(self, index: int) -> PlannedWindow:
        """Window ``index`` (global steps ``index * window ...`` from the origin, after a tail),
        planned here or read from the plan store (:mod:`energon.balance.plans`), once."""
        ranks, size = self.layout.world_size, self.balance.window
        first = self.window_origin + index * size * ranks
        if self._current is not None and self._current_at == first:
            return self._current
        previous = self._current
        at = WindowAt(first, self._plans_window(index), lambda: self._starts(first))
        self._current = self.plans.window(at, lambda: self._plan_after(previous, index, first))
        self._current_at = first
        return self._current

    def plan_window(self, index: int) -> Window:
        """Window ``index`` planned here whatever the plan source (windows in order:
        :func:`energon.balance.plans.publish_plans`)."""
        first = self.window_origin + index * self.balance.window * self.layout.world_size
        self._current = self._plan_after(self._current, index, first)
        self._current_at = first
        return self._current

    def _plans_window(self, index: int) -> bool:
        """Whether this rank plans window ``index`` for all ranks when they share plans: rank
        ``index mod ranks``, and of its workers the one that takes the window's first step."""
        layout = self.layout
        if index % layout.world_size != layout.rank:
            return False
        workers = max(1, layout.num_workers)
        first_step = self.tail_steps + index * self.balance.window
        base_step = (layout.base - self.origin) // layout.world_size
        return (first_step - base_step) % workers == layout.worker

    def _starts(self, first: int) -> dict[int, StreamSnapshot]:
        """Every stream's snapshot at global position ``first`` (the streams step there)."""
        return {s: self._stream_at(s, first) for s in range(self.spec.num_streams)}

    def _plan_after(self, previous: PlannedWindow | None, index: int, first: int) -> Window:
        """Window ``index`` planned here. Streams that did not step through the window before
        (it was read from a plan store) start from its end snapshots instead of stepping."""
        if previous is not None and not isinstance(previous, Window):
            positions = self.balance.window * self.layout.world_size
            if previous.first + positions == first:
                for stream_id, snapshot in previous.end.items():
                    stream = self.stream(stream_id)
                    if stream.emitted < emitted(snapshot):
                        stream.restore(snapshot)
        return self._plan(index, first, self.layout.world_size)

    def _tail_window(self) -> Window:
        """The tail (index -1): the interrupted window planned for the ranks that trained it,
        the samples of the steps they did not deliver composed into this rank count's steps."""
        if self._current is not None and self._current_at is None:
            return self._current  # type: ignore[return-value]
        assert self.tail is not None
        layers = layers_of(self.tail)
        window = self._plan(-1, int(self.tail["start"]), layers[0][0])
        plan = compose_tail(window.plan, window.costs, layers, self.layout.world_size)
        self._current = dataclasses.replace(window, steps=len(plan), plan=plan)
        self._current_at = None
        return self._current

    def _plan(self, index: int, start: int, ranks: int) -> Window:
        """The window of ``ranks`` ranks whose first global position is ``start``."""
        size = self.balance.window
        num_streams = self.spec.num_streams
        stop = start + size * ranks
        if self.end is not None:
            stop = min(stop, self.end)
        before = {s: self._stream_at(s, start) for s in range(num_streams)}
        pool: list[tuple[int, int, Key]] = []
        last_step = -1
        batches = self._stream_batches(start, stop)
        for position in range(start, stop):
            keys = batches[position % num_streams][position // num_streams]
            if keys is None:
                continue  # a finite stream ended
            pool.extend((position, j, key) for j, key in enumerate(keys))
            last_step = (position - start) // ranks
        after = {s: self.stream(s).state() for s in range(num_streams)}
        targets = [pointer_target(key) for *_, key in pool]
        costs = self.costs.planned_costs([s for s, _ in targets], [i for _, i in targets])
        steps = last_step + 1
        plan = compose_steps(costs, ranks, steps) if steps else []
        return Window(index, steps, pool, costs, plan, before, after, first=start)

    def _stream_batches(self, start: int, stop: int) -> dict[int, dict[int, list[Key] | None]]:
        """Per stream, its micro-batches of the global positions ``start ... stop - 1`` by index
        (streams are independent, so each is stepped through its own run of batches at once)."""
        num_streams = self.spec.num_streams
        batches: dict[int, dict[int, list[Key] | None]] = {}
        for stream_id in range(num_streams):
            first = max(0, -(-(start - stream_id) // num_streams))
            end = -(-(stop - stream_id) // num_streams) if stop > stream_id else 0
            if end <= first:
                batches[stream_id] = {}
                continue
            run = self.stream(stream_id).batches(first, end - first)
            batches[stream_id] = dict(zip(range(first, end), run))
        return batches

    def _stream_at(self, stream_id: int, position: int) -> StreamSnapshot:
        """Stream ``stream_id`` advanced to its first micro-batch at or after ``position`` (no
        pointer of the window read yet), and its snapshot there."""
        num_streams = self.spec.num_streams
        index = max(0, -(-(position - stream_id) // num_streams))
        stream = self.stream(stream_id)
        if stream.emitted > index:
            raise StateError(
                f"balanced state: stream {stream_id} is past micro-batch {index}, where the "
                f"window at global position {position} starts (the state does not belong to "
                "this window; was it saved by another configuration?)"
            )
        stream.skip_to(index)
        return stream.state()

    def _rank_batch(self, window: PlannedWindow, inner: int, own: int) -> Value:
        hook_context.batch_index = own
        hook_context.seed = self.spec.seed
        self.failures.current = own % self.spec.num_streams
        self.position = own  # the micro-batch being made (energon.loader.recovery)
        samples, groups = [], []
        for position, member, key in window.share(inner, self.layout.rank):
            for sample in self._load(key, position * (self.spec.batch_size or 1) + member):
                self._check_length(sample, key)
                samples.append(sample)
                if self.balance.group is not None:
                    groups.append(self.balance.group(self._meta(key)))
        stats = self.packer.stats
        before = (stats.truncated, stats.split, stats.dropped)
        packs = pack_balanced(
            samples,
            self.balance.max_length,
            packer=self.packer,
            groups=groups if self.balance.group is not None else None,
        )
        rank_costs = window.rank_costs(inner)
        value = layout_batch(
            packs,
            self.balance.max_length,
            rank_cost=rank_costs[self.layout.rank],
            step_costs=rank_costs,
            truncated=stats.truncated - before[0],
            split=stats.split - before[1],
            dropped=stats.dropped - before[2],
        )
        if samples:
            for part in self._batch_hooks:
                value = call_hook(part.fn, own, value)
        padding.mark(value, not samples)
        return value

    def _check_length(self, sample: Value, key: Key) -> None:
        """``Balance.length`` of an encoded sample, or a one-line error naming the missing
        field, the sample's key and its dataset (the packer would fail without them)."""
        try:
            self.balance.length(sample)
        except MISSING_FIELD_ERRORS as e:
            meta = self._meta(key)
            name = sample.get("__key__") if isinstance(sample, dict) else None
            name = name or getattr(sample, "__key__", None) or meta.key
            leaf = self.spec.leaves[meta.source]
            raise cost_failure(e, "Balance.length", name, dataset_name(leaf)) from e

    def _meta(self, key: Key) -> SampleMeta:
        source, index = pointer_target(key)
        return SampleMeta(self.costs.reader(source), source, index)

    def _load(self, key: Key, sample_index: int) -> list[Value]:
        """The encoded outputs of one sample (none when it failed and the policy skips it, or
        when a worker died on it: energon.loader.recovery)."""
        self.failures.loading(key)
        source, index = pointer_target(key)
        working_on(source, index, self.position)
        account = self.failures.account(self.failures.current)
        if account.lost_pending and account.skip_lost(key, source, index):
            return []
        try:
            sample = self._loader.rebuild(key)
        except SampleException as e:
            self._load_policy.failed(e, keys=(key,))
            return []
        self._load_policy.succeeded()
        outputs = [sample]
        for part in self._sample_hooks:
            produced = []
            for value in outputs:
                try:
                    produced.extend(call_hook(_outputs_of, sample_index, part.fn, value))
                except SkipSample:
                    continue
                except Exception as e:
                    self._encode_policy.failed(e, value, keys=(key,))
                    continue
                self._encode_policy.succeeded()
            outputs = produced
        return outputs


def _outputs_of(hook: Any, value: Value) -> list[Value]:
    """A hook's outputs for one input (a generator hook may yield any number)."""
    result = hook(value)
    return list(result) if inspect.isgenerator(result) else [result]


def _hooks_around_packing(
    parts: list[assembly.Part],
) -> tuple[list[assembly.Part], list[assembly.Part]]:
    """The sample hooks a balanced stream runs before its packing and the batch hooks after it,
    from the parts :func:`~energon.pipeline.assembly.stream_parts` lists; any other part is one
    this executor cannot run (it plans from the pointers and loads by itself)."""
    kinds = [part.kind for part in parts]
    if kinds[:2] != [assembly.POINTERS, assembly.LOAD] or assembly.BALANCED not in kinds:
        raise ValueError(f"the balanced executor cannot run a stream made of {kinds}")
    at = kinds.index(assembly.BALANCED)
    before, after = parts[2:at], parts[at + 1 :]
    wrong = [p for p in before if p.kind != assembly.SAMPLE]
    wrong += [p for p in after if p.kind != assembly.BATCH_STEP]
    if wrong:
        raise ValueError(f"the balanced executor cannot run a {wrong[0].kind!r} part in {kinds}")
    return before, after
