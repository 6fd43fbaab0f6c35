"""The ledger: the micro-batches of any training step, described without reading data.

Global micro-batch ``m`` is item ``m // L`` of logical stream ``m % L``; with ``R`` data-parallel
ranks and ``A`` micro-batches per step (gradient accumulation), rank ``r``'s ``k``-th micro-batch of
step ``N`` is ``m = (N * A + k) * R + r``. To describe it the ledger moves a simulated copy of stream
``m % L`` (:mod:`energon.ledger.simulate`) to item ``m // L``, starting from the latest snapshot of
that stream it was given (saved states) at or before the item, or from the beginning, and applying
the cursor edits of the states' history on the way (:mod:`energon.ledger.timeline`). Only the
streams of the asked positions are moved, and they jump (:mod:`energon.ledger.advance`).

A record names every sample of the micro-batch: key, dataset, split, shard, byte offset, epoch,
subflavors, grouped by output (a packed sample lists its members). Steps recorded in a journal
(:mod:`energon.loader.journal`) are taken from it instead (``origin: "journal"``): that is what the
loader delivered, whatever the hooks did.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from energon import arguments
from energon.balance.tail import TAIL_FIELD
from energon.errors import ArgumentError, ArgumentTypeError, StateError
from energon.ledger.advance import Counts, SimulatedStream
from energon.ledger.simulate import assumptions, simulated_spec
from energon.ledger.timeline import Segment, segment_at, timeline
from energon.loader.journal import JournalReader, sources_digest
from energon.pipeline import snapshot as snapshots
from energon.pipeline.keys import (
    Key,
    outputs_of,
    pointer_parts,
    pointer_target,
    pointers_in,
    stream_key,
)
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec, fingerprint_digest
from energon.plan.edits import PlanEdits, edits_from_json
from energon.plan.schedules import WeightChange
from energon.source.meta import SampleMeta, meta_reader
from energon.state import (
    check_state_shape,
    fingerprint_differences,
    parsed_weight_changes,
    rank_next_position,
    stream_snapshots,
    weight_changes,
)


@dataclasses.dataclass
class SampleRecord:
    """One sample of a micro-batch, as the dataset's metadata describes it."""

    key: str | None
    dataset: str
    split: str
    shard: str
    byte_offset: int | None
    index: int  # in the dataset split (the leaf)
    source: int  # the source number in the configuration
    epoch: int | None  # of the stream's reader of that source; None where it cannot be known
    subflavors: dict[str, Any]
    row_group: int | None = None  # Parquet/Arrow: the row group in the file (shard) ...
    row: int | None = None  # ... and the row in the file
    # the part of the sample this output holds, [start, stop) in the packer's units (stop None:
    # to its end), where packing split it across packs; None: the whole sample
    part: list[int | None] | None = None


@dataclasses.dataclass
class MicroBatchRecord:
    """One micro-batch of one rank: which samples it held, output by output."""

    step: int | None
    rank: int | None
    micro_batch: int | None  # the rank's k-th micro-batch of the step
    position: int  # global micro-batch position
    stream: int
    item: int  # item number in its logical stream
    status: str  # "seen", or "skipped" (a cursor edit skipped it: never trained on)
    origin: str  # "simulated" (from the plan) or "journal" (recorded by the loader)
    restore_key: Key  # the loader's __restore_key__ of the micro-batch
    outputs: list[list[SampleRecord]]  # per output (sample or packed sample): its samples
    # samples that cursor edits excluded and that were dropped while making this micro-batch
    excluded: list[SampleRecord] = dataclasses.field(default_factory=list)
    # samples on which the loader lost a worker, skipped while making this micro-batch
    lost: list[SampleRecord] = dataclasses.field(default_factory=list)

    @property
    def samples(self) -> list[SampleRecord]:
        return [s for output in self.outputs for s in output]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["restore_key"] = _json_key(self.restore_key)
        return data


def _json_key(key: Any) -> Any:
    return [_json_key(k) for k in key] if isinstance(key, tuple) else key


