"""The node base of the reference's wrapper datasets, and what every wrapper shares.

A wrapper is a thin node: its children plus ``open(ctx)``, which builds the stage it adds to one
logical stream over its children's stages. Where the reference runs a wrapper chain once per worker,
energon runs it once per logical stream (the reference's worker, see docs/ordering.md), so a
composed dataset is loaded, saved and restored by the same loader as any other dataset: the state of
a stream is the plain-data state of its stage tree (counters, restore keys, RNG counters), and
buffers are refilled from restore keys. Leaves are datasets from ``get_train_dataset`` /
``get_val_dataset`` or a factory's ``build()``.

Also here, under the reference's names (``megatron.energon.wrappers.base``): ``SampleIndex`` and the
restore-key helpers that custom code uses on samples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from energon import state_fields as fields
from energon.errors import ErrorPolicy, StateError
from energon.loader.hand_written import HandWrittenKind, IteratorStage, stream_worker
from energon.loader.planned import PlannedKind
from energon.loader.savable_dataset import SavableDataset
from energon.pipeline import assembly
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec, fingerprint_digest
from energon.pipeline.stage import Item, Stage
from energon.pipeline.stages import MapStage
from energon.pipeline.stream import Stream
from energon.plan.rng import CounterRng, stable_seed
from energon.samples import Sample
from energon.savable import FlexState, Savable
from energon.task_encoder.base import hook_context
from energon.worker import WorkerConfig

__all__ = [
    "BaseWrapperDataset",
    "FlexState",
    "Sample",
    "SampleIndex",
    "Savable",
    "SavableDataset",
    "WorkerConfig",
    "add_sample_restore_key",
    "get_sample_restore_key",
    "set_sample_restore_key",
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


def function_name(fn: Any) -> str:
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


# -- leaves: datasets from get_train_dataset / get_val_dataset, a factory's build(), or hand-written


class _LeafStage(Stage):
    """A leaf's stream as a stage (the composition decides the batch index, not the leaf)."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage

    def next(self) -> Item:
        batch_index = hook_context.batch_index
        try:
            return self.stage.next()
        finally:
            hook_context.batch_index = batch_index

    def state(self) -> Any:
        return self.stage.state()

    def restore(self, state: Any) -> None:
        self.stage.restore(state)

    def rebuild(self, key: tuple) -> Any:
        return self.stage.rebuild(key)


def open_stage(dataset: SavableDataset, ctx: StreamContext) -> Any:
    """The stage of ``dataset`` (a wrapper or a leaf) for one logical stream."""
    if isinstance(dataset, BaseWrapperDataset):
        return dataset.open(ctx)
    seed = dataset.spec.seed
    if ctx.epoch:  # a new pass of a finite leaf under RepeatDataset reshuffles
        seed = stable_seed(seed, "compat-pass", list(ctx.epoch))
    kind = dataset.dataset_kind
    return _LeafStage(kind.leaf_stage(dataset, ctx.stream, ctx.num_streams, seed))


def stream_length(dataset: SavableDataset, stream: int, num_streams: int) -> int:
    """Items ``dataset`` yields on one stream per pass (the reference's ``len_worker``)."""
    if isinstance(dataset, BaseWrapperDataset):
        return dataset.len_stream(stream, num_streams)
    return dataset.dataset_kind.leaf_length(dataset, stream, num_streams)


def _leaves(dataset: SavableDataset) -> list[SavableDataset]:
    if isinstance(dataset, BaseWrapperDataset):
        return [leaf for child in dataset.datasets for leaf in _leaves(child)]
    return [dataset]


# -- the node base ----------------------------------------------------------------------------------


