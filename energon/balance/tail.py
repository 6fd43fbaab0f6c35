"""The *tail* of a balanced window interrupted by an elastic restore (another number of ranks).

A window of ``Balance.window`` global steps is planned for the ``R`` ranks that trained it
(:mod:`energon.pipeline.balanced_executor`). States saved after step ``d`` of it hold the window's
start snapshots; restored on ``R'`` ranks, the window is planned as it was, for ``R`` ranks, and exactly
the samples of its steps ``d, d+1, ...`` (not delivered yet) are composed into
``ceil((steps - d) * R / R')`` steps for ``R'`` ranks: the tail. Normal windows for ``R'`` ranks
follow from the window's end. A tail interrupted by another elastic restore becomes the next
layer of the same construction, so the state describes the tail as a list of layers.

The tail is position, not configuration: it lives in the state field ``balance_tail`` (plain
data, identical in every rank's state, not part of the fingerprint)::

    {"start": W0, "layers": [[R0, d0], [R1, d1], ...]}

``W0``: the interrupted window's first global position; layer ``i`` was trained by ``Ri`` ranks
that delivered ``di`` of its steps. The current layer is trained by the state's ``world_size``
ranks; its steps take the global positions ``origin ... W_end - 1`` (``W_end = W0 + window * R0``,
``origin = W_end - T * world_size`` with ``T`` its nominal steps), so that the positions after
it are those of the streams again and the rank's ``consumed`` counts the tail's steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from energon import state_fields as fields
from energon.balance.assign import compose_steps
from energon.errors import StateError

TAIL_FIELD = "balance_tail"
MAX_LAYERS = 64  # elastic restores inside one window; more is a damaged state


def layers_of(tail: dict[str, Any]) -> list[tuple[int, int]]:
    return [(int(r), int(d)) for r, d in tail["layers"]]


def tail_steps(tail: dict[str, Any], window: int, world_size: int) -> int:
    """Nominal steps of the current layer (a window not cut short by the end of a pass)."""
    layers = layers_of(tail)
    steps = window
    for (ranks, delivered), following in zip(layers, [r for r, _ in layers[1:]] + [world_size]):
        steps = -(-max(0, steps - delivered) * ranks // following)
    return steps


def tail_end(tail: dict[str, Any], window: int) -> int:
    """The first global position after the interrupted window (where normal windows resume)."""
    return int(tail["start"]) + window * layers_of(tail)[0][0]


def tail_origin(tail: dict[str, Any], window: int, world_size: int) -> int:
    """The ``origin`` of a state in the tail: its steps end where the window ended."""
    return tail_end(tail, window) - tail_steps(tail, window, world_size) * world_size


def compose_tail(
    plan: list[list[list[int]]],
    costs: Sequence[float],
    layers: Sequence[tuple[int, int]],
    world_size: int,
) -> list[list[list[int]]]:
    """The current layer's ``[step][rank]`` shares (indices into the window's pool), from the
    window's own ``plan`` (for ``layers[0]``'s ranks): each layer keeps the samples of the steps
    its ranks did not deliver and composes them for the next layer's ranks. Pure and
    deterministic (samples in pool order), so every new rank computes the same tail. A layer
    whose number of ranks did not change keeps its steps as they were planned."""
    following = [r for r, _ in layers[1:]] + [world_size]
    for (ranks, delivered), next_ranks in zip(layers, following):
        left = plan[delivered:]
        if next_ranks == ranks:
            plan = left
            continue
        rest = sorted(i for step in left for share in step for i in share)
        steps = -(-len(left) * ranks // next_ranks)
        if not steps:
            return []
        composed = compose_steps([costs[i] for i in rest], next_ranks, steps)
        plan = [[[rest[j] for j in share] for share in step] for step in composed]
    return plan


def check_tail(state: dict[str, Any]) -> dict[str, Any] | None:
    """The state's tail (None when it has none), checked against the state: a damaged or edited
    tail is a :class:`StateError` naming the field."""
    tail = state.get(TAIL_FIELD)
    if tail is None:
        return None
    balance = state["fingerprint"].get("balance")
    if not isinstance(balance, dict):
        raise StateError(f"loader state field {TAIL_FIELD!r} belongs to balanced mode only")
    window = fields.as_int(balance.get("window", 1), "fingerprint.balance.window", low=1)
    fields.int_field(tail, "start", TAIL_FIELD)
    layers = fields.list_field(tail, "layers", TAIL_FIELD, max_len=MAX_LAYERS)
    if not layers:
        raise fields.bad_field(f"{TAIL_FIELD}.layers", layers, "at least one [ranks, delivered]")
    steps = window
    for i, layer in enumerate(layers):
        where = f"{TAIL_FIELD}.layers[{i}]"
        if not (isinstance(layer, list | tuple) and len(layer) == 2):
            raise fields.bad_field(where, layer, "[ranks, delivered steps]")
        ranks = fields.as_int(layer[0], f"{where}[0]", low=1)
        delivered = fields.as_int(layer[1], f"{where}[1]", high=max(0, steps - 1))
        following = layers[i + 1][0] if i + 1 < len(layers) else state["world_size"]
        if not isinstance(following, int) or following < 1:
            following = 1  # reported when its own layer is checked
        steps = -(-(steps - delivered) * ranks // following)
    expected = tail_origin(tail, window, state["world_size"])
    if state["origin"] != expected:
        raise fields.bad_field("origin", state["origin"], f"{expected} (the end of the tail)")
    return tail


def settled(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with a tail that its ranks finished folded away: counted from the window's end,
    as if the windows had never been interrupted (the streams are past the tail then)."""
    tail = state.get(TAIL_FIELD)
    if tail is None:
        return state
    window = state["fingerprint"]["balance"].get("window", 1)
    steps = tail_steps(tail, window, state["world_size"])
    if state["consumed"] < steps:
        return state
    out = {k: v for k, v in state.items() if k != TAIL_FIELD}
    out["origin"] = tail_end(tail, window)
    out["consumed"] = state["consumed"] - steps
    return out