class Ledger:
    """Describes the micro-batches of training steps of one configuration (see module docstring).

    ``dataset`` is what ``get_train_dataset`` returns for the configuration (its worker config
    gives the world size). ``states`` are saved loader states (any ranks, any save points) to start
    from; their cursor edits are applied. ``journal`` is a directory the loader wrote with
    ``start_journal``. ``micro_batches_per_step`` is the gradient-accumulation factor. What the
    simulation assumes is in :attr:`assumptions`; ``strict=True`` assumes nothing about the user's
    hooks (they raise :class:`~energon.errors.NotSimulableError` unless a journal covers the step).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        states: Sequence[dict[str, Any]] = (),
        journal: str | None = None,
        micro_batches_per_step: int = 1,
        native: bool = True,
        strict: bool = False,
    ) -> None:
        spec = training_spec(dataset)
        arguments.integer(micro_batches_per_step, "micro_batches_per_step", low=1)
        self.world_size = dataset.worker_config.world_size
        self.micro_batches_per_step = micro_batches_per_step
        self.native = native
        self.strict = strict
        self.assumptions = assumptions(spec.task_encoder)
        states = [check_state_shape(s) for s in states]
        spec = _with_num_streams(spec, states)
        self.edits = _newest_edits(states)
        checked: set[tuple[str, str]] = set()
        for state in states:
            edits_text = json.dumps(state.get("edits"), sort_keys=True)
            if (state["fingerprint_digest"], edits_text) not in checked:
                _check_state(spec, state)
                checked.add((state["fingerprint_digest"], edits_text))
        if spec.balance is not None:
            _check_balanced_grid(states, self.world_size, spec.balance.window)
        self.spec = dataclasses.replace(
            spec, edits=self.edits, weight_changes=_newest_weight_changes(states)
        )
        self.skipped = self.edits.skipped_ranges() if self.edits is not None else []
        self._snapshots = _collect_snapshots(states)
        self.lost = _collect_lost(states)  # per stream: samples the loader lost workers on
        self.journal = None
        if journal is not None:
            self.journal = JournalReader(journal, sources_digest(self.spec.fingerprint()))
        self._simulated: dict[str, PipelineSpec] = {}
        self._walkers: dict[int, StreamWalker] = {}

    @property
    def num_streams(self) -> int:
        return self.spec.num_streams

    # -- positions ---------------------------------------------------------------------------
    def step_positions(self, step: int) -> list[tuple[int, int, int]]:
        """``(rank, micro_batch, position)`` of every micro-batch of ``step``."""
        arguments.integer(step, "step", low=0)
        r, a = self.world_size, self.micro_batches_per_step
        return [(rank, k, (step * a + k) * r + rank) for k in range(a) for rank in range(r)]

    def step_of(self, position: int) -> tuple[int, int, int]:
        """``(step, rank, micro_batch)`` of a global position."""
        r, a = self.world_size, self.micro_batches_per_step
        rank_item, rank = divmod(position, r)
        step, k = divmod(rank_item, a)
        return step, rank, k

    # -- describing ----------------------------------------------------------------------------
    def describe_step(self, step: int) -> list[MicroBatchRecord]:
        """Every micro-batch of every rank in ``step`` (ordered by micro-batch, then rank)."""
        if self.spec.balance is not None:
            return self.describe_balanced_step(step)
        return self.describe_positions([m for _, _, m in self.step_positions(step)])

    def describe_balanced_step(self, step: int) -> list[MicroBatchRecord]:
        """Each rank's share of a balanced ``step`` (``get_train_dataset(balance=...)``), one
        record per rank: the ledger plans the step's window as every rank does
        (:mod:`energon.pipeline.balanced_executor`): the pointers of the window's positions, their
        costs from the index, :func:`~energon.balance.assign.compose_steps`. Each sample is an output
        of its own (how a rank packs them depends on the encoded lengths). Steps count from the
        first state's origin of a run that kept its number of ranks."""
        from energon.balance.assign import compose_steps
        from energon.balance.table import CostTable

        balance = self.spec.balance
        assert balance is not None
        if self.micro_batches_per_step != 1:
            raise ArgumentError(
                "micro_batches_per_step",
                "a balanced step is one micro-batch per rank (no accumulation): expected 1",
            )
        arguments.integer(step, "step", low=0)
        ranks, size = self.world_size, balance.window
        window, inner = divmod(step, size)
        first = window * size * ranks
        records = self.describe_positions(range(first, first + size * ranks))
        pool = [(record, sample) for record in records for sample in record.samples]
        table = CostTable(self.spec.leaves, balance.cost)
        costs = [balance.planned_cost(table.cost(s.source, s.index)) for _, s in pool]
        shares = compose_steps(costs, ranks, size)[inner]
        out = []
        for rank, share in enumerate(shares):
            position = step * ranks + rank
            own = records[position - first]
            out.append(
                dataclasses.replace(
                    own,
                    step=step,
                    rank=rank,
                    micro_batch=0,
                    restore_key=(),
                    outputs=[[pool[i][1]] for i in share],
                    excluded=[],
                )
            )
        return out

    def describe_steps(self, start: int, stop: int) -> Iterator[MicroBatchRecord]:
        """The micro-batches of steps ``start <= step < stop``, in order."""
        for step in range(start, stop):
            yield from self.describe_step(step)

    def describe_positions(self, positions: Iterable[int]) -> list[MicroBatchRecord]:
        """Records of global micro-batch positions (in the given order)."""
        positions = list(positions)
        found: dict[int, MicroBatchRecord] = {}
        L = self.num_streams
        for m in sorted(set(positions), key=lambda m: (m % L, m // L)):
            found[m] = self._describe(m)
        return [found[m] for m in positions]

    def _describe(self, position: int) -> MicroBatchRecord:
        stream, item = position % self.num_streams, position // self.num_streams
        journal_key = self.journal.lookup(position) if self.journal is not None else None
        if journal_key is not None:
            _, _, key = journal_key
            return self._record(position, key, None, "journal")
        walker = self._walker(stream)
        key = walker.item(item)
        return self._record(position, key, walker, "simulated")

    def _walker(self, stream: int) -> StreamWalker:
        walker = self._walkers.get(stream)
        if walker is None:
            walker = self._walkers[stream] = StreamWalker(self, stream)
        return walker

    def _record(
        self, position: int, key: Key, walker: StreamWalker | None, origin: str
    ) -> MicroBatchRecord:
        step, rank, k = self.step_of(position)
        epochs = walker.epochs_of(pointer_parts(key)) if walker is not None else None
        outputs = []
        n = 0
        for output in outputs_of(key):
            samples = []
            for pointer, part in pointer_parts(output):
                epoch = epochs[n] if epochs is not None else None
                samples.append(self._sample(pointer, epoch, part))
                n += 1
            outputs.append(samples)
        excluded, lost = [], []
        if walker is not None and walker.sim is not None:
            excluded = [self._sample(p, None) for p in walker.sim.excluded]
            lost = [self._sample(p, None) for p in walker.sim.lost]
        skipped = any(a <= position < b for a, b in self.skipped)
        return MicroBatchRecord(
            step=step,
            rank=rank,
            micro_batch=k,
            position=position,
            stream=position % self.num_streams,
            item=position // self.num_streams,
            status="skipped" if skipped else "seen",
            origin=origin,
            restore_key=stream_key(position % self.num_streams, position // self.num_streams, key),
            outputs=outputs,
            excluded=excluded,
            lost=lost,
        )

    def _sample(
        self, pointer: Key, epoch: int | None, part: tuple[int, int | None] | None = None
    ) -> SampleRecord:
        source, index = pointer_target(pointer)
        meta = SampleMeta(meta_reader(self.spec.sources[source].leaf), source, index)
        described = meta.describe()
        return SampleRecord(
            key=described["key"],
            dataset=described["dataset"],
            split=described["split"],
            shard=described["shard"],
            byte_offset=described["byte_offset"],
            index=index,
            source=source,
            epoch=epoch,
            subflavors=described["subflavors"],
            row_group=described.get("row_group"),
            row=described.get("row"),
            part=list(part) if part is not None else None,
        )

    # -- building blocks shared with exposure counting and cursor edits -------------------------
    def simulated(self, edits: PlanEdits | None) -> PipelineSpec:
        """The simulated spec of this configuration under ``edits`` (cached)."""
        name = repr(edits.fingerprint()) if edits is not None else ""
        spec = self._simulated.get(name)
        if spec is None:
            spec = simulated_spec(dataclasses.replace(self.spec, edits=edits), self.strict)
            self._simulated[name] = spec
        return spec

    def start_point(self, stream: int, item: int) -> _Known:
        """The latest known point of ``stream`` at or before ``item`` (a snapshot of None: the
        stream's beginning)."""
        best: _Known | None = None
        segments = timeline(self.edits, stream)
        if segments[0].replayable:
            best = _Known(0, None)
        for known in self._snapshots.get(stream, []):
            if known.emitted <= item and (best is None or known.emitted > best.emitted):
                best = known
        if best is None:
            first = next(s.start for s in segments if s.replayable)
            raise StateError(
                f"item {item} of stream {stream} ran under the configuration before a migration "
                f"(this stream's migrated part starts at item {first}): describe it with the old "
                "configuration and a state saved before the migration, or pass a state saved "
                "after it"
            )
        return best

    def in_flight(self) -> int | None:
        """How many samples can sit between a reader and the output (None: unbounded)."""
        spec = self.spec
        if spec.task_encoder.is_active("batch_group_criterion"):
            return None
        return (
            (spec.shuffle_buffer_size or 0)
            + (spec.batch_size or 1)
            + (spec.packing_buffer_size or 0)
        )


def training_spec(dataset: Any, name: str = "dataset") -> PipelineSpec:
    """The spec of a training dataset (what ``get_train_dataset`` returns), or an
    :class:`~energon.errors.ArgumentError` naming the argument."""
    spec = getattr(dataset, "spec", None)
    if not isinstance(spec, PipelineSpec):
        raise ArgumentTypeError(
            name, f"expected a dataset from get_train_dataset, got {type(dataset).__name__}"
        )
    if not spec.training:
        raise ArgumentError(
            name, "the ledger describes training datasets (get_train_dataset), not validation ones"
        )
    return spec


class StreamWalker:
    """A simulated stream that moves forward through the edit timeline of its stream."""

    def __init__(self, ledger: Ledger, stream: int) -> None:
        self.ledger = ledger
        self.stream = stream
        self.segments = timeline(ledger.edits, stream)
        self.sim: SimulatedStream | None = None
        self.segment: Segment | None = None

    def item(self, item: int) -> Key:
        """The restore key (inside the stream) of item ``item``."""
        self.advance_to(item)
        assert self.sim is not None
        return self.sim.next()

    def advance_to(self, item: int, counts: Counts | None = None) -> None:
        """Move to just before item ``item``; ``counts`` (per source, over its leaf) count the
        samples of the items passed on the way."""
        if self.sim is None or self.sim.emitted > item:
            self._start(item)
        assert self.sim is not None
        for segment in self.segments:
            if self.sim.emitted < segment.start <= item:
                self.sim.skip(segment.start - self.sim.emitted, counts)
                self._enter(segment)
        self.sim.skip(item - self.sim.emitted, counts)

    def _start(self, item: int) -> None:
        start = self.ledger.start_point(self.stream, item)
        self.segment = segment_at(self.segments, start.emitted)
        self.sim = self._build(self.segment, start.snapshot, start.filtered)

    def _build(
        self, segment: Segment, snap: StreamSnapshot | None, filtered: bool
    ) -> SimulatedStream:
        """The simulated stream under ``segment``'s edits, restored from ``snap`` (whose chain
        had the exclusion filter iff ``filtered``: one that had not gets it, fresh)."""
        spec = self.ledger.simulated(segment.edits)
        sim = SimulatedStream(spec, self.stream, native=self.ledger.native)
        if snap is not None:
            if self.ledger.spec.balance is not None:
                snap = _with_fresh_stages(snap, sim.snapshot())
            if _excludes(segment.edits) and not filtered:
                filter_at = sim.pointer_stages - 1  # the filter is the last pointer stage
                snap = snapshots.with_stage_state(snap, filter_at, {"dropped": 0})
            sim.restore(snap)
        if self.ledger.spec.balance is None:
            sim.add_lost(self.ledger.lost.get(self.stream, []))
        return sim

    def _enter(self, segment: Segment) -> None:
        """Continue under the edits of ``segment`` (an exclusion took effect)."""
        assert self.sim is not None and self.segment is not None
        snap = self.sim.snapshot()
        filtered = _excludes(self.segment.edits)
        self.segment = segment
        self.sim = self._build(segment, snap, filtered)

    def epochs_of(self, parts: list[tuple[Key, Part]]) -> list[int | None]:
        """The epoch of each ``(pointer, part)`` of the item just emitted (None where it cannot be
        known).

        A sample can be delivered twice close together: near an epoch's end its reader may read it
        again while the first copy still waits in the shuffle buffer. The copies are the reader's
        readings of that sample, oldest first: of the readings in this item and those still waiting
        in the pointer stages (delivered later), the latest is in the epoch
        :meth:`SimulatedStream.read_epoch` finds, each earlier one an epoch before. A piece that
        continues a split sample (``part`` not starting at 0) belongs to the reading whose first
        piece came before it: in this item, or (the oldest reading) in an earlier one."""
        assert self.sim is not None
        in_flight = self.ledger.in_flight()
        waiting = snapshots.stage_states(self.sim.snapshot())[1 : self.sim.pointer_stages]
        later = Counter(pointers_in(waiting))
        readings = Counter(p for p, part in parts if not _continues(part))
        seen: Counter[Key] = Counter()
        started: dict[Key, int | None] = {}
        epochs: list[int | None] = []
        for pointer, part in parts:
            if _continues(part) and pointer in started:
                epochs.append(started[pointer])
                continue
            if _continues(part):
                newer = readings[pointer] + later[pointer]
            else:
                newer = readings[pointer] - 1 - seen[pointer] + later[pointer]
                seen[pointer] += 1
            latest = self.sim.read_epoch(pointer, in_flight)
            epoch = latest - newer if latest is not None and latest >= newer else None
            if not _continues(part):
                started[pointer] = epoch
            epochs.append(epoch)
        return epochs


Part = tuple[int, int | None] | None  # the piece of a sample an output holds (None: all of it)


def _continues(part: Part) -> bool:
    """A piece of a split sample that is not its first."""
    return part is not None and part[0] > 0


def _check_balanced_grid(states: list[dict[str, Any]], world_size: int, window: int) -> None:
    """The ledger plans balanced steps in windows of ``window`` steps of ``world_size`` ranks
    counted from position 0; states of a run whose windows lie elsewhere (an elastic restore:
    another number of ranks, or a window's tail, energon.balance.tail) would be described
    wrongly, so they are refused."""
    for state in states:
        if state.get(TAIL_FIELD) is not None:
            raise StateError(
                "the ledger cannot describe balanced steps of a state inside the tail of an "
                "elastic restore (loader state field 'balance_tail': a window planned for "
                f"{state[TAIL_FIELD]['layers'][0][0]} ranks finished by {state['world_size']}); "
                "use a state saved after the tail, or the loader's journal"
            )
        if state["world_size"] != world_size or state["origin"] % (window * world_size):
            raise StateError(
                f"the ledger plans balanced steps in windows of {window} steps of {world_size} "
                f"ranks from position 0, but this state (rank {state['rank']} of "
                f"{state['world_size']}, origin {state['origin']}) counts its windows from "
                "elsewhere (an elastic restore): its steps cannot be described"
            )


def _with_fresh_stages(snap: StreamSnapshot, fresh: StreamSnapshot) -> StreamSnapshot:
    """A balanced-mode snapshot (its pointer stages only: energon.pipeline.balanced_executor)
    completed with the fresh states of the chain's other stages (empty at a micro-batch boundary)."""
    stages = snapshots.stage_states(snap)
    rest = snapshots.stage_states(fresh)[len(stages) :]
    return snapshots.make_snapshot(snapshots.emitted(snap), [*stages, *rest])


def _excludes(edits: PlanEdits | None) -> bool:
    return edits is not None and bool(edits.exclude)


def _with_num_streams(spec: PipelineSpec, states: list[dict[str, Any]]) -> PipelineSpec:
    counts = {s["num_streams"] for s in states}
    if len(counts) > 1:
        raise StateError(f"the states use different numbers of logical streams: {sorted(counts)}")
    if not counts or counts == {spec.num_streams}:
        return spec
    (num_streams,) = counts
    if spec.num_streams_fixed:
        raise StateError(
            f"the states use {num_streams} logical streams but num_streams={spec.num_streams} "
            "was given"
        )
    return dataclasses.replace(spec, num_streams=num_streams)


def _newest_weight_changes(states: list[dict[str, Any]]) -> tuple[WeightChange, ...]:
    """The online blend weight changes of the state with the most (later states know earlier
    changes: ``set_blend_weights`` records every change in every rank's state)."""
    newest = max(states, key=lambda s: len(weight_changes(s)), default={})
    return parsed_weight_changes(newest)


def _newest_edits(states: list[dict[str, Any]]) -> PlanEdits | None:
    """The edits of the state furthest ahead: its history covers the others'."""
    if not states:
        return None
    newest = max(
        states,
        key=lambda s: (len((s.get("edits") or {}).get("history", [])), rank_next_position(s)),
    )
    return edits_from_json(newest.get("edits"))


def _check_state(spec: PipelineSpec, state: dict[str, Any]) -> None:
    edits = edits_from_json(state.get("edits"))
    fingerprint = dataclasses.replace(spec, edits=edits).fingerprint()
    if state["fingerprint_digest"] != fingerprint_digest(fingerprint):
        diffs = fingerprint_differences(state["fingerprint"], fingerprint)
        raise StateError(
            "a state given to the ledger belongs to a different configuration:\n  "
            + "\n  ".join(diffs or ["(fingerprint digest differs)"])
        )


def _collect_snapshots(states: list[dict[str, Any]]) -> dict[int, list[_Known]]:
    """Per stream, the snapshots of the states, by items emitted."""
    found: dict[int, dict[int, _Known]] = {}
    merged_seen: set[tuple[str, int]] = set()
    for state in states:
        if state["consumed"] == 0:
            # the ranks of a redistributed (or edited) save all hold the same merged snapshots
            point = (state["fingerprint_digest"], state["origin"])
            if point in merged_seen:
                continue
            merged_seen.add(point)
        filtered = bool((state.get("edits") or {}).get("exclude"))
        for stream, snap in stream_snapshots(state).items():
            known = _Known(snapshots.emitted(snap), snap, filtered)
            found.setdefault(stream, {})[known.emitted] = known
    return {s: [by[e] for e in sorted(by)] for s, by in found.items()}


def _collect_lost(states: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Per stream, the samples the loader lost workers on (energon.loader.recovery), from every
    state's snapshots: skipped ones and those still pending, each once."""
    found: dict[int, dict[str, dict[str, Any]]] = {}
    for state in states:
        for stream, snap in stream_snapshots(state).items():
            account = snapshots.error_state(snap) or {}
            for entry in (*account.get("lost", ()), *account.get("skip", ())):
                plain = {name: entry[name] for name in ("source", "index", "key", "error")}
                found.setdefault(stream, {}).setdefault(entry["error"], plain)
    return {stream: list(by.values()) for stream, by in found.items()}


@dataclasses.dataclass(frozen=True)
class _Known:
    """A saved snapshot of a stream; ``filtered``: its chain has the exclusion filter."""

    emitted: int
    snapshot: StreamSnapshot | None
    filtered: bool = False