class BaseWrapperDataset(SavableDataset):
    """A node of the composition; a ``SavableDataset`` the loaders accept like any other."""

    #: Nodes that set a loader pass's length (EpochizeDataset, LimitDataset) must be outermost.
    outermost_only = False

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
        if type(self).open is BaseWrapperDataset.open:  # it has its own __iter__
            self._setup(worker_config, HAND_WRITTEN_WRAPPER, None)
        else:
            self._setup(worker_config, COMPOSED, self._root_spec(worker_config))

    @property
    def dataset(self) -> SavableDataset:
        return self.datasets[0]

    # -- what each wrapper defines -----------------------------------------------------------
    def open(self, ctx: StreamContext) -> Any:
        """This node's stage over its children's stages, for one stream; a hand-written wrapper
        (one that defines ``__iter__`` instead) runs as that stream's worker
        (:mod:`energon.loader.hand_written`)."""
        return IteratorStage(self, stream_worker(ctx.stream, self.worker_config.world_size))

    def len_stream(self, stream: int, num_streams: int) -> int:
        return stream_length(self.dataset, stream, num_streams)

    def _own_config(self) -> dict[str, Any]:
        return {}

    def _stateless(self) -> bool:
        """Whether this node's own function(s) can regenerate outputs (``restore_sample``; a
        node without functions can)."""
        return True

    # -- the reference's per-dataset state protocol (a hand-written wrapper's includes its
    #    children's, as the reference's does: HandWrittenWrapperKind) ------------------------------
    def reset_state_deep(self) -> None:
        self.reset_state_own()
        for child in self.datasets:
            child.reset_state_deep()

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
            batch_size=self.micro_batch_size(),
            virtual_epoch_length=epoch_length,
            limit=limit,
            repeat=training,
            even_ranks=False,
        )

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        """(continues across loader passes like training, virtual epoch length, limit): what a
        loader pass over this node is. Inner epoch lengths and limits do not count."""
        return any(pass_rule(child)[0] for child in self.datasets), 0, None

    def micro_batch_size(self) -> int | None:
        """The size of the micro-batches this node yields (None: unbatched samples)."""
        child = self.dataset
        return (
            child.micro_batch_size()
            if isinstance(child, BaseWrapperDataset)
            else child.spec.batch_size
        )

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

    def worker_has_samples(self) -> bool:
        return self.len_rank() > 0

    def assert_can_restore(self) -> None:
        if not self.can_restore_sample():
            raise RuntimeError(
                f"{type(self).__name__}: restore_sample needs stateless functions "
                "(stateless_map_fn=True, batcher_stateless=True, @stateless hooks)"
            )

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__name__, **self._own_config(), **self._children_config()}

    def _children_config(self) -> dict[str, Any]:
        if len(self.datasets) > 1:
            return {"datasets": [d.config() for d in self.datasets]}
        return {"dataset": self.dataset.config()}

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


# -- the two kinds of wrappers (energon.loader.dataset_kind) ----------------------------------------


class ComposedKind(PlannedKind):
    """A composition whose nodes build its stages (``open``): planned, its length summed over the
    rank's streams, its items regenerable where every node's function is stateless."""

    def len_rank(self, dataset: Any) -> int:
        spec = dataset.spec
        if spec.training and spec.virtual_epoch_length:
            return spec.virtual_epoch_length
        total = stream_rank_total(dataset)
        return min(total, spec.limit) if spec.limit else total

    def can_restore_sample(self, dataset: Any) -> bool:
        """Every node's own function(s) are stateless, and every leaf's hooks."""
        if not dataset._stateless():
            return False
        return all(
            child.can_restore_sample()
            if isinstance(child, BaseWrapperDataset)
            else child.dataset_kind.can_restore_sample(child)
            for child in dataset.datasets
        )


class HandWrittenWrapperKind(HandWrittenKind):
    """A wrapper with its own ``__iter__``: a hand-written dataset whose state holds its
    children's (``datasets``), as the reference's does."""

    def save_state(self, dataset: Any) -> FlexState:
        own = super().save_state(dataset)
        return FlexState(datasets=[d.save_state() for d in dataset.datasets], **own)

    def restore_state(self, dataset: Any, state: FlexState) -> None:
        children = state.get("datasets")
        if not isinstance(children, list) or len(children) != len(dataset.datasets):
            raise StateError(
                f"{type(dataset).__name__}.restore_state: the state's 'datasets' does not hold "
                f"one state per wrapped dataset ({len(dataset.datasets)})"
            )
        for child, child_state in zip(dataset.datasets, children):
            child.restore_state(child_state)
        super().restore_state(dataset, state)


#: The kinds of wrappers (a kind holds no state).
COMPOSED = ComposedKind()
HAND_WRITTEN_WRAPPER = HandWrittenWrapperKind()


def pass_rule(dataset: SavableDataset) -> tuple[bool, int, int | None]:
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
    if child.worker_config != worker_config:
        raise ValueError(
            f"{name}: the wrapped dataset was built for another worker config "
            f"({child.worker_config.config()} vs {worker_config.config()})"
        )
    limited = is_plain(child) and child.spec.limit is not None  # the core's LimitDataset
    if limited or getattr(child, "outermost_only", False):
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


def error_policy(worker_config: WorkerConfig, name: str, tolerance: int) -> ErrorPolicy:
    return ErrorPolicy(name, worker_config.global_error_handler, tolerance)


