"""Executes a rank's balanced steps: every rank plans each global step, each loads its share.

Global step ``j`` of a rank (from the resume point ``base``) covers the micro-batch positions
``base + j*R ... base + j*R + R - 1`` (``R`` ranks), which are, as always, micro-batches of logical
streams. Every rank runs the *pointer* stages of all of them (no data read: cursors and a shuffle
buffer of keys), pools their ``batch_size`` pointers each, costs the pool from the index metadata
(:class:`~energon.balance.table.CostTable`), splits it with
:func:`~energon.balance.assign.balance_costs` and then loads, encodes and packs only its own
share. With workers, worker ``w`` takes the rank's steps ``w, w + W, ...`` (the loader's round
robin), so with the default ``L = R * W`` streams each worker simulates only its own ``R`` streams.

Each item's :class:`~energon.pipeline.executor.ItemMeta` carries the snapshot of the rank's own
position's stream and (``others``) those of the step's other streams, so every rank's state holds
the pointer state of all streams after its last step: a rank restores alone (same ``R``), and a
merge of states saved at the same step restores on any other ``R`` (the steps are then composed
of ``R'`` positions; every position, hence every sample, is still delivered exactly once).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from energon.balance.assign import balance_costs
from energon.balance.packed import layout_batch, pack_balanced
from energon.balance.table import CostTable
from energon.errors import ErrorPolicy, SampleException, SkipSample, log_exception
from energon.pipeline.executor import ItemMeta
from energon.pipeline.keys import Key, pointer_target
from energon.pipeline.pointers import PointerSource, build_pointer_stages
from energon.pipeline.snapshot import StreamSnapshot, emitted, make_snapshot, stage_states
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Value
from energon.pipeline.stages import LoadStage, _call_hook
from energon.pipeline.stream import _cook_function
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
        self.emitted = 0

    def next_batch(self) -> list[Key] | None:
        """The pointers of the stream's next micro-batch (None once a finite stream ended)."""
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

    def batch_at(self, index: int) -> list[Key] | None:
        """Micro-batch ``index`` (``index >= emitted``; earlier ones belong to other executors)."""
        while self.emitted < index:
            if self.next_batch() is None:
                return None
        return self.next_batch()

    def state(self) -> StreamSnapshot:
        return make_snapshot(self.emitted, [stage.state() for stage in self.stages])

    def restore(self, snapshot: StreamSnapshot) -> None:
        for stage, state in zip(self.stages, stage_states(snapshot)):
            stage.restore(state)
        self.emitted = emitted(snapshot)


class BalancedExecutor:
    """Yields ``(BalancedBatch, ItemMeta)`` for this rank's (worker's) steps, in order."""

    def __init__(
        self,
        spec: PipelineSpec,
        layout: Layout,
        snapshots: dict[int, StreamSnapshot] | None = None,
        end: int | None = None,
    ) -> None:
        if spec.balance is None:
            raise ValueError("BalancedExecutor needs a spec with balance set")
        self.spec = spec
        self.balance = spec.balance
        self.layout = layout
        self.snapshots = snapshots or {}
        self.end = end
        self.streams: dict[int, PointerBatches] = {}
        self.costs = CostTable(spec.leaves, spec.balance.cost)
        handler = spec.error_handler or log_exception
        self._load_policy = ErrorPolicy("load_sample", handler, spec.failure_tolerance)
        self._encode_policy = ErrorPolicy("encode_sample", handler, spec.failure_tolerance)
        self._loader = LoadStage(
            None,  # type: ignore[arg-type]  # only rebuild() is used: keys come from the plan
            spec.leaves,
            spec.decoder,
            self._load_policy,
            [_cook_function(spec, source) for source in spec.sources],
        )
        te = spec.task_encoder
        self._hooks = [
            getattr(te, hook)
            for hook in ("encode_sample", "preencode_sample", "postencode_sample")
            if te.is_active(hook)
        ]
        self._encode_batch = te.encode_batch if te.is_active("encode_batch") else None
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
        num_streams = self.spec.num_streams
        k = 0
        while True:
            step = layout.worker + k * workers
            first = layout.base + step * ranks
            own = first + layout.rank
            if self.end is not None and own >= self.end:
                return
            pool, touched, ended = self._pool(first, ranks)
            if not pool and ended:
                return
            value = self._rank_batch(pool, own)
            own_stream = own % num_streams
            others = {s: self.stream(s).state() for s in touched if s != own_stream}
            yield (
                value,
                ItemMeta(
                    own,
                    own_stream,
                    self.stream(own_stream).state(),
                    worker=layout.worker,
                    others=others or None,
                ),
            )
            k += 1

    def _pool(self, first: int, ranks: int) -> tuple[list[tuple[int, int, Key]], list[int], bool]:
        """The pointers of positions ``first ... first + ranks - 1`` as ``(position, member,
        key)``, the streams read, and whether some stream had ended."""
        num_streams = self.spec.num_streams
        pool: list[tuple[int, int, Key]] = []
        touched: list[int] = []
        ended = False
        for position in range(first, first + ranks):
            stream_id, index = position % num_streams, position // num_streams
            stream = self.stream(stream_id)
            if stream.emitted > index:
                continue  # consumed before a restore
            keys = stream.batch_at(index)
            if keys is None:
                ended = True
                continue
            pool.extend((position, j, key) for j, key in enumerate(keys))
            if stream_id not in touched:
                touched.append(stream_id)
        return pool, touched, ended

    def _rank_batch(self, pool: list[tuple[int, int, Key]], own: int) -> Value:
        costs = [self.costs.cost(*pointer_target(key)) for _, _, key in pool]
        shares = balance_costs([c.cost for c in costs], self.layout.world_size)
        mine = shares[self.layout.rank]
        hook_context.batch_index = own
        hook_context.seed = self.spec.seed
        samples, groups = [], []
        for i in mine:
            position, member, key = pool[i]
            for sample in self._load(key, position * (self.spec.batch_size or 1) + member):
                samples.append(sample)
                if self.balance.group is not None:
                    groups.append(self.balance.group(self._meta(key)))
        packs = pack_balanced(
            samples,
            self.balance.max_length,
            packer=self.packer,
            groups=groups if self.balance.group is not None else None,
        )
        rank_costs = [sum(costs[i].cost for i in share) for share in shares]
        value = layout_batch(
            packs,
            self.balance.max_length,
            rank_cost=rank_costs[self.layout.rank],
            step_costs=rank_costs,
        )
        if self._encode_batch is not None and samples:
            value = _call_hook(self._encode_batch, own, value)
        padding.mark(value, not samples)
        return value

    def _meta(self, key: Key) -> SampleMeta:
        source, index = pointer_target(key)
        return SampleMeta(self.costs.reader(source), source, index)

    def _load(self, key: Key, sample_index: int) -> list[Value]:
        """The encoded outputs of one sample (none when it failed and the policy skips it)."""
        try:
            sample = self._loader.rebuild(key)
        except SampleException as e:
            self._load_policy.failed(e, keys=(key,))
            return []
        self._load_policy.succeeded()
        outputs = [sample]
        for hook in self._hooks:
            produced = []
            for value in outputs:
                try:
                    produced.extend(_call_hook(_outputs_of, sample_index, hook, value))
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
