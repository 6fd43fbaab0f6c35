"""Lost workers: replaced at their exact position, the sample they died on skipped, within budgets.

A worker (a process here; an actor elsewhere) runs some of a rank's logical streams and holds
nothing that cannot be rebuilt: every item it sent carried its stream's snapshot. When one is lost
(it died: a signal, ``os._exit``, the OOM killer; or it was stopped for being stuck,
``on_stall="skip"``), the loader

1. **detects** it: the worker pool reports it gone (:class:`WorkerGone`), at once for a process
   (its pipe and its exit are watched while the main process waits for it), or the stall check
   (:mod:`energon.observe.stall`) finds it stuck past the deadline and stops it;
2. **names** the sample it was on: every worker publishes what it is working on in its slot of the
   stats board (shared memory that outlives the process: the global position of the micro-batch
   it makes, and so its logical stream; the sample's source and index; the stage), written before
   each sample;
3. **decides** (:class:`Recovery`): a lost worker is replaced unless recovery is off or a budget is
   spent (losses per pass, per source, and in a row at the same place), which raises one
   :class:`~energon.errors.WorkerRecoveryError` listing every loss of the pass; the sample is a
   failure of the error policy (the dataset's error handler sees a
   :class:`~energon.errors.WorkerLostError`: the default logs it, a raising handler raises);
4. **rebuilds**: the replacement resumes the worker's streams from the last snapshots the worker
   delivered, with the sample added to its stream's *pending lost samples* (part of the stream's
   error account, :mod:`energon.pipeline.error_account`): the stream skips it where it meets it,
   counts it against the error budget and keeps it in its history. The main process adds the same
   entry to the snapshots it holds, so a state saved during or right after the recovery restores to
   the same continuation.

The order of everything else is untouched: the training loop sees the batches of an uninterrupted
run, minus that one sample. :class:`Recovery` knows nothing of processes; a pool of another kind
(Ray actors) reports :class:`WorkerGone` and reuses it, with :mod:`energon.loader.workers.results`.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from typing import Any

from energon.errors import ErrorHandler, WorkerLostError, WorkerRecoveryError, log_exception
from energon.observe.stall import PER
from energon.pipeline.error_account import lost_sample_entry
from energon.samples.source_info import SourceInfo

logger = logging.getLogger("energon.recovery")
ON_STALL = ("report", "skip")
# stages in which the sample on the board is the one being handled (elsewhere a worker is between
# samples: waiting, planning, or sending a finished item)
SAMPLE_STAGES = ("read", "decode", "encode", "batch")


@dataclasses.dataclass(frozen=True)
class WorkerRecovery:
    """What a loader does when one of its workers is lost (docs/observability.md).

    ``replace``: a worker that dies is replaced at its exact position and the sample it died on is
    skipped (False: the pass ends with :class:`~energon.errors.WorkerRecoveryError` naming the
    sample). ``on_stall``: ``"report"`` leaves stuck workers to the watchdog; ``"skip"`` stops a
    worker stuck longer than ``stall_timeout_seconds`` on one sample (``stall_timeout_per=
    "sample"``) or one micro-batch (``"batch"``), writes the watchdog's report on it and replaces
    it as if it had died. Budgets (None: none): ``max_restarts_per_pass`` losses in one pass of the
    loader, ``max_restarts_per_source`` losses on samples of one source dataset, and
    ``max_restarts_in_a_row`` losses of one worker in a row that its replacements do not get past
    (each dies on the same micro-batch or an earlier one: the cause is not the sample skipped).
    Going over raises one error that lists what happened. A sample is skipped where the worker
    died on it; when a stream meets it again (a later epoch) it is tried again, and a loss on it
    then is not counted against the budgets a second time.
    """

    replace: bool = True
    on_stall: str = "report"
    stall_timeout_seconds: float = 300.0
    stall_timeout_per: str = "sample"
    max_restarts_per_pass: int | None = 10
    max_restarts_per_source: int | None = 3
    max_restarts_in_a_row: int | None = 2

    def __post_init__(self) -> None:
        if self.on_stall not in ON_STALL:
            raise ValueError(f"on_stall must be one of {ON_STALL}, got {self.on_stall!r}")
        if self.stall_timeout_per not in PER:
            raise ValueError(
                f"stall_timeout_per must be one of {PER}, got {self.stall_timeout_per!r}"
            )
        if not self.stall_timeout_seconds > 0:
            raise ValueError(
                f"stall_timeout_seconds must be > 0, got {self.stall_timeout_seconds!r}"
            )
        for name in ("max_restarts_per_pass", "max_restarts_per_source", "max_restarts_in_a_row"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an integer or None, got {value!r}")
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")


@dataclasses.dataclass(frozen=True)
class WorkerGone:
    """A pool's report of a lost worker: its number, who it was (``"worker 1 (pid 4242)"``), why
    it ended (``"was killed by signal SIGKILL"``) and its process id (None for other kinds)."""

    worker: int
    who: str
    cause: str
    pid: int | None = None


@dataclasses.dataclass
class WorkerLoss:
    """One loss, as :meth:`Loader.worker_losses` lists it."""

    worker: int
    who: str
    cause: str
    position: int | None  # the global micro-batch position it was making
    stream: int | None  # ... of this logical stream
    sample: dict[str, Any] | None  # source, index, key, shard, byte_offset, dataset
    action: str = ""
    again: bool = False  # a worker was lost on this sample before (an earlier epoch)

    def line(self) -> str:
        where = (
            f" making micro-batch {self.position} (logical stream {self.stream})"
            if self.position is not None
            else ""
        )
        sample = f", on sample {_sample_text(self.sample)}" if self.sample else ""
        return f"{self.who} {self.cause}{where}{sample}: {self.action}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LostSample:
    """The sample to skip after a loss: its stream and its pending entry (error account)."""

    stream: int
    entry: dict[str, Any]


class Recovery:
    """Decides on lost workers for one loader and keeps their record (see the module docstring).

    ``num_streams``: the logical streams (a position's stream); ``describe(source, index)`` gives
    a sample's key, shard, byte offset and dataset (metadata only); ``handler`` is the dataset's
    error handler (it sees each lost sample)."""

    def __init__(
        self,
        policy: WorkerRecovery,
        num_streams: int,
        describe: Callable[[int, int], dict[str, Any]],
        handler: ErrorHandler | None = None,
    ) -> None:
        self.policy = policy
        self.num_streams = num_streams
        self.describe = describe
        self.handler = handler or log_exception
        self.losses: list[WorkerLoss] = []  # every loss of this loader
        self._pass: list[WorkerLoss] = []  # the losses of the current pass
        self._samples: set[tuple[int, int]] = set()  # (source, index) lost on so far
        # worker -> (losses in a row, the furthest position among them: None where unknown)
        self._in_a_row: dict[int, tuple[int, int | None]] = {}

    def set_policy(self, policy: WorkerRecovery, *, started: bool, num_workers: int) -> None:
        """``loader.recovery = policy`` (``started``: the loader is iterating, too late)."""
        if not isinstance(policy, WorkerRecovery):
            raise TypeError(f"recovery must be a WorkerRecovery, got {policy!r}")
        if started:
            raise ValueError("set recovery before iterating the loader")
        if policy.on_stall == "skip" and num_workers == 0:
            warnings.warn(
                "on_stall='skip' needs worker processes (num_workers > 0): without them a stuck "
                "sample can only be reported (the watchdog)",
                UserWarning,
                stacklevel=3,
            )
        self.policy = policy

    def new_pass(self) -> None:
        self._pass = []
        self._in_a_row = {}

    def lost(
        self, gone: WorkerGone, slot: dict[str, Any] | None, why: str = ""
    ) -> LostSample | None:
        """Record a lost worker and decide. Returns the sample to skip (None: the worker was not
        on a sample); raises :class:`WorkerRecoveryError` when the worker is not to be replaced.
        ``slot``: the worker's board slot (``probe_state``); ``why``: overrides ``gone.cause``
        (a worker the stall policy stopped)."""
        position, target = _culprit(slot, gone.pid)
        stream = position % self.num_streams if position is not None else None
        sample = self._sample(*target) if target is not None else None
        loss = WorkerLoss(gone.worker, gone.who, why or gone.cause, position, stream, sample)
        if target is not None:
            loss.again = target in self._samples
            self._samples.add(target)
        self.losses.append(loss)
        self._pass.append(loss)
        self._count_in_a_row(gone.worker, position)
        refusal = self._refusal(loss)
        if refusal is not None:
            loss.action = f"not replaced: {refusal}"
            logger.error("energon: %s", loss.line())
            raise WorkerRecoveryError(self._history(refusal))
        lost = None
        if stream is not None and target is not None:
            error = f"{gone.who} {loss.cause} while handling this sample (logical stream {stream})"
            self.handler(WorkerLostError(error), None, [_source_info(sample)])
            lost = LostSample(stream, lost_sample_entry(*target, sample.get("key"), error))
        loss.action = "replaced; sample skipped" if lost is not None else "replaced"
        logger.warning("energon: %s", loss.line())
        return lost

    def _count_in_a_row(self, worker: int, position: int | None) -> None:
        """A loss is in a row with the worker's previous ones unless it happened further on
        (its replacement got past the place where they were lost)."""
        count, furthest = self._in_a_row.get(worker, (0, None))
        if position is not None and furthest is not None and position > furthest:
            count = 0
        if position is not None and (furthest is None or position > furthest):
            furthest = position
        self._in_a_row[worker] = (count + 1, furthest)

    def _sample(self, source: int, index: int) -> dict[str, Any]:
        try:
            described = self.describe(source, index)
        except Exception as e:  # naming must not fail because metadata does
            described = {"error": f"{type(e).__name__}: {e}"}
        return {"source": source, "index": index, **described}

    def _refusal(self, loss: WorkerLoss) -> str | None:
        """Why this loss may not be recovered (None: it may)."""
        policy = self.policy
        if not policy.replace:
            return "recovery is off (WorkerRecovery(replace=False))"
        in_a_row = self._in_a_row[loss.worker][0]
        if policy.max_restarts_in_a_row is not None and in_a_row > policy.max_restarts_in_a_row:
            return (
                f"lost {in_a_row} times in a row at the same place, more than "
                f"max_restarts_in_a_row={policy.max_restarts_in_a_row}"
            )
        # a sample met again (in a later epoch) is the same cause: it does not count again
        charged = [x for x in self._pass if not x.again]
        limit = policy.max_restarts_per_pass
        if limit is not None and len(charged) > limit:
            return (
                f"{len(charged)} workers lost in this pass, more than max_restarts_per_pass={limit}"
            )
        source = loss.sample["source"] if loss.sample else None
        same = [x for x in charged if x.sample and x.sample["source"] == source]
        limit = policy.max_restarts_per_source
        if source is not None and limit is not None and len(same) > limit:
            return (
                f"{len(same)} workers lost on samples of source {source} "
                f"({loss.sample.get('dataset')}) in this pass, more than "
                f"max_restarts_per_source={limit}"
            )
        return None

    def _history(self, refusal: str) -> str:
        lines = [f"energon: a lost loader worker is not replaced: {refusal}. Losses of this pass:"]
        lines += [f"  {i + 1}. {loss.line()}" for i, loss in enumerate(self._pass)]
        return "\n".join(lines)


def _culprit(
    slot: dict[str, Any] | None, pid: int | None
) -> tuple[int | None, tuple[int, int] | None]:
    """(position, (source, index)) the lost process was on, from its board slot; None where it
    was not on one (the slot is another process's, or it was between samples)."""
    if slot is None or (pid is not None and slot.get("pid") != pid):
        return None, None
    position = slot["position"] if slot.get("position", -1) >= 0 else None
    if slot["stage"] not in SAMPLE_STAGES or slot["index"] < 0:
        return position, None
    return position, (slot["source"], slot["index"])


def _sample_text(sample: dict[str, Any]) -> str:
    fields = ", ".join(
        f"{name} {sample[name]!r}"
        for name in ("key", "shard", "byte_offset", "dataset", "error")
        if sample.get(name) is not None
    )
    return f"source {sample['source']} index {sample['index']} ({fields})"


def _source_info(sample: dict[str, Any]) -> SourceInfo:
    """What the error handler is told about the lost sample's origin."""
    return SourceInfo(
        dataset_path=sample.get("dataset"),
        index=sample["index"],
        shard_name=sample.get("shard") or "?",
        file_names=(),
    )