class StageChain(Stage):
    """Exposes a core stage that keeps no reference to its upstream's state as one that does."""

    def __init__(self, stage: Any, upstream: Any) -> None:
        self.stage = stage
        self.upstream = upstream

    def next(self) -> Item:
        return next(self.stage)

    def state(self) -> dict[str, Any]:
        return {"own": self.stage.state(), "upstream": self.upstream.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self.upstream.restore(fields.get(state, "upstream", "chain"))
        self.stage.restore(fields.get(state, "own", "chain"))

    def rebuild(self, key: tuple) -> Any:
        return self.stage.rebuild(key)


def open_part(
    node: BaseWrapperDataset,
    ctx: StreamContext,
    own: assembly.Part,
    build_own: Callable[[Any], Stage],
) -> Any:
    """The stage of a wrapper that is one part of a stream (``own``, built over its upstream by
    ``build_own``) over its child: the parts :func:`energon.pipeline.assembly.stream_parts` lists
    for it, in order (after a batching wrapper: the batch hooks every stream runs)."""
    stage: Any = None
    for part in assembly.stream_parts(own):
        if part.kind == assembly.UPSTREAM:
            stage = open_stage(node.dataset, ctx.child(0))
        elif part is own:
            stage = StageChain(build_own(stage), stage)
        elif part.kind in (assembly.SAMPLE, assembly.BATCH_STEP) and part.fn is not None:
            tolerance = getattr(part.fn, "__failure_tolerance__", 100)
            hook = MapStage(
                stage,
                part.fn,
                part.name,
                error_policy(node.worker_config, part.name, tolerance),
                stream=ctx.stream,
                num_streams=ctx.num_streams,
            )
            stage = StageChain(hook, stage)
        else:
            raise ValueError(f"{type(node).__name__} cannot build a {part.kind!r} part")
    return stage


class PassThrough(BaseWrapperDataset):
    def open(self, ctx: StreamContext) -> Any:
        return open_stage(self.dataset, ctx.child(0))

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        return pass_rule(self.dataset)

    def config(self) -> dict[str, Any]:
        return self.dataset.config()  # transparent, as in the reference


def is_plain(dataset: Any) -> bool:
    """A dataset the core pipeline builds alone (not a composition, not a task encoder's own)."""
    return type(dataset) is SavableDataset


def stream_rank_total(node: BaseWrapperDataset) -> int:
    return sum(node.len_stream(s, node.spec.num_streams) for s in node._rank_streams())


# -- the reference's helpers for samples and custom wrappers ----------------------------------------


def get_sample_restore_key(sample: Any) -> str | int | None:
    """The restore key of a sample (a ``Sample`` or a dict carrying ``__restore_key__``)."""
    if isinstance(sample, dict):
        return sample.get("__restore_key__")
    return getattr(sample, "__restore_key__", None)


def _set_restore_key(sample: Any, key: tuple, fail_otherwise: bool) -> Any:
    if isinstance(sample, Sample):
        sample.__restore_key__ = key
    elif isinstance(sample, dict) and "__restore_key__" in sample:
        sample["__restore_key__"] = key
    elif fail_otherwise:
        raise RuntimeError(
            "Did not yield a sample with a restore key, but is marked stateless/deterministic."
        )
    return sample


def add_sample_restore_key(
    sample: Any, *key: int | str, src: Any, fail_otherwise: bool = False
) -> Any:
    """Prepend ``(type name of src, *key)`` to the sample's restore key."""
    existing = get_sample_restore_key(sample)
    inner = tuple(existing) if isinstance(existing, (list, tuple)) else ()
    return _set_restore_key(sample, (type(src).__name__, *key, *inner), fail_otherwise)


def set_sample_restore_key(
    sample: Any, *key: int | str, src: Any, fail_otherwise: bool = False
) -> Any:
    """Set the sample's restore key to ``(type name of src, *key)``."""
    return _set_restore_key(sample, (type(src).__name__, *key), fail_otherwise)


class SampleIndex(Savable):
    """The running index of the samples a custom wrapper produces; ``ctx()`` makes it the current
    sample index (``TaskEncoder.current_sample_index``) while the wrapper's function runs."""

    actives: int = 0  # how many ctx() blocks are open (a class default, as the reference's)

    def __init__(self, worker_config: WorkerConfig, *, src: Any) -> None:
        self.worker_config = worker_config
        self.src = src
        self.current_idx = 0
        self.actives = 0

    def get_next(self) -> int:
        index = self.current_idx
        self.current_idx += 1
        return index

    @contextlib.contextmanager
    def ctx(self, sample_idx: int | None = None) -> Iterator[int]:
        index = self.get_next() if sample_idx is None else sample_idx
        previous = hook_context.sample_index
        hook_context.sample_index = index
        self.actives += 1
        try:
            yield index
        finally:
            self.actives -= 1
            hook_context.sample_index = previous

    def iter_ctx(
        self, it: Iterable[Any], sample_idx: int | None = None
    ) -> Generator[tuple[int, Any], None, None]:
        """Each element of ``it`` with the sample index current while it is produced."""
        iterator = iter(it)
        while True:
            with self.ctx(sample_idx) as index:
                try:
                    value = next(iterator)
                except StopIteration:
                    return
            yield index, value

    def save_state(self) -> int:
        return self.current_idx

    def restore_state(self, state: int | None) -> None:
        self.current_idx = 0 if state is None else int(state)
