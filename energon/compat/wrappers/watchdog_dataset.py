"""``WatchdogDataset``: reports a pipeline step that hangs (``megatron.energon.wrappers.watchdog_dataset``)."""

from __future__ import annotations

import faulthandler
import sys
import threading
import warnings
from typing import Any

from energon.compat.watchdog import Watchdog
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    PassThrough,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    open_stage,
)
from energon.pipeline.stage import Item, Stage

__all__ = [
    "BaseWrapperDataset",
    "SavableDataset",
    "Watchdog",
    "WatchdogDataset",
    "WorkerConfig",
]


class _WatchdogStage(Stage):
    """Warns (or exits) when one ``next()`` of the wrapped pipeline takes longer than the timeout,
    with every thread's stack, so a hang says where it is."""

    def __init__(self, upstream: Any, node: WatchdogDataset) -> None:
        self.upstream = upstream
        self.node = node
        self._first = True

    def next(self) -> Item:
        timeout = self.node.timeout_seconds
        if self._first and self.node.initial_timeout_seconds is not None:
            timeout = self.node.initial_timeout_seconds
        self._first = False
        if timeout is None:
            return next(self.upstream)
        timer = threading.Timer(timeout, self.node._watchdog_trigger, args=(timeout,))
        timer.daemon = True
        timer.start()
        try:
            return next(self.upstream)
        finally:
            timer.cancel()

    def state(self) -> dict[str, Any]:
        return self.upstream.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.upstream.restore(state)

    def rebuild(self, key: tuple) -> Any:
        return self.upstream.rebuild(key)


class WatchdogDataset(PassThrough):
    """Reports a pipeline step that takes longer than ``timeout_seconds`` (stacks of all threads);
    ``fail_on_timeout=True`` ends the process instead of warning."""

    def __init__(
        self,
        dataset: SavableDataset,
        worker_config: WorkerConfig,
        timeout_seconds: float | None = 60,
        initial_timeout_seconds: float | None = None,
        fail_on_timeout: bool = False,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.initial_timeout_seconds = initial_timeout_seconds
        self.fail_on_timeout = fail_on_timeout
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _WatchdogStage(open_stage(self.dataset, ctx.child(0)), self)

    def _watchdog_trigger(self, timeout: float) -> None:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        message = f"WatchdogDataset: a pipeline step took longer than {timeout} s (stacks above)"
        if self.fail_on_timeout:
            print(message, file=sys.stderr, flush=True)
            import os

            os._exit(1)
        warnings.warn(message, RuntimeWarning, stacklevel=1)
