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
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import json
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.utils.data

from energon import arguments, debug_log
from energon.balance.tail import TAIL_FIELD, settled
from energon.errors import (
    ArgumentError,
    ArgumentTypeError,
    ErrorBudget,
    StateError,
    WatchdogTimeout,
    WorkerRecoveryError,
)
from energon.loader.blend_report import BlendReport, BlendTracker, source_names, source_rows
from energon.loader.error_report import ErrorReport
from energon.loader.evenness import Fillers, agreement_group, any_rank_has_item
from energon.loader.journal import JournalWriter, sources_digest
from energon.loader.recovery import LostSample, Recovery, WorkerRecovery
from energon.loader.savable_dataset import ResumePoint, SavableDataset, restore_item
from energon.loader.workers.base import WorkerPoolFactory
from energon.loader.workers.messages import collate
from energon.loader.workers.processes import ProcessPool
from energon.loader.workers.results import Watch, WorkerResults, with_lost
from energon.memory.batch_arena import BatchArena, arena_supported
from energon.observe.stall import StallCheck
from energon.observe.stats import LoaderMonitor
from energon.pipeline import snapshot
from energon.pipeline.executor import ItemMeta
from energon.pipeline.keys import Key
from energon.pipeline.snapshot import PackedSnapshot, StreamSnapshot
from energon.pipeline.spec import check_blend_streams
from energon.pipeline.stage import Value
from energon.plan.edits import PlanEdits, edits_from_json
from energon.plan.schedules import FlatWeights, WeightChange, WeightSchedule
from energon.source.meta import SampleMeta, meta_reader
from energon.state import (
    check_compatible,
    check_position,
    check_state_shape,
    make_rank_state,
    parsed_weight_changes,
    redistribute_states,
    stream_snapshots,
    upgrade_state,
)
from energon.task_encoder.base import hook_context
from energon.worker import WorkerConfig

