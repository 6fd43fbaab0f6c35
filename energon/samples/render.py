"""Human-readable renderings of samples and batches, for error messages, ``energon preview``
and debugging. Tensors and arrays are summarised (shape, dtype, range), never dumped."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import yaml

__all__ = ["default_get_batch_keys", "format_sample_compact", "format_sample_detailed"]

_DETAILED_MAX_DICT_ITEMS = 25
_DETAILED_MAX_SEQ_ITEMS = 10
_DETAILED_MAX_STR_LEN = 1000
_DETAILED_MAX_REPR_LEN = 200


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _named_items(value: Any) -> tuple[str, list[tuple[Any, Any]]] | None:
    """(type label, [(name, value)]) for dataclasses, mappings and namedtuples; None otherwise."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__, [
            (f.name, getattr(value, f.name)) for f in dataclasses.fields(value)
        ]
    if isinstance(value, Mapping):
        return "", list(value.items())
    if _is_namedtuple(value):
        return type(value).__name__, list(zip(value._fields, value))
    return None


def format_sample_compact(
    sample: Any, depth: int = 3, max_items: int = 10, max_str_len: int = 50
) -> str:
    """One line: ``CaptioningSample(__key__='a', image=Tensor(shape=(3, 4, 4), ...), ...)``.

    Nesting deeper than ``depth`` is shown as ``...``; containers show at most ``max_items``
    entries and strings at most ``max_str_len`` characters.
    """
    if isinstance(sample, torch.Tensor):
        return f"Tensor(shape={tuple(sample.shape)}, dtype={sample.dtype}, device={sample.device})"
    if isinstance(sample, np.ndarray):
        return f"ndarray(shape={sample.shape}, dtype={sample.dtype})"
    if isinstance(sample, str):
        return repr(_shorten(sample, max_str_len))
    if isinstance(sample, (bytes, bytearray, memoryview)):
        return f"bytes(len={len(sample)})"
    named = _named_items(sample)
    if named is None and not isinstance(sample, (list, tuple)):
        return _shorten(repr(sample), max_str_len)
    if depth <= 0:
        return "..."

    def inner(value: Any) -> str:
        return format_sample_compact(value, depth - 1, max_items, max_str_len)

    if named is not None:
        label, items = named
        shown = [f"{k}={inner(v)}" if label else f"{k!r}: {inner(v)}" for k, v in items[:max_items]]
        if len(items) > max_items:
            shown.append(f"...(+{len(items) - max_items})")
        body = ", ".join(shown)
        return f"{label}({body})" if label else f"{{{body}}}"
    shown = [inner(v) for v in list(sample)[:max_items]]
    if len(sample) > max_items:
        shown.append(f"...(+{len(sample) - max_items})")
    opening, closing = ("[", "]") if isinstance(sample, list) else ("(", ")")
    return opening + ", ".join(shown) + closing


def _summarise_array(values: np.ndarray, label: str) -> dict[str, Any]:
    """Shape, dtype, range and the first/last three values of a tensor or array."""
    summary: dict[str, Any] = {"shape": list(values.shape), "dtype": str(values.dtype)}
    flat = values.reshape(-1)
    if flat.size and values.dtype.kind in "biuf":
        summary["min"] = flat.min().item()
        summary["max"] = flat.max().item()
        head = flat[:3].tolist()
        summary["values"] = head if flat.size <= 6 else [*head, "...", *flat[-3:].tolist()]
    return {label: summary}


def _to_plain(value: Any) -> Any:
    """Convert a sample into YAML-safe plain data with the size limits of the detailed view."""
    if isinstance(value, torch.Tensor):
        array = value.detach().cpu()
        if array.dtype in (torch.bfloat16, torch.float16):
            array = array.float()
        summary = _summarise_array(array.numpy(), "Tensor")
        summary["Tensor"]["dtype"] = str(value.dtype)
        return summary
    if isinstance(value, np.ndarray):
        return _summarise_array(value, "ndarray")
    if isinstance(value, str):
        return _shorten(value, _DETAILED_MAX_STR_LEN)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    named = _named_items(value)
    if named is not None:
        label, items = named
        limit = None if label and not isinstance(value, Mapping) else _DETAILED_MAX_DICT_ITEMS
        body = {str(k): _to_plain(v) for k, v in items[:limit]}
        if limit is not None and len(items) > limit:
            body["..."] = f"{len(items) - limit} more"
        return {label: body} if label else body
    if isinstance(value, Sequence):
        shown = [_to_plain(v) for v in list(value)[:_DETAILED_MAX_SEQ_ITEMS]]
        if len(value) > _DETAILED_MAX_SEQ_ITEMS:
            shown.append(f"... {len(value) - _DETAILED_MAX_SEQ_ITEMS} more")
        return shown
    return _shorten(repr(value), _DETAILED_MAX_REPR_LEN)


def format_sample_detailed(sample: Any, indent: str = "") -> str:
    """Multi-line YAML view: dataclasses as ``{ClassName: {fields}}``, tensors summarised,
    dicts capped at 25 items, sequences at 10, strings at 1000 characters; every line is
    prefixed with ``indent``."""
    text = yaml.safe_dump(_to_plain(sample), sort_keys=False, allow_unicode=True, width=100)
    return "".join(indent + line for line in text.splitlines(keepends=True))


def default_get_batch_keys(batch: Any) -> list[str] | None:
    """The sample keys of a batch: its ``__key__`` (attribute or dict entry; a single key becomes
    a one-element list), or the keys of a list of samples in order; None when any is unknown."""
    if isinstance(batch, (list, tuple)) and not _is_namedtuple(batch):
        keys: list[str] = []
        for item in batch:
            item_keys = default_get_batch_keys(item)
            if item_keys is None:
                return None
            keys.extend(item_keys)
        return keys
    found = batch.get("__key__") if isinstance(batch, Mapping) else getattr(batch, "__key__", None)
    if found is None:
        return None
    return [found] if isinstance(found, str) else list(found)
