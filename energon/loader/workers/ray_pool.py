"""The Ray actors of a loader (a :class:`~energon.loader.workers.base.WorkerPool`), driven from the
training process: :class:`RayPool`.

**Messages and backpressure.** The loader *pulls*: it keeps ``prefetch`` calls of each actor's
``next`` method outstanding and submits one more for every message it receives, so at most
``prefetch`` messages per actor are made ahead (each at most ``message_items`` items). Calls to one
actor run in the order they were made, so messages arrive in order.

**Stats.** Each actor keeps its own stats board (shared memory of its node) and sends its slot with
every message; the pool writes it into the loader's board with the actor's clock moved to this
process's and what earlier actors of the same worker counted added. ``loader.stats()``, the
watchdog and the stall check then read actors as they read local processes, as of the last message
(while the loader waits for an actor, the pool asks it for its slot every ``SLOT_POLL_SECONDS``, on a
second thread of the actor that the pipeline does not block). The board lists the slot as remote
(``Board.remote``): the watchdog asks the actor for its stacks instead of signalling a process.

**Losses.** A call that fails with Ray's ``RayActorError`` (the actor was killed with ``ray.kill``,
its process died, its node is gone or unreachable) reports the worker gone, and the loader's
recovery (:mod:`energon.loader.recovery`) replaces it with a new actor that resumes from the
snapshots the loader received. Unlike a local worker, a lost actor names no sample to skip: an
actor killed from outside or lost with its node says nothing about its data, and its slot is as
old as its last message. The replacement repeats exactly what was lost, so nothing is lost or read
twice; an actor lost again and again at the same place ends the pass through the restart budgets
of :class:`~energon.loader.recovery.WorkerRecovery`, with the list of losses. An actor that the
cluster cannot place within ``start_timeout_seconds`` ends the pass with one
:class:`~energon.errors.ClusterError` saying what was asked and what the cluster has.

**Lifetime.** :meth:`RayPool.close` ends a pass and keeps the actors for the loader's next one; they
end with the pool (the loader dropped), or wait for another loader (``keep_actors``).
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
import time
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from torch._utils import ExceptionWrapper

from energon.cluster.ray_cluster import connect
from energon.errors import ClusterError
from energon.loader.recovery import WorkerGone
from energon.loader.savable_dataset import ResumePoint, SavableDataset
from energon.loader.workers.messages import Group
from energon.loader.workers.ray_actor import Assignment, Message, Slot, actor_class, failed_message
from energon.observe.probe import (
    ACTIVE_SECONDS,
    HOT_FIELDS,
    INDEX,
    ITEM_SINCE_NS,
    ITEMS,
    PID,
    POSITION,
    PUBLISHED,
    REMOTE_BYTES,
    RETRIES,
    SAMPLES,
    STAGE,
    STAGES,
    STARTED,
    TIMED_SECONDS,
    TIMES,
    WAIT,
    Board,
)

SLOT_POLL_SECONDS = 1.0  # how often a waiting loader asks a busy actor for its stats slot
ENDED_POLL_SECONDS = 1.0  # how often the pool looks for actors lost while others are awaited
IDLE_CHECK_SECONDS = 30.0  # how long a kept actor may take to answer before it is replaced
# the stats fields that add up over the actors that took a worker's place (floats; ints)
_ADDED_FLOATS = [ACTIVE_SECONDS, TIMED_SECONDS, RETRIES, REMOTE_BYTES]
_ADDED_FLOATS += range(TIMES, TIMES + len(STAGES))


class ActorsConfig(Protocol):
    """What a pool needs of its configuration: ``RayWorkers``, which makes the pools (this module
    does not import it: no import cycle)."""

    num_actors: int
    address: str | None
    keep_actors: bool
    message_items: int
    message_seconds: float
    start_timeout_seconds: float

    def options(self) -> dict[str, Any]: ...

    def actor_kind(self) -> str: ...


_IDLE: dict[str, list[Any]] = {}  # actors kept for the next loader (RayWorkers.keep_actors)


@dataclasses.dataclass
class _Actor:
    """One actor and what the pool knows about it."""

    handle: Any
    name: str  # its name in the job's namespace (ray.get_actor)
    created: float  # time.monotonic() when it was asked for
    ready: Any  # the `describe` call that says where it runs (None once answered)
    calls: collections.deque = dataclasses.field(default_factory=collections.deque)
    groups: collections.deque = dataclasses.field(default_factory=collections.deque)
    who: str = ""
    pid: int | None = None
    slot_call: Any = None  # an outstanding `slot` call
    slot_asked: float = 0.0
    last: bool = False  # it sent its last group of the pass
    next_position: int | None = None  # the position it makes next (the loss reports)


class RayPool:
    """The actors of a loader (see the module docstring)."""

    def __init__(
        self,
        config: ActorsConfig,
        dataset: SavableDataset,
        *,
        prefetch: int,
        pinned: bool,
        board: Board | None,
        cache_pool: Any = None,
    ) -> None:
        self.config = config
        self.num_workers = config.num_actors
        self.prefetch = max(1, prefetch)
        self.pinned = pinned
        self.board = board
        self.ray = connect(config.address)
        self._class = actor_class(self.ray)
        self._actors: list[_Actor | None] = [None] * self.num_workers
        self._parked: list[_Actor | None] = [None] * self.num_workers  # kept from the last pass
        self._carry: list[tuple[np.ndarray, np.ndarray] | None] = [None] * self.num_workers
        self._ended_checked = 0.0
        self._live: dict[str, Any] = {}  # name -> handle of every actor this pool holds
        keep = config.keep_actors
        self._release = weakref.finalize(
            self, _release, self.ray, self._live, config.actor_kind(), keep
        )
        self._source: SavableDataset | None = None
        self.renew(dataset, cache_pool)

    def renew(self, dataset: SavableDataset, cache_pool: Any = None) -> None:
        """The next pass runs ``dataset`` (put into the object store again only if it changed:
        a restore or a blend weight change gives the loader a new one)."""
        if self._source is dataset:
            return
        self._source = dataset
        self._shipped = _shipped(self.ray, dataset, cache_pool)
        self._layout = dataset.layout
        self._rank = dataset.worker_config.rank

    def shutdown(self) -> None:
        """End (or, with ``keep_actors``, set aside) every actor now."""
        self.close()
        self._parked = [None] * self.num_workers
        self._release()

    # -- WorkerPool ------------------------------------------------------------------------
    def start(self, worker: int, resume: ResumePoint, *, replacement: bool = False) -> None:
        self._end(worker)
        actor, self._parked[worker] = self._parked[worker], None
        if actor is not None and replacement:
            self._kill(actor)
            actor = None
        if actor is None:
            actor = self._new_actor(worker)
        board = self.board
        self._carry[worker] = _added_fields(board, worker)
        assignment = Assignment(
            worker,
            self.num_workers,
            board.sources if board is not None else [],
            board.timed if board is not None else False,
            self.pinned,
        )
        actor.handle.start.remote(
            self._shipped, dataclasses.replace(resume, board=None), assignment
        )
        actor.next_position = self._layout(worker, resume.base).position(0)
        actor.last = False
        for _ in range(self.prefetch):
            actor.calls.append(self._next_call(actor))
        self._actors[worker] = actor
        if board is not None:
            board.remote[worker] = _RemoteSlot(self, worker)

    def receive(self, worker: int, timeout: float) -> Group | WorkerGone | None:
        actor = self._actors[worker]
        if actor is None:
            raise RuntimeError(f"the Ray actor of worker {worker} is not running")
        if actor.groups:
            return self._handed_out(actor.groups.popleft())
        if not actor.calls:  # its last group was handed out; nothing more will come
            return None
        ready, _ = self.ray.wait([actor.calls[0]], timeout=timeout)
        if not ready:
            self._check_started(worker, actor)
            self._poll_slot(worker, actor)
            return None
        call = actor.calls.popleft()
        try:
            message = self.ray.get(call)
        except self.ray.exceptions.RayActorError as e:
            return self._gone(worker, actor, e)
        except self.ray.exceptions.RayTaskError as e:  # the message could not be made or sent
            message = failed_message(worker, e)
        self._take(worker, actor, message)
        return self._handed_out(actor.groups.popleft()) if actor.groups else None

    def ended(self) -> list[int]:
        """Workers whose actor is lost (its oldest call failed), looked for at most every
        ``ENDED_POLL_SECONDS``."""
        now = time.monotonic()
        if now - self._ended_checked < ENDED_POLL_SECONDS:
            return []
        self._ended_checked = now
        waiting = {a.calls[0]: w for w, a in enumerate(self._actors) if a is not None and a.calls}
        if not waiting:
            return []
        done, _ = self.ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        lost = []
        for ref in done:
            try:
                self.ray.get(ref, timeout=0)
            except self.ray.exceptions.RayActorError:
                lost.append(waiting[ref])
            except Exception:
                pass  # a failed message is handed out in its turn
        return sorted(lost)

    def stop(self, worker: int) -> None:
        actor = self._actors[worker]
        if actor is not None:
            self.ray.kill(actor.handle, no_restart=True)

    def close(self) -> None:
        """End the pass: what the actors made ahead is dropped, the actors are kept."""
        for worker, actor in enumerate(self._actors):
            if actor is None:
                continue
            for call in (*actor.calls, actor.slot_call):
                if call is not None:
                    self.ray.cancel(call)  # not run if not started yet
            actor.calls.clear()
            actor.groups.clear()
            actor.slot_call = None
            self._parked[worker], self._actors[worker] = actor, None
        if self.board is not None:
            self.board.remote.clear()

    def stacks(self, worker: int, timeout: float = 10.0) -> str:
        """The Python stacks of every thread of worker ``worker``'s actor."""
        actor = self._actors[worker]
        if actor is None:
            return "(no actor)"
        try:
            return self.ray.get(actor.handle.stacks.remote(), timeout=timeout)
        except Exception as e:
            return f"(no stacks: {type(e).__name__}: {e})"

    def who(self, worker: int) -> str:
        actor = self._actors[worker]
        return (actor.who or f"Ray actor {actor.name}") if actor is not None else "(no actor)"

    # -- messages --------------------------------------------------------------------------
    def _next_call(self, actor: _Actor) -> Any:
        return actor.handle.next.remote(self.config.message_items, self.config.message_seconds)

    def _take(self, worker: int, actor: _Actor, message: Message) -> None:
        """Queue a message's groups, mirror its stats slot, and ask for the next message."""
        self._check_started(worker, actor)  # where it runs (answered before its first message)
        self._mirror(worker, message.slot)
        actor.groups.extend(message.groups)
        if any(group.last for group in message.groups):
            actor.last = True
            actor.calls.clear()  # calls after the last group return nothing
        elif not actor.last:
            actor.calls.append(self._next_call(actor))
        step = self.num_workers * self._layout(worker).world_size
        for group in message.groups:
            for item in group.items:
                if not isinstance(item, ExceptionWrapper) and not item[1].ended:
                    actor.next_position = item[1].position + step

    def _handed_out(self, group: Group) -> Group:
        return group.pin_memory() if self.pinned else group

    # -- stats slots -----------------------------------------------------------------------
    def _mirror(self, worker: int, slot: Slot | None) -> None:
        """Write an actor's slot into the loader's board (see the module docstring)."""
        board, carry = self.board, self._carry[worker]
        if board is None or slot is None or carry is None:
            return
        floats, hot = slot.floats.copy(), slot.hot.copy()
        shift_ns = time.monotonic_ns() - slot.now_ns  # the actor's clock -> this process's
        added_floats, added_hot = carry
        floats[_ADDED_FLOATS] += added_floats
        floats[PUBLISHED] += shift_ns / 1e9
        started = board.array[worker, STARTED]
        floats[STARTED] = started if started else floats[STARTED] + shift_ns / 1e9
        hot[[SAMPLES, ITEMS]] += added_hot[:2]
        hot[HOT_FIELDS:] += added_hot[2:]
        hot[ITEM_SINCE_NS] += shift_ns
        board.array[worker] = floats
        board.hot[worker] = hot

    def _poll_slot(self, worker: int, actor: _Actor) -> None:
        """While the loader waits for a busy actor: its current slot, every SLOT_POLL_SECONDS."""
        if self.board is None:
            return
        if actor.slot_call is not None:
            ready, _ = self.ray.wait([actor.slot_call], timeout=0)
            if not ready:
                return
            try:
                self._mirror(worker, self.ray.get(actor.slot_call))
            except Exception:
                pass  # a lost actor is reported by its `next` call
            actor.slot_call = None
        now = time.monotonic()
        if now - actor.slot_asked >= SLOT_POLL_SECONDS:
            actor.slot_asked = now
            actor.slot_call = actor.handle.slot.remote()

    # -- starting and losing actors --------------------------------------------------------
    def _new_actor(self, worker: int) -> _Actor:
        """An actor kept by an earlier loader (``keep_actors``) that still answers, or a new one."""
        idle = _IDLE.get(self.config.actor_kind(), [])
        while idle:
            name, handle = idle.pop()
            ready = handle.describe.remote()
            done, _ = self.ray.wait([ready], timeout=IDLE_CHECK_SECONDS)
            if done:
                self._live[name] = handle
                actor = _Actor(handle, name, time.monotonic(), ready)
                self._check_started(worker, actor)
                return actor
            _kill_quietly(self.ray, handle)
        name = f"energon-{secrets.token_hex(6)}"
        handle = self._class.options(name=name, **self.config.options()).remote()
        self._live[name] = handle
        return _Actor(handle, name, time.monotonic(), handle.describe.remote())

    def _check_started(self, worker: int, actor: _Actor) -> None:
        """Learn where a new actor runs; one that the cluster has not started within
        ``start_timeout_seconds`` ends the pass with a ClusterError."""
        if actor.ready is None:
            return
        ready, _ = self.ray.wait([actor.ready], timeout=0)
        if ready:
            try:
                self._describe(worker, actor, self.ray.get(actor.ready))
            except self.ray.exceptions.RayActorError:
                return  # its `next` call reports it gone
            actor.ready = None
            return
        waited = time.monotonic() - actor.created
        if waited >= self.config.start_timeout_seconds:
            self._end(worker)
            raise ClusterError(self._not_started(worker, waited))

    def _describe(self, worker: int, actor: _Actor, where: dict[str, Any]) -> None:
        actor.pid = where["pid"]
        node = f"node {where['node_id'][:8]} ({where['ip']})"
        streams = ", ".join(str(s) for s in self._layout(worker).streams())
        actor.who = (
            f"Ray actor {actor.name} (worker {worker} of rank {self._rank}, pid {actor.pid} on "
            f"{node}; logical streams {streams})"
        )

    def _not_started(self, worker: int, waited: float) -> str:
        ray = self.ray
        try:
            total, free, nodes = ray.cluster_resources(), ray.available_resources(), ray.nodes()
        except Exception as e:  # the diagnosis must not hide the error
            return f"the Ray actor of worker {worker} was not started within {waited:.0f} s ({e})"
        alive = sum(1 for n in nodes if n.get("Alive"))
        return (
            f"the Ray cluster could not place and start the actor of worker {worker} within "
            f"{waited:.0f} s (RayWorkers.start_timeout_seconds="
            f"{self.config.start_timeout_seconds:g}). Each actor asks for "
            f"{_asked(self.config.options())}; the cluster has {_resources(free)} free of "
            f"{_resources(total)}, on {alive} live node(s) ({len(nodes) - alive} gone). Add "
            "nodes, or ask for less per actor (num_cpus, memory, resources), or run fewer actors "
            "(docs/ray.md)"
        )

    def _gone(self, worker: int, actor: _Actor, error: Exception) -> WorkerGone:
        """Report an actor lost, and leave on the board the place it was lost at (see the module
        docstring: no sample is named)."""
        if actor.ready is not None:
            try:
                self._describe(worker, actor, self.ray.get(actor.ready, timeout=0))
            except Exception:
                pass
        self._end(worker)
        board = self.board
        if board is not None:
            hot = board.hot[worker]
            hot[STAGE], hot[INDEX] = WAIT, -1
            if actor.next_position is not None:
                hot[POSITION] = actor.next_position
            if actor.pid is not None:
                board.array[worker, PID] = actor.pid  # the slot is the lost actor's
        return WorkerGone(worker, actor.who or f"Ray actor {actor.name}", _cause(error), actor.pid)

    def _end(self, worker: int) -> None:
        """Forget worker ``worker``'s actor (killed if it is still there)."""
        actor, self._actors[worker] = self._actors[worker], None
        if actor is not None:
            self._kill(actor)

    def _kill(self, actor: _Actor) -> None:
        self._live.pop(actor.name, None)
        _kill_quietly(self.ray, actor.handle)


