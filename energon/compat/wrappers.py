"""The reference's wrapper datasets (``MapDataset``, ``BlendDataset``, ``BatchDataset``, ...) as
nodes of one composition that runs on energon's stream pipeline.

A wrapper is a thin node: its children plus ``open(ctx)``, which builds the stage it adds to one
logical stream over its children's stages. Where the reference runs a wrapper chain once per worker,
energon runs it once per logical stream (the reference's worker, see docs/ordering.md), so a
composed dataset is loaded, saved and restored by the same loader as any other dataset: the state of
a stream is the plain-data state of its stage tree (counters, restore keys, RNG counters), and
buffers are refilled from restore keys. Leaves are datasets from ``get_train_dataset`` /
``get_val_dataset`` or a factory's ``build()``.

Two wrappers change the pass, not the stream: ``EpochizeDataset`` and ``LimitDataset`` set how many
micro-batches a loader pass yields, so they must be outermost (a clear error says so otherwise).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import inspect
import json
import math
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from energon.errors import ErrorPolicy, SkipSample
from energon.loader import wrappers as core_wrappers
from energon.loader.savable_dataset import SavableDataset
from energon.pipeline.keys import as_key, attach_restore_key
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec, fingerprint_digest
from energon.pipeline.stage import Item, Stage
from energon.pipeline.stages import BatchStage, GroupBatchStage, MapStage, PackStage
from energon.pipeline.stream import Stream, build_stream
from energon.plan.rng import CounterRng, stable_seed
from energon.samples.collate import concat_pad, generic_concat, homogeneous_concat_mix
from energon.task_encoder.base import hook_context
from energon.worker import WorkerConfig

__path__: list[str] = []  # a package for the alias: megatron.energon.wrappers.<module> map here

__all__ = [
    "BaseWrapperDataset",
    "BatchDataset",
    "BlendDataset",
    "ConcatDataset",
    "EpochizeDataset",
    "FilterDataset",
    "GcDataset",
    "GroupBatchDataset",
    "IterMapDataset",
    "LimitDataset",
    "LogSampleDataset",
    "MapDataset",
    "MixBatchDataset",
    "PackingDataset",
    "RepeatDataset",
    "ShuffleBufferDataset",
    "SkipSample",
    "WatchdogDataset",
    "concat_pad",
    "generic_concat",
    "homogeneous_concat_mix",
]


@dataclasses.dataclass(frozen=True)
class StreamContext:
    """Which logical stream a stage is built for, and where its node sits in the composition
    (``path``: child indices from the root; ``epoch``: pass of an enclosing ``RepeatDataset``).
    Every random stream of a stage is seeded from these, never from the process layout."""

    stream: int
    num_streams: int
    seed: int
    path: tuple[int, ...] = ()
    epoch: tuple[int, ...] = ()

    def child(self, index: int) -> StreamContext:
        return dataclasses.replace(self, path=(*self.path, index))

    def next_epoch(self, epoch: int) -> StreamContext:
        return dataclasses.replace(self, epoch=(*self.epoch, epoch))

    def rng(self, purpose: str) -> CounterRng:
        return CounterRng(
            stable_seed(
                self.seed, "compat", purpose, list(self.path), list(self.epoch), self.stream
            )
        )


def _function_name(fn: Any) -> str:
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


# -- leaves: datasets built by energon's own pipeline ------------------------------------------------


class _StreamStage(Stage):
    """A leaf dataset's stream as a stage (the composition decides the batch index, not the leaf)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def next(self) -> Item:
        batch_index = hook_context.batch_index
        try:
            return self.stream.next()
        finally:
            hook_context.batch_index = batch_index

    def state(self) -> dict[str, Any]:
        return self.stream.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.stream.restore(state)

    def rebuild(self, key: tuple) -> Any:
        return self.stream.rebuild(key)


def _leaf_spec(dataset: SavableDataset, ctx: StreamContext) -> PipelineSpec:
    spec = dataset.spec
    changes: dict[str, Any] = {}
    if spec.num_streams != ctx.num_streams:
        changes["num_streams"] = ctx.num_streams
    if ctx.epoch:  # a new pass of a finite leaf under RepeatDataset reshuffles
        changes["seed"] = stable_seed(spec.seed, "compat-pass", list(ctx.epoch))
    return dataclasses.replace(spec, **changes) if changes else spec


def open_stage(dataset: SavableDataset, ctx: StreamContext) -> Any:
    """The stage of ``dataset`` (a wrapper or a leaf) for one logical stream."""
    if isinstance(dataset, BaseWrapperDataset):
        return dataset.open(ctx)
    return _StreamStage(build_stream(_leaf_spec(dataset, ctx), ctx.stream))


