"""``megatron.energon.savable`` and ``megatron.energon.state``: the contract of an object whose state
can be saved and restored, and the dict that carries such a state (defined in :mod:`energon.savable`,
which energon's ``SavableDataset`` implements).
"""

from __future__ import annotations

from energon.savable import FlexState, Savable

__all__ = ["FlexState", "Savable"]
