"""Cooking: turning crude samples (plain dicts of parts) into typed samples.

A task encoder lists ``cookers``; each applies to the crude datasets whose subflavors match, and may
ask for extra stores (aux data, the sample's own dataset as ``primary``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from energon.task_encoder.base import TaskEncoder

__all__ = ["Cooker", "basic_sample_keys", "cooker", "select_cooker"]


class Cooker:
    """Turns crude samples (plain dicts) of datasets whose subflavors match into samples."""

    def __init__(
        self, cook: Callable[..., Any], has_subflavors: dict[str, Any] | None = None
    ) -> None:
        self.cook = cook
        self.has_subflavors = has_subflavors

    def is_match(self, subflavors: dict[str, Any] | None) -> bool:
        if not self.has_subflavors:
            return True
        subflavors = subflavors or {}
        return all(subflavors.get(k) == v for k, v in self.has_subflavors.items())

    @property
    def need_primary(self) -> bool:
        return getattr(self.cook, "__need_primary__", False)

    @property
    def need_cache(self) -> bool:
        return getattr(self.cook, "__need_cache__", False)


def cooker(
    fn: Callable | None = None, *, need_cache: bool = False, need_primary: bool = False
) -> Any:
    """Mark a cook function; ``need_primary`` passes ``primary=`` (a store of the sample's own dataset)."""

    def decorate(f: Callable) -> Callable:
        f.__need_cache__ = need_cache  # type: ignore[attr-defined]
        f.__need_primary__ = need_primary  # type: ignore[attr-defined]
        return f

    return decorate(fn) if fn is not None else decorate


def basic_sample_keys(
    crude_sample: dict[str, Any], additional_source_info: Sequence[Any] = ()
) -> dict[str, Any]:
    """The bookkeeping fields of a crude sample, to pass on to the cooked sample (keeps it restorable)."""
    out = {
        k: crude_sample[k]
        for k in ("__key__", "__restore_key__", "__subflavors__", "__sources__")
        if k in crude_sample
    }
    if additional_source_info:
        out["__sources__"] = tuple(out.get("__sources__") or ()) + tuple(additional_source_info)
    return out


def select_cooker(task_encoder: TaskEncoder | None, subflavors: dict[str, Any]) -> Cooker | None:
    """The first of the task encoder's cookers matching a crude dataset's subflavors."""
    cookers = getattr(task_encoder, "cookers", ()) or ()
    if not cookers:
        return None
    for candidate in cookers:
        if candidate.is_match(subflavors):
            return candidate
    raise ValueError(f"No cooker found for subflavors {subflavors!r}")
