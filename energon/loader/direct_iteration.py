"""Where iterating a planned dataset without a loader (``for x in dataset``) has got to.

The reference lets code iterate a dataset by hand and ask it for ``save_state()``; energon's planned
datasets answer with this position: the rank's next global position and the snapshot of each
logical stream the iteration has read, plain data like a loader's state. ``restore_state`` makes the
next ``iter(dataset)`` continue from it. Loaders never read it: they keep their own positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.errors import StateError
from energon.pipeline.executor import ItemMeta
from energon.pipeline.snapshot import StreamSnapshot
from energon.worker import Layout


@dataclasses.dataclass
class DirectPosition:
    """``base``: the layout base the next executor starts from; ``emitted``: items yielded so far
    (for ``virtual_epoch_length`` / ``limit``); ``snapshots``: each stream's state after its last
    item."""

    base: int = 0
    emitted: int = 0
    snapshots: dict[int, StreamSnapshot] = dataclasses.field(default_factory=dict)

    def advance(self, meta: ItemMeta, layout: Layout, counted: bool) -> DirectPosition:
        """The position after ``meta``'s item (an ended stream's final snapshot consumes no
        position; a hole or an item consumes one)."""
        snapshots = {**self.snapshots, meta.stream: meta.snapshot}
        if meta.ended:
            return dataclasses.replace(self, snapshots=snapshots)
        # the executor's next position is meta.position + step; base is counted without its offset
        step = layout.position(1) - layout.position(0)
        offset = layout.position(0) - layout.base
        return DirectPosition(
            base=meta.position + step - offset,
            emitted=self.emitted + int(counted),
            snapshots=snapshots,
        )

    def to_state(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "emitted": self.emitted,
            "snapshots": {str(stream): snap for stream, snap in self.snapshots.items()},
        }

    @classmethod
    def from_state(cls, state: Any, where: str) -> DirectPosition:
        """Read back :meth:`to_state` (``StateError`` naming the field that is wrong)."""
        if state is None:
            return cls()
        try:
            return cls(
                base=int(state["base"]),
                emitted=int(state["emitted"]),
                snapshots={int(s): snap for s, snap in dict(state["snapshots"]).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"{where}: not a saved iteration position ({e!r})") from e
