"""Samples lost to errors in one logical stream, per source dataset: counted, explained with a few
examples, and checked against the :class:`~energon.errors.ErrorBudget`.

Every stage's :class:`~energon.errors.ErrorPolicy` reports the restore keys of the samples it lost;
the account resolves them to ``(source, index)`` pointers and counts them. A source whose failures
exceed ``max_rate`` of a window of ``window`` samples this stream read from it, the stream's sources
together beyond ``max_total_rate``, or a source of which every sample a finished stream read failed,
stop the run with :class:`~energon.errors.ErrorBudgetExceeded` naming the source. Samples read come
from the stream's readers (``reads(source)``), so the account only stores what failed.

Samples on which a loader worker died (:mod:`energon.loader.recovery`) are *lost samples*: the
main process adds them to the stream's account as pending (``skip``), and the stream skips each where
it meets it again (:meth:`ErrorAccount.skip_lost`), counting it as a failure
(:class:`~energon.errors.WorkerLostError`) and keeping it in a short history (``lost``) that the ledger
and ``energon checkpoint info`` read.

Its state is part of the stream's snapshot (:mod:`energon.pipeline.snapshot`) and so of the loader
state: plain data, ``None`` while nothing failed, at most :data:`MAX_REASONS` reasons and
:data:`MAX_EXAMPLES` examples per source. The success path costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from energon.errors import ErrorBudget, ErrorBudgetExceeded, StateError, WorkerLostError
from energon.pipeline.keys import as_key, pointer_target, pointers_of

MAX_REASONS = 8  # distinct exception types per source; more are counted as "other"
MAX_EXAMPLES = 3  # example failures kept per source and stream
MAX_MESSAGE = 300  # characters of an example's error message
MAX_LOST = 100  # lost samples kept in a stream's history (the oldest go first)
LOST_FIELDS = ("source", "index", "key", "error")  # a lost sample; the history adds "failed_before"


@dataclasses.dataclass
class _Window:
    """Failures within the current window of ``window`` samples read."""

    index: int = -1
    failed: int = 0

    def add(self, reads: int, window: int) -> int:
        """Count one failure while ``reads`` samples have been read; the window's failures."""
        index = max(reads - 1, 0) // window
        if index != self.index:
            self.index, self.failed = index, 0
        self.failed += 1
        return self.failed


@dataclasses.dataclass
class _SourceErrors:
    failed: int = 0
    window: _Window = dataclasses.field(default_factory=_Window)
    reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def state(self, source: int) -> list[Any]:
        return [
            source,
            self.failed,
            [self.window.index, self.window.failed],
            dict(self.reasons),
            [dict(e) for e in self.examples],
        ]


