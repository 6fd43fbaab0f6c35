"""The leaf-dataset contract: what the plan, the pipeline, the loader and the metadataset resolver
may use of one leaf dataset.

A leaf is one readable unit of data: a split of a prepared WebDataset, a JSONL file, a split of a
Parquet/Arrow dataset, a join of prepared datasets, or the GPT windows of Megatron token files.
:func:`energon.source.kinds.open_leaf` decides which class serves a path (once), and the object
carries that decision as ``kind``.
Leaves are small and picklable (paths and counts): they travel into worker processes and open
their files lazily there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

#: The values of ``LeafDataset.kind``.
LEAF_KINDS = ("webdataset", "jsonl", "join", "tokens", "parquet")


@runtime_checkable
class LeafBuilder(Protocol):
    """How a leaf turns raw parts into samples, as far as the loader needs to know."""

    @property
    def kind(self) -> str:
        """``"crude"`` for plain dicts that cookers turn into samples; otherwise how samples are
        built (``"field_map"``, ``"sample_loader"``, ``"joined"``, ``"tokens"``)."""
        ...

    @property
    def sample_type(self) -> type | None:
        """The sample class every sample is an instance of, or None (dicts, joiner functions)."""
        ...


@runtime_checkable
class LeafDataset(Protocol):
    """One leaf dataset, readable by global sample index ``0 <= index < len(leaf)``."""

    @property
    def kind(self) -> str:
        """One of :data:`LEAF_KINDS`."""
        ...

    @property
    def root(self) -> str:
        """The dataset's path (or name, for token blends), used in messages and statistics."""
        ...

    @property
    def split_part(self) -> str:
        """The split this leaf reads (``""`` where the format has no splits)."""
        ...

    @property
    def subflavors(self) -> dict[str, Any]:
        """Merged subflavors, copied into every sample's ``__subflavors__``."""
        ...

    @property
    def builder(self) -> LeafBuilder: ...

    @property
    def excluded(self) -> frozenset[int]:
        """Indices the plan skips (sample excludes of the split)."""
        ...

    @property
    def shard_starts(self) -> Sequence[int]:
        """Start index of each shard in the leaf's index space; the plan cuts slices there."""
        ...

    @property
    def remote(self) -> bool:
        """Data lives in object storage: readers send :meth:`prefetch` hints."""
        ...

    def __len__(self) -> int: ...

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        """Read, decode and build sample ``index``; per-sample problems raise
        :class:`~energon.errors.SampleException` subclasses naming file, key and offset."""
        ...

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        """Hint that samples ``[first, end)`` will be read soon (``later``: after the ranges hinted
        without it); a no-op for local data."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """JSON-able identity (path, split, counts); part of the loader state's fingerprint."""
        ...

    def config(self) -> dict[str, Any]:
        """JSON-able description for ``config()`` of datasets and loaders."""
        ...
