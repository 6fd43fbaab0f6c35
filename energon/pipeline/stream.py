"""One logical stream: its stage chain, its output counter and its snapshot."""

from __future__ import annotations

from typing import Any

from energon.errors import ErrorPolicy, log_exception
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stages import (
    BatchStage,
    GroupBatchStage,
    LoadStage,
    MapStage,
    PackStage,
    PointerSource,
    ShuffleBuffer,
)
from energon.plan.mixing import QuotaSchedule, WeightedSchedule
from energon.plan.reader import SliceReader
from energon.plan.rng import CounterRng, stable_seed
from energon.plan.sharding import slice_bounds, stream_ranges
from energon.task_encoder.base import hook_context
from energon.task_encoder.cooking import select_cooker

DEFAULT_PARALLEL_SLICES = 16


class Stream:
    """Emits the items (micro-batches) of one logical stream in order; snapshot after each one."""

    def __init__(
        self, stream_id: int, spec: PipelineSpec, stages: list[Any], max_items: int | None
    ):
        self.stream_id = stream_id
        self.spec = spec
        self.stages = stages
        self.max_items = max_items
        self.emitted = 0

    @property
    def sink(self) -> Any:
        return self.stages[-1]

    def next_item(self) -> Any:
        """The next item; ``StopIteration`` at the end of a finite (validation) pass."""
        if self.max_items is not None and self.emitted >= self.max_items:
            raise StopIteration
        hook_context.batch_index = self.batch_index(self.emitted)
        hook_context.seed = self.spec.seed
        value, key = next(self.sink)
        self.emitted += 1
        return value, key

    def snapshot(self) -> dict[str, Any]:
        return {"emitted": self.emitted, "stages": [stage.state() for stage in self.stages]}

    def restore(self, snapshot: dict[str, Any]) -> None:
        hook_context.seed = self.spec.seed
        for stage, state in zip(self.stages, snapshot["stages"]):
            stage.restore(state)
        self.emitted = int(snapshot["emitted"])

    def batch_index(self, item_index: int) -> int:
        """``current_batch_index`` of this stream's ``item_index``-th item (its global position)."""
        return item_index * self.spec.num_streams + self.stream_id

    def rebuild(self, key: tuple, item_index: int) -> Any:
        """Regenerate this stream's ``item_index``-th item from its key, under the batch index
        it was first made with."""
        hook_context.seed = self.spec.seed
        hook_context.batch_index = self.batch_index(item_index)
        return self.sink.rebuild(key)


def build_stream(spec: PipelineSpec, stream_id: int) -> Stream:
    """The stage chain of ``stream_id``: pointers -> shuffle -> load (+cook) -> encode -> pack ->
    batch or group -> encode batch. Only hooks the task encoder overrides become stages."""
    te = spec.task_encoder
    handler = spec.error_handler or log_exception

    def policy(name: str, fn: Any = None) -> ErrorPolicy:
        tolerance = getattr(fn, "__failure_tolerance__", spec.failure_tolerance)
        return ErrorPolicy(name, handler, tolerance)

    def hook_stage(hook: str) -> None:
        fn = getattr(te, hook)
        stages.append(
            MapStage(
                stages[-1],
                fn,
                hook,
                policy(hook, fn),
                stream=stream_id,
                num_streams=spec.num_streams,
            )
        )

    pointers, padding = _pointer_source(spec, stream_id)
    stages: list[Any] = [pointers]
    if spec.training and spec.shuffle_buffer_size and spec.shuffle_buffer_size > 1:
        rng = CounterRng(stable_seed(spec.seed, "shuffle-buffer", stream_id))
        stages.append(ShuffleBuffer(stages[-1], spec.shuffle_buffer_size, rng))
    cooks = [_cook_function(spec, source) for source in spec.sources]
    stages.append(
        LoadStage(
            stages[-1],
            spec.leaves,
            spec.decoder,
            policy("load_sample"),
            cooks,
            epoch_of=pointers.epoch_of,
        )
    )
    if te.is_active("preencode_sample"):
        if _user_defined(te, "encode_sample"):
            raise ValueError(
                "define either encode_sample or preencode_sample/postencode_sample, not both"
            )
        hook_stage("preencode_sample")
    elif te.is_active("encode_sample"):
        hook_stage("encode_sample")
    postencode = te.postencode_sample if te.is_active("postencode_sample") else None
    if spec.packing_buffer_size:
        stages.append(
            PackStage(
                stages[-1],
                spec.packing_buffer_size,
                te.select_samples_to_pack,
                te.pack_selected_samples,
                postencode,
                policy("pack_selected_samples", te.pack_selected_samples),
                stream=stream_id,
                num_streams=spec.num_streams,
            )
        )
    elif postencode is not None:
        hook_stage("postencode_sample")
    if te.is_active("batch_group_criterion"):
        stages.append(
            GroupBatchStage(
                stages[-1],
                te.batch_group_criterion,
                te.batch,
                policy("batch", te.batch),
                batch_size=spec.batch_size,
                drop_last=spec.batch_drop_last,
                max_wait=spec.group_max_wait,
                stream=stream_id,
                num_streams=spec.num_streams,
            )
        )
    elif spec.batch_size is not None:
        sizes = _batch_sizes(spec, stream_id, padding)
        stages.append(
            BatchStage(
                stages[-1],
                sizes,
                te.batch,
                policy("batch", te.batch),
                drop_last=spec.batch_drop_last,
                stream=stream_id,
                num_streams=spec.num_streams,
            )
        )
    if (spec.batch_size is not None or te.is_active("batch_group_criterion")) and te.is_active(
        "encode_batch"
    ):
        hook_stage("encode_batch")
    max_items = None
    if not spec.training and not spec.repeat and not spec.data_dependent_counts:
        max_items = spec.stream_val_batches(stream_id)
    return Stream(stream_id, spec, stages, max_items)