class ErrorAccount:
    """The lost samples of one stream. ``leaves[i]`` is source ``i``'s leaf dataset (for names and
    locations), ``reads(i)`` how many samples the stream has read from it so far."""

    def __init__(
        self, budget: ErrorBudget, leaves: Sequence[Any], reads: Callable[[int], int]
    ) -> None:
        self.budget = budget
        self.leaves = leaves
        self.reads = reads
        self.failed_total = 0
        self._window = _Window()
        self._sources: dict[int, _SourceErrors] = {}
        # lost samples to skip when the stream meets them (a stage holds this very list: it is
        # only ever changed in place), and those skipped so far
        self.lost_pending: list[dict[str, Any]] = []
        self.lost_history: list[dict[str, Any]] = []
        self._state: dict[str, Any] | None = None  # cached: snapshots share it until a change

    # -- counting -------------------------------------------------------------------------------
    def reads_now(self) -> tuple[int, ...]:
        """Samples read so far per source: a stage that reads ahead and reports a failure later
        passes this, taken when it read the sample, to :meth:`failed`."""
        return tuple(self.reads(source) for source in range(len(self.leaves)))

    def failed(
        self,
        keys: Sequence[Any],
        exc: BaseException,
        sample: Any,
        reads: Sequence[int] | None = None,
    ) -> None:
        """The samples named by ``keys`` were lost to ``exc`` (``sample``: the input, if one).
        ``reads`` (from :meth:`reads_now`) stands for the current reads when given."""
        reads_of = self.reads if reads is None else reads.__getitem__
        pointers = [p for key in keys for p in pointers_of(as_key(key))]
        for pointer in pointers:
            source, index = pointer_target(pointer)
            errors = self._sources.setdefault(source, _SourceErrors())
            errors.failed += 1
            reason = type(exc).__name__
            if reason not in errors.reasons and len(errors.reasons) >= MAX_REASONS:
                reason = "other"
            errors.reasons[reason] = errors.reasons.get(reason, 0) + 1
            if len(errors.examples) < MAX_EXAMPLES:
                errors.examples.append(
                    self._example(source, index, exc, sample if len(pointers) == 1 else None)
                )
            self.failed_total += 1
            self._state = None
            in_window = errors.window.add(reads_of(source), self.budget.window)
            if self.budget.max_rate < 1 and in_window > self.budget.max_rate * self.budget.window:
                raise ErrorBudgetExceeded(
                    f"{self._name(source)}: {in_window} of a window of {self.budget.window} "
                    f"samples failed (more than max_rate={self.budget.max_rate}): the source is "
                    f"mostly broken. {self._evidence(errors, exc)}"
                ) from exc
            total_reads = sum(reads_of(s) for s in range(len(self.leaves)))
            in_window = self._window.add(total_reads, self.budget.window)
            if (
                self.budget.max_total_rate < 1
                and in_window > self.budget.max_total_rate * self.budget.window
            ):
                raise ErrorBudgetExceeded(
                    f"{in_window} of a window of {self.budget.window} samples of all sources "
                    f"failed (more than max_total_rate={self.budget.max_total_rate}); the last "
                    f"from {self._name(source)}. {self._evidence(errors, exc)}"
                ) from exc

    def skip_lost(self, key: Any, source: int, index: int) -> bool:
        """Whether sample ``index`` of ``source`` (pointer ``key``) is a pending lost sample; if so
        it is counted as failed (:class:`WorkerLostError`, against the budget) and moved to the
        history. Call it only while :attr:`lost_pending` is not empty."""
        for i, entry in enumerate(self.lost_pending):
            if entry["source"] == source and entry["index"] == index:
                del self.lost_pending[i]
                self.lost_history.append({**entry, "failed_before": self.failed_total})
                del self.lost_history[:-MAX_LOST]
                self._state = None
                self.failed([key], WorkerLostError(entry["error"]), {"__key__": entry["key"]})
                return True
        return False

    def finish(self) -> None:
        """The stream ended: a source of which every sample read here failed is a fatal error."""
        for source, errors in self._sources.items():
            reads = self.reads(source)
            if reads and errors.failed >= reads:
                raise ErrorBudgetExceeded(
                    f"{self._name(source)}: all {reads} samples this stream read from it failed: "
                    f"the source fails completely. {self._evidence(errors, None)}"
                )

    def _example(self, source: int, index: int, exc: BaseException, sample: Any) -> dict[str, Any]:
        location = getattr(self.leaves[source], "sample_location", None)
        where = _safe_location(location, index) if location is not None else {}
        key = (
            sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
        )
        return {
            "key": key if isinstance(key, str) else None,
            "index": index,
            "shard": where.get("shard"),
            "offset": where.get("offset"),
            **{name: where[name] for name in ("row_group", "row") if name in where},
            "error": f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE],
        }

    def _name(self, source: int) -> str:
        leaf = self.leaves[source]
        split = getattr(leaf, "split_part", "")
        return f"source {source} ({leaf.root}{f', split {split!r}' if split else ''})"

    def _evidence(self, errors: _SourceErrors, exc: BaseException | None) -> str:
        reasons = ", ".join(f"{n}x {r}" for r, n in sorted(errors.reasons.items()))
        examples = "; ".join(_describe(e) for e in errors.examples)
        last = f" Last error: {type(exc).__name__}: {exc}." if exc is not None else ""
        return f"Reasons: {reasons}. Examples: {examples}.{last}"

    # -- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any] | None:
        """Plain data (None while nothing failed or was lost); treat it as read-only."""
        if not (self.failed_total or self.lost_pending or self.lost_history):
            return None
        if self._state is None:
            self._state = {
                "failed": self.failed_total,
                "window": [self._window.index, self._window.failed],
                "sources": [e.state(s) for s, e in sorted(self._sources.items())],
            }
            if self.lost_pending or self.lost_history:
                self._state["skip"] = [dict(e) for e in self.lost_pending]
                self._state["lost"] = [dict(e) for e in self.lost_history]
        return self._state

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue from a saved account; a malformed one is a ``StateError`` naming the field."""
        self._sources = {}
        self._window = _Window()
        self.failed_total = 0
        self.lost_pending[:] = []
        self.lost_history[:] = []
        self._state = None
        if not state:
            return
        try:
            self.lost_pending[:] = _lost_entries(state.get("skip", []), len(self.leaves), False)
            self.lost_history[:] = _lost_entries(state.get("lost", []), len(self.leaves), True)
            self.failed_total = _count(state["failed"])
            self._window = _Window(*_pair(state["window"]))
            for source, failed, window, reasons, examples in state["sources"]:
                if not (isinstance(source, int) and 0 <= source < len(self.leaves)):
                    raise ValueError(f"source {source!r} of {len(self.leaves)}")
                if len(reasons) > MAX_REASONS + 1 or len(examples) > MAX_EXAMPLES:
                    raise ValueError("more reasons or examples than an account keeps")
                self._sources[source] = _SourceErrors(
                    _count(failed),
                    _Window(*_pair(window)),
                    {str(r): _count(n) for r, n in reasons.items()},
                    [dict(e) for e in examples],
                )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StateError(f"loader state: a stream's 'errors' account is damaged ({e})") from e


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"bad count {value!r}")
    return value


def _lost_entries(entries: Any, num_sources: int, history: bool) -> list[dict[str, Any]]:
    """Lost samples of a saved account, checked (a ``ValueError`` names what is wrong)."""
    if not isinstance(entries, list) or len(entries) > MAX_LOST:
        raise ValueError(f"lost samples {entries!r:.80}")
    fields = LOST_FIELDS + (("failed_before",) if history else ())
    checked = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != set(fields):
            raise ValueError(f"lost sample {entry!r:.80} (fields {', '.join(fields)})")
        if not (isinstance(entry["source"], int) and 0 <= entry["source"] < num_sources):
            raise ValueError(f"lost sample of source {entry['source']!r} of {num_sources}")
        _count(entry["index"])
        if history:
            _count(entry["failed_before"])
        checked.append({name: entry[name] for name in fields})
    return checked


def lost_sample_entry(source: int, index: int, key: str | None, error: str) -> dict[str, Any]:
    """A lost sample for an account's pending list (:func:`with_lost_sample`)."""
    return {"source": source, "index": index, "key": key, "error": error[:MAX_MESSAGE]}


