"""What runs inside a Ray actor of :mod:`energon.loader.workers.ray_pool`: one worker's executors,
and the messages that travel between the actor and the loader.

An actor is not tied to one loader: every :meth:`StreamsActor.start` gives it the dataset, the
worker it is (of how many) and where to resume, so an actor kept from a past pass, or from a loader
that is gone (``RayWorkers(keep_actors=True)``), runs the next one without starting a process.

Tensors leave the actor as out-of-band byte buffers (:func:`tensor_parts`, registered for
``torch.Tensor`` in the actor process only): Ray writes a message above its inline limit once into
the object store of the actor's node, and the loader's process maps it without a copy
(:func:`tensor_from_parts`; a loader on another node gets one transfer into its own node's store).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch._utils import ExceptionWrapper

from energon.loader.savable_dataset import ResumePoint, SavableDataset
from energon.loader.workers.messages import Group, WorkerItems
from energon.observe.probe import Board
from energon.samples.collate import batches_in_shared_memory
from energon.task_encoder.base import hook_context


@dataclasses.dataclass
class Slot:
    """An actor's stats slot (its float and int rows) at ``now_ns`` of its monotonic clock."""

    floats: np.ndarray
    hot: np.ndarray
    now_ns: int


@dataclasses.dataclass
class Message:
    """What one ``next`` call returns: groups in order, and the actor's slot after them."""

    groups: list[Group]
    slot: Slot | None


@dataclasses.dataclass
class Assignment:
    """What an actor runs in a pass: worker ``worker`` of ``num_workers`` of the rank, its stats
    slot laid out as the loader's board (``sources``, ``timed``), items marked for pinning
    (``pinned``)."""

    worker: int
    num_workers: int
    sources: list[str]
    timed: bool
    pinned: bool


def failed_message(worker: int, error: Exception) -> Message:
    """A call that failed inside the actor (the actor is fine): the error, raised in the place of
    the worker's next item."""
    try:
        raise error
    except Exception:
        wrapped = ExceptionWrapper(where=f"in Ray actor of worker {worker}")
    return Message([Group(worker, True, [wrapped])], None)


def tensor_parts(tensor: torch.Tensor) -> tuple[np.ndarray, str, tuple[int, ...]]:
    """A CPU tensor as a byte array (pickled out of band: not copied into the message)."""
    tensor = tensor.detach().cpu().contiguous()
    data = tensor.reshape(-1).view(torch.uint8).numpy()
    return data, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)


def tensor_from_parts(parts: tuple[np.ndarray, str, tuple[int, ...]]) -> torch.Tensor:
    """The tensor over the received bytes (the object store's memory, no copy). Ray marks the
    array read-only; nothing else reads it, so the tensor may be written like any batch."""
    data, dtype, shape = parts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        flat = torch.from_numpy(data)
    return flat.view(getattr(torch, dtype)).reshape(shape)


class StreamsActor:
    """The body of the Ray actor (made a Ray class by :func:`actor_class`)."""

    def __init__(self) -> None:
        import ray.util

        ray.util.register_serializer(
            torch.Tensor, serializer=tensor_parts, deserializer=tensor_from_parts
        )
        self.dataset: SavableDataset | None = None
        self.assignment: Assignment | None = None
        self.board: Board | None = None
        self.groups: Iterator[Group] | None = None

    def describe(self) -> dict[str, Any]:
        """Where this actor runs."""
        import ray
        import ray.util

        node = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node_id": node, "ip": ray.util.get_node_ip_address()}

    def start(
        self, shipped: tuple[SavableDataset, Any], resume: ResumePoint, assignment: Assignment
    ) -> None:
        """Run ``assignment``'s executors of the shipped dataset (and cache pool) from
        ``resume``, on a new stats slot (the loader adds what earlier actors counted)."""
        self.dataset, hook_context.cache_pool = shipped
        self.groups = None  # the last pass's executors end (their probe publishes, then closes)
        if self.board is not None:
            self.board.close()
        # a new board for every pass: its slot counts from zero (the loader adds earlier counts)
        self.board = Board(assignment.num_workers, assignment.sources, timed=assignment.timed)
        _unlink_files(self.board)  # mapped: nothing is left behind if this process dies
        self.assignment = assignment
        _become_worker(self.dataset, assignment.worker, assignment.num_workers)
        resume = dataclasses.replace(resume, board=self.board)
        items = WorkerItems(self.dataset, resume, None, assignment.pinned)
        self.groups = items.groups(assignment.worker)

    def next(self, max_items: int, max_seconds: float) -> Message:
        """The groups made within ``max_seconds`` (at least one; at most ``max_items`` items)."""
        groups: list[Group] = []
        items, started = 0, time.monotonic()
        for group in self.groups:
            groups.append(group)
            items += len(group.items)
            if group.last or items >= max_items or time.monotonic() - started >= max_seconds:
                break
        return Message(groups, self.slot())

    def slot(self) -> Slot | None:
        """This actor's stats slot now (also asked on the `watch` thread while `next` runs)."""
        if self.board is None or self.assignment is None:
            return None
        worker = self.assignment.worker
        return Slot(
            self.board.array[worker].copy(), self.board.hot[worker].copy(), time.monotonic_ns()
        )

    def stacks(self) -> str:
        """The Python stacks of every thread of this actor (the watchdog's reports)."""
        names = {t.ident: t.name for t in threading.enumerate()}
        own = threading.get_ident()
        return "\n".join(
            f"thread {names.get(ident, '?')} ({ident}):\n" + "".join(traceback.format_stack(frame))
            for ident, frame in sys._current_frames().items()
            if ident != own
        )


def _become_worker(dataset: SavableDataset, worker: int, num_workers: int) -> None:
    """This process as a loader worker for a pass: ``get_worker_info()`` answers, torch uses one
    thread, batches are made in reused memory, and the global generators are seeded as a local
    worker's are at the start of every pass (for augmentations that draw from them; energon itself
    never does)."""
    import random

    from torch.utils.data._utils import worker as torch_worker

    from energon.loader.workers.processes import _base_seed

    # one intra-op thread, as in a local worker: torch would otherwise start a thread per core
    # of the node for every batch it collates, each fighting the node's other actors
    torch.set_num_threads(1)
    batches_in_shared_memory(False)  # they leave through Ray's object store
    base = _base_seed()
    seed = base + worker
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(base, worker))
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker, num_workers=num_workers, seed=seed, dataset=dataset
    )


def _unlink_files(board: Board) -> None:
    for name in os.listdir(board.folder):
        try:
            os.unlink(os.path.join(board.folder, name))
        except OSError:
            pass
    try:
        os.rmdir(board.folder)
    except OSError:
        pass


_ACTOR_CLASSES: dict[int, Any] = {}


def actor_class(ray: Any) -> Any:
    """:class:`StreamsActor` as a Ray actor class: ``start`` / ``next`` in order on one thread,
    ``slot`` / ``stacks`` / ``describe`` on a second one (they answer while ``next`` works)."""
    key = id(ray)
    if key not in _ACTOR_CLASSES:
        methods = {
            name: ray.method(concurrency_group="watch")(getattr(StreamsActor, name))
            for name in ("slot", "stacks", "describe")
        }
        body = type("EnergonStreamsActor", (StreamsActor,), methods)
        body.__module__ = __name__
        _ACTOR_CLASSES[key] = ray.remote(concurrency_groups={"watch": 1})(body)
    return _ACTOR_CLASSES[key]