def stream_length(dataset: SavableDataset, stream: int, num_streams: int) -> int:
    """Items ``dataset`` yields on one stream per pass (the reference's ``len_worker``)."""
    if isinstance(dataset, BaseWrapperDataset):
        return dataset.len_stream(stream, num_streams)
    spec = dataset.spec
    if spec.num_streams != num_streams:
        spec = dataclasses.replace(spec, num_streams=num_streams)
    if not spec.training:
        return spec.stream_val_batches(stream)
    count = spec.stream_sample_counts()[stream]
    if spec.batch_size is None:
        return count
    return count // spec.batch_size if spec.batch_drop_last else math.ceil(count / spec.batch_size)


def _leaves(dataset: SavableDataset) -> list[SavableDataset]:
    if isinstance(dataset, BaseWrapperDataset):
        return [leaf for child in dataset.datasets for leaf in _leaves(child)]
    return [dataset]


def _describe(dataset: SavableDataset) -> dict[str, Any]:
    if isinstance(dataset, BaseWrapperDataset):
        return dataset.config()
    return dataset.config()


# -- the node base ----------------------------------------------------------------------------------


class BaseWrapperDataset(SavableDataset):
    """A node of the composition; a ``SavableDataset`` the loaders accept like any other."""

    #: Stages that only observe (logging, gc, watchdog) do not change keys or state.
    _passes_through = False

    def __init__(
        self,
        datasets: SavableDataset | Iterable[SavableDataset],
        *,
        worker_config: WorkerConfig,
    ) -> None:
        if not isinstance(datasets, (list, tuple)):
            datasets = [datasets]
        self.datasets = tuple(datasets)
        if not isinstance(worker_config, WorkerConfig):
            raise TypeError(f"{type(self).__name__}: worker_config must be an energon WorkerConfig")
        for child in self.datasets:
            _check_child(self, child, worker_config)
        super().__init__(self._root_spec(worker_config), worker_config)

    @property
    def dataset(self) -> SavableDataset:
        return self.datasets[0]

    # -- what each wrapper defines -----------------------------------------------------------
    def open(self, ctx: StreamContext) -> Any:
        """This node's stage over its children's stages, for one stream."""
        raise NotImplementedError

    def len_stream(self, stream: int, num_streams: int) -> int:
        return stream_length(self.dataset, stream, num_streams)

    def _own_config(self) -> dict[str, Any]:
        return {}

    def _stateless(self) -> bool:
        """Whether this node's own function(s) can regenerate outputs (``restore_sample``)."""
        return True

    # -- the composition as a loader dataset -------------------------------------------------
    def _root_spec(self, worker_config: WorkerConfig) -> PipelineSpec:
        leaves = _leaves(self)
        first = leaves[0].spec
        training, epoch_length, limit = self._pass_rule()
        return PipelineSpec(
            sources=[source for leaf in leaves for source in leaf.spec.sources],
            mode="composed",
            training=training,
            seed=worker_config.seed_offset,
            num_streams=first.num_streams,
            num_streams_fixed=any(leaf.spec.num_streams_fixed for leaf in leaves),
            batch_size=self._micro_batch_size(),
            virtual_epoch_length=epoch_length,
            limit=limit,
            repeat=training,
            even_ranks=False,
        )

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        """(continues across loader passes like training, virtual epoch length, limit): what a
        loader pass over this node is. Inner epoch lengths and limits do not count."""
        return any(_pass_rule(child)[0] for child in self.datasets), 0, None

    def _micro_batch_size(self) -> int | None:
        node: Any = self
        while isinstance(node, BaseWrapperDataset):
            if isinstance(node, BatchDataset):
                return node.batch_size
            if isinstance(node, GroupBatchDataset):
                return node.fixed_batch_size
            node = node.dataset
        return node.spec.batch_size

    def build_stream(self, stream_id: int) -> Stream:
        ctx = StreamContext(stream_id, self.spec.num_streams, self.spec.seed)
        return Stream(stream_id, self.spec, [self.open(ctx)])

    def positions_per_pass(self) -> int | None:
        return None

    def pass_end(self, base: int = 0) -> int | None:
        return None  # streams end by themselves (finite leaves) or never

    def check_snapshot(self, stream_id: int, snapshot: StreamSnapshot) -> None:
        pass  # a composed stream checks its state when a worker restores it

    def _rank_streams(self) -> list[int]:
        workers = range(max(1, self.worker_config.num_workers))
        return sorted({s for w in workers for s in self.layout(w).streams()})

    def len_worker(self, worker_idx: int | None = None) -> int:
        """Items of one local worker per pass (the logical streams it executes)."""
        streams = self.layout(worker_idx or 0).streams()
        return sum(self.len_stream(s, self.spec.num_streams) for s in streams)

    def len_rank(self) -> int:
        spec = self.spec
        if spec.training and spec.virtual_epoch_length:
            return spec.virtual_epoch_length
        total = sum(self.len_stream(s, spec.num_streams) for s in self._rank_streams())
        return min(total, spec.limit) if spec.limit else total

    def worker_has_samples(self) -> bool:
        return self.len_rank() > 0

    def can_restore_sample(self) -> bool:
        if not self._stateless():
            return False
        return all(
            child.can_restore_sample()
            if isinstance(child, BaseWrapperDataset)
            else SavableDataset.can_restore_sample(child)
            for child in self.datasets
        )

    def assert_can_restore(self) -> None:
        if not self.can_restore_sample():
            raise RuntimeError(
                f"{type(self).__name__}: restore_sample needs stateless functions "
                "(stateless_map_fn=True, batcher_stateless=True, @stateless hooks)"
            )

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": type(self).__name__, **self._own_config()}
        if isinstance(self, BlendDataset):
            out["dataset_weights"] = [[_describe(d), w] for d, w in self.dataset_weights]
        elif len(self.datasets) > 1 or isinstance(self, ConcatDataset):
            out["datasets"] = [_describe(d) for d in self.datasets]
        else:
            out["dataset"] = _describe(self.dataset)
        return out

    def _fingerprint_tree(self) -> dict[str, Any]:
        """What a saved state depends on: the composition and its leaves' data and options,
        not the process layout (ranks, workers), which a restore may change."""
        return {
            "type": type(self).__name__,
            **self._own_config(),
            "children": [
                d._fingerprint_tree() if isinstance(d, BaseWrapperDataset) else d.spec.fingerprint()
                for d in self.datasets
            ],
        }

    def fingerprint(self) -> tuple[dict[str, Any], str]:
        fp = {"composed": self._fingerprint_tree()}
        fp = json.loads(json.dumps(fp, default=str))  # function configs may hold any object
        return fp, fingerprint_digest(fp)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(type(d).__name__ for d in self.datasets)})"


