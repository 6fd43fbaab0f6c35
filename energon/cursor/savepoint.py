"""All ranks' states of one save, merged into one view that edits work on."""

from __future__ import annotations

import dataclasses
from typing import Any

from energon import arguments
from energon.pipeline import snapshot
from energon.pipeline.snapshot import StreamSnapshot
from energon.plan.edits import PlanEdits, edits_from_json
from energon.state import check_state_shape, make_rank_state, redistribute_states, stream_snapshots


@dataclasses.dataclass
class SavePoint:
    """Every position below ``position`` was consumed; ``snapshots`` holds each stream's snapshot
    furthest ahead (a stream past ``position`` was read further by a rank that was ahead)."""

    state: dict[str, Any]  # one merged rank state: fingerprint, version, micro-batch size, ...
    position: int
    world_size: int
    num_streams: int
    snapshots: dict[int, StreamSnapshot]
    edits: PlanEdits | None

    def emitted(self, stream: int) -> int:
        snap = self.snapshots.get(stream)
        return snapshot.emitted(snap) if snap is not None else 0

    def emitted_list(self) -> list[int]:
        """Items each stream had emitted (what the edit history records)."""
        return [self.emitted(s) for s in range(self.num_streams)]

    def rank_states(
        self,
        *,
        snapshots: dict[int, StreamSnapshot],
        edits: PlanEdits | None,
        fingerprint: dict[str, Any],
        digest: str,
        position: int | None = None,
    ) -> list[dict[str, Any]]:
        """States for this save point's world size after an edit (every rank continues at
        ``position``)."""
        return [
            make_rank_state(
                fingerprint=fingerprint,
                fingerprint_digest=digest,
                num_streams=self.num_streams,
                world_size=self.world_size,
                rank=rank,
                origin=self.position if position is None else position,
                consumed=0,
                pass_offset=0,
                streams=snapshots,
                micro_batch_size=self.state.get("micro_batch_size"),
                version=self.state["version"],
                edits=edits.to_json() if edits is not None else None,
            )
            for rank in range(self.world_size)
        ]


def merge_states(states: list[dict[str, Any]]) -> SavePoint:
    """The save point of all ranks' states (one per rank, saved at the same step)."""
    arguments.not_empty(states, "states", "the loader states of all ranks (one per rank)")
    states = [check_state_shape(s) for s in states]
    merged = redistribute_states(states, states[0]["world_size"])[0]
    return SavePoint(
        state=merged,
        position=merged["origin"],
        world_size=merged["world_size"],
        num_streams=merged["num_streams"],
        snapshots=stream_snapshots(merged),
        edits=edits_from_json(merged.get("edits")),
    )


def upgraded(point: SavePoint, pointer_kinds: list[str]) -> SavePoint:
    """The save point with its snapshots in the current state version (older versions tagged
    pointers differently)."""
    from energon.state import upgrade_state

    state = upgrade_state(point.state, pointer_kinds)
    return dataclasses.replace(point, state=state, snapshots=stream_snapshots(state))