BLEND_REPORT_WINDOW = 1000  # global samples per window of Loader.blend_report()
# A state may name at most world_size x MAX_WORKERS logical streams (or one per sample): more is a
# damaged state, and building that many streams would look like a hang.
MAX_WORKERS = 1024


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
        self._origin = 0
        self._consumed = 0
        self._balance_tail: dict[str, Any] | None = None  # energon.balance.tail
        self._pass_offset = 0
        self._yielded = 0
        self._worker_yields: dict[int, int] = {}
        self._snapshots = {}  # see the property: plain snapshots, and packed ones to unpack
        self._source: Iterator[tuple[Value, ItemMeta]] | None = None
        self._source_ended = False
        self._fillers: Fillers | None = None
        self._arena: BatchArena | None = None
        self._restart_at: int | None = None  # reopen the source here (blend weights changed)
        self._blend_window = BLEND_REPORT_WINDOW
        self._blend_tracker = self._new_blend_tracker()
        self.journal_dir: str | None = None
        self._journal: JournalWriter | None = None
        self._journal_spec: Any = None
        self._errors = ErrorReport(
            dataset.spec.error_budget or ErrorBudget(),
            [
                {"path": s.leaf.fingerprint()["path"], "split_part": s.leaf.split_part}
                for s in dataset.spec.sources
            ],
        )
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
        self._results: WorkerResults | None = None
        self._workers: WorkerPoolFactory | None = None  # see the `workers` property
        self._local_num_workers: int | None = None  # the worker config's, before `workers`
        self._worker_pool: Any = None  # their pool, kept from pass to pass
        if self.worker_config.num_workers:
            self.check_worker_number_rationality()  # as torch's DataLoader warns
        if self.worker_config.should_log(1):
            self._log(1, "__init__", config=self.config())

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

    def _log(self, level: int, event: str, **fields: Any) -> None:
        wc = self.worker_config
        if wc.should_log(level):
            name = self._log_name if event == "__init__" else type(self).__name__
            wc.worker_log(
                {"t": f"{name}.{event}", "r": wc.rank, "w": None, "id": self.id, **fields}
            )

    # -- iteration ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.dataset.len_rank()

    def __iter__(self) -> Iterator[Value]:
        return self._one_pass()

    def _pass_length(self) -> int | None:
        return self._pass_length_of(self.dataset.spec)

    @staticmethod
    def _pass_length_of(spec: Any) -> int | None:
        if spec.limit is not None:
            return spec.limit
        if spec.training:
            return spec.virtual_epoch_length or None
        return None

    def _one_pass(self) -> Iterator[Value]:
        length = self._pass_length()
        iter_id = self.next_id()
        self._log(1, "iter", iter_id=iter_id)
        self._log_pass_boundary("start", length)
        self._recovery.new_pass()
        if self._source is None:
            self._source = self._open_source()
        agree, group = agreement_group(self.dataset)
        iter_idx = 0
        while length is None or self._pass_offset < length:
            if self._restart_at is not None and self._next_position() >= self._restart_at:
                self._reopen_source()
            entry = self._next_entry()
            if agree and entry is None and any_rank_has_item(False, group):
                # this rank ran out, another has not: keep step with a filler
                self._pass_offset += 1
                yield self._filler(self.worker_config.rank % self.dataset.spec.num_streams)
                continue
            if entry is None or (agree and not any_rank_has_item(True, group)):
                self._log(1, "StopIteration", iter_id=iter_id)
                self._finish_pass()
                return
            value, meta = entry
            self._record(meta)
            if self.journal_dir is not None and not meta.hole:
                self._journal_writer().append(meta.position, meta.key)
            if meta.hole:
                value = self._filler(meta.stream)
            elif meta.arena:
                value = self._arena.import_(value)
            self._log_yield(value, meta, iter_id, iter_idx)
            iter_idx += 1
            yield value
        self._log_pass_boundary("end", length)
        self._log(1, "StopIteration", iter_id=iter_id)
        self._pass_offset = 0
        spec = self.dataset.spec
        if spec.limit is not None and spec.limit_resets:
            self._finish_pass()

    def _next_entry(self) -> tuple[Value, ItemMeta] | None:
        """The source's next ``(value, meta)``, or None once it has ended (and ever after, until
        the pass is finished). Final snapshots of ended streams are recorded on the way."""
        while not self._source_ended:
            try:
                value, meta = self._monitor.next_entry(self._source)
            except StopIteration:
                self._source_ended = True
                break
            except (WatchdogTimeout, WorkerRecoveryError):
                self._close_source()  # the next iteration restarts from the consumed position
                raise
            if not meta.ended:
                return value, meta
            self._keep_snapshot(meta.stream, meta.snapshot)
            self._errors.observe(meta.stream, meta.snapshot, self._all_snapshots)
        return None

    def _filler(self, stream: int) -> Value:
        if self._fillers is None:
            self._fillers = Fillers(self.dataset)
        return self._fillers.make(stream)

    def _log_yield(self, value: Value, meta: ItemMeta, iter_id: int, iter_idx: int) -> None:
        worker = meta.worker
        worker_idx = self._worker_yields.get(worker, 0)
        self._worker_yields[worker] = worker_idx + 1
        self._yielded += 1
        if self.worker_config.should_log(1):
            self._log(
                1,
                "yield",
                iter_id=iter_id,
                worker_id=worker,
                worker_idx=worker_idx,
                idx=iter_idx,
                iter_idx=iter_idx,
                global_idx=self._yielded - 1,
                keys=debug_log.batch_keys(value),
            )

    def _log_pass_boundary(self, which: str, length: int | None) -> None:
        """Level 2: where a virtual epoch or a limited validation pass starts and ends."""
        if length is None or not self.worker_config.should_log(2):
            return
        if self.dataset.spec.limit is None:  # a virtual epoch
            event = (
                "EpochizeDataset.epoch_start" if which == "start" else "EpochizeDataset.epoch_end"
            )
        else:
            event = "LimitDataset.start" if which == "start" else "LimitDataset.done"
        wc = self.worker_config
        wc.worker_log(
            {"t": event, "r": wc.rank, "w": None, "offset": self._pass_offset, "length": length}
        )

    def _finish_pass(self) -> None:
        """After a finite pass (validation, or training with repeat=False) the next starts afresh."""
        self._errors.finish_pass(self._snapshots)
        self._close_source()
        self._origin = self._consumed = self._pass_offset = 0
        self._balance_tail = None
        self._snapshots = {}
        self._fillers = None

    def _record(self, meta: ItemMeta) -> None:
        wc = self.worker_config
        self._keep_snapshot(meta.stream, meta.snapshot)
        if meta.others:
            self._snapshots.update(meta.others)  # a balanced step advanced several streams
        if self._blend_tracker is not None:
            self._blend_tracker.observe(meta.stream, self._snapshots[meta.stream])
        self._consumed = (meta.position - self._origin - wc.rank) // wc.world_size + 1
        self._pass_offset += 1
        self._errors.observe(meta.stream, meta.snapshot, self._all_snapshots)

    @property
    def _snapshots(self) -> dict[int, StreamSnapshot]:
        """The latest snapshot of every stream this pass. Those that came packed from workers
        (:class:`PackedSnapshot`) are unpacked here, when first read: most never are."""
        packed = self._packed_snapshots
        if packed:
            for stream, snap in packed.items():
                self._plain_snapshots[stream] = snap.unpack()
            packed.clear()
        return self._plain_snapshots

    @_snapshots.setter
    def _snapshots(self, snapshots: dict[int, StreamSnapshot]) -> None:
        self._plain_snapshots = snapshots
        self._packed_snapshots: dict[int, PackedSnapshot] = {}

    def _all_snapshots(self) -> dict[int, StreamSnapshot]:
        return self._snapshots

    def _keep_snapshot(self, stream: int, snap: StreamSnapshot | PackedSnapshot) -> None:
        """Record a stream's latest snapshot; a packed one stays packed until it is read."""
        if isinstance(snap, PackedSnapshot):
            self._packed_snapshots[stream] = snap
        else:
            self._snapshots[stream] = snap  # unpacks what is pending first: the newest wins

    def start_journal(self, directory: str) -> None:
        """Record the position and restore key of every micro-batch this loader delivers from now
        on in ``directory``, so that the ledger can say exactly what past steps held whatever the
        task encoder's hooks did (see docs/ledger.md). Call it before iterating."""
        if self._source is not None:
            raise RuntimeError("start_journal must be called before iterating the loader")
        self.journal_dir = directory
        self.dataset = self.dataset.with_spec(self.dataset.spec)  # this loader's own copy
        self.dataset.journal_keys = True

    def _journal_writer(self) -> JournalWriter:
        """The journal of this rank under the current source numbering (see energon.ledger)."""
        journal = self._journal
        if journal is None or self._journal_spec is not self.dataset.spec:
            digest = sources_digest(self.dataset.spec.fingerprint())
            if journal is None or journal.digest != digest:
                if journal is not None:
                    journal.close()
                journal = JournalWriter(self.journal_dir, self.worker_config.rank, digest)
                self._journal = journal
            self._journal_spec = self.dataset.spec
        return journal

    def _open_source(self) -> Iterator[tuple[Value, ItemMeta]]:
        wc = self.worker_config
        self._restart_at = None  # the new source runs the current spec
        hook_context.cache_pool = self.cache_pool  # workers inherit it through fork
        self._source_ended = False
        resume = ResumePoint(
            base=self._origin + self._consumed * wc.world_size,
            origin=self._origin,
            tail=self._balance_tail,
            snapshots=dict(self._snapshots),
            board=self._monitor.open_source(),
        )
        if wc.num_workers == 0:
            items = self.dataset.executor(0, resume)
            return map(functools.partial(collate, None), items)
        if self._workers is not None:
            self._worker_pool = self._workers.pool(
                self.dataset,
                prefetch=self.prefetch_factor,
                pinned=torch.cuda.is_available(),
                board=self._monitor.board,
                cache_pool=self.cache_pool,
                previous=self._worker_pool,
            )
            self._results = WorkerResults(self._worker_pool, resume, self._recovery, self._watch())
            return self._results
        self._arena = BatchArena(wc.num_workers) if arena_supported() else None
        pool = ProcessPool(
            self.dataset,
            wc.num_workers,
            prefetch=self.prefetch_factor,
            arena=self._arena,
            pinned=torch.cuda.is_available(),
        )
        self._results = WorkerResults(pool, resume, self._recovery, self._watch(), self._arena)
        return self._results

    def _watch(self) -> Watch:
        """What the worker results need to replace lost workers (energon.loader.recovery)."""
        wc, monitor, policy = self.worker_config, self._monitor, self._recovery.policy
        self._recovery.num_streams = self.dataset.spec.num_streams  # (a restore may change it)
        stall = None
        if policy.on_stall == "skip" and monitor.board is not None:
            stall = StallCheck(
                monitor.board, policy.stall_timeout_seconds, policy.stall_timeout_per
            )
        return Watch(
            rank=wc.rank,
            world_size=wc.world_size,
            board=monitor.board,
            stall=stall,
            report_stall=monitor.report_stall,
            stopped=monitor.stopped_by_watchdog,
            initial_snapshot=self.dataset.initial_snapshot,
            lost_sample=_weakly(self._lost_sample),
        )

    def _lost_sample(self, lost: LostSample) -> None:
        """A worker was lost on a sample: the stream's consumed snapshot gets it as pending, so
        that a state saved now skips it too."""
        snap = self._snapshots.get(lost.stream) or self.dataset.initial_snapshot(lost.stream)
        self._snapshots[lost.stream] = with_lost(snap, lost)

    def worker_losses(self) -> list[dict[str, Any]]:
        """Every worker this loader lost, in order (plain data): ``worker``, ``who`` (with its
        process id), ``cause`` (the signal, exit code, or the stall), the logical ``stream`` it
        was making an item of, the ``sample`` it was on (source, index, key, shard, byte_offset,
        dataset; None if it was between samples) and the ``action`` taken."""
        return [loss.to_json() for loss in self._recovery.losses]

    def _next_position(self) -> int:
        """The global micro-batch position this rank yields next."""
        wc = self.worker_config
        return self._origin + wc.rank + self._consumed * wc.world_size

    def _consumed_boundary(self) -> int:
        """Every global position below this one was consumed (ranks step together)."""
        return self._origin + self._consumed * self.worker_config.world_size

    def _reopen_source(self) -> None:
        """Drop what the workers computed ahead and start them again from the consumed position
        (with the current spec): how a blend weight change reaches every worker."""
        self._restart_at = None
        self._close_source()
        self._source = self._open_source()

    def _close_source(self) -> None:
        source, self._source = self._source, None
        self._source_ended = False
        if source is not None:
            self._monitor.close_source()
        results, self._results = self._results, None
        if results is not None:
            if self._arena is not None:
                self._arena.release_workers()
            results.close()
        if self._arena is not None:
            self._arena.close()

    def close(self) -> None:
        """End the loader's workers now (their processes, or Ray actors, which with
        ``keep_actors`` wait for the next loader) rather than when the loader is collected.
        Iterating again starts new ones where the loop stands."""
        self._close_source()
        pool, self._worker_pool = self._worker_pool, None
        if pool is not None:
            pool.shutdown()

    def __del__(self) -> None:
        try:
            self._close_source()
            if self._journal is not None:
                self._journal.close()
            self._monitor.close()
        except Exception:
            pass

    # -- state -------------------------------------------------------------------------------
    def save_state_rank(self) -> dict[str, Any]:
        """This rank's position as plain data (JSON-serialisable; safe for ``torch.load``)."""
        if self._journal is not None:
            self._journal.flush()  # every batch before a checkpoint is in the journal
        fp, digest = self.dataset.fingerprint()
        spec = self.dataset.spec
        state = make_rank_state(
            fingerprint=fp,
            fingerprint_digest=digest,
            num_streams=spec.num_streams,
            world_size=self.worker_config.world_size,
            rank=self.worker_config.rank,
            origin=self._origin,
            consumed=self._consumed,
            pass_offset=self._pass_offset,
            streams=self._snapshots,
            micro_batch_size=spec.batch_size,
            weight_changes=[c.config() for c in spec.weight_changes],
            edits=spec.edits.to_json() if spec.edits is not None else None,
            errors=self._errors.state(),
            balance_tail=self._balance_tail,
        )
        return json.loads(json.dumps(settled(state)))

    def restore_state_rank(self, state: dict[str, Any] | None) -> None:
        """Continue exactly where ``state`` was saved. Call before iterating."""
        if state is None:
            return
        if self._source is not None:
            raise StateError("restore_state_rank must be called before iterating the loader")
        state = check_state_shape(state)
        unedited = self.dataset.spec
        self._apply_edits(edits_from_json(state.get("edits")))
        fp, digest = self.dataset.fingerprint()
        try:
            check_compatible(state, fp, digest)
        except StateError:
            self.dataset = self.dataset.with_spec(unedited)
            raise
        state = upgrade_state(state, self.dataset.spec.pointer_kinds())
        wc = self.worker_config
        if (state["rank"], state["world_size"]) != (wc.rank, wc.world_size):
            raise StateError(
                f"this state was saved by rank {state['rank']} of {state['world_size']}, but this "
                f"loader is rank {wc.rank} of {wc.world_size}: use restore_state_global(states) or "
                "energon.redistribute_states(states, new_world_size)"
            )
        spec = self._spec_with_streams(state["num_streams"])
        spec = dataclasses.replace(spec, weight_changes=parsed_weight_changes(state))
        try:
            self._check_state_fits(state, spec)
        except StateError:
            self.dataset = self.dataset.with_spec(unedited)
            raise
        # this loader's own copy: other loaders over the same dataset keep their streams
        self.dataset = self.dataset.with_spec(spec)
        self._origin = state["origin"]
        self._consumed = state["consumed"]
        self._pass_offset = state["pass_offset"]
        self._balance_tail = copy.deepcopy(state.get(TAIL_FIELD))
        self._snapshots = copy.deepcopy(stream_snapshots(state))
        self._blend_tracker = self._new_blend_tracker()
        self._errors.restore(state.get("errors"), self._snapshots)

    def _apply_edits(self, edits: PlanEdits | None) -> None:
        """Continue under the cursor edits of the state (skip, exclude, migrate: they change the
        plan, and the state's fingerprint describes the edited configuration)."""
        spec = self.dataset.spec
        if (
            edits is not None
            and edits.sources is not None
            and len(edits.sources) != len(spec.sources)
        ):
            raise StateError(
                f"the state's cursor edits describe {len(edits.sources)} sources, but this "
                f"configuration has {len(spec.sources)}: it belongs to another configuration"
            )
        if edits != spec.edits:
            self.dataset = self.dataset.with_spec(dataclasses.replace(spec, edits=edits))

    def _spec_with_streams(self, num_streams: int) -> Any:
        """The dataset's spec with the state's number of logical streams (not applied yet)."""
        spec = self.dataset.spec
        if num_streams == spec.num_streams:
            return spec
        if spec.num_streams_fixed:
            raise StateError(
                f"the state uses {num_streams} logical streams but num_streams={spec.num_streams} was given"
            )
        samples = sum(len(source) for source in spec.sources)
        limit = max(samples, spec.num_streams, self.worker_config.world_size * MAX_WORKERS)
        if num_streams > limit:
            raise StateError(
                f"loader state field 'num_streams' is {num_streams}, more than this dataset "
                f"({samples} samples) can have (at most {limit}; the state is damaged)"
            )
        spec = dataclasses.replace(spec, num_streams=num_streams)
        if spec.training and spec.repeat and min(spec.stream_sample_counts()) == 0:
            raise StateError(
                f"loader state field 'num_streams' is {num_streams}: more logical streams than "
                f"the {samples} samples of this dataset (the state is damaged or from another "
                "dataset)"
            )
        return spec

    def _check_state_fits(self, state: dict[str, Any], spec: Any) -> None:
        """Every field against this dataset and config: the position against the pass and the
        snapshots, each snapshot's pointer stages by restoring them (no data is read)."""
        probe = self.dataset.with_spec(spec)
        check_position(state, probe.pass_end(), finite=not (spec.training and spec.repeat))
        length = self._pass_length_of(spec)
        if length is not None and state["pass_offset"] > length:
            raise StateError(
                f"loader state field 'pass_offset' is {state['pass_offset']}, beyond the pass of "
                f"{length} batches"
            )
        for stream_id, snap in stream_snapshots(state).items():
            probe.check_snapshot(stream_id, snap)

    def save_state_global(
        self, global_dst_rank: int | None = None, *, dst_rank: int | None = None
    ) -> list | None:
        """Gather every data-parallel rank's state on ``global_dst_rank`` (all ranks must call).

        ``dst_rank`` is accepted as another name for it, since Megatron-Energon's docs use it.
        """
        if global_dst_rank is None:
            global_dst_rank = dst_rank or 0
        state = self.save_state_rank()
        if self.worker_config.world_size == 1:
            return [state]
        import torch.distributed as dist

        group = self.worker_config.data_parallel_group
        gathered = (
            [None] * self.worker_config.world_size if dist.get_rank() == global_dst_rank else None
        )
        dist.gather_object(state, gathered, dst=global_dst_rank, group=group)
        return gathered

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
        wc = self.worker_config
        if src_rank is not None and wc.world_size > 1:
            import torch.distributed as dist

            received = [None]
            scatter = None
            if dist.get_rank() == src_rank:
                scatter = self._states_for_this_world(state)
            dist.scatter_object_list(received, scatter, src=src_rank, group=wc.data_parallel_group)
            self.restore_state_rank(received[0])
            return
        if state is None:
            return
        self.restore_state_rank(self._states_for_this_world(state)[wc.rank])

    def _states_for_this_world(self, states: list) -> list:
        states = [check_state_shape(s) for s in states]
        world = self.worker_config.world_size
        if len(states) == world and all(s["world_size"] == world for s in states):
            return sorted(states, key=lambda s: s["rank"])
        return redistribute_states(states, world)

    # -- blending ----------------------------------------------------------------------------
    @property
    def blend_window(self) -> int:
        """Samples of the global clock per window of :meth:`blend_report` (default 1,000); set it
        before iterating (or right after a restore)."""
        return self._blend_window

    @blend_window.setter
    def blend_window(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"blend_window must be an integer >= 1, got {window!r}")
        if self._source is not None:
            raise ValueError("set blend_window before iterating the loader")
        self._blend_window = window
        self._blend_tracker = self._new_blend_tracker()

    def _new_blend_tracker(self) -> BlendTracker | None:
        """A tracker that counts from the current position (after a restore: the restored one)."""
        spec = self.dataset.spec
        if not spec.training or spec.mode != "weight":
            return None
        tracker = BlendTracker(len(spec.sources), spec.num_streams, self._blend_window)
        for stream, snap in self._snapshots.items():
            tracker.prime(stream, snap)
        return tracker

    def blend_report(self, window: int | None = None) -> BlendReport:
        """Requested against observed share of each source: in total over the samples this rank's
        streams have picked so far (samples waiting in shuffle buffers count as picked) and, for a
        weight blend, per window of the global sample clock: ``window`` samples, a multiple of the
        loader's ``blend_window`` (default: that; the most recent ``MAX_WINDOWS`` of them are
        kept). Iterating the report gives one dict per source."""
        spec = self.dataset.spec
        consumed = [0] * len(spec.sources)
        for snap in self._snapshots.values():
            for i, read in enumerate(snapshot.samples_read(snap)):
                consumed[i] += read
        tracker = self._blend_tracker
        picked, expected = tracker.totals() if tracker is not None else (None, None)
        sizes = picked if tracker is not None and tracker.sized else None
        report = BlendReport(
            sources=source_rows(spec, consumed, expected, sizes),
            windows=tracker.windows() if tracker is not None else [],
            window=self.blend_window,
            streams=sorted(self._rank_streams()),
            num_streams=spec.num_streams,
            changes=[c.config() for c in spec.weight_changes],
            unit=spec.blend_by.unit(),
        )
        return report if window is None else report.merged(window)

    def _rank_streams(self) -> set[int]:
        workers = range(max(1, self.worker_config.num_workers))
        return {s for w in workers for s in self.dataset.layout(w, self._origin).streams()}

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
        if broadcast and self.worker_config.world_size > 1:
            weights, from_step, from_sample = _broadcast(
                [weights, from_step, from_sample], self.worker_config.data_parallel_group
            )
        spec = self.dataset.spec
        if not spec.training or spec.mode != "weight":
            raise ValueError(
                "set_blend_weights needs a training loader over a weight blend ('blend' with at "
                f"least two datasets); this loader's datasets are mixed as {spec.mode!r}"
            )
        position = self._change_position(from_step, from_sample)
        function = None if weights is None else self._flat_weights(weights)
        if function is not None:
            sample = position * (spec.batch_size or 1)
            step = f"step {from_step}: " if from_step is not None else ""
            where = f"set_blend_weights (from {step}micro-batch {position}, global sample {sample})"
            check_blend_streams(spec, function, where, start=sample)
        change = WeightChange(position, function)
        kept = [c for c in spec.weight_changes if c.position != position]
        if change in spec.weight_changes:
            return position
        changes = tuple(sorted([*kept, change], key=lambda c: c.position))
        self.dataset = self.dataset.with_spec(dataclasses.replace(spec, weight_changes=changes))
        if self._source is not None and (self._restart_at is None or position < self._restart_at):
            self._restart_at = position
        return position

    def _change_position(self, from_step: int | None, from_sample: int | None) -> int:
        spec = self.dataset.spec
        micro = spec.batch_size or 1
        if from_step is not None and from_sample is not None:
            raise ValueError("give from_step or from_sample, not both")
        for name, value in (("from_step", from_step), ("from_sample", from_sample)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an integer, got {value!r}")
        boundary = self._consumed_boundary()
        if from_step is not None:
            if spec.global_batch_size is None:
                raise ValueError(
                    "from_step needs the global batch size: pass global_batch_size= to "
                    "get_train_dataset (or set it in the metadataset), or use from_sample="
                )
            from_sample = from_step * spec.global_batch_size
        if from_sample is None:
            return boundary
        if from_sample % micro:
            raise ValueError(
                f"from_sample={from_sample} is not a multiple of the micro-batch size {micro}"
            )
        position = from_sample // micro
        if position < boundary:
            raise ValueError(
                f"the weight change would start at global micro-batch {position} (sample "
                f"{from_sample}), but the ranks have consumed up to micro-batch {boundary} "
                f"(sample {boundary * micro}): a change can only start at or after the next step"
            )
        return position

    def _flat_weights(self, weights: Sequence[Any] | Mapping[str, Any]) -> FlatWeights:
        spec = self.dataset.spec
        names = source_names(spec)
        if isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(names))
            if unknown:
                raise KeyError(f"unknown blend source(s) {unknown}; the sources are {names}")
            if len(set(names)) != len(names):
                raise ValueError(
                    "some sources share a name (the same dataset twice): give a list of weights"
                )
            weights = [weights.get(name, 0.0) for name in names]
        weights = list(weights)
        if len(weights) != len(names):
            raise ValueError(f"{len(weights)} weights given for the blend's {len(names)} sources")
        schedules = []
        for i, weight in enumerate(weights):
            if isinstance(weight, WeightSchedule):
                try:
                    schedules.append(weight.in_samples(spec.global_batch_size))
                except ValueError as e:
                    raise ValueError(f"weight {i}: {e} (pass global_batch_size=...)") from e
            elif isinstance(weight, bool) or not isinstance(weight, int | float) or not weight >= 0:
                raise ValueError(f"weight {i} ({names[i]}) must be a number >= 0, got {weight!r}")
            else:
                schedules.append(WeightSchedule.constant(float(weight)))
        return FlatWeights(tuple(schedules))

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
        return self._monitor.stats(self._errors.report(self._snapshots))

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

    @property
    def recovery(self) -> WorkerRecovery:
        """What happens when a worker dies or is stuck (docs/observability.md): a
        :class:`~energon.loader.recovery.WorkerRecovery`; set it before iterating."""
        return self._recovery.policy

    @recovery.setter
    def recovery(self, policy: WorkerRecovery) -> None:
        if not isinstance(policy, WorkerRecovery):
            raise TypeError(f"recovery must be a WorkerRecovery, got {policy!r}")
        if self._source is not None:
            raise ValueError("set recovery before iterating the loader")
        if policy.on_stall == "skip" and self.worker_config.num_workers == 0:
            warnings.warn(
                "on_stall='skip' needs worker processes (num_workers > 0): without them a stuck "
                "sample can only be reported (the watchdog)",
                UserWarning,
                stacklevel=2,
            )
        self._recovery.policy = policy

    @property
    def workers(self) -> WorkerPoolFactory | None:
        """Who runs the loader's workers: None for local processes (``num_workers`` of the
        worker config), or e.g. :class:`~energon.loader.workers.ray_workers.RayWorkers` for Ray
        actors on a cluster (docs/ray.md). Set it before iterating: the dataset's logical streams
        are then spread over its ``num_workers`` workers, and the batches, their order and the
        saved states are those of as many local workers."""
        return self._workers

    @workers.setter
    def workers(self, workers: WorkerPoolFactory | None) -> None:
        if workers is not None and not isinstance(workers, WorkerPoolFactory):
            raise TypeError(
                f"workers must be None or a worker pool factory such as "
                f"RayWorkers(num_actors=...), got {workers!r}"
            )
        if self._source is not None or self._monitor.board is not None:
            raise ValueError("set workers before iterating the loader")
        if self._local_num_workers is None:
            self._local_num_workers = self.worker_config.num_workers
        count = self._local_num_workers if workers is None else workers.num_workers
        self.dataset = self.dataset.with_num_workers(count)  # this loader's own copy
        self.worker_config = self.dataset.worker_config
        self._monitor.num_workers = count
        self._workers = workers

    def watchdog_reports(self) -> list[str]:
        """The stall reports the watchdog has written (also logged, logger ``energon.watchdog``),
        with those on workers that ``on_stall="skip"`` stopped."""
        return self._monitor.reports()

    def _describe_sample(self, source: int, index: int) -> dict[str, Any]:
        """Key, shard, byte offset and dataset of sample ``index`` of ``source`` (metadata only)."""
        leaf = self.dataset.spec.sources[source].leaf
        meta = SampleMeta(meta_reader(leaf), source, index).describe()
        return {k: meta[k] for k in ("key", "shard", "byte_offset", "dataset") if k in meta}

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
        return self._errors.report(self._snapshots)

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
        if self._workers is not None:
            config["workers"] = self._workers.config()
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


def _broadcast(values: list[Any], group: Any) -> list[Any]:
    """``values`` of the data-parallel group's first rank, on every rank of the group."""
    import torch.distributed as dist

    source = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(values, src=source, group=group)
    return values


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