class _RemoteSlot:
    """A board slot whose process is a Ray actor, for the watchdog and the stats: who it is, and
    its stacks (asked from the actor: no signal reaches another machine)."""

    def __init__(self, pool: RayPool, worker: int) -> None:
        self._pool = weakref.ref(pool)
        self.worker = worker

    @property
    def who(self) -> str:
        pool = self._pool()
        return pool.who(self.worker) if pool is not None else "(gone)"

    def stacks(self) -> str:
        pool = self._pool()
        return pool.stacks(self.worker) if pool is not None else "(gone)"


def _release(ray: Any, live: dict[str, Any], kind: str, keep: bool) -> None:
    """The pool is done: its actors end, or wait for the next loader (``keep_actors``)."""
    if keep:
        _IDLE.setdefault(kind, []).extend(live.items())
    else:
        for handle in live.values():
            _kill_quietly(ray, handle)
    live.clear()


def _kill_quietly(ray: Any, handle: Any) -> None:
    if not ray.is_initialized():
        return  # disconnected: the cluster ends the actors of this job (and a call would connect)
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        pass  # already gone, or Ray is shut down


def _shipped(ray: Any, dataset: SavableDataset, cache_pool: Any) -> Any:
    """The dataset and the loader's cache pool in the object store, once for all actors; the
    worker config without what cannot leave this process (the torch process group, an open
    debug file)."""
    portable = dataset.with_spec(dataset.spec)
    portable.worker_config = dataclasses.replace(
        dataset.worker_config, data_parallel_group=None, _worker_debug_file=None
    )
    try:
        return ray.put((portable, cache_pool))
    except Exception as e:
        raise ClusterError(
            f"the dataset cannot be sent to Ray actors ({type(e).__name__}: {e}): what it holds "
            "(the task encoder, its hooks and what they refer to) must be picklable, and "
            "importable on every node (docs/ray.md)"
        ) from e


