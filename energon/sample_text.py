"""Samples as text, as the reference renders them, character for character: the module
``megatron.energon.sample_utils`` (``format_sample_detailed``: YAML with tensors and arrays as
one-line summaries; ``format_sample_compact``: one line, leaves quoted), and the message of
``SampleException.from_sample``. It sits in the foundation so that the error tree can use it.
energon's own renderings, used in ``energon preview``, are :mod:`energon.samples.render`."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import yaml

__all__ = ["default_get_batch_keys", "format_sample_compact", "format_sample_detailed"]

_MAX_DICT_ITEMS = 25
_MAX_LIST_ITEMS = 10
_MAX_STR_LEN = 1000
_MAX_REPR_LEN = 200


def _values_text(flat: Any, to_list: Any) -> str:
    """``[a, b, c, ..., x, y, z]``: all values of a 1-d tensor/array of at most six, else the
    first and last three (each as its ``repr``)."""
    shown = to_list(flat) if len(flat) <= 6 else [*to_list(flat[:3]), ..., *to_list(flat[-3:])]
    return "[" + ", ".join("..." if v is ... else repr(v) for v in shown) + "]"


def _tensor_text(tensor: torch.Tensor, detailed: bool) -> str:
    head = f"Tensor(shape={tensor.shape}, dtype={tensor.dtype}, device={tensor.device}"
    if not detailed or tensor.numel() == 0:
        return head + ")"
    flat = tensor.detach().flatten()
    values = _values_text(flat, lambda t: t.tolist())
    return f"{head}, min={flat.min().item()}, max={flat.max().item()}, values={values})"


def _array_text(array: np.ndarray, detailed: bool) -> str:
    head = f"np.ndarray(shape={array.shape}, dtype={array.dtype}"
    if not detailed or array.size == 0 or array.dtype.kind not in "biuf":
        return head + ")"
    flat = array.reshape(-1)
    return f"{head}, min={flat.min()}, max={flat.max()}, values={_values_text(flat, list)})"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _fields(value: Any) -> list[tuple[str, Any]]:
    return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]


def _plain(value: Any) -> Any:
    """The sample as YAML-safe data, with the detailed view's limits."""
    if isinstance(value, torch.Tensor):
        return _tensor_text(value, detailed=True)
    if isinstance(value, np.ndarray):
        return _array_text(value, detailed=True)
    if value is None or type(value) in (bool, int, float):
        return value
    if isinstance(value, str):
        return _shorten(value, _MAX_STR_LEN)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {type(value).__name__: {k: _plain(v) for k, v in _fields(value)}}
    if isinstance(value, dict):
        items = list(value.items())
        body = {k: _plain(v) for k, v in items[:_MAX_DICT_ITEMS]}
        if len(items) > _MAX_DICT_ITEMS:
            body["..."] = f"and {len(items) - _MAX_DICT_ITEMS} more items"
        return body
    if isinstance(value, (list, tuple)):
        shown = [_plain(v) for v in value[:_MAX_LIST_ITEMS]]
        if len(value) > _MAX_LIST_ITEMS:
            shown.append(f"... and {len(value) - _MAX_LIST_ITEMS} more items")
        return shown
    return _shorten(repr(value), _MAX_REPR_LEN)


def format_sample_detailed(sample: Any, indent: str = "") -> str:
    """A multi-line YAML view of a sample; every line starts with ``indent``."""
    text = yaml.dump(_plain(sample), sort_keys=False, allow_unicode=True, width=120)
    if text.endswith("\n...\n"):
        text = text[: -len("...\n")]
    return "\n".join(indent + line for line in text.rstrip("\n").split("\n"))


def format_sample_compact(
    sample: Any, depth: int = 3, max_items: int = 10, max_str_len: int = 50
) -> str:
    """One line; leaves are quoted text of at most ``max_str_len`` characters, containers show
    ``max_items`` entries and ``depth`` levels."""
    if isinstance(sample, torch.Tensor):
        return _tensor_text(sample, detailed=False)
    if isinstance(sample, np.ndarray):
        return _array_text(sample, detailed=False)

    def inner(value: Any) -> str:
        return format_sample_compact(value, depth - 1, max_items, max_str_len)

    if dataclasses.is_dataclass(sample) and not isinstance(sample, type):
        if depth <= 0:
            return f"{type(sample).__name__}(...)"
        body = ", ".join(f"{k}={inner(v)}" for k, v in _fields(sample)[:max_items])
        return f"{type(sample).__name__}({body})"
    if isinstance(sample, dict):
        if depth <= 0:
            return "{...}"
        return (
            "{" + ", ".join(f"{k}: {inner(v)}" for k, v in list(sample.items())[:max_items]) + "}"
        )
    if isinstance(sample, (list, tuple)):
        opening, closing = ("[", "]") if isinstance(sample, list) else ("(", ")")
        if depth <= 0:
            return f"{opening}...{closing}"
        return opening + ", ".join(inner(v) for v in sample[:max_items]) + closing
    text = sample if isinstance(sample, str) else repr(sample)
    return repr(_shorten(text, max_str_len))


def default_get_batch_keys(batch: Any) -> Any:
    """The reference's rule for a batch's keys: a list ``__key__`` (attribute), a dict's
    ``"__key__"`` entry, or those of a list's first element; None otherwise."""
    if isinstance(batch, list):
        return default_get_batch_keys(batch[0]) if batch else None
    if isinstance(batch, dict):
        return batch.get("__key__")
    key = getattr(batch, "__key__", None)
    return key if isinstance(key, list) else None
