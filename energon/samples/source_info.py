"""Where a sample came from: enough to find the exact bytes again when something goes wrong."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["SourceInfo", "add_source_info", "get_source_info"]


@dataclasses.dataclass(frozen=True, slots=True)
class SourceInfo:
    """One origin of a sample (a joined or packed sample has several).

    ``dataset_path`` is the dataset root (a path object, or a str for JSONL files); ``index`` is the
    global sample index for webdataset reads or the entry key for file-store reads; ``file_names``
    are the full tar member names that were read.
    """

    dataset_path: Any
    index: str | int
    shard_name: str
    file_names: tuple[str, ...]

    def __reduce__(self):
        # Positional rebuild: every batch carries one per sample across process boundaries, and
        # the dataclass default (``__setstate__`` per field) is several times slower.
        return (
            make_source_info,
            (self.dataset_path, self.index, self.shard_name, self.file_names),
        )


_new_object = object.__new__
_set_path = SourceInfo.dataset_path.__set__  # type: ignore[attr-defined]
_set_index = SourceInfo.index.__set__  # type: ignore[attr-defined]
_set_shard = SourceInfo.shard_name.__set__  # type: ignore[attr-defined]
_set_names = SourceInfo.file_names.__set__  # type: ignore[attr-defined]


def make_source_info(
    dataset_path: Any, index: str | int, shard_name: str, file_names: tuple[str, ...]
) -> SourceInfo:
    """A SourceInfo with its slots set directly: faster than the frozen dataclass's ``__init__``
    (one ``object.__setattr__`` per field). Every sample read makes one, and the main process
    rebuilds one per sample of every batch from a worker (``__reduce__``)."""
    info = _new_object(SourceInfo)
    _set_path(info, dataset_path)
    _set_index(info, index)
    _set_shard(info, shard_name)
    _set_names(info, file_names)
    return info


def _current_sources(sample: Any) -> tuple[SourceInfo, ...]:
    if isinstance(sample, Mapping):
        value = sample.get("__sources__")
    else:
        value = getattr(sample, "__sources__", None)
    return tuple(value) if value else ()


def add_source_info(sample: Any, *source_infos: SourceInfo) -> Any:
    """Append ``source_infos`` to ``sample.__sources__`` (``sample["__sources__"]`` for dicts).

    Returns the sample so the call can be chained inside a cooker or encoder.
    """
    merged = _current_sources(sample) + tuple(source_infos)
    if isinstance(sample, Mapping):
        sample["__sources__"] = merged
    else:
        sample.__sources__ = merged
    return sample


def get_source_info(sample: Any) -> list[SourceInfo]:
    """All source infos of a sample, a dict sample, a batch, or a list/tuple of those, in order."""
    if isinstance(sample, SourceInfo):
        return [sample]
    if isinstance(sample, (list, tuple)) and not hasattr(sample, "_fields"):
        return [info for item in sample for info in get_source_info(item)]
    return list(_current_sources(sample))


def unique_sources(groups: Iterable[Iterable[SourceInfo] | None]) -> tuple[SourceInfo, ...]:
    """Concatenate source groups in order, dropping repeats (a joined sample lists each origin once)."""
    merged: list[SourceInfo] = []
    for group in groups:
        for info in group or ():
            # Linear membership instead of a set: a path object inside may not be hashable,
            # and a sample has only a handful of sources.
            if info not in merged:
                merged.append(info)
    return tuple(merged)
