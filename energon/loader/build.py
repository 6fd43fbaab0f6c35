"""Building datasets: ``get_train_dataset``, ``get_val_dataset`` and ``get_val_datasets``.

A path (dataset, JSONL file, token prefix, metadataset YAML, ``Blender``) is resolved into sources,
checked, and turned into a :class:`PipelineSpec` that any worker can execute.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from energon import arguments, epath
from energon.balance.config import Balance
from energon.decode.threads import check_decode_threads, default_decode_threads
from energon.errors import ArgumentError, ArgumentTypeError, DatasetNotFoundError, ErrorBudget
from energon.loader.savable_dataset import SavableDataset
from energon.metadataset.resolve import resolve_dataset
from energon.pipeline.blend_by import BlendBy
from energon.pipeline.spec import PipelineSpec, check_blend_streams
from energon.source.meta import SampleMeta
from energon.task_encoder import DefaultTaskEncoder, TaskEncoder
from energon.task_encoder.composition import composition
from energon.worker import WorkerConfig

# The reference's deprecated keywords of its dataset factories: the only ones ``**kwargs`` takes.
_DECODE_KWARGS = ("auto_decode", "image_decode", "av_decode", "video_decode_audio")
_REFERENCE_KWARGS = (*_DECODE_KWARGS, "handler")

BlendByArgument = str | Callable[[SampleMeta], float] | BlendBy | None


@dataclasses.dataclass(frozen=True)
class DatasetOptions:
    """energon's keywords of :func:`get_train_dataset`, :func:`get_val_dataset` and
    :func:`get_val_datasets` beyond the reference's (all optional), carried as one value into
    the build:

    - ``num_streams``: logical streams (default ``world_size * max(1, num_workers)``); fixing it
      keeps the order when the number of ranks or workers changes (docs/ordering.md).
    - ``parallel_shard_iters``: slices a stream reads at once (default 1).
    - ``subflavors``: a dict merged into every sample's ``__subflavors__``.
    - ``dataset_config`` / ``split_config``: file names in ``.nv-meta`` other than ``dataset.yaml``
      / ``split.yaml``.
    - ``token_config``: the GPT settings of a Megatron token prefix (docs/megatron.md).
    - ``global_batch_size``: samples per training step: converts blend weight schedules given in
      steps, and ``loader.set_blend_weights(from_step=...)``.
    - ``blend_by``: what a weight blend's weights share: ``"samples"`` (default), ``"tokens"``,
      ``"bytes"`` or a function of a :class:`~energon.source.meta.SampleMeta`
      (docs/metadatasets.md; also the metadataset key ``blend_by``).
    - ``balance``: an :class:`energon.balance.Balance`: compute-balanced steps across ranks
      (docs/balance.md).
    - ``error_budget``: an :class:`~energon.errors.ErrorBudget` (default from
      ``ENERGON_ERROR_BUDGET``).
    - ``decode_threads``: threads that decode a batch's JPEGs in each loading process (default: up
      to 4 with ``num_workers=0``, else 1; ``ENERGON_DECODE_THREADS``); batches are the same for
      any value (see :mod:`energon.decode.threads`).
    - ``group_max_wait``: samples after which a ``batch_group_criterion`` bucket is flushed as a
      smaller batch (docs/task-encoders.md).
    - ``sample_type``: the sample class every leaf must yield (checked before loading).
    - ``even_ranks``: validation gives every rank the same number of batches (default True;
      False: the reference's behaviour, every stream's natural batches).
    """

    num_streams: int | None = None
    parallel_shard_iters: int | None = None
    subflavors: dict[str, Any] | None = None
    dataset_config: str | None = None
    split_config: str | None = None
    token_config: Mapping[str, Any] | None = None
    global_batch_size: int | None = None
    blend_by: BlendByArgument = None
    balance: Balance | None = None
    error_budget: ErrorBudget | None = None
    decode_threads: int | None = None
    group_max_wait: int | None = None
    sample_type: type | None = None
    even_ranks: bool = True


#: The default ``task_encoder`` of the dataset functions (the reference's signature shows one shared
#: ``DefaultTaskEncoder()``); each call that gets it builds its own, so nothing ever changes it.
DEFAULT_TASK_ENCODER = DefaultTaskEncoder()


def _apply_decode_kwargs(task_encoder: TaskEncoder, kwargs: dict[str, Any]) -> None:
    """The deprecated decoding kwargs become ``task_encoder.decoder``."""
    given = {k: kwargs.pop(k) for k in _DECODE_KWARGS if k in kwargs}
    if "handler" in kwargs:
        kwargs.pop("handler")
        warnings.warn(
            "'handler' is deprecated and ignored; set WorkerConfig.global_error_handler instead",
            FutureWarning,
            stacklevel=3,
        )
    if not given:
        return
    warnings.warn(
        f"{sorted(given)} are deprecated; set task_encoder.decoder = SampleDecoder(...) instead",
        FutureWarning,
        stacklevel=3,
    )
    if given.pop("auto_decode", True) is False:
        task_encoder.decoder = None
        return
    from energon.decode import SampleDecoder

    task_encoder.decoder = SampleDecoder(**given)


def _build(
    path: Any,
    *,
    training: bool,
    split_part: str,
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool,
    packing_buffer_size: int | None,
    shuffle_buffer_size: int | None,
    max_samples_per_sequence: int | None,
    virtual_epoch_length: int,
    shuffle_over_epochs_multiplier: int | None,
    task_encoder: TaskEncoder | None,
    repeat: bool,
    limit: int | None,
    options: DatasetOptions,
    reference_kwargs: dict[str, Any],
) -> SavableDataset:
    _check_arguments(
        path,
        split_part=split_part,
        worker_config=worker_config,
        batch_size=batch_size,
        packing_buffer_size=packing_buffer_size,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        virtual_epoch_length=virtual_epoch_length,
        shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier,
        task_encoder=task_encoder,
        limit=limit,
        options=options,
    )
    if task_encoder is None or task_encoder is DEFAULT_TASK_ENCODER:
        task_encoder = DefaultTaskEncoder()  # its own: the decode keywords below set its decoder
    _apply_decode_kwargs(task_encoder, dict(reference_kwargs))
    balance = _check_balance(options.balance, batch_size, packing_buffer_size, task_encoder)
    resolved = resolve_dataset(
        path,
        split_part=split_part,
        training=training,
        subflavors=options.subflavors,
        shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier if training else None,
        dataset_config=options.dataset_config,
        split_config=options.split_config,
        token_config=options.token_config,
        global_batch_size=options.global_batch_size,
    )
    blend_by = _combined_blend_by(
        _blend_by(options.blend_by), resolved.blend_by, resolved.mode, training
    )
    _check_resolved(resolved, options, training=training, repeat=repeat)
    spec = _spec_of(
        resolved,
        options,
        training=training,
        worker_config=worker_config,
        task_encoder=task_encoder,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        packing_buffer_size=packing_buffer_size,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        virtual_epoch_length=virtual_epoch_length,
        repeat=repeat,
        limit=limit,
        balance=balance,
        blend_by=blend_by,
    )
    _check_streams_have_samples(spec)
    _check_blend_streams(spec)
    if task_encoder.composes_pipeline():  # Megatron-Energon's build_* hooks, overridden
        return composition().compose(task_encoder, spec, worker_config)
    return SavableDataset.from_spec(spec, worker_config)


def _spec_of(
    resolved: Any,
    options: DatasetOptions,
    *,
    training: bool,
    worker_config: WorkerConfig,
    task_encoder: TaskEncoder,
    batch_size: int | None,
    batch_drop_last: bool,
    packing_buffer_size: int | None,
    shuffle_buffer_size: int | None,
    max_samples_per_sequence: int | None,
    virtual_epoch_length: int,
    repeat: bool,
    limit: int | None,
    balance: Balance | None,
    blend_by: BlendBy,
) -> PipelineSpec:
    """Everything a worker needs to run the streams (picklable, no open files)."""
    return PipelineSpec(
        sources=resolved.sources,
        mode=resolved.mode,
        training=training,
        seed=worker_config.seed_offset,
        num_streams=options.num_streams or worker_config.default_num_streams,
        num_streams_fixed=options.num_streams is not None,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        shuffle_buffer_size=shuffle_buffer_size if training else None,
        max_samples_per_sequence=max_samples_per_sequence if training else None,
        parallel_shard_iters=options.parallel_shard_iters,
        repeat=repeat if training else False,
        task_encoder=task_encoder,
        decoder=task_encoder.decoder,
        error_handler=worker_config.global_error_handler,
        failure_tolerance=getattr(task_encoder, "__default_failure_tolerance__", 100),
        error_budget=options.error_budget or ErrorBudget.from_env(),
        virtual_epoch_length=virtual_epoch_length if training else 0,
        limit=limit,
        packing_buffer_size=packing_buffer_size or None,
        group_max_wait=options.group_max_wait,
        even_ranks=bool(options.even_ranks) and worker_config.world_size > 1,
        mixture=resolved.mixture,
        global_batch_size=options.global_batch_size or resolved.global_batch_size,
        balance=balance,
        decode_threads=_decode_threads(options.decode_threads, worker_config),
        blend_by=blend_by,
    )


def _decode_threads(given: int | None, worker_config: WorkerConfig) -> int:
    if given is None:
        return default_decode_threads(worker_config.num_workers)
    return check_decode_threads(given)


def _check_resolved(
    resolved: Any, options: DatasetOptions, *, training: bool, repeat: bool
) -> None:
    """What can only be checked once the path is resolved into sources."""
    _check_sample_type(resolved.sources, options.sample_type)
    if training and resolved.mode == "weight" and not repeat:
        raise ArgumentError(
            "repeat", "a weighted blend is infinite: use repeat=True (or blend_epochized)"
        )
    if training and options.parallel_shard_iters not in (None, 1):
        if any(s.shuffle_over_epochs is None for s in resolved.sources):
            raise ArgumentError(
                "parallel_shard_iters",
                "unshuffled training (shuffle_over_epochs_multiplier=None) reads one slice at a time",
            )


def _blend_by(value: Any) -> BlendBy | None:
    """The ``blend_by=`` argument (None: as the configuration says)."""
    return None if value is None else BlendBy.of(value)


def _combined_blend_by(
    given: BlendBy | None, configured: BlendBy, mode: str, training: bool
) -> BlendBy:
    """What a weight blend's weights share: the argument or the metadataset's ``blend_by`` (they
    must agree where both are set). Only a training weight blend has shares to size; elsewhere
    (one dataset, validation) every sample is read as it comes and the size changes nothing."""
    if given is not None and configured.by_size and given.name != configured.name:
        raise ArgumentError(
            "blend_by",
            f"{given.name!r}, but the metadataset's blend says blend_by "
            f"{configured.name!r}: set it in one place",
        )
    chosen = given if given is not None and given.by_size else configured
    if chosen.by_size and training and mode == "repetitions":
        raise ArgumentError(
            "blend_by",
            "sizes the shares of a weight blend ('blend'); an epochized blend "
            "('blend_epochized') reads fixed sample counts per pass",
        )
    return chosen if training and mode == "weight" else BlendBy()


def _check_arguments(
    path: Any,
    *,
    split_part: Any,
    worker_config: Any,
    task_encoder: Any,
    packing_buffer_size: Any,
    options: DatasetOptions,
    **numbers: Any,
) -> None:
    """Bad arguments are an :class:`~energon.errors.ArgumentError` naming them, before any work."""
    arguments.instance(worker_config, "worker_config", WorkerConfig, "an energon.WorkerConfig")
    arguments.instance(split_part, "split_part", str, "a split name such as 'train'")
    if task_encoder is not None:
        arguments.instance(task_encoder, "task_encoder", TaskEncoder, "a TaskEncoder or None")
    lows = {
        "batch_size": 1,
        "packing_buffer_size": 0,
        "shuffle_buffer_size": 0,
        "max_samples_per_sequence": 1,
        "virtual_epoch_length": 0,
        "limit": 0,
    }
    for name, low in lows.items():
        value = packing_buffer_size if name == "packing_buffer_size" else numbers[name]
        arguments.integer(value, name, low=low, none=True)
    multiplier = numbers["shuffle_over_epochs_multiplier"]
    if arguments.integer(multiplier, "shuffle_over_epochs_multiplier", low=-1, none=True) == 0:
        raise ArgumentError(
            "shuffle_over_epochs_multiplier", "expected -1, None or an integer >= 1, got 0"
        )
    for name in ("num_streams", "parallel_shard_iters", "group_max_wait", "global_batch_size"):
        arguments.integer(getattr(options, name), name, low=1, none=True)
    if packing_buffer_size and not (
        task_encoder is not None
        and task_encoder.is_active("select_samples_to_pack")
        and task_encoder.is_active("pack_selected_samples")
    ):
        raise ArgumentError(
            "packing_buffer_size",
            "needs a task encoder with select_samples_to_pack and pack_selected_samples",
        )
    _check_path(path)


def _check_path(path: Any) -> None:
    """A local path must exist (as itself, or as a token prefix's ``.idx``)."""
    if not isinstance(path, str | os.PathLike):
        return  # a Blender, a metadataset object, ...: resolved and checked where it is opened
    text = os.fspath(path)
    if epath.is_remote(text) or text.startswith("file://"):
        return
    if not (os.path.exists(text) or os.path.exists(text + ".idx")):
        raise DatasetNotFoundError(
            f"path: {text} does not exist (expected a prepared dataset folder, a metadataset "
            ".yaml, a .jsonl file or a Megatron token prefix)"
        )


def _check_balance(
    balance: Any,
    batch_size: int | None,
    packing_buffer_size: int | None,
    task_encoder: TaskEncoder,
) -> Any:
    """``balance=`` (an :class:`energon.balance.Balance`): with a batch size (the samples per rank
    and step on average), without the per-stream packing and grouping it replaces. Validation
    too: every rank takes part in every step, so the ranks stay even by construction."""
    if balance is None:
        return None

    if not isinstance(balance, Balance):
        raise ArgumentTypeError(
            "balance", f"expected an energon.balance.Balance, got {type(balance).__name__}"
        )
    if not batch_size:
        raise ArgumentError("balance", "needs batch_size (samples per rank and step, on average)")
    if packing_buffer_size or task_encoder.is_active("batch_group_criterion"):
        raise ArgumentError(
            "balance",
            "packs and groups by itself (Balance.max_length, Balance.group): do not "
            "combine it with packing_buffer_size or batch_group_criterion",
        )
    return balance


def _check_sample_type(sources: list[Any], sample_type: type | None) -> None:
    if sample_type is None:
        return
    for source in sources:
        st = source.leaf.builder.sample_type
        if st is not None and not issubclass(st, sample_type):
            raise ArgumentTypeError(
                "sample_type",
                f"{source.leaf.root} yields {st.__name__}, not {sample_type.__name__}",
            )


def _check_streams_have_samples(spec: PipelineSpec) -> None:
    if not spec.training or not spec.repeat:
        return
    counts = spec.stream_sample_counts()
    if min(counts) == 0:
        raise ArgumentError(
            "num_streams",
            f"the dataset has {sum(counts)} samples, fewer than the {spec.num_streams} logical "
            "streams (world_size x num_workers): some streams would have nothing to read. Use fewer "
            "workers or pass num_streams=...",
        )


def _check_blend_streams(spec: PipelineSpec) -> None:
    """Every stream of a scheduled blend must have a non-empty source with weight at every time
    (a dataset with fewer samples than logical streams is absent from some streams)."""
    if spec.mixture is None or spec.mode != "weight" or not spec.training:
        return
    check_blend_streams(spec, spec.mixture, "the weight schedules")


@arguments.known_keywords(*_REFERENCE_KWARGS)
def get_train_dataset(
    path: Any,
    *,
    split_part: str = "train",
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    shuffle_buffer_size: int | None,
    max_samples_per_sequence: int | None,
    virtual_epoch_length: int = 0,
    shuffle_over_epochs_multiplier: int | None = 1,
    task_encoder: TaskEncoder | None = DEFAULT_TASK_ENCODER,
    repeat: bool = True,
    num_streams: int | None = None,
    parallel_shard_iters: int | None = None,
    subflavors: dict[str, Any] | None = None,
    dataset_config: str | None = None,
    split_config: str | None = None,
    token_config: Mapping[str, Any] | None = None,
    global_batch_size: int | None = None,
    blend_by: BlendByArgument = None,
    balance: Balance | None = None,
    error_budget: ErrorBudget | None = None,
    decode_threads: int | None = None,
    group_max_wait: int | None = None,
    sample_type: type | None = None,
    even_ranks: bool = True,
    **kwargs: Any,
) -> SavableDataset:
    """An infinite (``repeat=True``), reshuffled-every-epoch training dataset.

    ``batch_size``, ``shuffle_buffer_size`` and ``max_samples_per_sequence`` must be given (``None`` is
    allowed) so that the trade-off between randomness and read locality is a conscious choice.

    energon's own options (the keywords after ``repeat``, all optional) are documented on
    :class:`DatasetOptions`. The reference's deprecated decoding keywords (``auto_decode``,
    ``image_decode``, ``av_decode``, ``video_decode_audio``, ``handler``) still work through
    ``**kwargs``, with a ``FutureWarning``; any other keyword raises, naming the closest valid one.
    """
    options = DatasetOptions(
        num_streams=num_streams,
        parallel_shard_iters=parallel_shard_iters,
        subflavors=subflavors,
        dataset_config=dataset_config,
        split_config=split_config,
        token_config=token_config,
        global_batch_size=global_batch_size,
        blend_by=blend_by,
        balance=balance,
        error_budget=error_budget,
        decode_threads=decode_threads,
        group_max_wait=group_max_wait,
        sample_type=sample_type,
        even_ranks=even_ranks,
    )
    return _build(
        path,
        training=True,
        split_part=split_part,
        worker_config=worker_config,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        packing_buffer_size=packing_buffer_size,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        virtual_epoch_length=virtual_epoch_length,
        shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier,
        task_encoder=task_encoder,
        repeat=repeat,
        limit=None,
        options=options,
        reference_kwargs=kwargs,
    )


@arguments.known_keywords(*_REFERENCE_KWARGS)
def get_val_dataset(
    path: Any,
    *,
    split_part: str = "val",
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    limit: int | None = None,
    task_encoder: TaskEncoder | None = DEFAULT_TASK_ENCODER,
    num_streams: int | None = None,
    parallel_shard_iters: int | None = None,
    subflavors: dict[str, Any] | None = None,
    dataset_config: str | None = None,
    split_config: str | None = None,
    token_config: Mapping[str, Any] | None = None,
    global_batch_size: int | None = None,
    blend_by: BlendByArgument = None,
    balance: Balance | None = None,
    error_budget: ErrorBudget | None = None,
    decode_threads: int | None = None,
    group_max_wait: int | None = None,
    sample_type: type | None = None,
    even_ranks: bool = True,
    **kwargs: Any,
) -> SavableDataset:
    """One deterministic pass over the split: every sample exactly once, the same batches every
    pass, and the same number of batches on every rank (see docs/ordering.md); ``limit`` caps the
    samples read. energon's options are :func:`get_train_dataset`'s."""
    options = DatasetOptions(
        num_streams=num_streams,
        parallel_shard_iters=parallel_shard_iters,
        subflavors=subflavors,
        dataset_config=dataset_config,
        split_config=split_config,
        token_config=token_config,
        global_batch_size=global_batch_size,
        blend_by=blend_by,
        balance=balance,
        error_budget=error_budget,
        decode_threads=decode_threads,
        group_max_wait=group_max_wait,
        sample_type=sample_type,
        even_ranks=even_ranks,
    )
    return _build(
        path,
        training=False,
        split_part=split_part,
        worker_config=worker_config,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        packing_buffer_size=packing_buffer_size,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        virtual_epoch_length=0,
        shuffle_over_epochs_multiplier=None,
        task_encoder=task_encoder,
        repeat=False,
        limit=limit,
        options=options,
        reference_kwargs=kwargs,
    )


@arguments.known_keywords(*_REFERENCE_KWARGS)
def get_val_datasets(
    path: Any,
    *,
    split_part: str = "val",
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    limit: int | None = None,
    task_encoder: TaskEncoder | None = DEFAULT_TASK_ENCODER,
    num_streams: int | None = None,
    parallel_shard_iters: int | None = None,
    subflavors: dict[str, Any] | None = None,
    dataset_config: str | None = None,
    split_config: str | None = None,
    token_config: Mapping[str, Any] | None = None,
    global_batch_size: int | None = None,
    blend_by: BlendByArgument = None,
    balance: Balance | None = None,
    error_budget: ErrorBudget | None = None,
    decode_threads: int | None = None,
    group_max_wait: int | None = None,
    sample_type: type | None = None,
    even_ranks: bool = True,
    **kwargs: Any,
) -> list[tuple[SavableDataset, Any]]:
    """One validation pipeline per leaf dataset, each with the source that describes it (the
    arguments are :func:`get_val_dataset`'s)."""
    dataset = get_val_dataset(
        path,
        split_part=split_part,
        worker_config=worker_config,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        packing_buffer_size=packing_buffer_size,
        limit=limit,
        task_encoder=task_encoder,
        num_streams=num_streams,
        parallel_shard_iters=parallel_shard_iters,
        subflavors=subflavors,
        dataset_config=dataset_config,
        split_config=split_config,
        token_config=token_config,
        global_batch_size=global_batch_size,
        blend_by=blend_by,
        balance=balance,
        error_budget=error_budget,
        decode_threads=decode_threads,
        group_max_wait=group_max_wait,
        sample_type=sample_type,
        even_ranks=even_ranks,
        **kwargs,
    )
    out = []
    for source in dataset.spec.sources:
        spec = dataclasses.replace(dataset.spec, sources=[source], mode="none")
        out.append((SavableDataset.from_spec(spec, dataset.worker_config), source))
    return out
