"""The reference's state contract of one object: ``Savable`` (``save_state`` / ``restore_state``)
and ``FlexState``, the dict such a state is.

energon's loaders save plain-data stream states and never ask a dataset for its own; this contract
is what code written for Megatron-Energon calls on datasets and wrappers it iterates itself, and what
its hand-written datasets implement (:mod:`energon.loader.hand_written`). ``FlexState`` is a plain
dict, so such states stay JSON- and ``torch.load(weights_only=True)``-loadable when their values are.
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
        """Continue as the object that saved ``state`` would have (None: the initial state)."""
