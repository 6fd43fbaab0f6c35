"""Where a rank's balanced windows come from: planned here, or read from a shared plan store.

An exact share of a balanced step depends on every sample of the window (one cost anywhere can
move a sample into or out of it), so a rank that plans alone reads all ``ranks x batch``
pointers of each step: its planning grows with the number of ranks. A :class:`PlanSource` hides
who planned a window from :class:`~energon.pipeline.balanced_executor.BalancedExecutor`:

- :class:`LocalPlans` (the default): every rank plans every window itself;
- :class:`SharedPlans` (``Balance(plan_store=DIR)``): window ``k`` is planned once, by rank
  ``k mod ranks`` (the loader worker of that rank that takes the window's first step), and
  published to :mod:`energon.balance.store`; every other rank and worker waits for the file (at
  most ``Balance.plan_wait`` seconds) and reads only its shares. A window published before
  training (:func:`publish_plans`) is read at once. When the wait runs out the rank plans the
  window itself (the same plan: planning is deterministic) and warns; a file that does not
  continue the previous window stops the loader with :class:`~energon.balance.store.PlanStoreError`.

Both give the same windows: the stored shares and costs are those the local plan makes, to the
bit (float64 written and read back). Tails of elastic restores are always planned locally.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from energon.balance.store import Key, PlanStore, StoredWindow, StreamSnapshot, snapshots_digest
from energon.errors import PlanStoreError


class PlannedWindow(Protocol):
    """A window of global steps as a rank uses it: its shares, costs and streams' snapshots."""

    first: int  # its first global position
    steps: int  # global steps it holds (fewer at the end of a finite pass)
    start: Mapping[int, StreamSnapshot]  # every stream before the window
    end: Mapping[int, StreamSnapshot]  # every stream after it

    def share(self, step: int, rank: int) -> list[tuple[int, int, Key]]:
        """(position, member, pointer key) of each sample ``rank`` gets in ``step``."""
        ...

    def rank_costs(self, step: int) -> Sequence[float]:
        """Every rank's planned cost of ``step``."""
        ...


@dataclasses.dataclass
class Window:
    """A window of global steps planned here: its pointers, their costs and who gets which."""

    index: int  # counted from the origin in windows of Balance.window steps
    steps: int
    pool: list[tuple[int, int, Key]]  # (position, member, key) of every pointer read
    costs: list[float]  # what the plan counts of each pointer (Balance.planned_cost)
    plan: list[list[list[int]]]  # [step][rank] -> indices into pool
    start: dict[int, StreamSnapshot]
    end: dict[int, StreamSnapshot]
    first: int = 0

    def share(self, step: int, rank: int) -> list[tuple[int, int, Key]]:
        return [self.pool[i] for i in self.plan[step][rank]]

    def rank_costs(self, step: int) -> list[float]:
        return [sum(self.costs[i] for i in share) for share in self.plan[step]]


@dataclasses.dataclass(frozen=True)
class WindowAt:
    """Which window a rank asks for, and whether it is the one to plan it."""

    first: int  # its first global position
    owner: bool  # this rank (worker) plans and publishes it
    start: Callable[[], Mapping[int, StreamSnapshot]]  # the streams' snapshots at ``first``


class PlanSource(Protocol):
    """The contract between the balanced executor and whoever plans its windows."""

    def window(self, at: WindowAt, plan: Callable[[], Window]) -> PlannedWindow:
        """The window starting at ``at.first``; ``plan()`` plans it here."""
        ...


class LocalPlans:
    """Every rank plans every window itself (nothing shared)."""

    def window(self, at: WindowAt, plan: Callable[[], Window]) -> PlannedWindow:
        return plan()


