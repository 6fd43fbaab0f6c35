"""Checked reads of saved-state fields: a state is data from a file, validated, never trusted.

Every ``restore`` reads its fields through these helpers, so a damaged or edited state (a negative
cursor, a counter of 1e15, a buffer longer than the buffer) is a :class:`StateError` that names
the field, instead of a hang or a silently different order. ``where`` is the field's path inside
the stage's state; :meth:`energon.pipeline.stream.Stream.restore` prefixes the stream and stage.
"""

from __future__ import annotations

from typing import Any

from energon.errors import StateError

# Replays that a restore may run (e.g. outputs of a generator hook re-run to reach its position):
# more than this is a damaged state, not a position.
MAX_REPLAY = 1_000_000


def bad_field(where: str, value: Any, expected: str) -> StateError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return StateError(f"loader state field {where!r} is {shown}, expected {expected}")


def path(where: str, name: str) -> str:
    """``where.name`` (just ``name`` at the top level, where ``where`` is empty)."""
    return f"{where}.{name}" if where else name


def get(state: Any, name: str, where: str) -> Any:
    if not isinstance(state, dict):
        raise bad_field(where, state, "a mapping")
    if name not in state:
        raise StateError(f"loader state field {path(where, name)!r} is missing")
    return state[name]


def as_int(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    """An int (not a bool) in ``[low, high]``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_field(where, value, "an integer")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise bad_field(where, value, f"an integer {bounds}")
    return value


def int_field(
    state: Any, name: str, where: str, low: int = 0, high: int | None = None, default: Any = None
) -> int:
    if default is not None and isinstance(state, dict) and name not in state:
        return default
    return as_int(get(state, name, where), path(where, name), low, high)


def bool_field(state: Any, name: str, where: str) -> bool:
    value = get(state, name, where)
    if not isinstance(value, bool):
        raise bad_field(path(where, name), value, "true or false")
    return value


def list_field(state: Any, name: str, where: str, max_len: int | None = None) -> list:
    value = get(state, name, where)
    if not isinstance(value, list | tuple):
        raise bad_field(path(where, name), value, "a list")
    if max_len is not None and len(value) > max_len:
        raise StateError(
            f"loader state field {path(where, name)!r} holds {len(value)} entries, more than the "
            f"{max_len} this loader can have there (the state is damaged or from another config)"
        )
    return list(value)
