"""One ``for`` loop over a loader: a pass.

:class:`PassRunner` takes the items of the loader's source (:mod:`energon.loader.transport`) in
plan order and notes each one where it is kept: the position (:mod:`energon.loader.position`), the
blend's counts (:mod:`energon.loader.blend_control`), the error counts
(:mod:`energon.loader.error_report`) and the journal (:mod:`energon.loader.journal`). A pass ends
after its length (a virtual epoch, a ``LimitDataset``), when the data ends (validation, training
without repeat: the next pass then starts afresh), or never (training). Holes in a planned pass and
the steps of a rank that ran out before the others become fillers (:mod:`energon.loader.evenness`).
"""

from __future__ import annotations

from collections.abc import Iterator

from energon.loader.blend_control import BlendControl
from energon.loader.error_report import ErrorReport
from energon.loader.evenness import Fillers, agreement_group, any_rank_has_item
from energon.loader.journal import LoaderJournal
from energon.loader.loader_log import LoaderLog
from energon.loader.loader_state import pass_length
from energon.loader.position import LoaderPosition
from energon.loader.recovery import Recovery
from energon.loader.savable_dataset import SavableDataset
from energon.loader.transport import WorkerTransport
from energon.pipeline.executor import ItemMeta
from energon.pipeline.stage import Value
from energon.worker import WorkerConfig


class PassRunner:
    """Runs the passes of one loader over its collaborators. ``journal``: where delivered items
    are recorded (None: nowhere; ``loader.start_journal`` sets it)."""

    def __init__(
        self,
        position: LoaderPosition,
        transport: WorkerTransport,
        errors: ErrorReport,
        blend: BlendControl,
        recovery: Recovery,
        log: LoaderLog,
    ) -> None:
        self._position = position
        self._transport = transport
        self._errors = errors
        self._blend = blend
        self._recovery = recovery
        self._log = log
        self.journal: LoaderJournal | None = None
        self._fillers: Fillers | None = None

    def run(self, dataset: SavableDataset, wc: WorkerConfig, iter_id: int) -> Iterator[Value]:
        """Pass number ``iter_id`` over ``dataset`` (``wc``: the loader's worker config, for the
        debug log). A new pass continues where the last one stopped, unless that one finished."""
        spec, position = dataset.spec, self._position
        length = pass_length(spec)
        self._log.event(wc, 1, "iter", iter_id=iter_id)
        self._log.pass_boundary(wc, "start", length, spec.limit is not None, position.pass_offset)
        self._recovery.new_pass()
        if not self._transport.is_open:
            self._transport.open(dataset, position)
        agree, group = agreement_group(dataset)
        iter_idx = 0
        while length is None or position.pass_offset < length:
            self._transport.reopen_if_due(position)
            entry = self._next_entry()
            if agree and entry is None and any_rank_has_item(False, group):
                # this rank ran out, another has not: keep step with a filler
                position.pass_offset += 1
                yield self._filler(dataset, wc.rank % spec.num_streams)
                continue
            if entry is None or (agree and not any_rank_has_item(True, group)):
                self._log.event(wc, 1, "StopIteration", iter_id=iter_id)
                self.finish()
                return
            value, meta = entry
            self._record(dataset, meta)
            if meta.hole:
                value = self._filler(dataset, meta.stream)
            else:
                value = self._transport.received(value, meta)
            self._log.yielded(wc, value, meta, iter_id, iter_idx)
            iter_idx += 1
            yield value
        self._log.pass_boundary(wc, "end", length, spec.limit is not None, position.pass_offset)
        self._log.event(wc, 1, "StopIteration", iter_id=iter_id)
        position.pass_offset = 0
        if spec.limit is not None and spec.limit_resets:
            self.finish()

    def _next_entry(self) -> tuple[Value, ItemMeta] | None:
        """The source's next ``(value, meta)``, or None once it has ended (and ever after, until
        the pass is finished). Final snapshots of ended streams are recorded on the way."""
        while (entry := self._transport.next_entry()) is not None:
            meta = entry[1]
            if not meta.ended:
                return entry
            self._position.keep(meta.stream, meta.snapshot)
            self._errors.observe(meta.stream, meta.snapshot, self._position.all_snapshots)
        return None

    def _record(self, dataset: SavableDataset, meta: ItemMeta) -> None:
        """The item of ``meta`` is handed out: the position, the blend, the error counts and the
        journal take note."""
        position, wc = self._position, dataset.worker_config
        position.record(meta, wc.rank, wc.world_size)
        self._blend.observe(meta.stream, position.all_snapshots)
        self._errors.observe(meta.stream, meta.snapshot, position.all_snapshots)
        if self.journal is not None and not meta.hole:
            self.journal.append(dataset.spec, meta.position, meta.key)

    def _filler(self, dataset: SavableDataset, stream: int) -> Value:
        if self._fillers is None:
            self._fillers = Fillers(dataset)
        return self._fillers.make(stream)

    def finish(self) -> None:
        """After a finite pass (validation, or training with repeat=False) the next starts afresh."""
        self._errors.finish_pass(self._position.snapshots)
        self._transport.close()
        self._position.start_over()
        self._fillers = None
