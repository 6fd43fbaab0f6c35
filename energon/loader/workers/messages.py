"""What a worker sends the main process: its items in groups (:class:`Group`), made from the
dataset's executor of the worker's positions (:class:`WorkerItems`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.pin_memory import pin_memory as _torch_pin_memory

from energon import debug_log
from energon.loader.savable_dataset import ResumePoint, SavableDataset
from energon.loader.transit import pack_strings
from energon.memory.batch_arena import BatchArena
from energon.observe import probe
from energon.pipeline.executor import ItemMeta
from energon.pipeline.stage import Value
from energon.samples.base import needs_pinning

# A worker sends the items it makes within this many seconds (at most GROUP_MAX_ITEMS) as one
# message: see grouped.
GROUP_SECONDS = 0.01
GROUP_MAX_ITEMS = 8


def collate(arena: BatchArena | None, item: tuple[Value, ItemMeta]) -> tuple[Value, ItemMeta]:
    """Runs where the item was made (a worker, or the main process without workers): torch's
    ``default_convert`` (numpy arrays in dicts, lists and tuples -> tensors, as Megatron-Energon
    does with and without workers), and arena tensors -> small references."""
    value, meta = item
    stage = probe.ACTIVE.enter(probe.TRANSFER)
    value = torch.utils.data.default_convert(value)
    if arena is not None:
        value, meta.arena = arena.export(value)
    probe.ACTIVE.enter(stage)
    return value, meta


class WorkerItems:
    """What a loader's workers run: each its share of the rank's items, with their stream
    snapshots, resuming where the loader says (the dataset itself holds no loader state), in
    groups ready to travel (:func:`collate_group`)."""

    def __init__(
        self,
        dataset: SavableDataset,
        resume: ResumePoint,
        arena: BatchArena | None,
        pinned: bool,
    ) -> None:
        self.dataset = dataset
        self.resume = resume
        self.arena = arena
        self.pinned = pinned

    def groups(self, worker: int) -> Iterator[Group]:
        if self.arena is not None:
            self.arena.activate(worker)
        debug_log.activate(self.dataset.worker_config)
        # the worker's slot on the stats board (an executor that does not time its stages still
        # publishes the sample it is on: the watchdog and the recovery of lost workers read it)
        probe.activate(self.resume.board, worker)
        groups = grouped(worker, iter(self.dataset.executor(worker, self.resume)))
        if self.arena is not None:
            groups = self.arena.count_groups(groups)
        for group in groups:
            yield collate_group(self.arena, self.pinned, group)


class Group:
    """One message from a worker: some of its items in order (an error of its pipeline in the place
    of the item it failed on), and whether they are its last (``last``).

    With CUDA, the main process calls :meth:`pin_memory` on every message. Only items that need it
    (``ItemMeta.pin``, decided in the worker) are pinned: torch's own walk would rebuild every
    list, tuple and dict of every batch, and for text batches, which hold no tensor, that walk
    cost the main process more than all else a batch costs it there (docs/benchmarks.md, "Sixth
    round")."""

    __slots__ = ("worker", "last", "items")

    def __init__(self, worker: int, last: bool = False, items: list[Any] | None = None) -> None:
        self.worker = worker
        self.last = last
        self.items = [] if items is None else items

    def __reduce__(self) -> tuple:
        return Group, (self.worker, self.last, self.items)

    def pin_memory(self) -> Group:
        for i, item in enumerate(self.items):
            if not isinstance(item, ExceptionWrapper) and item[1].pin:
                self.items[i] = (_torch_pin_memory(item[0]), item[1])
        return self


def grouped(worker: int, items: Iterator[tuple[Value, ItemMeta]]) -> Iterator[Group]:
    """A worker's items in groups, one message to the main process per group. Every message costs
    both processes a fixed price (a pipe write in the worker, a read and the bookkeeping in the
    main process) that is as large as the work of a small batch, so a worker gathers the items it
    makes within ``GROUP_SECONDS`` (at most ``GROUP_MAX_ITEMS``); a slow item (an image batch)
    travels alone. The price: an item is not sent before the next one of its group is made, so an
    item that stalls (a hung read, a slow hook) holds back the few items made in the
    ``GROUP_SECONDS`` before it; the watchdog still names the stalled item. An exception of the
    worker's pipeline travels in its place in the group, so the main process raises it exactly
    where the item would have been."""
    while True:
        group = Group(worker)
        started = time.monotonic()
        try:
            while True:
                group.items.append(next(items))
                if (
                    len(group.items) >= GROUP_MAX_ITEMS
                    or time.monotonic() - started >= GROUP_SECONDS
                ):
                    break
        except StopIteration:
            group.last = True
        except Exception:
            group.items.append(ExceptionWrapper(where=f"in DataLoader worker process {worker}"))
            group.last = True
        yield group
        if group.last:
            return


def collate_group(arena: BatchArena | None, pinned: bool, group: Group) -> Group:
    """:func:`collate` for every item of a worker's group (in place), its strings ready to travel
    (:func:`pack_strings`) and, when the main process pins memory (``pinned``), marked if it has
    anything to pin."""
    items = group.items
    for i, item in enumerate(items):
        if not isinstance(item, ExceptionWrapper):
            value, meta = items[i] = collate(arena, item)
            pack_strings(value)
            meta.pin = pinned and needs_pinning(value)
    return group
