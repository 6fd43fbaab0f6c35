"""The stage contract: every step of a logical stream is a :class:`Stage`.

A stage turns the items of its upstream stage into its own items. An item is ``(value, key)``: a
value (a sample pointer, a sample, a packed sample, a batch) and its restore key
(:mod:`energon.pipeline.keys`), from which the chain can regenerate the value. A stage has four
methods and nothing else is asked of it:

- ``next()``: the next item; ``StopIteration`` at the end of a finite (validation) pass.
  (``next_items(count)``, for a consumer that needs several at once, gives the same items.)
- ``state()``: plain JSON-able data (counters, cursors, the keys of buffered items; never values).
- ``restore(state)``: continue exactly as the stage that saved ``state`` would have. The upstream
  is restored first; buffered items are regenerated through ``upstream.rebuild``. A state is data
  from a file: every field is checked (:mod:`energon.state_fields`), a bad one is a ``StateError``.
- ``rebuild(key)``: the value ``key`` names (used to refill buffers on restore and by
  ``Loader.restore_sample``).

Stages call ``upstream.next()`` directly; ``for`` loops and ``next(stage)`` work too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, TypeAlias

from energon import state_fields as fields
from energon.errors import ErrorPolicy
from energon.pipeline.keys import Key

Value: TypeAlias = Any  # whatever the stage makes: a pointer key, a sample, a batch (user types)
Item: TypeAlias = tuple[Value, Key]
StageState: TypeAlias = dict[str, Any]  # plain JSON data


class Stage(ABC):
    """Base of all stages. ``policy`` is the stage's error policy, if it has one: its counters are
    saved with the stage's state by :meth:`counters` and :meth:`restore_counters`."""

    policy: ErrorPolicy | None = None

    @abstractmethod
    def next(self) -> Item:
        """The next item (``StopIteration`` when a finite pass ends)."""

    @abstractmethod
    def state(self) -> StageState:
        """Plain data from which :meth:`restore` continues exactly here."""

    @abstractmethod
    def restore(self, state: StageState) -> None:
        """Continue as the stage that saved ``state`` would have (after the upstream's restore)."""

    @abstractmethod
    def rebuild(self, key: Key) -> Value:
        """The value that ``key`` names."""

    def next_items(self, count: int) -> list[Item]:
        """The next ``count`` items, fewer only where a finite pass ends (none: it has ended).

        A consumer that needs several items at once (a batch) asks for them together, so that a
        stage able to make several faster than one by one (the load stage decodes their images
        on threads, :mod:`energon.decode.threads`) may do so. Items, their order and the state
        after them are what ``count`` calls of :meth:`next` give."""
        items = []
        for _ in range(count):
            try:
                items.append(self.next())
            except StopIteration:
                break
        return items

    def skip_items(self, count: int) -> int | None:
        """Move the state forward as if this stage had emitted ``count`` more items, without
        computing them; returns how many upstream items that consumed, or None (and changes
        nothing) when that depends on the data (buffers, packing, grouping, generators).

        The ledger uses it to jump a simulated stream ahead: only the pointer stages have to run
        item by item (see ``energon.ledger.advance``). It assumes no item fails or is skipped.
        """
        return None

    def check_key(self, key: Key) -> None:
        """Raise ``StateError`` unless ``key`` (read back from a state) names an item this stage
        can make. Pointer stages check sample pointers; others ask their upstream."""
        upstream = getattr(self, "upstream", None)
        if upstream is not None:
            upstream.check_key(key)

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        return self.next()

    def counters(self) -> dict[str, int]:
        """The error policy's counters, to be merged into :meth:`state`."""
        if self.policy is None:
            return {}
        return {"skipped": self.policy.skipped}

    def restore_counters(self, state: StageState) -> None:
        if self.policy is not None:
            self.policy.skipped = fields.int_field(state, "skipped", "stage", default=0)
