"""A loader's records in the per-process debug log (:mod:`energon.debug_log`).

They are named and shaped as Megatron-Energon writes them, so that ``energon analyze-debug`` reads
both: ``<Loader>.__init__``, ``.iter``, ``.yield`` and ``.StopIteration`` at level 1, the pass
boundaries at level 2.

Every record goes through the loader's current worker config (a caller may replace it), which
also says whether its level is logged at all; nothing is built when it is not.
"""

from __future__ import annotations

from typing import Any

from energon import debug_log
from energon.pipeline.executor import ItemMeta
from energon.pipeline.stage import Value
from energon.worker import WorkerConfig


class LoaderLog:
    """The debug log records of loader number ``loader_id``. ``name``: its class (``init_name``:
    the name its ``__init__`` record uses, as in Megatron-Energon)."""

    def __init__(self, loader_id: int, name: str, init_name: str) -> None:
        self.loader_id = loader_id
        self.name = name
        self.init_name = init_name
        self._yielded = 0  # items handed out, all passes together
        self._worker_yields: dict[int, int] = {}  # worker -> items of it handed out

    def event(self, wc: WorkerConfig, level: int, event: str, **fields: Any) -> None:
        """One ``<Loader>.<event>`` record, if ``wc`` logs ``level``."""
        if wc.should_log(level):
            name = self.init_name if event == "__init__" else self.name
            wc.worker_log(
                {"t": f"{name}.{event}", "r": wc.rank, "w": None, "id": self.loader_id, **fields}
            )

    def yielded(
        self, wc: WorkerConfig, value: Value, meta: ItemMeta, iter_id: int, iter_idx: int
    ) -> None:
        """``value`` (made by ``meta.worker``) was handed out as item ``iter_idx`` of pass
        ``iter_id``; counted whether logged or not."""
        worker = meta.worker
        worker_idx = self._worker_yields.get(worker, 0)
        self._worker_yields[worker] = worker_idx + 1
        self._yielded += 1
        if wc.should_log(1):
            self.event(
                wc,
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

    def pass_boundary(
        self, wc: WorkerConfig, which: str, length: int | None, limited: bool, offset: int
    ) -> None:
        """Level 2: where a virtual epoch (``limited`` False) or a limited pass ``which`` is
        ``"start"`` or ``"end"``s, at ``offset`` batches into the pass of ``length``."""
        if length is None or not wc.should_log(2):
            return
        if limited:
            event = "LimitDataset.start" if which == "start" else "LimitDataset.done"
        else:
            event = (
                "EpochizeDataset.epoch_start" if which == "start" else "EpochizeDataset.epoch_end"
            )
        wc.worker_log({"t": event, "r": wc.rank, "w": None, "offset": offset, "length": length})