def _pass_rule(dataset: SavableDataset) -> tuple[bool, int, int | None]:
    if isinstance(dataset, BaseWrapperDataset):
        return dataset._pass_rule()
    spec = dataset.spec
    return spec.training, spec.virtual_epoch_length, spec.limit


def _check_child(parent: BaseWrapperDataset, child: Any, worker_config: WorkerConfig) -> None:
    name = type(parent).__name__
    if not isinstance(child, SavableDataset):
        raise TypeError(
            f"{name} wraps datasets from get_train_dataset / get_val_dataset, a factory's build() or "
            f"another wrapper, not {type(child).__name__}"
        )
    if type(child).build_stream is SavableDataset.build_stream and not hasattr(child, "spec"):
        raise TypeError(
            f"{name}: {type(child).__name__} is a custom SavableDataset subclass; energon composes "
            "only its own datasets and wrappers (see docs/migrating.md)"
        )
    if child.worker_config != worker_config:
        raise ValueError(
            f"{name}: the wrapped dataset was built for another worker config "
            f"({child.worker_config.config()} vs {worker_config.config()})"
        )
    limited = _is_plain(child) and child.spec.limit is not None  # the core's LimitDataset
    if limited or isinstance(child, (EpochizeDataset, LimitDataset)):
        kind = "LimitDataset" if limited else type(child).__name__
        raise ValueError(
            f"{name} wraps a {kind}: energon applies epoch lengths and limits per "
            f"loader pass, so {kind} must be the outermost wrapper"
        )
    if not isinstance(child, BaseWrapperDataset) and (
        child.spec.virtual_epoch_length or child.spec.limit
    ):
        warnings.warn(
            f"{name} wraps a dataset built with virtual_epoch_length / limit; those apply only to "
            "the outermost dataset a loader iterates and are ignored here (wrap the result in "
            "EpochizeDataset / LimitDataset instead)",
            UserWarning,
            stacklevel=4,
        )


def _policy(worker_config: WorkerConfig, name: str, tolerance: int) -> ErrorPolicy:
    return ErrorPolicy(name, worker_config.global_error_handler, tolerance)


# -- per-sample functions --------------------------------------------------------------------------


