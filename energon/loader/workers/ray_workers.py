"""``RayWorkers``: a loader option that runs the loader's workers as Ray actors on any node of a Ray
cluster (``get_savable_loader(ds, workers=RayWorkers(num_actors=8))``; docs/ray.md).

Actor ``w`` runs exactly what local worker ``w`` would run: ``dataset.executor(w, resume)``, the
rank's positions ``w, w + W, ...`` over the dataset's logical streams, in the same messages with
every item's stream snapshot. So the loader receives the same batches in the same order as with
``num_actors`` local workers, saves the same state (a state saved with actors restores with local
workers and the reverse, with any number of either), and replaces a lost actor with the machinery
that replaces a lost process (:mod:`energon.loader.recovery`). How the actors are driven:
:mod:`energon.loader.workers.ray_pool`; what runs in them: :mod:`energon.loader.workers.ray_actor`.

This module imports no Ray: only a loader that uses ``RayWorkers`` connects to a cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from energon.loader.savable_dataset import SavableDataset
from energon.loader.workers.base import WorkerPool
from energon.observe.probe import Board


@dataclasses.dataclass(frozen=True)
class RayWorkers:
    """Run a loader's workers as Ray actors (see the module docstring and docs/ray.md).

    ``num_actors``: the actors of each rank (the loader's number of workers: the dataset's logical
    streams are spread over them as over as many local workers). ``address``: the cluster
    (``"auto"``: the one this machine belongs to; ``"HOST:PORT"``; ``"ray://HOST:10001"``; None: a
    private one-machine instance); a process already connected with ``ray.init`` keeps its
    cluster. ``num_cpus`` / ``memory`` (bytes) / ``resources``: what each actor reserves on its
    node; ``actor_options``: further options of Ray's ``.options()`` (``scheduling_strategy``,
    ``runtime_env``, ...).

    ``message_items`` / ``message_seconds``: an actor sends the items it made within
    ``message_seconds``, at most ``message_items``, as one message (a Ray call costs more than a
    pipe write, so messages carry more than a local worker's). ``prefetch``: messages per actor
    made ahead (None: the loader's ``prefetch_factor``); a rank holds at most
    ``num_actors x prefetch x message_items`` items in flight.

    ``start_timeout_seconds``: how long an actor may take to be placed and started (a cluster
    that adds nodes on demand needs minutes) before the pass ends with one
    :class:`~energon.errors.ClusterError`. ``keep_actors``: the actors of a loader that is dropped
    wait for the next loader whose actors ask for the same (address and actor options; it then
    starts at once), instead of ending; they keep their reservation on the cluster meanwhile.
    """

    num_actors: int
    address: str | None = "auto"
    num_cpus: float = 1.0
    memory: int | None = None
    resources: Mapping[str, float] | None = None
    actor_options: Mapping[str, Any] | None = None
    message_items: int = 32
    message_seconds: float = 0.05
    prefetch: int | None = None
    start_timeout_seconds: float = 120.0
    keep_actors: bool = False

    def __post_init__(self) -> None:
        for name in ("num_actors", "message_items", "prefetch"):
            value = getattr(self, name)
            if name == "prefetch" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RayWorkers: {name} must be an integer >= 1, got {value!r}")
        for name in ("num_cpus", "message_seconds", "start_timeout_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"RayWorkers: {name} must be a number >= 0, got {value!r}")
        if self.start_timeout_seconds <= 0:
            raise ValueError("RayWorkers: start_timeout_seconds must be > 0")

    @property
    def num_workers(self) -> int:
        return self.num_actors

    def options(self) -> dict[str, Any]:
        """The Ray options of each actor (what it asks of its node)."""
        options: dict[str, Any] = dict(self.actor_options or {})
        options.setdefault("num_cpus", self.num_cpus)
        if self.memory is not None:
            options.setdefault("memory", self.memory)
        if self.resources:
            options.setdefault("resources", dict(self.resources))
        # energon replaces lost actors itself, from the snapshots the loader holds
        options["max_restarts"] = 0
        options["max_task_retries"] = 0
        return options

    def actor_kind(self) -> str:
        """Actors made with equal options are interchangeable (``keep_actors``)."""
        return repr((self.address, sorted(self.options().items(), key=lambda kv: kv[0])))

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "num_actors": self.num_actors,
            "address": self.address,
            "num_cpus": self.num_cpus,
            "message_items": self.message_items,
            "prefetch": self.prefetch,
            "keep_actors": self.keep_actors,
        }

    def pool(
        self,
        dataset: SavableDataset,
        *,
        prefetch: int,
        pinned: bool,
        board: Board | None,
        cache_pool: Any = None,
        previous: WorkerPool | None = None,
    ) -> WorkerPool:
        """The actors of a loader pass: those of the ``previous`` pass of the same loader when it
        had some (an actor takes seconds to start: a validation loader starts a pass every few
        hundred steps), else new ones (:class:`~energon.loader.workers.ray_pool.RayPool`)."""
        from energon.loader.workers.ray_pool import RayPool

        if isinstance(previous, RayPool) and previous.config == self and previous.board is board:
            previous.renew(dataset, cache_pool)
            return previous
        return RayPool(
            self,
            dataset,
            prefetch=self.prefetch or prefetch,
            pinned=pinned,
            board=board,
            cache_pool=cache_pool,
        )