def with_lost_sample(account: dict[str, Any] | None, entry: dict[str, Any]) -> dict[str, Any]:
    """A copy of a saved account (None: a clean one) in which ``entry`` is a pending lost sample:
    the stream skips it where it meets it (what the main process gives a replaced worker)."""
    updated = dict(account) if account else {"failed": 0, "window": [-1, 0], "sources": []}
    updated["skip"] = [*updated.get("skip", []), dict(entry)]
    updated.setdefault("lost", [])
    return updated


def knows_lost_sample(account: dict[str, Any] | None, error: str) -> bool:
    """Whether a saved account holds the lost sample whose error message is ``error`` (pending,
    or already skipped)."""
    if not account:
        return False
    return any(
        e.get("error") == error for e in (*account.get("skip", ()), *account.get("lost", ()))
    )


def _pair(value: Any) -> tuple[int, int]:
    index, failed = value
    if not isinstance(index, int) or index < -1:
        raise ValueError(f"bad window {value!r}")
    return index, _count(failed)


def _safe_location(location: Callable[[int], dict[str, Any]], index: int) -> dict[str, Any]:
    """Where sample ``index`` lies; a damaged index must not turn an example into a crash."""
    try:
        return location(index)
    except Exception:
        return {}


def _describe(example: dict[str, Any]) -> str:
    where = ", ".join(
        f"{name} {example[name]!r}"
        for name in ("key", "shard", "offset", "row_group", "row")
        if example.get(name) is not None
    )
    return f"sample {example['index']}" + (f" ({where})" if where else "")


# -- per-source totals (a rank's report, finished passes in the loader state) -----------------------


def empty_totals() -> dict[str, Any]:
    """One source's totals: samples read, skipped, reasons (type -> count) and a few examples."""
    return {"read": 0, "skipped": 0, "reasons": {}, "examples": []}


def copy_totals(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "read": entry["read"],
        "skipped": entry["skipped"],
        "reasons": dict(entry["reasons"]),
        "examples": [dict(e) for e in entry["examples"]],
    }


def add_failures(entry: dict[str, Any], failed: int, reasons: dict, examples: list) -> None:
    """Add failures (with their reasons and examples, kept to :data:`MAX_EXAMPLES`) to totals."""
    entry["skipped"] += int(failed)
    for reason, count in reasons.items():
        entry["reasons"][reason] = entry["reasons"].get(reason, 0) + int(count)
    room = MAX_EXAMPLES - len(entry["examples"])
    entry["examples"] += [dict(e) for e in examples[: max(0, room)]]


def account_totals(account: dict[str, Any], num_sources: int) -> list[dict[str, Any]]:
    """A stream's account (:meth:`ErrorAccount.state`) as per-source totals (no reads: those are
    counted from the streams' readers), so that accounts can be added up into totals."""
    totals = [empty_totals() for _ in range(num_sources)]
    try:
        for source, failed, _window, reasons, examples in account["sources"]:
            if not (isinstance(source, int) and 0 <= source < num_sources):
                raise ValueError(f"source {source!r} of {num_sources}")
            add_failures(totals[source], _count(failed), dict(reasons), list(examples))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StateError(f"loader state: a stream's 'errors' account is damaged ({e})") from e
    return totals


def merge_totals(lists: list[list[dict[str, Any]] | None]) -> list[dict[str, Any]] | None:
    """Per-source totals of several ranks added up (None when none has any)."""
    present = [totals for totals in lists if totals]
    if not present:
        return None
    merged = [empty_totals() for _ in present[0]]
    for totals in present:
        for entry, other in zip(merged, totals):
            entry["read"] += int(other["read"])
            add_failures(entry, other["skipped"], other["reasons"], other["examples"])
    return merged
