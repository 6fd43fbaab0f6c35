"""Task encoders: the user's hooks that turn loaded samples into model inputs.

A task encoder is a bag of optional hooks. A hook is *active* when a subclass overrides it; only
active hooks become pipeline stages. Hooks run inside loader workers; ``current_sample_index`` and
``current_batch_index`` are deterministic and layout-independent (they are derived from the logical
stream and its counters, not from the physical worker).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, TypeVar

from energon.decode import SampleDecoder
from energon.errors import SkipSample
from energon.plan.rng import stable_seed
from energon.samples import Sample
from energon.samples.collate import generic_batch
from energon.task_encoder.composition import BUILD_HOOKS, DatasetBlendMode, composition

T_sample = TypeVar("T_sample")
T_encoded_sample = TypeVar("T_encoded_sample")
T_raw_batch = TypeVar("T_raw_batch")
T_batch = TypeVar("T_batch")

__all__ = [
    "AugmentTaskEncoder",
    "DefaultTaskEncoder",
    "SkipSample",
    "TaskEncoder",
    "hook_context",
    "last_packing_round",
    "may_split",
    "stateless",
    "uses_sample_meta",
]


class _HookContext:
    """Where in the stream the hook being called is (set by the pipeline around every call)."""

    __slots__ = ("sample_index", "batch_index", "seed", "cache_pool", "packing")

    def __init__(self) -> None:
        self.sample_index: int | None = None
        self.batch_index: int | None = None
        self.seed: int = 0
        self.cache_pool: Any = None  # the loader's ``cache_pool=`` (cookers with need_cache get it)
        self.packing: PackingRound | None = None  # while select_samples_to_pack runs


@dataclasses.dataclass(frozen=True)
class PackingRound:
    """What ``select_samples_to_pack`` may ask about the buffer it was given
    (``hook_context.packing`` while it runs; :func:`may_split`, :func:`last_packing_round`).

    ``whole``: ids of the buffered samples (as the hook sees them) of datasets marked
    ``pack_whole`` (never split across packs); ``last``: the pass ends, nothing follows this
    buffer, so whatever the hook leaves in it is lost (counted as skipped)."""

    whole: frozenset[int] = frozenset()
    last: bool = False


def may_split(sample: Any) -> bool:
    """Whether ``select_samples_to_pack`` may split ``sample`` (one it was given) across packs:
    False for samples of datasets marked ``pack_whole`` in the metadataset."""
    round_ = hook_context.packing
    return round_ is None or id(sample) not in round_.whole


def last_packing_round() -> bool:
    """Whether this call of ``select_samples_to_pack`` gets the last buffer of a finite pass (a
    packer that keeps samples back for the next call must group them now)."""
    return hook_context.packing is not None and hook_context.packing.last


hook_context = _HookContext()


def stateless(
    fn: Callable | None = None, *, restore_seeds: bool = False, failure_tolerance: int | None = None
) -> Any:
    """Mark a hook as a pure function of its input (so its outputs can be regenerated on restore).

    With ``restore_seeds=True`` the global python/numpy/torch RNGs are seeded from the sample's
    deterministic index around each call and put back afterwards, so augmentations written with the
    global RNGs are reproducible per sample, after a restore, and leave the caller's RNG untouched.
    """

    def decorate(f: Callable) -> Callable:
        wrapped = _with_restored_seeds(f) if restore_seeds else f
        wrapped.__stateless__ = True  # type: ignore[attr-defined]
        if failure_tolerance is not None:
            wrapped.__failure_tolerance__ = failure_tolerance  # type: ignore[attr-defined]
        return wrapped

    if fn is not None:
        return decorate(fn)
    return decorate


def uses_sample_meta(fn: Callable) -> Callable:
    """Mark ``select_samples_to_pack`` or ``batch_group_criterion`` as deciding from metadata.

    The marked hook receives :class:`~energon.source.meta.SampleMeta` objects (key, byte and part
    sizes, media metadata, token counts: what the dataset's index knows without reading the
    sample) instead of encoded samples; for a packed sample, the list of its members'. Its
    decisions are then known without reading data, so the ledger, ``energon checkpoint skip`` and
    simulations reproduce packing and grouping exactly (see docs/ledger.md).
    ``select_samples_to_pack`` returns groups of the SampleMetas it was given.
    """
    fn.__uses_sample_meta__ = True  # type: ignore[attr-defined]
    return fn


def decides_from_sample_meta(fn: Any) -> bool:
    """Whether a hook is marked with :func:`uses_sample_meta`."""
    return bool(getattr(fn, "__uses_sample_meta__", False))


def _sample_seed() -> int:
    index = hook_context.sample_index if hook_context.sample_index is not None else -1
    return stable_seed(hook_context.seed, "hook-seed", index) & 0xFFFFFFFF


class _GlobalRngStates:
    """Snapshot and restore of the three global RNGs that user augmentations typically use."""

    def __init__(self) -> None:
        import numpy as np
        import torch

        self.python = random.getstate()
        self.numpy = np.random.get_state()
        self.torch = torch.random.get_rng_state()

    def apply(self) -> None:
        import numpy as np
        import torch

        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.random.set_rng_state(self.torch)


def _seed_globals(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.random.manual_seed(seed)


def _with_restored_seeds(f: Callable) -> Callable:
    if inspect.isgeneratorfunction(f):

        @functools.wraps(f)
        def generator_wrapper(*args: Any, **kwargs: Any) -> Generator:
            outer = _GlobalRngStates()
            _seed_globals(_sample_seed())
            try:
                gen = f(*args, **kwargs)
                inner = None
                while True:
                    if inner is not None:
                        outer = _GlobalRngStates()
                        inner.apply()
                    try:
                        value = next(gen)
                    finally:
                        inner = _GlobalRngStates()
                        outer.apply()
                    yield value
            except StopIteration:
                return

        return generator_wrapper

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outer = _GlobalRngStates()
        _seed_globals(_sample_seed())
        try:
            return f(*args, **kwargs)
        finally:
            outer.apply()

    return wrapper


class TaskEncoder(Generic[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Base class: override the hooks you need.

    Hooks: ``encode_sample`` (value or generator; may raise ``SkipSample``), ``preencode_sample`` /
    ``postencode_sample``, ``select_samples_to_pack`` + ``pack_selected_samples``,
    ``batch_group_criterion``, ``batch``, ``encode_batch``.
    """

    cookers: Sequence[Any] = ()
    __default_failure_tolerance__: int = 100

    @property
    def decoder(self) -> Any:
        """The decoder of loaded parts (``None`` = raw bytes). Per instance, never shared."""
        if "_decoder" not in self.__dict__:
            self.__dict__["_decoder"] = SampleDecoder()
        return self.__dict__["_decoder"]

    @decoder.setter
    def decoder(self, value: Any) -> None:
        self.__dict__["_decoder"] = value

    def cook_crude_sample(
        self, sample: dict[str, Any], cooker: Any, aux: dict[str, Any]
    ) -> T_sample:
        """Cook one crude sample with the cooker selected for its dataset (override to wrap it)."""
        return cooker.cook(sample, **aux)

    def encode_sample(self, sample: T_sample) -> T_encoded_sample | Generator[T_encoded_sample]:
        return sample  # type: ignore[return-value]

    def preencode_sample(self, sample: T_sample) -> Any:
        return sample

    def postencode_sample(self, sample: Any) -> T_encoded_sample:
        return sample

    def select_samples_to_pack(
        self, samples: list[T_encoded_sample]
    ) -> list[list[T_encoded_sample]]:
        raise NotImplementedError

    def pack_selected_samples(self, samples: list[T_encoded_sample]) -> T_encoded_sample:
        raise NotImplementedError

    def batch_group_criterion(self, sample: T_encoded_sample) -> tuple[Any, int | None]:
        raise NotImplementedError

    def batch(self, samples: list[T_encoded_sample]) -> T_raw_batch:
        return self._batch(samples, type(samples[0]))

    def encode_batch(self, batch: T_raw_batch) -> T_batch | Generator[T_batch]:
        return batch  # type: ignore[return-value]

    @property
    def current_sample_index(self) -> int:
        """Deterministic index of the sample being processed (unique over all streams)."""
        if hook_context.sample_index is None:
            raise RuntimeError("current_sample_index is only available inside a loader hook")
        return hook_context.sample_index

    @property
    def current_batch_index(self) -> int:
        """Global micro-batch position of the batch being produced."""
        if hook_context.batch_index is None:
            raise RuntimeError("current_batch_index is only available inside a loader hook")
        return hook_context.batch_index

    @property
    def cache(self) -> Any:
        """The loader's cache pool (``get_loader(..., cache_pool=...)``), inside loader hooks."""
        if hook_context.cache_pool is None:
            raise RuntimeError(
                "no cache pool: pass cache_pool=... to get_loader / get_savable_loader"
            )
        return hook_context.cache_pool

    # -- Megatron-Energon's pipeline hooks (see energon.task_encoder.composition) -----------------
    # Overriding any of them replaces energon's pipeline by the composition they describe; the
    # default bodies are the reference's and come from the registered composition.

    def composes_pipeline(self) -> bool:
        """True when a ``build_*`` hook (or ``_load_dataset``) is overridden."""
        return any(getattr(type(self), h) is not getattr(TaskEncoder, h) for h in BUILD_HOOKS)

    def build_train_datasets(
        self,
        *,
        datasets: list[Any],
        worker_config: Any,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        virtual_epoch_length: int = 0,
        shuffle_buffer_size: int | None = None,
        blend_mode: DatasetBlendMode = DatasetBlendMode.NONE,
        repeat: bool = True,
    ) -> Any:
        """The training dataset composed of ``datasets`` (``LoadedDataset``s of the metadataset)."""
        return composition().build_train_datasets(
            self,
            datasets=datasets,
            worker_config=worker_config,
            batch_size=batch_size,
            batch_drop_last=batch_drop_last,
            packing_buffer_size=packing_buffer_size,
            virtual_epoch_length=virtual_epoch_length,
            shuffle_buffer_size=shuffle_buffer_size,
            blend_mode=blend_mode,
            repeat=repeat,
        )

    def build_val_datasets(
        self,
        *,
        datasets: list[Any],
        worker_config: Any,
        batch_size: int,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        limit: int | None = None,
    ) -> Any:
        """The validation dataset composed of ``datasets``."""
        return composition().build_val_datasets(
            self,
            datasets=datasets,
            worker_config=worker_config,
            batch_size=batch_size,
            batch_drop_last=batch_drop_last,
            packing_buffer_size=packing_buffer_size,
            limit=limit,
        )

    def build_batch(
        self,
        dataset: Any,
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: Any,
    ) -> Any:
        """Packing, grouping, batching and ``encode_batch`` over ``dataset``."""
        return composition().build_batch(
            self,
            dataset,
            batch_size=batch_size,
            batch_drop_last=batch_drop_last,
            packing_buffer_size=packing_buffer_size,
            worker_config=worker_config,
        )

    def build_encode_sample(self, dataset: Any, *, worker_config: Any) -> Any:
        """``encode_sample`` (or ``preencode_sample``) over ``dataset``."""
        return composition().build_encode_sample(self, dataset, worker_config=worker_config)

    def build_cook_crude_sample(
        self,
        dataset: Any,
        *,
        worker_config: Any,
        subflavors: dict[str, Any],
        get_primary_aux: Callable[[], Any],
        aux: dict[str, Any] | None = None,
    ) -> Any:
        """The cooker selected by ``subflavors`` over a crude ``dataset``."""
        return composition().build_cook_crude_sample(
            self,
            dataset,
            worker_config=worker_config,
            subflavors=subflavors,
            get_primary_aux=get_primary_aux,
            aux=aux,
        )

    def _load_dataset(self, dataset: Any, worker_rotation_offset: int, worker_config: Any) -> Any:
        """One ``LoadedDataset``'s samples (cooked when it is crude)."""
        return composition().load_dataset(self, dataset, worker_rotation_offset, worker_config)

    def is_active(self, hook: str) -> bool:
        """True when ``hook`` is overridden relative to ``TaskEncoder``."""
        return getattr(type(self), hook) is not getattr(TaskEncoder, hook)

    def _batch(
        self,
        samples: list[Any],
        result_type: type,
        actions: dict[str, Callable[[list], Any]] | None = None,
        default_action: Callable[[list], Any] = generic_batch,
    ) -> Any:
        """Batch by fields: tensors pad-stacked, everything else as lists (per-field overrides)."""
        if dataclasses.is_dataclass(result_type) and hasattr(result_type, "from_samples"):
            return result_type.from_samples(samples)
        actions = actions or {}
        first = samples[0]
        if isinstance(first, dict):
            names = list(first.keys())
            columns = {n: [s[n] for s in samples] for n in names}
        elif dataclasses.is_dataclass(first):
            names = [f.name for f in dataclasses.fields(first)]
            columns = {n: [getattr(s, n) for s in samples] for n in names}
        elif isinstance(first, tuple) and hasattr(first, "_fields"):
            names = list(first._fields)
            columns = {n: [getattr(s, n) for s in samples] for n in names}
        else:
            return default_action(samples)
        batched = {n: actions.get(n, default_action)(col) for n, col in columns.items()}
        if isinstance(first, dict):
            return batched
        return result_type(**batched)

    def config(self) -> dict[str, Any]:
        return {"type": f"{type(self).__module__}.{type(self).__qualname__}"}


