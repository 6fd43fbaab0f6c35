"""One logical stream: its stage chain, its output counter and its snapshot.

``build_stream`` puts the pointer stages (:mod:`energon.pipeline.pointers`) first and the stages
that read and transform data (:mod:`energon.pipeline.stages`) behind them. It is also where the plan
meets I/O: remote leaves get a :class:`PrefetchObserver` on their readers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from energon.decode.sample_decoder import SampleDecoder
from energon.errors import (
    ErrorBudget,
    ErrorPolicy,
    FatalSampleError,
    MetadatasetError,
    SampleException,
    StateError,
    log_exception,
)
from energon.pipeline import assembly
from energon.pipeline.error_account import ErrorAccount
from energon.pipeline.keys import Key, is_group, pointer_target, pointers_of
from energon.pipeline.packing import PackStage
from energon.pipeline.pointers import PointerSource, build_pointer_stages
from energon.pipeline.snapshot import (
    StreamSnapshot,
    emitted,
    error_state,
    make_snapshot,
    stage_states,
)
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Item, Stage, Value
from energon.pipeline.stages import (
    BatchStage,
    ConstantSize,
    GroupBatchStage,
    Hook,
    LoadStage,
    MapStage,
)
from energon.plan.reader import ReadObserver
from energon.samples.batch import Batch
from energon.source.file_store import (
    DecodeFileStore,
    FileStore,
    PrimaryFileStore,
    WebdatasetFileStore,
    open_file_store,
)
from energon.source.meta import SampleMeta, meta_reader
from energon.task_encoder.base import (
    DefaultTaskEncoder,
    TaskEncoder,
    decides_from_sample_meta,
    hook_context,
)
from energon.task_encoder.cooking import select_cooker

if TYPE_CHECKING:
    from energon.plan.sources import Source


class Stream(Stage):
    """Emits the items (micro-batches) of one logical stream in order; its state after each item is
    the stream's snapshot (:mod:`energon.pipeline.snapshot`), which includes its error account."""

    def __init__(
        self,
        stream_id: int,
        spec: PipelineSpec,
        stages: list[Stage],
        account: ErrorAccount | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.spec = spec
        self.stages = stages
        self.account = account
        self.emitted = 0
        first = stages[0] if stages else None
        # blend weights changed online start at an item boundary (see PointerSource)
        self._begin_item = (
            first.begin_item if isinstance(first, PointerSource) and first.item_clock else None
        )

    @property
    def sink(self) -> Stage:
        return self.stages[-1]

    def next(self) -> Item:
        """The next item; ``StopIteration`` at the end of a finite (validation) pass."""
        hook_context.batch_index = self.batch_index(self.emitted)
        hook_context.seed = self.spec.seed
        if self._begin_item is not None:
            self._begin_item(self.emitted)
        try:
            item = self.sink.next()
        except StopIteration:
            if self.account is not None:
                self.account.finish()
            raise
        self.emitted += 1
        return item

    def state(self) -> StreamSnapshot:
        errors = self.account.state() if self.account is not None else None
        return make_snapshot(self.emitted, [stage.state() for stage in self.stages], errors)

    def restore(self, state: StreamSnapshot) -> None:  # type: ignore[override]
        hook_context.seed = self.spec.seed
        if self.account is not None:
            self.account.restore(error_state(state))
        restore_stages(self.stages, state, self.stream_id)
        self.emitted = emitted(state)

    def batch_index(self, item_index: int) -> int:
        """``current_batch_index`` of this stream's ``item_index``-th item (its global position)."""
        return item_index * self.spec.num_streams + self.stream_id

    def rebuild(self, key: Key, item_index: int | None = None) -> Value:
        """Regenerate an item from its key; with ``item_index`` (this stream's ``item_index``-th
        item) under the batch index it was first made with."""
        if item_index is not None:
            hook_context.batch_index = self.batch_index(item_index)
        hook_context.seed = self.spec.seed
        return self.sink.rebuild(key)


def restore_stages(
    stages: list[Stage], state: StreamSnapshot, stream_id: int, *, complete: bool = True
) -> None:
    """Restore a stream's stages from its snapshot (``complete=False``: only the first ones, to
    check a state without reading data). A bad field is a ``StateError`` saying which stream and
    stage it belongs to."""
    where = f"streams[{stream_id}]"
    saved = stage_states(state)
    if not isinstance(saved, list) or (complete and len(saved) != len(stages)):
        raise StateError(
            f"loader state field {where + '.stages'!r} does not hold the states of this "
            f"stream's {len(stages)} stages (the state is damaged or from another pipeline)"
        )
    for i, stage in enumerate(stages):
        at = f"{where}.stages[{i}] ({type(stage).__name__})"
        if i >= len(saved):
            raise StateError(f"loader state field {at!r} is missing (the state is damaged)")
        try:
            stage.restore(saved[i])
        except StateError as e:
            raise StateError(f"{at}: {e}") from None
        except SampleException:
            raise  # a buffered sample that cannot be read: a data error, not a state error
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise StateError(f"{at}: damaged stage state ({type(e).__name__}: {e})") from e


class PrefetchObserver:
    """Forwards a reader's upcoming sample ranges to a remote leaf's prefetcher (a
    :class:`~energon.plan.reader.ReadObserver`)."""

    __slots__ = ("leaf",)

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf

    def will_read(self, first: int, end: int, later: bool) -> None:
        self.leaf.prefetch(first, end, later)


def prefetch_observers(spec: PipelineSpec) -> list[ReadObserver | None]:
    """One observer per source whose leaf lives in object storage (local reads need no hints)."""
    return [
        PrefetchObserver(source.leaf) if source.leaf.remote else None for source in spec.sources
    ]


def sample_meta_view(spec: PipelineSpec) -> Callable[[Value, Key], Any]:
    """What a hook marked ``@uses_sample_meta`` sees of an item: the :class:`SampleMeta` of the
    sample it was made from (a packed item: the list of its members')."""
    readers: dict[int, Any] = {}

    def meta(pointer: Key) -> SampleMeta:
        source, index = pointer_target(pointer)
        reader = readers.get(source)
        if reader is None:
            reader = readers[source] = meta_reader(spec.sources[source].leaf)
        return SampleMeta(reader, source, index)

    def view(value: Value, key: Key) -> Any:
        metas = [meta(p) for p in pointers_of(key)]
        return metas if is_group(key) else metas[0]

    return view


def _view_for(spec: PipelineSpec, hook: Any) -> Callable[[Value, Key], Any] | None:
    return sample_meta_view(spec) if decides_from_sample_meta(hook) else None


def build_stream(spec: PipelineSpec, stream_id: int) -> Stream:
    """The stage chain of ``stream_id``: one stage (the pointers: several) per part that
    :func:`energon.pipeline.assembly.stream_parts` lists, in its order."""
    chain = _Chain(spec, stream_id)
    identity_encode = chain.defer_images and _identity_encode(spec.task_encoder)
    for part in assembly.stream_parts(spec, identity_encode=identity_encode):
        chain.add(part)
    return Stream(stream_id, spec, chain.stages, chain.account)


class _Chain:
    """A stream's stages, built part by part: one method per kind of part."""

    def __init__(self, spec: PipelineSpec, stream_id: int) -> None:
        self.spec = spec
        self.stream_id = stream_id
        self.handler = spec.error_handler or log_exception
        self.cooks = [cook_function(spec, source) for source in spec.sources]
        self.defer_images = _only_library_batching_sees_samples(spec, self.cooks)
        self.stages: list[Stage] = []
        self.account: ErrorAccount | None = None

    def add(self, part: assembly.Part) -> None:
        build = getattr(self, f"_{part.kind}", None)
        if build is None:
            raise ValueError(f"build_stream cannot build a {part.kind!r} part")
        self.stages.extend(build(part))

    def policy(self, name: str, fn: Callable[..., Any] | None = None) -> ErrorPolicy:
        tolerance = getattr(fn, "__failure_tolerance__", self.spec.failure_tolerance)
        return ErrorPolicy(name, self.handler, tolerance, self.account)

    def _pointers(self, part: assembly.Part) -> list[Stage]:
        spec = self.spec
        stages = build_pointer_stages(spec, self.stream_id, prefetch_observers(spec))
        pointers: PointerSource = stages[0]  # type: ignore[assignment]
        self.account = ErrorAccount(
            spec.error_budget or ErrorBudget(),
            spec.leaves,
            lambda source: pointers.readers[source].yielded,
        )
        return stages

    def _load(self, part: assembly.Part) -> list[Stage]:
        spec = self.spec
        assert self.account is not None, "loading needs the pointers before it"
        load = LoadStage(
            self.stages[-1],
            spec.leaves,
            spec.decoder,
            self.policy("load_sample"),
            self.cooks,
            epoch_of=self.stages[0].epoch_of,
            defer_images=self.defer_images,
            decode_threads=spec.decode_threads,
            reads=self.account.reads_now,
        )
        return [load]

    def _sample(self, part: assembly.Part) -> list[Stage]:
        assert part.fn is not None
        stage = MapStage(
            self.stages[-1],
            part.fn,
            part.name,
            self.policy(part.name, part.fn),
            stream=self.stream_id,
            num_streams=self.spec.num_streams,
            identity=part.identity,
        )
        return [stage]

    _batch_step = _sample  # a hook on each batch is built like one on each sample

    def _pack(self, part: assembly.Part) -> list[Stage]:
        spec, te = self.spec, self.spec.task_encoder
        postencode = te.postencode_sample if te.is_active("postencode_sample") else None
        pack = PackStage(
            self.stages[-1],
            spec.packing_buffer_size,
            te.select_samples_to_pack,
            te.pack_selected_samples,
            postencode,
            self.policy("pack_selected_samples", te.pack_selected_samples),
            stream=self.stream_id,
            num_streams=spec.num_streams,
            view=_view_for(spec, te.select_samples_to_pack),
            whole_sources=[source.pack_whole for source in spec.sources],
        )
        return [pack]

    def _group(self, part: assembly.Part) -> list[Stage]:
        spec, te = self.spec, self.spec.task_encoder
        group = GroupBatchStage(
            self.stages[-1],
            te.batch_group_criterion,
            te.batch,
            self.policy("batch", te.batch),
            batch_size=spec.batch_size,
            drop_last=spec.batch_drop_last,
            max_wait=spec.group_max_wait,
            stream=self.stream_id,
            num_streams=spec.num_streams,
            view=_view_for(spec, te.batch_group_criterion),
        )
        return [group]

    def _batch(self, part: assembly.Part) -> list[Stage]:
        spec, te = self.spec, self.spec.task_encoder
        batch = BatchStage(
            self.stages[-1],
            _batch_sizes(spec, self.stream_id),
            te.batch,
            self.policy("batch", te.batch),
            drop_last=spec.batch_drop_last,
            stream=self.stream_id,
            num_streams=spec.num_streams,
            deferred_images=self.defer_images,
        )
        return [batch]

    # A balanced stream, walked without the balanced executor (the ledger, the cursor editors):
    # each micro-batch is its position's pool of pointers, which the executor composes into
    # the ranks' shares.
    _balanced = _batch


def _only_library_batching_sees_samples(spec: PipelineSpec, cooks: list[Any]) -> bool:
    """Whether loaded samples go unchanged into the library's own batching and nowhere else:
    then float images may stay uint8 until their batch is made (energon.decode.pending). Any
    code of the user's between decoding and batching (a decoder subclass, a ``sample_loader``,
    joiner or sample type of their own, cooking, encoding, packing, grouping, a ``batch`` or a
    batch type's ``from_samples``) keeps the ordinary decode."""
    te = spec.task_encoder
    library_batch = (TaskEncoder.batch, DefaultTaskEncoder.batch)
    raw_batch_type = getattr(te, "raw_batch_type", None)
    return (
        spec.batch_size is not None
        and type(spec.decoder) is SampleDecoder
        and all(_built_by_library(source) for source in spec.sources)
        and not spec.packing_buffer_size
        and all(cook is None for cook in cooks)
        and _library_encode(te)
        and getattr(type(te), "batch", None) in library_batch
        and not te.is_active("preencode_sample")
        and not te.is_active("postencode_sample")
        and not te.is_active("batch_group_criterion")
        and (
            raw_batch_type is None
            or getattr(raw_batch_type, "from_samples", None) is None
            or raw_batch_type.from_samples.__func__ is Batch.from_samples.__func__
        )
    )


def _library_encode(te: TaskEncoder) -> bool:
    """Whether ``encode_sample`` is the library's (no code of the user's)."""
    library_encode = (TaskEncoder.encode_sample, DefaultTaskEncoder.encode_sample)
    return getattr(type(te), "encode_sample", None) in library_encode


def _identity_encode(te: TaskEncoder) -> bool:
    """Whether ``encode_sample`` is the library's and returns its sample unchanged."""
    return _library_encode(te) and getattr(te, "encoded_sample_type", None) is None


def _built_by_library(source: Source) -> bool:
    """Samples made by a field map into one of energon's sample types (no user code runs)."""
    builder = getattr(source.leaf, "builder", None)
    sample_type = getattr(builder, "sample_type", None)
    return (
        getattr(builder, "kind", None) == "field_map"
        and sample_type is not None
        and sample_type.__module__.startswith("energon.samples.")
    )


def cook_function(spec: PipelineSpec, source: Source) -> Hook | None:
    """For crude sources with a matching cooker: sample -> cooked sample (aux stores attached)."""
    if source.leaf.builder.kind != "crude":
        if source.aux:
            raise MetadatasetError(
                f"{source.leaf.root}: aux data sources are only allowed for crude datasets"
            )
        return None
    selected = select_cooker(spec.task_encoder, source.leaf.subflavors)
    if selected is None:
        return None
    decoder = spec.decoder

    def wrap(store: FileStore) -> FileStore:
        return DecodeFileStore(store, decoder=decoder) if decoder is not None else store

    stores = {name: wrap(open_file_store(ref)) for name, ref in source.aux.items()}
    primary = None
    if selected.need_primary:
        # Opened here, at build time, outside any error policy: a dataset whose primary store
        # cannot be opened (DatasetNotPreparedError, RemoteError, ...) stops the run.
        primary = wrap(WebdatasetFileStore(source.leaf.root))

    def cook(sample: dict[str, Any]) -> Value:
        extra = dict(stores)
        if primary is not None:
            extra["primary"] = PrimaryFileStore(primary, sample["__key__"])
        if selected.need_cache:
            if hook_context.cache_pool is None:
                raise FatalSampleError(
                    "this cooker needs a cache pool (@cooker(need_cache=True)): pass "
                    "cache_pool=... to get_loader / get_savable_loader"
                )
            extra["cache"] = hook_context.cache_pool
        return spec.task_encoder.cook_crude_sample(sample, selected, extra)

    return cook


def _batch_sizes(spec: PipelineSpec, stream_id: int) -> Callable[[int], int]:
    """Training: constant. Planned validation: full batches first, then smaller ones, so that every
    stream with enough samples emits the common number of batches (see docs/ordering.md)."""
    bs = spec.batch_size
    if not spec.planned_validation or spec.batch_drop_last:
        return ConstantSize(bs)
    total = spec.stream_sample_count(stream_id)
    batches = spec.val_batches_per_stream()
    if bs <= 1:
        return ConstantSize(bs)
    full = max(0, min(batches, (total - batches) // (bs - 1)))

    def size(i: int) -> int:
        if i < full:
            return bs
        if i == full and i < batches:
            return max(1, total - full * bs - (batches - 1 - full))
        return 1

    return size