class SharedPlans:
    """Windows planned once and read from a plan store (see the module's docstring)."""

    def __init__(self, store: Callable[[], PlanStore], wait: float, window_positions: int) -> None:
        self._open_store = store  # made on first use: the run digest reads the whole config
        self._store: PlanStore | None = None
        self.wait = wait
        self.window_positions = window_positions  # global positions of a whole window
        self.planned = 0  # windows this process planned (as the owner, or after a wait ran out)
        self.read = 0  # windows read from the store
        self.fallbacks = 0  # windows planned here because the wait ran out
        self._chain: tuple[int, str] | None = None  # (first position, start digest) expected next

    @property
    def store(self) -> PlanStore:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def window(self, at: WindowAt, plan: Callable[[], Window]) -> PlannedWindow:
        stored = self.store.read(at.first)
        if stored is None and not at.owner:
            stored = self._wait_for(at.first)
        if stored is None:
            return self._plan_here(at, plan)
        self._check_chain(stored, at)
        self.read += 1
        return stored

    def _plan_here(self, at: WindowAt, plan: Callable[[], Window]) -> Window:
        window = plan()
        self.planned += 1
        if not self.store.has(at.first):
            self.publish(window)
        self._chain = (window.first + self.window_positions, snapshots_digest(window.end))
        return window

    def publish(self, window: Window) -> None:
        """Write a window planned here to the store."""
        kinds = sorted({key[0] for *_, key in window.pool})
        ranks = self.store.ranks
        shares = [[window.share(step, r) for r in range(ranks)] for step in range(window.steps)]
        costs = [window.rank_costs(step) for step in range(window.steps)]
        self.store.write(window.first, kinds, shares, costs, window.start, window.end)

    def _wait_for(self, first: int) -> StoredWindow | None:
        """The window once its owner published it, or None (with a warning) after ``wait`` s."""
        deadline = time.monotonic() + self.wait
        pause = 0.001
        while time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            stored = self.store.read(first)
            if stored is not None:
                return stored
        self.fallbacks += 1
        warnings.warn(
            f"balance plan store: window at global position {first} was not published in "
            f"{self.store.path(first)} within {self.wait:g} s (Balance.plan_wait); planning it "
            "on this rank (the same plan, at the cost of planning all ranks' shares)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None

    def _check_chain(self, stored: StoredWindow, at: WindowAt) -> None:
        """A stored window must start where the streams are: the previous window's end, or
        (for the first window this process reads) the snapshots it started or restored from."""
        if self._chain is not None and self._chain[0] == at.first:
            expected = self._chain[1]
        else:
            expected = snapshots_digest(at.start())
        if stored.header["start_digest"] != expected:
            raise PlanStoreError(
                f"balance plan store: {stored.path} does not start where this rank's streams "
                f"are at global position {at.first} (its start snapshots differ from the "
                "previous window's end or from the restored state): the store holds plans of "
                "another run; remove it or point Balance(plan_store=...) elsewhere"
            )
        self._chain = (at.first + self.window_positions, stored.header["end_digest"])


def plan_source(balance: Any, spec: Any, ranks: int, end: int | None) -> PlanSource:
    """The plan source ``Balance.plan_store`` asks for (``spec``: the pipeline's spec)."""
    if balance.plan_store is None:
        return LocalPlans()

    def store() -> PlanStore:
        return PlanStore(balance.plan_store, spec.config(), ranks, end)

    return SharedPlans(store, balance.plan_wait, balance.window * ranks)


def publish_plans(dataset: Any, steps: int, progress: bool = True) -> int:
    """Plan the windows of the first ``steps`` global steps of ``dataset`` (a balanced training
    dataset with ``Balance(plan_store=...)``, built as for any rank of the run) in this process
    and publish those not in the store yet, before training; returns the windows published.
    Ranks then read every such window at once instead of waiting for its planner."""
    from tqdm import tqdm

    executor = dataset.executor(0, all_workers=True)
    source = executor.plans
    if not isinstance(source, SharedPlans):
        raise ValueError("publish_plans needs a dataset built with Balance(plan_store=...)")
    windows = -(-steps // executor.balance.window)
    published = 0
    for index in tqdm(range(windows), desc="planning windows", disable=not progress):
        window = executor.plan_window(index)
        if window.steps == 0:
            break
        if not source.store.has(window.first):
            source.publish(window)
            published += 1
    return published
