"""The loaders: ``get_loader`` / ``get_savable_loader`` and the :class:`Loader` they return.

A loader hands this rank its micro-batches in global-plan order. With workers
(:mod:`energon.loader.workers`), it takes worker ``w``'s results in strict round-robin, and worker
``w`` produces exactly the rank's positions ``w, w + W, ...``, so the order is the plan's. Every
yielded item comes with the snapshot of its stream, so saving the state is copying a few small dicts:
nothing is paused and nothing replayed; and a lost worker is replaced where it stood
(:mod:`energon.loader.recovery`).

A loader keeps all of its own state (position, snapshots, arena, the spec it restored) to itself:
several loaders over one dataset object do not affect each other. Validation passes stay even across
ranks through :mod:`energon.loader.evenness`.

:class:`Loader` runs the passes and delegates the rest to one collaborator per concern, each in its
own module: where it stands (:mod:`~energon.loader.position`), how items reach it
(:mod:`~energon.loader.transport`), saving and restoring (:mod:`~energon.loader.loader_state`), the
journal (:mod:`~energon.loader.journal`), the blend report and weight changes
(:mod:`~energon.loader.blend_control`), stats and the watchdog (:mod:`energon.observe.stats`), lost
workers (:mod:`~energon.loader.recovery`) and the error report (:mod:`~energon.loader.error_report`).
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.utils.data

from energon import arguments
from energon.errors import ArgumentError, ArgumentTypeError, StateError
from energon.loader import loader_state
from energon.loader.blend_control import BLEND_REPORT_WINDOW as BLEND_REPORT_WINDOW
from energon.loader.blend_control import (
    BlendControl,
    checked_window,
    from_first_rank,
    spec_with_weights,
)
from energon.loader.blend_report import BlendReport
from energon.loader.error_report import ErrorReport, describe_sample
from energon.loader.journal import LoaderJournal
from energon.loader.loader_log import LoaderLog
from energon.loader.loader_state import MAX_WORKERS as MAX_WORKERS
from energon.loader.passes import PassRunner
from energon.loader.position import LoaderPosition
from energon.loader.recovery import Recovery, WorkerRecovery
from energon.loader.savable_dataset import SavableDataset, restore_item
from energon.loader.transport import WorkerTransport
from energon.loader.workers.base import WorkerPoolFactory
from energon.observe.stats import LoaderMonitor
from energon.pipeline.keys import Key
from energon.pipeline.stage import Value
from energon.worker import WorkerConfig


class Loader:
    """Iterates a :class:`SavableDataset` for this rank and tracks its exact position.

    ``for batch in loader`` yields one pass: ``virtual_epoch_length`` batches (training with a
    virtual epoch), ``limit`` batches (``LimitDataset``), the whole validation split, or forever
    (training). A new ``for`` loop over a training loader continues where the last one stopped; over
    a validation loader it starts the next pass from the beginning (unless a ``LimitDataset`` without
    reset says to continue).

    The constructor takes Megatron-Energon's loader options. Those that tune machinery energon does
    not have warn when given a non-default value (see :func:`_warn_unused_options`). The watchdog
    options are real: after ``watchdog_timeout_seconds`` (``watchdog_initial_timeout_seconds`` for
    the first batch of a pass) without a batch, the stacks of every process and the sample each
    worker is on are logged, and with ``fail_on_timeout`` the wait ends in
    :class:`~energon.errors.WatchdogTimeout` (None or 0 switches the watchdog off).
    :attr:`recovery` says what happens when a worker dies or is stuck (default: it is replaced at
    its exact position and the sample it died on is skipped and counted; stuck ones are left to
    the watchdog). See docs/observability.md, also for :meth:`stats`.
    """

    _ids: ClassVar[Iterator[int]] = itertools.count()
    id: int  # this loader's number (``next_id``), as in the debug logs
    _log_name: ClassVar[str] = "Loader"

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        prefetch_factor: int = 2,
        cache_pool: Any = None,
        gc_collect_every_n_steps: int = 10,
        gc_freeze_at_start: bool = True,
        watchdog_timeout_seconds: float | None = 60,
        watchdog_initial_timeout_seconds: float | None = None,
        fail_on_timeout: bool = False,
    ) -> None:
        if not isinstance(dataset, SavableDataset):
            raise ArgumentTypeError(
                "dataset", "the loader needs a dataset from get_train_dataset / get_val_dataset"
            )
        _warn_unused_options(
            gc_collect_every_n_steps=gc_collect_every_n_steps,
            gc_freeze_at_start=gc_freeze_at_start,
        )
        self.dataset = dataset
        self.worker_config = dataset.worker_config
        self.prefetch_factor = prefetch_factor
        self.cache_pool = cache_pool
        self.id = self.next_id()
        self._position = LoaderPosition()
        self._debug_log = LoaderLog(self.id, type(self).__name__, self._log_name)
        self._errors = ErrorReport.for_sources(dataset.spec)
        self._monitor = LoaderMonitor(
            self.worker_config.num_workers,
            self.worker_config.rank,
            _weakly(self._describe_sample),
            watchdog_timeout=watchdog_timeout_seconds,
            watchdog_initial_timeout=watchdog_initial_timeout_seconds,
            fail_on_timeout=fail_on_timeout,
            sources=[name["path"] for name in self._errors.names],
        )
        self._recovery = Recovery(
            WorkerRecovery(),
            dataset.spec.num_streams,
            _weakly(self._describe_sample),
            dataset.spec.error_handler,
        )
        self._transport = WorkerTransport(
            self._monitor, self._recovery, prefetch_factor=prefetch_factor, cache_pool=cache_pool
        )
        self._blend = BlendControl()
        self._blend.start(dataset.spec, {})
        self._passes = PassRunner(
            self._position,
            self._transport,
            self._errors,
            self._blend,
            self._recovery,
            self._debug_log,
        )
        if self.worker_config.num_workers:
            self.check_worker_number_rationality()  # as torch's DataLoader warns
        if self.worker_config.should_log(1):
            self._debug_log.event(self.worker_config, 1, "__init__", config=self.config())

    @staticmethod
    def next_id() -> int:
        """A process-wide number for loaders and their passes (as in the debug logs)."""
        return next(Loader._ids)

    @property
    def num_workers(self) -> int:
        return self.worker_config.num_workers

    def check_worker_number_rationality(self) -> None:
        """Warn (as torch's DataLoader does) when more workers are asked than CPUs are available."""
        torch.utils.data.DataLoader.check_worker_number_rationality(self)

    # -- iteration ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.dataset.len_rank()

    def __iter__(self) -> Iterator[Value]:
        return self._one_pass()

    def _one_pass(self) -> Iterator[Value]:
        yield from self._passes.run(self.dataset, self.worker_config, self.next_id())

    def close(self) -> None:
        """End the loader's workers now (their processes, or Ray actors, which with
        ``keep_actors`` wait for the next loader) rather than when the loader is collected.
        Iterating again starts new ones where the loop stands."""
        self._transport.shutdown()

    def __del__(self) -> None:
        try:
            self._transport.close()
            if self._passes.journal is not None:
                self._passes.journal.close()
            self._monitor.close()
        except Exception:
            pass

    # -- journal -----------------------------------------------------------------------------
    def start_journal(self, directory: str) -> None:
        """Record the position and restore key of every micro-batch this loader delivers from now
        on in ``directory``, so that the ledger can say exactly what past steps held whatever the
        task encoder's hooks did (see docs/ledger.md). Call it before iterating."""
        if self._transport.is_open:
            raise RuntimeError("start_journal must be called before iterating the loader")
        if self._passes.journal is not None:
            self._passes.journal.close()
        self._passes.journal = LoaderJournal(directory, self.worker_config.rank)
        self.dataset = self.dataset.with_spec(self.dataset.spec)  # this loader's own copy
        self.dataset.journal_keys = True

    @property
    def journal_dir(self) -> str | None:
        """The folder of :meth:`start_journal` (None: no journal)."""
        journal = self._passes.journal
        return None if journal is None else journal.directory

    # -- state -------------------------------------------------------------------------------
    def save_state_rank(self) -> dict[str, Any]:
        """This rank's position as plain data (JSON-serialisable; safe for ``torch.load``)."""
        if self._passes.journal is not None:
            self._passes.journal.flush()  # every batch before a checkpoint is in the journal
        return loader_state.rank_state(self.dataset, self._position, self._errors)

    def restore_state_rank(self, state: dict[str, Any] | None) -> None:
        """Continue exactly where ``state`` was saved. Call before iterating."""
        if state is None:
            return
        if self._transport.is_open:
            raise StateError("restore_state_rank must be called before iterating the loader")
        # this loader's own copy: other loaders over the same dataset keep their streams
        self.dataset, state = loader_state.restored_dataset(self.dataset, state)
        self._position.restore(state)
        self._blend.start(self.dataset.spec, self._position.snapshots)
        self._errors.restore(state.get("errors"), self._position.snapshots)

    def save_state_global(
        self, global_dst_rank: int | None = None, *, dst_rank: int | None = None
    ) -> list | None:
        """Gather every data-parallel rank's state on ``global_dst_rank`` (all ranks must call).

        ``dst_rank`` is accepted as another name for it, since Megatron-Energon's docs use it.
        """
        if global_dst_rank is None:
            global_dst_rank = dst_rank or 0
        state = self.save_state_rank()
        return loader_state.gathered_states(state, self.worker_config, global_dst_rank)

    def save_state(self, dst_rank: int) -> list | None:
        """Deprecated (Megatron-Energon's old name): ``save_state_global(dst_rank)``."""
        warnings.warn(
            "save_state is deprecated, use save_state_global (or save_state_rank)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.save_state_global(dst_rank)

    def restore_state(self, state: list | None) -> None:
        """Deprecated (Megatron-Energon's old name): ``restore_state_global(state)``."""
        warnings.warn(
            "restore_state is deprecated, use restore_state_global (or restore_state_rank)",
            DeprecationWarning,
            stacklevel=2,
        )
        self.restore_state_global(state)

    def restore_state_global(self, state: list | None, *, src_rank: int | None = None) -> None:
        """Restore from the list of all ranks' states, on any number of ranks (all must call)."""
        self.restore_state_rank(
            loader_state.state_of_this_rank(state, self.worker_config, src_rank)
        )

    # -- blending ----------------------------------------------------------------------------
    @property
    def blend_window(self) -> int:
        """Samples of the global clock per window of :meth:`blend_report` (default 1,000); set it
        before iterating (or right after a restore)."""
        return self._blend.window

    @blend_window.setter
    def blend_window(self, window: int) -> None:
        window = checked_window(window)
        if self._transport.is_open:
            raise ValueError("set blend_window before iterating the loader")
        self._blend.window = window
        self._blend.start(self.dataset.spec, self._position.snapshots)

    def blend_report(self, window: int | None = None) -> BlendReport:
        """Requested against observed share of each source: in total over the samples this rank's
        streams have picked so far (samples waiting in shuffle buffers count as picked) and, for a
        weight blend, per window of the global sample clock: ``window`` samples, a multiple of the
        loader's ``blend_window`` (default: that; the most recent ``MAX_WINDOWS`` of them are
        kept). Iterating the report gives one dict per source."""
        workers = range(max(1, self.worker_config.num_workers))
        origin = self._position.origin
        streams = {s for w in workers for s in self.dataset.layout(w, origin).streams()}
        return self._blend.report(self.dataset.spec, self._position.snapshots, streams, window)

    def set_blend_weights(
        self,
        weights: Sequence[Any] | Mapping[str, Any] | None,
        *,
        from_step: int | None = None,
        from_sample: int | None = None,
        broadcast: bool = False,
    ) -> int:
        """Change the weights of a training blend from a point of the global sequence on.

        ``weights``: one weight per source, in the order of :meth:`blend_report` (a number or a
        :class:`~energon.plan.schedules.WeightSchedule`), or a mapping from a source's report
        ``name`` to its weight (sources left out get 0); normalised, and final: they replace the
        configured blend tree. None goes back to the configured weights (and schedules).

        Where it starts: ``from_step`` (needs ``global_batch_size`` from ``get_train_dataset`` or
        the metadataset), ``from_sample`` (global samples, a multiple of the micro-batch size), or
        by default the next micro-batch (call it between training steps, all ranks at the same
        step). It must not lie before what the ranks have already consumed. Logical stream ``s``
        switches before its first micro-batch at or after that global position; workers already
        ahead are restarted from the consumed position when the loader gets there, so the order is
        the same as if the change had been in the config from the start, on any number of ranks
        and workers.

        Every rank must call it with the same values, or pass ``broadcast=True`` (a collective:
        all ranks call, rank 0's arguments win, sent through ``torch.distributed`` over the
        data-parallel group). The change is recorded in the loader state, so a restored run
        repeats it. Returns the global micro-batch position where it starts.
        """
        wc = self.worker_config
        if broadcast and wc.world_size > 1:
            weights, from_step, from_sample = from_first_rank(
                [weights, from_step, from_sample], wc.data_parallel_group
            )
        boundary = self._position.consumed_boundary(wc.world_size)
        spec = self.dataset.spec
        changed, position = spec_with_weights(spec, weights, from_step, from_sample, boundary)
        if changed is not spec:
            self.dataset = self.dataset.with_spec(changed)
            self._transport.restart_from(position, self.dataset)
        return position

    # -- stats, watchdog, lost workers, errors -----------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Live numbers of this rank's loader (docs/observability.md): ``batches``;
        ``wait_seconds`` / ``wait_fraction`` / ``wait_ms`` (p50, p95, max over recent batches): how
        long the training loop waited for batches (the exposed wait); ``stage_seconds``: time in
        the workers per stage (wait, plan, read, decode, encode, batch, transfer); ``workers``: per
        worker its stage now, samples, samples/s (over its lifetime and over its busy time),
        queue depth (items made but not yet taken), per-stage seconds and remote retries/bytes;
        ``sources``: samples read, skipped, errors by reason and remote read retries per source
        dataset;
        ``watchdog_reports``: stall reports so far. Cheap: call it as often as you like."""
        return self._monitor.stats(self._errors.report(self._position.snapshots))

    def log_stats(self, every_seconds: float | None = 60.0) -> None:
        """Log one line of :meth:`stats` (logger ``energon.stats``, level INFO) at most every
        ``every_seconds`` while batches are taken; None switches it off (the default)."""
        self._monitor.log_every = every_seconds

    @property
    def collect_stats(self) -> bool:
        """Per-stage stats in the workers (on by default; the watchdog reads them too). Set it
        before iterating."""
        return self._monitor.enabled

    @collect_stats.setter
    def collect_stats(self, value: bool) -> None:
        self._monitor.enabled = bool(value)

    def watchdog_reports(self) -> list[str]:
        """The stall reports the watchdog has written (also logged, logger ``energon.watchdog``),
        with those on workers that ``on_stall="skip"`` stopped."""
        return self._monitor.reports()

    @property
    def recovery(self) -> WorkerRecovery:
        """What happens when a worker dies or is stuck (docs/observability.md): a
        :class:`~energon.loader.recovery.WorkerRecovery`; set it before iterating."""
        return self._recovery.policy

    @recovery.setter
    def recovery(self, policy: WorkerRecovery) -> None:
        self._recovery.set_policy(
            policy, started=self._transport.is_open, num_workers=self.worker_config.num_workers
        )

    def worker_losses(self) -> list[dict[str, Any]]:
        """Every worker this loader lost, in order (plain data): ``worker``, ``who`` (with its
        process id), ``cause`` (the signal, exit code, or the stall), the logical ``stream`` it
        was making an item of, the ``sample`` it was on (source, index, key, shard, byte_offset,
        dataset; None if it was between samples) and the ``action`` taken."""
        return [loss.to_json() for loss in self._recovery.losses]

    def error_report(self) -> dict[str, Any]:
        """Samples this rank lost to errors, per source dataset (see docs/errors.md)::

            {"skipped": <total>, "read": <samples read>,
             "sources": [{"path", "split_part", "read", "skipped", "rate",
                          "reasons": {exception type: count},
                          "examples": [{"key", "index", "shard", "offset", "error"}, ...]}]}

        Counts cover the items consumed so far (the current pass and finished ones) and survive
        save and restore; samples that failed in a worker but whose stream has not delivered an
        item since are counted with that stream's next item.
        """
        return self._errors.report(self._position.snapshots)

    def _describe_sample(self, source: int, index: int) -> dict[str, Any]:
        return describe_sample(self.dataset.spec, source, index)

    # -- workers -----------------------------------------------------------------------------
    @property
    def workers(self) -> WorkerPoolFactory | None:
        """Who runs the loader's workers: None for local processes (``num_workers`` of the
        worker config), or e.g. :class:`~energon.loader.workers.ray_workers.RayWorkers` for Ray
        actors on a cluster (docs/ray.md). Set it before iterating: the dataset's logical streams
        are then spread over its ``num_workers`` workers, and the batches, their order and the
        saved states are those of as many local workers."""
        return self._transport.factory

    @workers.setter
    def workers(self, workers: WorkerPoolFactory | None) -> None:
        self.dataset = self._transport.use_factory(workers, self.dataset)  # this loader's copy
        self.worker_config = self.dataset.worker_config

    # -- debugging ---------------------------------------------------------------------------
    def can_restore_sample(self) -> bool:
        return self.dataset.can_restore_sample()

    def restore_sample(self, restore_key: Key) -> Value:
        """Regenerate a yielded item from its ``__restore_key__`` (pure hooks only; see
        :func:`restore_item`; errors go to this loader's ``restore_error_handler``)."""
        return restore_item(self.dataset, restore_key, self.worker_config.restore_error_handler)

    def config(self) -> dict[str, Any]:
        config = {
            "type": type(self).__name__,
            "num_workers": self.worker_config.num_workers,
            "prefetch_factor": self.prefetch_factor if self.worker_config.num_workers else None,
            # threads decoding JPEGs in each loading process (energon.decode.threads)
            "decode_threads": getattr(self.dataset.spec, "decode_threads", 1),
            "dataset": self.dataset.config(),
        }
        if self._transport.factory is not None:
            config["workers"] = self._transport.factory.config()
        return config


class BasicDataLoader(Loader):
    """The loader of ``get_loader``; it can save and restore its position too."""

    _log_name = "BasicDataLoader"

    def __init__(
        self,
        dataset: SavableDataset,
        gc_collect_every_n_steps: int = 10,
        gc_freeze_at_start: bool = True,
        prefetch_factor: int = 2,
        cache_pool: Any = None,
        watchdog_timeout_seconds: float | None = 60,
        watchdog_initial_timeout_seconds: float | None = None,
        fail_on_timeout: bool = False,
    ) -> None:
        """Megatron-Energon's argument order (its options may be given positionally)."""
        super().__init__(
            dataset,
            prefetch_factor=prefetch_factor,
            cache_pool=cache_pool,
            gc_collect_every_n_steps=gc_collect_every_n_steps,
            gc_freeze_at_start=gc_freeze_at_start,
            watchdog_timeout_seconds=watchdog_timeout_seconds,
            watchdog_initial_timeout_seconds=watchdog_initial_timeout_seconds,
            fail_on_timeout=fail_on_timeout,
        )


class SavableDataLoader(Loader):
    """The loader of ``get_savable_loader``.

    ``checkpoint_every_sec`` / ``checkpoint_every_min_n_samples`` / ``n_checkpoints`` tune how often
    Megatron-Energon's workers snapshot their state (and so how much a restore replays); here every
    batch carries its exact snapshot, so they have nothing to tune and warn when changed.
    """

    _log_name = "SavableLoader"

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        checkpoint_every_sec: float = 60,
        checkpoint_every_min_n_samples: int | None = None,
        n_checkpoints: int | None = None,
        gc_collect_every_n_steps: int = 10,
        gc_freeze_at_start: bool = True,
        prefetch_factor: int = 2,
        cache_pool: Any = None,
        watchdog_timeout_seconds: float | None = 60,
        watchdog_initial_timeout_seconds: float | None = None,
        fail_on_timeout: bool = False,
    ) -> None:
        _warn_unused_options(
            checkpoint_every_sec=checkpoint_every_sec,
            checkpoint_every_min_n_samples=checkpoint_every_min_n_samples,
            n_checkpoints=n_checkpoints,
        )
        super().__init__(
            dataset,
            prefetch_factor=prefetch_factor,
            cache_pool=cache_pool,
            gc_collect_every_n_steps=gc_collect_every_n_steps,
            gc_freeze_at_start=gc_freeze_at_start,
            watchdog_timeout_seconds=watchdog_timeout_seconds,
            watchdog_initial_timeout_seconds=watchdog_initial_timeout_seconds,
            fail_on_timeout=fail_on_timeout,
        )


# option -> (Megatron-Energon's default, why energon has nothing to do with another value)
_UNUSED_OPTIONS = {
    "gc_collect_every_n_steps": (10, "workers do not run periodic gc.collect()"),
    "gc_freeze_at_start": (True, "workers do not run periodic gc.collect()"),
    "checkpoint_every_sec": (60, "every batch carries its exact state: nothing is replayed"),
    "checkpoint_every_min_n_samples": (None, "every batch carries its exact state"),
    "n_checkpoints": (None, "every batch carries its exact state"),
}


def _weakly(method: Any) -> Any:
    """``method`` through a weak reference to its object: the watchdog's thread runs as long as
    the watchdog, and a strong reference from it would keep a loader that its user dropped, and
    that loader's worker processes, alive for good. Once the loader is gone it describes nothing."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        target = ref()
        return {} if target is None else target(*args)

    return call


def _warn_unused_options(**given: Any) -> None:
    """A Megatron-Energon loader option set to a non-default value that energon cannot honour is
    never ignored silently."""
    for name, value in given.items():
        default, why = _UNUSED_OPTIONS[name]
        if value != default:
            warnings.warn(
                f"{name}={value!r} has no effect in energon: {why}", UserWarning, stacklevel=4
            )


def _check_worker_config(dataset: SavableDataset, worker_config: WorkerConfig | None) -> None:
    """The deprecated ``worker_config`` argument must equal the dataset's (which is used)."""
    if not isinstance(dataset, SavableDataset):
        raise ArgumentTypeError(
            "dataset",
            f"expected a dataset from get_train_dataset / get_val_dataset, got {dataset!r}",
        )
    if worker_config is None:
        return
    if worker_config != dataset.worker_config:
        raise ArgumentError(
            "worker_config",
            "differs from the dataset's; the dataset's worker_config is used "
            "(this argument is deprecated)",
        )
    warnings.warn("the loader's worker_config argument is deprecated", FutureWarning, stacklevel=3)


@arguments.known_keywords()
def get_loader(
    dataset: SavableDataset,
    *,
    worker_config: WorkerConfig | None = None,
    prefetch_factor: int = 2,
    cache_pool: Any = None,
    watchdog_timeout_seconds: float | None = 60,
    watchdog_initial_timeout_seconds: float | None = None,
    fail_on_timeout: bool = False,
) -> BasicDataLoader:
    """A loader over ``dataset`` with ``worker_config.num_workers`` worker processes."""
    _check_worker_config(dataset, worker_config)
    return BasicDataLoader(
        dataset,
        prefetch_factor=prefetch_factor,
        cache_pool=cache_pool,
        watchdog_timeout_seconds=watchdog_timeout_seconds,
        watchdog_initial_timeout_seconds=watchdog_initial_timeout_seconds,
        fail_on_timeout=fail_on_timeout,
    )


@arguments.known_keywords()
def get_savable_loader(
    dataset: SavableDataset,
    *,
    worker_config: WorkerConfig | None = None,
    checkpoint_every_sec: float = 60,
    checkpoint_every_min_n_samples: int | None = None,
    n_checkpoints: int | None = None,
    gc_collect_every_n_steps: int = 10,
    prefetch_factor: int = 2,
    cache_pool: Any = None,
    watchdog_timeout_seconds: float | None = 60,
    watchdog_initial_timeout_seconds: float | None = None,
    fail_on_timeout: bool = False,
) -> SavableDataLoader:
    """A loader whose exact position can be saved (``save_state_rank``) and restored."""
    _check_worker_config(dataset, worker_config)
    return SavableDataLoader(
        dataset,
        checkpoint_every_sec=checkpoint_every_sec,
        checkpoint_every_min_n_samples=checkpoint_every_min_n_samples,
        n_checkpoints=n_checkpoints,
        gc_collect_every_n_steps=gc_collect_every_n_steps,
        prefetch_factor=prefetch_factor,
        cache_pool=cache_pool,
        watchdog_timeout_seconds=watchdog_timeout_seconds,
        watchdog_initial_timeout_seconds=watchdog_initial_timeout_seconds,
        fail_on_timeout=fail_on_timeout,
    )