class MapDataset(BaseWrapperDataset):
    """``map_fn`` on every sample (a value or a generator of 0..n values; ``SkipSample`` drops)."""

    def __init__(
        self,
        dataset: SavableDataset,
        map_fn: Callable[[Any], Any],
        *,
        stateless_map_fn: bool = False,
        map_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.map_fn = map_fn
        self.stateless_map_fn = stateless_map_fn
        self.map_fn_config = map_fn_config
        self.failure_tolerance = failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        upstream = open_stage(self.dataset, ctx.child(0))
        name = f"MapDataset({_function_name(self.map_fn)})"
        stage = MapStage(
            upstream,
            self.map_fn,
            "MapDataset",
            _policy(self.worker_config, name, self.failure_tolerance),
            stream=ctx.stream,
            num_streams=ctx.num_streams,
        )
        return _StageChain(stage, upstream)

    def _stateless(self) -> bool:
        return self.stateless_map_fn

    def _own_config(self) -> dict[str, Any]:
        cfg = self.map_fn_config() if callable(self.map_fn_config) else self.map_fn_config
        return {
            "map_fn": _function_name(self.map_fn),
            **({"map_fn_config": cfg} if cfg else {}),
            "map_fn_stateless": self.stateless_map_fn,
        }


class _FilterStage(Stage):
    def __init__(self, upstream: Any, fn: Callable[[Any], bool], ctx: StreamContext) -> None:
        self.upstream = upstream
        self.fn = fn
        self.ctx = ctx
        self._inputs = 0

    def next(self) -> Item:
        while True:
            value, key = next(self.upstream)
            previous = hook_context.sample_index
            hook_context.sample_index = self._inputs * self.ctx.num_streams + self.ctx.stream
            self._inputs += 1
            try:
                keep = self.fn(value)
            finally:
                hook_context.sample_index = previous
            if keep:
                return value, key

    def state(self) -> dict[str, Any]:
        return {"inputs": self._inputs, "upstream": self.upstream.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self._inputs = int(state["inputs"])
        self.upstream.restore(state["upstream"])

    def rebuild(self, key: tuple) -> Any:
        return self.upstream.rebuild(key)


class FilterDataset(BaseWrapperDataset):
    """Keeps the samples for which ``filter_fn`` is true."""

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        filter_fn: Callable[[Any], bool],
        filter_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        worker_config: WorkerConfig,
    ) -> None:
        self.filter_fn = filter_fn
        self.filter_fn_config = filter_fn_config
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _FilterStage(open_stage(self.dataset, ctx.child(0)), self.filter_fn, ctx)

    def _own_config(self) -> dict[str, Any]:
        return {"filter_fn": _function_name(self.filter_fn)}


class _IterMapStage(Stage):
    """``iter_map_fn`` over the upstream as an iterator. An output's key lists the inputs consumed
    since the previous output, so a restored stage replays exactly those into a fresh iterator."""

    def __init__(
        self, upstream: Any, fn: Callable[[Iterator], Iterator], ctx: StreamContext
    ) -> None:
        self.upstream = upstream
        self.fn = fn
        self.ctx = ctx
        self._outputs = 0
        self._pending: list[Item] = []  # consumed since the last output
        self._replay: list[Item] = []
        self._iterator: Iterator | None = None

    def _inputs(self) -> Iterator[Any]:
        while True:
            if self._replay:
                item = self._replay.pop(0)
            else:
                try:
                    item = next(self.upstream)
                except StopIteration:
                    return
            self._pending.append(item)
            yield item[0]

    def next(self) -> Item:
        if self._iterator is None:
            self._iterator = iter(self.fn(self._inputs()))
        previous = hook_context.sample_index
        hook_context.sample_index = self._outputs * self.ctx.num_streams + self.ctx.stream
        try:
            value = next(self._iterator)
        finally:
            hook_context.sample_index = previous
        key = ("IterMapDataset", self._outputs, tuple(k for _, k in self._pending))
        self._outputs += 1
        self._pending = []
        attach_restore_key(value, key)
        return value, key

    def state(self) -> dict[str, Any]:
        return {
            "outputs": self._outputs,
            "pending": [k for _, k in self._pending],
            "upstream": self.upstream.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self._outputs = int(state["outputs"])
        self.upstream.restore(state["upstream"])
        keys = [as_key(k) for k in state["pending"]]
        self._replay = [(self.upstream.rebuild(k), k) for k in keys]
        self._pending = []
        self._iterator = None

    def rebuild(self, key: tuple) -> Any:
        _, _, members = key
        values = [self.upstream.rebuild(k) for k in members]
        return next(iter(self.fn(iter(values))))


class IterMapDataset(BaseWrapperDataset):
    """A stream-to-stream function: ``iter_map_fn(iterator of samples) -> iterator of outputs``."""

    def __init__(
        self,
        dataset: SavableDataset,
        iter_map_fn: Callable[[Iterator], Iterator],
        *,
        len_map_fn: Callable[[int], int] = lambda x: x,
        stateless_iter_fn: bool = False,
        iter_map_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        worker_config: WorkerConfig,
    ) -> None:
        self.iter_map_fn = iter_map_fn
        self.len_map_fn = len_map_fn
        self.stateless_iter_fn = stateless_iter_fn
        self.iter_map_fn_config = iter_map_fn_config
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _IterMapStage(open_stage(self.dataset, ctx.child(0)), self.iter_map_fn, ctx)

    def len_stream(self, stream: int, num_streams: int) -> int:
        return self.len_map_fn(stream_length(self.dataset, stream, num_streams))

    def _stateless(self) -> bool:
        return self.stateless_iter_fn

    def _own_config(self) -> dict[str, Any]:
        return {
            "iter_map_fn": _function_name(self.iter_map_fn),
            "len_map_fn": _function_name(self.len_map_fn),
        }


# -- buffers ---------------------------------------------------------------------------------------


class _ShuffleStage(Stage):
    """Holds up to ``size`` samples and emits a uniformly random one; its state is their keys."""

    def __init__(self, upstream: Any, size: int, rng: CounterRng) -> None:
        self.upstream = upstream
        self.size = size
        self.rng = rng
        self._buffer: list[Item] = []
        self._exhausted = False

    def next(self) -> Item:
        while not self._exhausted and len(self._buffer) < self.size:
            try:
                self._buffer.append(next(self.upstream))
            except StopIteration:
                self._exhausted = True
        if not self._buffer:
            raise StopIteration
        i = self.rng.randbelow(len(self._buffer))
        self._buffer[i], self._buffer[-1] = self._buffer[-1], self._buffer[i]
        return self._buffer.pop()

    def state(self) -> dict[str, Any]:
        return {
            "buffer": [k for _, k in self._buffer],
            "rng": self.rng.counter,
            "exhausted": self._exhausted,
            "upstream": self.upstream.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.upstream.restore(state["upstream"])
        keys = [as_key(k) for k in state["buffer"]]
        self._buffer = [(self.upstream.rebuild(k), k) for k in keys]
        self.rng.counter = int(state["rng"])
        self._exhausted = bool(state["exhausted"])

    def rebuild(self, key: tuple) -> Any:
        return self.upstream.rebuild(key)


class ShuffleBufferDataset(BaseWrapperDataset):
    """Emits a random sample of a buffer of ``size`` (seeded per logical stream)."""

    def __init__(self, dataset: SavableDataset, size: int, *, worker_config: WorkerConfig) -> None:
        self.size = size
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _ShuffleStage(open_stage(self.dataset, ctx.child(0)), self.size, ctx.rng("shuffle"))

    def _own_config(self) -> dict[str, Any]:
        return {"size": self.size}


class _StageChain(Stage):
    """Exposes a core stage that keeps no reference to its upstream's state as one that does."""

    def __init__(self, stage: Any, upstream: Any) -> None:
        self.stage = stage
        self.upstream = upstream

    def next(self) -> Item:
        return next(self.stage)

    def state(self) -> dict[str, Any]:
        return {"own": self.stage.state(), "upstream": self.upstream.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self.upstream.restore(state["upstream"])
        self.stage.restore(state["own"])

    def rebuild(self, key: tuple) -> Any:
        return self.stage.rebuild(key)


class BatchDataset(BaseWrapperDataset):
    """Batches of ``batch_size`` consecutive samples (the last one partial unless ``drop_last``)."""

    def __init__(
        self,
        dataset: SavableDataset,
        batch_size: int,
        batcher: Callable[[list], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.batch_size = batch_size
        self.batcher = batcher
        self.batcher_stateless = batcher_stateless
        self.batcher_config = batcher_config
        self.drop_last = drop_last
        self.failure_tolerance = failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        upstream = open_stage(self.dataset, ctx.child(0))
        size = self.batch_size
        stage = BatchStage(
            upstream,
            lambda _: size,
            self.batcher,
            _policy(self.worker_config, "BatchDataset", self.failure_tolerance),
            drop_last=self.drop_last,
        )
        return _StageChain(stage, upstream)

    def len_stream(self, stream: int, num_streams: int) -> int:
        n = stream_length(self.dataset, stream, num_streams)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _stateless(self) -> bool:
        return self.batcher_stateless

    def _own_config(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "batcher": _function_name(self.batcher),
            "batcher_stateless": self.batcher_stateless,
            "drop_last": self.drop_last,
        }


class GroupBatchDataset(BaseWrapperDataset):
    """Batches of samples sharing a group key; ``sample_group_key(sample) -> (key, batch_size)``."""

    def __init__(
        self,
        dataset: SavableDataset,
        fixed_batch_size: int | None,
        sample_group_key: Callable[[Any], tuple[Any, int | None]],
        batcher: Callable[[list], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.fixed_batch_size = fixed_batch_size
        self.sample_group_key = sample_group_key
        self.batcher = batcher
        self.batcher_stateless = batcher_stateless
        self.batcher_config = batcher_config
        self.drop_last = drop_last
        self.failure_tolerance = failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        upstream = open_stage(self.dataset, ctx.child(0))
        stage = GroupBatchStage(
            upstream,
            self.sample_group_key,
            self.batcher,
            _policy(self.worker_config, "GroupBatchDataset", self.failure_tolerance),
            batch_size=self.fixed_batch_size,
            drop_last=self.drop_last,
            stream=ctx.stream,
            num_streams=ctx.num_streams,
        )
        return _StageChain(stage, upstream)

    def _stateless(self) -> bool:
        return self.batcher_stateless

    def _own_config(self) -> dict[str, Any]:
        return {
            "fixed_batch_size": self.fixed_batch_size,
            "sample_group_key": _function_name(self.sample_group_key),
            "batcher": _function_name(self.batcher),
            "drop_last": self.drop_last,
        }


class PackingDataset(BaseWrapperDataset):
    """Sequence packing: ``pre_packer`` groups a buffer of samples, ``final_packer`` packs a group."""

    def __init__(
        self,
        dataset: SavableDataset,
        buffer_size: int,
        pre_packer: Callable[[list], list[list]],
        final_packer: Callable[[list], Any],
        *,
        final_packer_stateless: bool = False,
        sample_encoder: Callable[[Any], Any] | None = None,
        sample_encoder_stateless: bool = False,
        packer_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        pre_packer_failure_tolerance: int = 100,
        final_packer_failure_tolerance: int = 100,
        sample_encoder_failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.buffer_size = buffer_size
        self.pre_packer = pre_packer
        self.final_packer = final_packer
        self.final_packer_stateless = final_packer_stateless
        self.sample_encoder = sample_encoder
        self.sample_encoder_stateless = sample_encoder_stateless
        self.packer_config = packer_config
        self.final_packer_failure_tolerance = final_packer_failure_tolerance
        self.pre_packer_failure_tolerance = pre_packer_failure_tolerance
        self.sample_encoder_failure_tolerance = sample_encoder_failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        upstream = open_stage(self.dataset, ctx.child(0))
        stage = PackStage(
            upstream,
            self.buffer_size,
            self.pre_packer,
            self.final_packer,
            self.sample_encoder,
            _policy(self.worker_config, "PackingDataset", self.final_packer_failure_tolerance),
            stream=ctx.stream,
            num_streams=ctx.num_streams,
            empty_rounds_tolerance=self.pre_packer_failure_tolerance,
        )
        return _StageChain(stage, upstream)

    def _stateless(self) -> bool:
        return self.final_packer_stateless and (
            self.sample_encoder is None or self.sample_encoder_stateless
        )

    def _own_config(self) -> dict[str, Any]:
        return {
            "buffer_size": self.buffer_size,
            "pre_packer": _function_name(self.pre_packer),
            "final_packer": _function_name(self.final_packer),
            "sample_encoder": _function_name(self.sample_encoder) if self.sample_encoder else None,
        }


# -- several inputs --------------------------------------------------------------------------------


class _BlendStage(Stage):
    """Per step, a child drawn with probability proportional to its weight; a child that ends is
    dropped; the blend ends when all have ended."""

    def __init__(self, children: list[Any], weights: list[float], rng: CounterRng) -> None:
        self.children = children
        self.weights = weights
        self.rng = rng
        self.exhausted = [False] * len(children)

    def next(self) -> Item:
        while True:
            weights = [0.0 if done else w for w, done in zip(self.weights, self.exhausted)]
            if sum(weights) <= 0:
                raise StopIteration
            i = self.rng.choice_weighted(weights)
            try:
                value, key = next(self.children[i])
            except StopIteration:
                self.exhausted[i] = True
                continue
            key = ("BlendDataset", i, key)
            attach_restore_key(value, key)
            return value, key

    def state(self) -> dict[str, Any]:
        return {
            "exhausted": list(self.exhausted),
            "rng": self.rng.counter,
            "datasets": [child.state() for child in self.children],
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.exhausted = [bool(x) for x in state["exhausted"]]
        self.rng.counter = int(state["rng"])
        for child, child_state in zip(self.children, state["datasets"]):
            child.restore(child_state)

    def rebuild(self, key: tuple) -> Any:
        _, i, inner = key
        value = self.children[i].rebuild(inner)
        attach_restore_key(value, key)
        return value


class BlendDataset(BaseWrapperDataset):
    """Weighted random blend: each output comes from a dataset drawn by weight (per logical
    stream, seeded); a dataset that ends drops out."""

    def __init__(
        self, *dataset_weights: tuple[SavableDataset, float], worker_config: WorkerConfig
    ) -> None:
        for entry in dataset_weights:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise TypeError("BlendDataset takes (dataset, weight) tuples")
        self.dataset_weights = tuple(dataset_weights)
        self.weights = tuple(float(w) for _, w in dataset_weights)
        super().__init__([d for d, _ in dataset_weights], worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        children = [open_stage(d, ctx.child(i)) for i, d in enumerate(self.datasets)]
        return _BlendStage(children, list(self.weights), ctx.rng("blend"))

    def len_stream(self, stream: int, num_streams: int) -> int:
        return sum(stream_length(d, stream, num_streams) for d in self.datasets)

    def _own_config(self) -> dict[str, Any]:
        return {"weights": list(self.weights)}


class _ConcatStage(Stage):
    def __init__(self, children: list[Any]) -> None:
        self.children = children
        self.current = 0

    def next(self) -> Item:
        while self.current < len(self.children):
            try:
                value, key = next(self.children[self.current])
            except StopIteration:
                self.current += 1
                continue
            key = ("ConcatDataset", self.current, key)
            attach_restore_key(value, key)
            return value, key
        raise StopIteration

    def state(self) -> dict[str, Any]:
        return {"current": self.current, "datasets": [c.state() for c in self.children]}

    def restore(self, state: dict[str, Any]) -> None:
        self.current = int(state["current"])
        for child, child_state in zip(self.children, state["datasets"]):
            child.restore(child_state)

    def rebuild(self, key: tuple) -> Any:
        _, i, inner = key
        value = self.children[i].rebuild(inner)
        attach_restore_key(value, key)
        return value


class ConcatDataset(BaseWrapperDataset):
    """The datasets one after the other (per logical stream)."""

    def __init__(self, *datasets: SavableDataset, worker_config: WorkerConfig) -> None:
        super().__init__(list(datasets), worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _ConcatStage([open_stage(d, ctx.child(i)) for i, d in enumerate(self.datasets)])

    def len_stream(self, stream: int, num_streams: int) -> int:
        return sum(stream_length(d, stream, num_streams) for d in self.datasets)

    def _own_config(self) -> dict[str, Any]:
        return {}


class MixBatchDataset(BatchDataset):
    """Batches mixed from already batched datasets: ``BatchDataset(BlendDataset(...))`` whose
    ``batch_mix_fn`` gets the list of sub-batches (``homogeneous_concat_mix`` concatenates them)."""

    def __init__(
        self,
        *dataset_weights: tuple[SavableDataset, float],
        batch_size: int,
        batch_mix_fn: Callable[[list], Any] = lambda x: x,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(
            BlendDataset(*dataset_weights, worker_config=worker_config),
            batch_size,
            batch_mix_fn,
            batcher_stateless=True,
            worker_config=worker_config,
        )


# -- repetition and pass lengths -------------------------------------------------------------------


class _RepeatStage(Stage):
    """Re-opens its child when it ends (a new pass, reshuffled); ``repeats=None`` repeats forever,
    a fraction yields that share of the next pass. A child that yields nothing ends the repeat."""

    def __init__(self, node: RepeatDataset, ctx: StreamContext) -> None:
        self.node = node
        self.ctx = ctx
        self.repetition = 0
        self.index = 0
        self.child = self._open(0)
        self._tail: int | None = None

    def _open(self, repetition: int) -> Any:
        ctx = self.ctx.child(0)
        return open_stage(self.node.dataset, ctx.next_epoch(repetition) if repetition else ctx)

    def _tail_length(self) -> int:
        if self._tail is None:
            fraction = self.node.repeats - int(self.node.repeats)
            per_pass = stream_length(self.node.dataset, self.ctx.stream, self.ctx.num_streams)
            self._tail = int(per_pass * fraction)
        return self._tail

    def next(self) -> Item:
        repeats = self.node.repeats
        while True:
            if repeats is not None:
                whole = int(repeats)
                if self.repetition > whole or (
                    self.repetition == whole and self.index >= self._tail_length()
                ):
                    raise StopIteration
            try:
                item = next(self.child)
            except StopIteration:
                if self.index == 0:
                    raise  # nothing to repeat on this stream
                self.repetition += 1
                self.index = 0
                self.child = self._open(self.repetition)
                continue
            self.index += 1
            return item

    def state(self) -> dict[str, Any]:
        return {"repetition": self.repetition, "index": self.index, "dataset": self.child.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self.repetition = int(state["repetition"])
        self.index = int(state["index"])
        self.child = self._open(self.repetition)
        self.child.restore(state["dataset"])

    def rebuild(self, key: tuple) -> Any:
        return self.child.rebuild(key)


class RepeatDataset(BaseWrapperDataset):
    """The dataset again and again (``repeats=None``: forever; a number: that many passes).

    Over a dataset of ``get_train_dataset`` / ``get_val_dataset`` this is the core's pass-length
    rule (:func:`energon.loader.wrappers.RepeatDataset`, exact totals, elastic); only a composed
    chain gets a node."""

    def __new__(
        cls,
        dataset: SavableDataset,
        *,
        repeats: int | float | None = None,
        restart: bool = True,
        worker_config: WorkerConfig,
    ) -> Any:
        if _is_plain(dataset):
            return core_wrappers.RepeatDataset(
                dataset, repeats=repeats, restart=restart, worker_config=worker_config
            )
        return super().__new__(cls)

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        repeats: int | float | None = None,
        restart: bool = True,
        worker_config: WorkerConfig,
    ) -> None:
        self.repeats = repeats
        self.restart = restart
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _RepeatStage(self, ctx)

    def len_stream(self, stream: int, num_streams: int) -> int:
        inner = stream_length(self.dataset, stream, num_streams)
        return inner if self.repeats is None else int(inner * self.repeats)

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        return True, 0, None  # infinite or a fixed number of passes: continue across loops

    def _own_config(self) -> dict[str, Any]:
        return {"repeats": self.repeats}


class _PassThrough(BaseWrapperDataset):
    def open(self, ctx: StreamContext) -> Any:
        return open_stage(self.dataset, ctx.child(0))

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        return _pass_rule(self.dataset)

    def config(self) -> dict[str, Any]:
        return _describe(self.dataset)  # transparent, as in the reference


class EpochizeDataset(_PassThrough):
    """Every loader pass yields ``length`` micro-batches per rank; the next pass continues where
    the previous one stopped. Must be the outermost wrapper."""

    def __init__(self, dataset: SavableDataset, length: int, worker_config: WorkerConfig) -> None:
        self.length = length
        super().__init__(dataset, worker_config=worker_config)

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        return True, self.length, None

    def config(self) -> dict[str, Any]:
        return {
            "type": "EpochizeDataset",
            "length": self.length,
        }


class LimitDataset(_PassThrough):
    """Every loader pass yields at most ``length`` micro-batches per rank; with
    ``reset_after_epoch=True`` each pass starts from the beginning again (validation), else it
    continues. Must be the outermost wrapper. Over a dataset of ``get_train_dataset`` /
    ``get_val_dataset`` this is the core's rule (:func:`energon.loader.wrappers.LimitDataset`)."""

    def __new__(
        cls,
        dataset: SavableDataset,
        length: int,
        *,
        reset_after_epoch: bool = False,
        worker_config: WorkerConfig,
    ) -> Any:
        if _is_plain(dataset):
            return core_wrappers.LimitDataset(
                dataset, length, reset_after_epoch=reset_after_epoch, worker_config=worker_config
            )
        return super().__new__(cls)

    def __init__(
        self,
        dataset: SavableDataset,
        length: int,
        *,
        reset_after_epoch: bool = False,
        worker_config: WorkerConfig,
    ) -> None:
        self.length = length
        self.reset_after_epoch = reset_after_epoch
        super().__init__(dataset, worker_config=worker_config)

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        if self.reset_after_epoch:
            return False, 0, self.length
        return True, self.length, None

    def len_rank(self) -> int:
        return min(self.length, stream_rank_total(self))

    def config(self) -> dict[str, Any]:
        return {
            "type": "LimitDataset",
            "length": self.length,
            "reset_after_epoch": self.reset_after_epoch,
        }


def _is_plain(dataset: Any) -> bool:
    """A dataset the core pipeline builds alone (not a composition, not a task encoder's own)."""
    return type(dataset) is SavableDataset


def stream_rank_total(node: BaseWrapperDataset) -> int:
    return sum(node.len_stream(s, node.spec.num_streams) for s in node._rank_streams())


class LogSampleDataset(_PassThrough):
    """Accepted for compatibility; energon's logging is the loader's (``WorkerConfig`` debug
    options), so this node adds no stage."""

    def __init__(
        self,
        dataset: SavableDataset,
        mode: str,
        worker_config: WorkerConfig,
        get_keys_fn: Callable[[Any], list[str] | None] | None = None,
    ) -> None:
        self.mode = mode
        self.get_keys_fn = get_keys_fn
        super().__init__(dataset, worker_config=worker_config)


class GcDataset(_PassThrough):
    """Accepted for compatibility: energon's workers hold raw bytes and plain-data state, so there
    is no reference cycle build-up for a periodic ``gc.collect`` to fight; this adds no stage."""

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        worker_config: WorkerConfig,
        every_n_iter: int = 10,
        freeze: bool = True,
    ) -> None:
        self.every_n_iter = every_n_iter
        self.freeze = freeze
        super().__init__(dataset, worker_config=worker_config)


class _WatchdogStage(Stage):
    """Warns (or exits) when one ``next()`` of the wrapped pipeline takes longer than the timeout,
    with every thread's stack, so a hang says where it is."""

    def __init__(self, upstream: Any, node: WatchdogDataset) -> None:
        self.upstream = upstream
        self.node = node
        self._first = True

    def next(self) -> Item:
        timeout = self.node.timeout_seconds
        if self._first and self.node.initial_timeout_seconds is not None:
            timeout = self.node.initial_timeout_seconds
        self._first = False
        if timeout is None:
            return next(self.upstream)
        timer = threading.Timer(timeout, self.node._watchdog_trigger, args=(timeout,))
        timer.daemon = True
        timer.start()
        try:
            return next(self.upstream)
        finally:
            timer.cancel()

    def state(self) -> dict[str, Any]:
        return self.upstream.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.upstream.restore(state)

    def rebuild(self, key: tuple) -> Any:
        return self.upstream.rebuild(key)


class WatchdogDataset(_PassThrough):
    """Reports a pipeline step that takes longer than ``timeout_seconds`` (stacks of all threads);
    ``fail_on_timeout=True`` ends the process instead of warning."""

    def __init__(
        self,
        dataset: SavableDataset,
        worker_config: WorkerConfig,
        timeout_seconds: float | None = 60,
        initial_timeout_seconds: float | None = None,
        fail_on_timeout: bool = False,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.initial_timeout_seconds = initial_timeout_seconds
        self.fail_on_timeout = fail_on_timeout
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _WatchdogStage(open_stage(self.dataset, ctx.child(0)), self)

    def _watchdog_trigger(self, timeout: float) -> None:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        message = f"WatchdogDataset: a pipeline step took longer than {timeout} s (stacks above)"
        if self.fail_on_timeout:
            print(message, file=sys.stderr, flush=True)
            import os

            os._exit(1)
        warnings.warn(message, RuntimeWarning, stacklevel=1)


def is_generator_function(fn: Any) -> bool:
    return inspect.isgeneratorfunction(getattr(fn, "__func__", fn))
