"""``ResumePoint``: where a loader's next pass of executors starts (its own position, never the
dataset's: any number of loaders can share one dataset object)."""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.pipeline.snapshot import StreamSnapshot


@dataclasses.dataclass
class ResumePoint:
    """Where the next pass of executors starts: the rank's next position and stream snapshots."""

    base: int = 0
    origin: int = 0  # where the rank's global steps are counted from (balanced windows)
    tail: dict[str, Any] | None = None  # a balanced window's tail (energon.balance.tail)
    snapshots: dict[int, StreamSnapshot] = dataclasses.field(default_factory=dict)
    board: str | None = None  # the folder of the loader's stats board (energon.observe.probe)
