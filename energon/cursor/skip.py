"""Skip steps: a state that resumes N steps later, as if those batches had been consumed.

Every stream is moved, in simulation (no data read), to the item it would be at after the
skipped positions (the ledger's machinery: the same stages over metadata, the pointer stages in C),
and the new states continue there. The skipped positions are recorded in the state's edit history,
so the ledger shows them as skipped, not seen. Where the simulation cannot know what a hook does
(it decides from decoded data), ``read_data=True`` runs the real streams instead: exact, but it
reads the skipped samples.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tqdm import tqdm

from energon import arguments
from energon.cursor.savepoint import merge_states, upgraded
from energon.errors import NotSimulableError
from energon.ledger.exposure import items_below
from energon.ledger.ledger import Ledger, StreamWalker, training_spec
from energon.pipeline.spec import fingerprint_digest
from energon.pipeline.stream import build_stream
from energon.plan.edits import PlanEdits


@dataclasses.dataclass
class SkipReport:
    """What a skip did: positions ``[start, end)`` are now consumed; ``skipped`` lists the ranges
    that nobody had consumed (what the history records)."""

    start: int
    end: int
    skipped: list[tuple[int, int]]
    read_data: bool

    def lines(self) -> list[str]:
        total = sum(b - a for a, b in self.skipped)
        how = "reading the skipped samples" if self.read_data else "without reading data"
        if self.end == self.start:
            return [f"nothing skipped (0 steps); training resumes at position {self.end}"]
        return [
            f"skipped global micro-batch positions {self.start}..{self.end - 1} "
            f"({total} micro-batches, {how}); training resumes at position {self.end}"
        ]


def skip_steps(
    states: list[dict[str, Any]],
    steps: int,
    *,
    dataset: Any = None,
    micro_batches_per_step: int = 1,
    read_data: bool = False,
    progress: bool = False,
) -> tuple[list[dict[str, Any]], SkipReport]:
    """States (one per rank, same world size) that resume ``steps`` steps later.

    ``dataset``: the training dataset of the configuration (``get_train_dataset``); by default it
    is rebuilt from the state (:mod:`energon.cursor.rebuild`).
    """
    arguments.integer(steps, "steps", low=0)
    arguments.integer(micro_batches_per_step, "micro_batches_per_step", low=1)
    point = merge_states(states)
    if dataset is None:
        from energon.cursor.rebuild import dataset_from_state

        dataset = dataset_from_state(point.state)
    training_spec(dataset)
    point = upgraded(point, dataset.spec.pointer_kinds())
    ledger = Ledger(dataset, states=[point.state], micro_batches_per_step=micro_batches_per_step)
    L = ledger.num_streams
    end = point.position + steps * point.world_size * micro_batches_per_step
    snapshots = dict(point.snapshots)
    consumed = []  # positions in [start, end) read by ranks that were ahead when saving
    with tqdm(range(L), desc="Skipping", unit="stream", disable=not progress) as bar:
        for stream in bar:
            target = items_below(end, stream, L)
            emitted = point.emitted(stream)
            first = items_below(point.position, stream, L)
            consumed += [i * L + stream for i in range(first, min(emitted, target))]
            if emitted < target:
                snapshots[stream] = _moved(
                    ledger, point.snapshots.get(stream), stream, target, read_data
                )
    skipped = _without(point.position, end, sorted(consumed))
    edits = point.edits or PlanEdits()
    for a, b in skipped:
        edits = edits.with_history({"edit": "skip", "start": a, "end": b})
    spec = dataclasses.replace(ledger.spec, edits=edits)
    fingerprint = spec.fingerprint()
    new_states = point.rank_states(
        snapshots=snapshots,
        edits=edits,
        fingerprint=fingerprint,
        digest=fingerprint_digest(fingerprint),
        position=end,
    )
    return new_states, SkipReport(point.position, end, skipped, read_data)


def _moved(ledger: Ledger, saved: Any, stream: int, target: int, read_data: bool) -> Any:
    """The snapshot of ``stream`` after item ``target - 1``, from its ``saved`` snapshot."""
    walker = StreamWalker(ledger, stream)
    try:
        walker.advance_to(target)
        assert walker.sim is not None
        return walker.sim.snapshot()
    except NotSimulableError:
        if not read_data:
            raise
    real = build_stream(ledger.spec, stream)
    if saved is not None:
        real.restore(saved)
    while real.emitted < target:
        real.next()
    return real.state()


def _without(start: int, end: int, holes: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` minus the sorted positions ``holes``, as ranges."""
    ranges, cursor = [], start
    for hole in holes:
        if hole > cursor:
            ranges.append((cursor, hole))
        cursor = max(cursor, hole + 1)
    if end > cursor:
        ranges.append((cursor, end))
    return ranges
