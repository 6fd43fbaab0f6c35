"""This rank's account of samples lost to errors: ``loader.error_report()``, the count budgets and
the periodic log line.

The counts live in the streams' snapshots (:mod:`energon.pipeline.error_account`), which travel with
every item and are saved with the loader state, so the report survives save and restore. The loader
calls :meth:`ErrorReport.observe` for every item; it does work only when a stream's failure count
changed. Finished validation passes are folded into a small per-source total (kept in the state as
``errors``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from energon.errors import ErrorBudget, ErrorBudgetExceeded, StateError
from energon.pipeline import snapshot as snapshots_
from energon.pipeline.error_account import add_failures, copy_totals, empty_totals
from energon.pipeline.snapshot import PackedSnapshot, StreamSnapshot
from energon.pipeline.spec import PipelineSpec
from energon.source.meta import SampleMeta, meta_reader

logger = logging.getLogger("energon")


class ErrorReport:
    """Per-source totals of one rank. ``names[i]`` describes source ``i`` (path, split)."""

    def __init__(self, budget: ErrorBudget, names: list[dict[str, Any]]) -> None:
        self.budget = budget
        self.names = names
        self.finished = [empty_totals() for _ in names]  # totals of finished passes
        self._seen: dict[int, int] = {}  # stream -> failures already observed
        self._logged = 0
        self._last_log: float | None = None

    @classmethod
    def for_sources(cls, spec: PipelineSpec) -> ErrorReport:
        """An empty report on the sources of ``spec``, under its error budget."""
        names = [
            {"path": s.leaf.fingerprint()["path"], "split_part": s.leaf.split_part}
            for s in spec.sources
        ]
        return cls(spec.error_budget or ErrorBudget(), names)

    def observe(
        self,
        stream: int,
        snapshot: StreamSnapshot | PackedSnapshot,
        streams: Callable[[], Mapping[int, StreamSnapshot]],
    ) -> None:
        """After an item of ``stream``: check the count budgets and log when failures grew.
        ``streams`` gives every stream's latest snapshot; it is called only then (it may have to
        unpack snapshots that came from workers)."""
        errors = snapshots_.error_state(snapshot)
        failed = errors["failed"] if errors else 0
        if failed == self._seen.get(stream, 0):
            return
        self._seen[stream] = failed
        totals = self.totals(streams())
        self._check_counts(totals)
        self._log(totals)

    def totals(self, streams: Mapping[int, StreamSnapshot]) -> list[dict[str, Any]]:
        """Per source: samples read, skipped, reasons and examples (this pass plus finished ones)."""
        totals = [copy_totals(entry) for entry in self.finished]
        for snap in streams.values():
            for entry, read in zip(totals, snapshots_.samples_read(snap)):
                entry["read"] += read
            errors = snapshots_.error_state(snap)
            for source, failed, _window, reasons, examples in (errors or {}).get("sources", []):
                add_failures(totals[source], failed, reasons, examples)
        return totals

    def report(self, streams: Mapping[int, StreamSnapshot]) -> dict[str, Any]:
        totals = self.totals(streams)
        sources = []
        for name, entry in zip(self.names, totals):
            rate = entry["skipped"] / entry["read"] if entry["read"] else 0.0
            sources.append({**name, **entry, "rate": rate})
        return {
            "skipped": sum(e["skipped"] for e in totals),
            "read": sum(e["read"] for e in totals),
            "sources": sources,
        }

    def finish_pass(self, streams: Mapping[int, StreamSnapshot]) -> None:
        self.finished = self.totals(streams)
        self._seen = {}

    def state(self) -> list[dict[str, Any]] | None:
        """The finished passes' totals (None when there are none)."""
        if not any(e["read"] or e["skipped"] for e in self.finished):
            return None
        return [copy_totals(e) for e in self.finished]

    def restore(self, state: list[dict[str, Any]] | None, streams: Mapping[int, Any]) -> None:
        """Continue from a rank state's ``errors`` (a malformed one is a ``StateError``)."""
        self.finished = [empty_totals() for _ in self.names]
        if state is not None and (not isinstance(state, list) or len(state) != len(self.names)):
            raise StateError(
                f"loader state field 'errors' must list {len(self.names)} sources (it is damaged)"
            )
        try:
            for entry, saved in zip(self.finished, state or []):
                entry["read"] = int(saved["read"])
                add_failures(entry, int(saved["skipped"]), saved["reasons"], saved["examples"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StateError(f"loader state field 'errors' is damaged ({e})") from e
        self._seen = {
            s: (snapshots_.error_state(snap) or {}).get("failed", 0) for s, snap in streams.items()
        }

    # -- budgets and logs ---------------------------------------------------------------------
    def _check_counts(self, totals: list[dict[str, Any]]) -> None:
        budget = self.budget
        for name, entry in zip(self.names, totals):
            if budget.max_skipped is not None and entry["skipped"] > budget.max_skipped:
                raise ErrorBudgetExceeded(
                    f"{_describe(name)}: {entry['skipped']} samples skipped after errors on this "
                    f"rank, more than max_skipped={budget.max_skipped}. {_evidence(entry)}"
                )
        total = sum(e["skipped"] for e in totals)
        if budget.max_total_skipped is not None and total > budget.max_total_skipped:
            worst = max(range(len(totals)), key=lambda i: totals[i]["skipped"])
            raise ErrorBudgetExceeded(
                f"{total} samples skipped after errors on this rank, more than "
                f"max_total_skipped={budget.max_total_skipped}; most from "
                f"{_describe(self.names[worst])}. {_evidence(totals[worst])}"
            )

    def _log(self, totals: list[dict[str, Any]]) -> None:
        interval = self.budget.log_interval_s
        total = sum(e["skipped"] for e in totals)
        if interval is None or total <= self._logged:
            return
        now = time.monotonic()
        if self._last_log is not None and now - self._last_log < interval:
            return
        self._last_log, self._logged = now, total
        parts = [
            f"{_describe(name)}: {e['skipped']} of {e['read']} "
            f"({', '.join(f'{n}x {r}' for r, n in sorted(e['reasons'].items()))})"
            for name, e in zip(self.names, totals)
            if e["skipped"]
        ]
        logger.warning(
            "energon: %d samples skipped after errors so far: %s (loader.error_report() has "
            "examples)",
            total,
            "; ".join(parts),
        )


def describe_sample(spec: PipelineSpec, source: int, index: int) -> dict[str, Any]:
    """Key, shard, byte offset and dataset of sample ``index`` of ``source`` (metadata only): how
    the watchdog's and lost workers' reports name a sample."""
    meta = SampleMeta(meta_reader(spec.sources[source].leaf), source, index).describe()
    return {k: meta[k] for k in ("key", "shard", "byte_offset", "dataset") if k in meta}


def _describe(name: dict[str, Any]) -> str:
    split = name.get("split_part")
    return f"{name['path']}" + (f" (split {split!r})" if split else "")


def _evidence(entry: dict[str, Any]) -> str:
    reasons = ", ".join(f"{n}x {r}" for r, n in sorted(entry["reasons"].items()))
    examples = "; ".join(
        f"sample {e['index']} key {e.get('key')!r} shard {e.get('shard')!r} offset "
        f"{e.get('offset')!r}: {e['error']}"
        for e in entry["examples"]
    )
    return f"Reasons: {reasons}. Examples: {examples}"
