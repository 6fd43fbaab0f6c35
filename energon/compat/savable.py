"""``megatron.energon.savable`` and ``megatron.energon.state``: the contract of an object whose state
can be saved and restored, and the dict that carries such a state.

energon's own states are plain data (dicts of ints, strings and lists, see docs/save-restore.md);
``FlexState`` is such a dict, so a ``Savable`` written for the reference saves states that energon's
loaders, checkpoint tools and ``torch.load(weights_only=True)`` accept.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["FlexState", "Savable"]


class FlexState(dict):
    """A state: a plain dict (JSON- and ``weights_only``-loadable when its values are)."""


class Savable(ABC):
    """An object whose state can be saved (``save_state``) and restored (``restore_state``)."""

    @abstractmethod
    def save_state(self) -> FlexState:
        """The object's state, as plain data."""

    @abstractmethod
    def restore_state(self, state: FlexState | None) -> None:
        """Restore ``state`` (None: the initial state)."""
