"""Per-process debug logs: ``WorkerConfig(worker_debug_path="dir/{worker_id}.jsonl", worker_log_level=N)``.

Each process writes JSON lines to its own file, named as Megatron-Energon names them, so that
``energon analyze-debug`` (and the reference's tool) can read them: the main process of rank ``r``
writes file ``r * (num_workers + 1)``, its loader worker ``w`` file ``r * (num_workers + 1) + 1 + w``
(``{pid}`` in the path is the process id). Without a path the lines go to stdout. Files are opened
for appending: use a fresh directory per run.

Records (``"t"`` is the event), level 1: the loader's ``<Loader>.__init__`` (with its config),
``.iter``, ``.yield`` (the keys of every batch handed to the user, in order) and ``.StopIteration``;
in the process that computes them, ``yield_batch`` (keys of every batch a worker produced) and
``WebdatasetSampleLoaderDataset._slices_iter.yield`` (every sample read, in reading order, with its
reader's ``epoch`` and ``epoch_count``), and per reader (one per logical stream and source)
``WebdatasetSampleLoaderDataset.__iter__`` + ``._slices_iter.next_epoch`` when an epoch starts. Level 2
adds ``._slices_iter.exhausted`` (a slice is done), ``._slices_iter.all_exhausted`` (the epoch is
done), ``RepeatDataset.repeat`` (a repeating pass starts the next epoch) and the pass boundaries
(``EpochizeDataset.epoch_start|epoch_end`` for virtual epochs, ``LimitDataset.start|done`` for limited
validation passes).

Logging is off unless a level is set, and every call site checks the level before building a record.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol, TextIO


class LogTarget(Protocol):
    """What a log needs to know about its process (``WorkerConfig`` is one)."""

    rank: int
    num_workers: int
    worker_debug_path: str | None
    worker_log_level: int


_files: dict[str, TextIO] = {}
_files_pid = os.getpid()
_active: LogTarget | None = None


def local_worker_id() -> int | None:
    """This process's loader worker number, or None in the main process."""
    try:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return None if info is None else info.id


def file_id(target: LogTarget) -> int:
    """The ``{worker_id}`` of this process's log file (Megatron-Energon's numbering)."""
    worker = local_worker_id()
    return target.rank * (target.num_workers + 1) + (0 if worker is None else 1 + worker)


def should_log(target: LogTarget, level: int) -> bool:
    return 0 < level <= target.worker_log_level


def write(target: LogTarget, record: dict[str, Any]) -> None:
    """One JSON line to this process's file (stdout without a path); a file the target holds open
    for this process's log number (``_worker_debug_file``) takes precedence."""
    line = json.dumps(record, default=_plain) + "\n"
    given = getattr(target, "_worker_debug_file", None)
    if given is not None and getattr(target, "_worker_debug_file_worker_id", None) == file_id(
        target
    ):
        given.write(line)
        return
    if target.worker_debug_path is None:
        sys.stdout.write(line)
        return
    path = target.worker_debug_path.format(worker_id=file_id(target), pid=os.getpid())
    _file(path).write(line)


def _file(path: str) -> TextIO:
    global _files_pid
    if _files_pid != os.getpid():  # a forked worker: the parent's handles are not ours
        _files.clear()
        _files_pid = os.getpid()
    f = _files.get(path)
    if f is None:
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        f = _files[path] = open(path, "a", buffering=1)  # noqa: SIM115  (kept open per process)
    return f


@atexit.register
def _close_files() -> None:
    for f in _files.values():
        f.close()
    _files.clear()


def _plain(value: Any) -> Any:
    """JSON for what configs and keys may hold (tuples become lists by json itself)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


# -- the log of the pipeline running in this process ---------------------------------------------


def activate(target: LogTarget | None) -> None:
    """Make ``target`` the log of the pipeline stages running in this process (None: off)."""
    global _active
    _active = target if target is not None and target.worker_log_level > 0 else None


def logs(level: int) -> bool:
    """Whether the active log records ``level`` (for call sites that must prepare a record)."""
    return _active is not None and _active.worker_log_level >= level


def emit(level: int, make_record: Callable[..., dict[str, Any]], *args: Any) -> None:
    """Write ``make_record(*args)`` to the active log if it logs ``level`` (the record is only
    built then, so disabled logging costs one comparison)."""
    target = _active
    if target is None or target.worker_log_level < level:
        return
    record = make_record(*args)
    worker = local_worker_id()
    write(target, {"t": record.pop("t"), "r": target.rank, "w": worker or 0, **record})


def batch_keys(value: Any) -> list[Any] | None:
    """The sample keys of a batch or sample (``__key__``, ``__keys__`` or ``keys``), as a list."""
    for name in ("__key__", "__keys__", "keys"):
        keys = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
        if keys is None or callable(keys):
            continue
        if isinstance(keys, str | int):
            return [keys]
        try:
            return [k for k in keys]
        except TypeError:
            return [keys]
    return None