def _convert_by_fields(value: Any, target: type) -> Any:
    """Copy same-named fields of ``value`` into a new ``target`` instance."""
    if isinstance(value, target):
        return value
    if isinstance(value, dict):
        data = dict(value)
    elif dataclasses.is_dataclass(value):
        data = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    else:
        data = value._asdict()
    if dataclasses.is_dataclass(target):
        names = {f.name for f in dataclasses.fields(target)}
        return target(**{k: v for k, v in data.items() if k in names})
    if target is dict:
        return data
    return target(**data)


class DefaultTaskEncoder(TaskEncoder[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Identity encoding and default batching (tensors pad-stacked, other fields as lists)."""

    def __init__(
        self,
        *,
        encoded_sample_type: type | None = None,
        raw_batch_type: type | None = None,
        batch_type: type | None = None,
    ) -> None:
        self.encoded_sample_type = encoded_sample_type
        self.raw_batch_type = raw_batch_type
        self.batch_type = batch_type

    @stateless
    def encode_sample(self, sample: T_sample) -> T_encoded_sample:
        if self.encoded_sample_type is None:
            return sample  # type: ignore[return-value]
        return _convert_by_fields(sample, self.encoded_sample_type)

    def batch(self, samples: list[T_encoded_sample]) -> T_raw_batch:
        result_type = self.raw_batch_type or type(samples[0])
        actions = {"__subflavors__": list} if isinstance(samples[0], Sample) else None
        return self._batch(samples, result_type, actions=actions)

    @stateless
    def encode_batch(self, batch: T_raw_batch) -> T_batch:
        if self.batch_type is None or self.batch_type is self.raw_batch_type:
            return batch  # type: ignore[return-value]
        return _convert_by_fields(batch, self.batch_type)


class AugmentTaskEncoder(TaskEncoder[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Wraps another task encoder; subclass it and override a hook to augment the inner one."""

    def __init__(self, task_encoder: TaskEncoder) -> None:
        self._task_encoder = task_encoder

    @property
    def decoder(self) -> Any:
        return self._task_encoder.decoder

    @decoder.setter
    def decoder(self, value: Any) -> None:
        self._task_encoder.decoder = value

    def encode_sample(self, sample: T_sample) -> Any:
        return self._task_encoder.encode_sample(sample)

    def batch(self, samples: list) -> Any:
        return self._task_encoder.batch(samples)

    def encode_batch(self, batch_data: Any) -> Any:
        return self._task_encoder.encode_batch(batch_data)