def _added_fields(board: Board | None, worker: int) -> tuple[np.ndarray, np.ndarray] | None:
    """What the worker's earlier processes counted (a started actor counts from zero)."""
    if board is None:
        return None
    floats = board.array[worker, _ADDED_FLOATS].copy()
    hot = board.hot[worker]
    return floats, np.concatenate([hot[[SAMPLES, ITEMS]], hot[HOT_FIELDS:]]).copy()


def _cause(error: Exception) -> str:
    """Why an actor is gone, in a few words, from Ray's error."""
    text = str(error)
    if "killed by `ray.kill`" in text:
        return "was killed with ray.kill"
    if "node has died" in text or "node was terminated" in text:
        node = text.split("Node Id: ", 1)[1].split()[0][:8] if "Node Id: " in text else "?"
        return f"was lost with its node {node} (the node died or left the cluster)"
    if "worker process has died" in text:
        return "lost its process (a signal, os._exit, a crash or the OOM killer)"
    if "is unavailable" in text:
        return "became unreachable (its node died or was cut off, or its process hangs)"
    lines = text.strip().splitlines()
    return f"was lost: {lines[-1] if lines else type(error).__name__}"


def _asked(options: dict[str, Any]) -> str:
    asked = {"CPU": options.get("num_cpus", 1)}
    if options.get("memory"):
        asked["memory"] = options["memory"]
    asked.update(options.get("resources") or {})
    return _resources(asked)


def _resources(resources: Mapping[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if not k.startswith("node:")}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"