def _user_defined(te: Any, hook: str) -> bool:
    """Overridden by the user (not just by DefaultTaskEncoder's identity version)."""
    from energon.task_encoder.base import DefaultTaskEncoder

    return te.is_active(hook) and getattr(type(te), hook) is not getattr(DefaultTaskEncoder, hook)


def _cook_function(spec: PipelineSpec, source: Any) -> Any:
    """For crude sources with a matching cooker: sample -> cooked sample (aux stores attached)."""
    if getattr(source.leaf.builder, "kind", None) != "crude":
        if source.aux:
            raise ValueError(
                f"{source.leaf.root}: aux data sources are only allowed for crude datasets"
            )
        return None
    selected = select_cooker(spec.task_encoder, source.leaf.subflavors)
    if selected is None:
        return None
    from energon.source.file_store import DecodeFileStore, PrimaryFileStore, open_file_store

    decoder = spec.decoder

    def wrap(store: Any) -> Any:
        return DecodeFileStore(store, decoder=decoder) if decoder is not None else store

    stores = {name: wrap(open_file_store(ref)) for name, ref in source.aux.items()}
    primary = None
    if selected.need_primary:
        from energon.source.file_store import WebdatasetFileStore

        try:
            primary = wrap(WebdatasetFileStore(source.leaf.root))
        except Exception as e:
            raise SystemError(f"cannot open the primary store of {source.leaf.root}: {e}") from e

    def cook(sample: Any) -> Any:
        extra = dict(stores)
        if primary is not None:
            extra["primary"] = PrimaryFileStore(primary, sample["__key__"])
        return spec.task_encoder.cook_crude_sample(sample, selected, extra)

    return cook


def _pointer_source(spec: PipelineSpec, stream_id: int) -> tuple[PointerSource, int]:
    """One reader per source over this stream's range, mixed as the spec's mode says.

    Validation streams that are short of the common batch count get padding (see docs/ordering.md).
    """
    readers = []
    stream_total = 0
    mixing = spec.training and spec.mode in ("weight", "repetitions")
    for i, (source, rotation) in enumerate(zip(spec.sources, spec.source_rotations())):
        start, end = stream_ranges(source.start, source.end, spec.num_streams, rotation)[stream_id]
        stream_total += end - start
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
                hint=source.leaf.prefetch if getattr(source.leaf, "remote", False) else None,
            )
        )
    schedule = None
    if spec.training and spec.mode == "weight":
        weights = [s.weight if r.num_samples else 0.0 for s, r in zip(spec.sources, readers)]
        phase_rng = CounterRng(stable_seed(spec.seed, "blend-phase", stream_id))
        schedule = WeightedSchedule(weights, phases=[phase_rng.random() for _ in weights])
    elif spec.training and spec.mode == "repetitions":
        schedule = QuotaSchedule([q[stream_id] for q in spec.source_stream_quotas()])
    padding = 0
    if (
        not spec.training
        and not spec.repeat
        and spec.even_ranks
        and not spec.batch_drop_last
        and not spec.data_dependent_counts
    ):
        padding = max(0, spec.val_batches_per_stream() - stream_total)
    if padding and readers:
        target = next((r for r in readers if r.num_samples), None)
        if target is None:
            target = readers[0]
            target.pad_index = spec.sources[0].start
        else:
            target.pad_index = int(target.bounds[0])
        target.padding = padding
    return PointerSource(readers, schedule, repeat=spec.repeat), padding


def _batch_sizes(spec: PipelineSpec, stream_id: int, padding: int):
    """Training: constant. Validation: full batches first, then smaller ones, so that every stream
    emits the same number of batches (see docs/ordering.md)."""
    bs = spec.batch_size
    if spec.training or spec.batch_drop_last or spec.data_dependent_counts or not spec.even_ranks:
        return lambda i: bs
    total = spec.stream_sample_counts()[stream_id] + padding
    batches = spec.val_batches_per_stream()
    if bs <= 1 or batches == 0:
        return lambda i: bs
    full = min(batches, (total - batches) // (bs - 1))

    def size(i: int) -> int:
        if i < full:
            return bs
        if i == full:
            return total - full * bs - (batches - 1 - full)
        return 1

    return size
