"""The shards of one split: names, sample counts and where each shard's samples start.

A leaf asks a :class:`ShardIndex` about single shards (the ones it reads) and never needs the
whole list, so the list may be lazy: :class:`energon.format.shard_table.SplitTable` reads the
blocks of the prepared shard table that a rank touches, :class:`ListedShards` holds lists read
from ``.info.json`` (datasets without a table; tools that edit the list). The views
(:class:`ShardStarts`, :class:`ShardNames`, :class:`ShardCounts`) make either look like a
sequence for the code that wants one (``leaf.shard_starts`` for the plan; tools such as
``energon lint`` that do go over every shard).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, overload, runtime_checkable

import numpy as np

from energon.format.shard_table import shards_digest


@runtime_checkable
class ShardIndex(Protocol):
    """The shards of a split, in split order, asked one at a time."""

    num_shards: int
    samples: int  # all shards together

    def start(self, shard: int) -> int:
        """First global sample index of ``shard``; ``start(num_shards) == samples``."""
        ...

    def name(self, shard: int) -> str:
        """The shard's path relative to the dataset root."""
        ...

    def tar_file_id(self, shard: int) -> int | None:
        """The shard's position in ``.info.json`` (None: not known without reading it)."""
        ...

    def shard_of(self, index: int) -> int:
        """The shard that holds global sample ``index`` (``0 <= index < samples``)."""
        ...

    def search(self, value: int, side: str = "right") -> int:
        """How many shards start before ``value`` (``side="left"``) or at or before it
        (``"right"``), as ``np.searchsorted`` over the starts would say."""
        ...

    def load(self, first: int, end: int) -> None:
        """Get ready to answer for the shards that hold samples ``[first, end)``: a lazy index
        reads what they need now, in as few reads as it can (a list in memory has nothing to
        do)."""
        ...

    @property
    def digest(self) -> str:
        """:func:`energon.format.shard_table.shards_digest` of the whole list."""
        ...


class ListedShards:
    """A :class:`ShardIndex` over lists in memory."""

    def __init__(
        self,
        names: Sequence[str],
        counts: Sequence[int],
        tar_file_ids: Sequence[int] | None = None,
    ) -> None:
        if len(names) != len(counts):
            raise ValueError(f"{len(names)} shard names but {len(counts)} counts")
        self.names = list(names)
        self.counts = [int(c) for c in counts]
        self.tar_file_ids = None if tar_file_ids is None else list(tar_file_ids)
        self.starts = np.concatenate(([0], np.cumsum(self.counts, dtype=np.int64)))
        self.num_shards = len(self.names)
        self.samples = int(self.starts[-1])
        self._digest: str | None = None

    def start(self, shard: int) -> int:
        return int(self.starts[shard])

    def name(self, shard: int) -> str:
        return self.names[shard]

    def tar_file_id(self, shard: int) -> int | None:
        return None if self.tar_file_ids is None else self.tar_file_ids[shard]

    def shard_of(self, index: int) -> int:
        return self.search(index, "right") - 1

    def search(self, value: int, side: str = "right") -> int:
        return int(np.searchsorted(self.starts[:-1], value, side=side))

    def load(self, first: int, end: int) -> None:
        pass  # all in memory

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = shards_digest(self.names, self.counts)
        return self._digest


class _View(Sequence):
    """A read-only sequence over one property of each shard, fetched on demand."""

    def __init__(self, shards: ShardIndex) -> None:
        self.shards = shards

    def __len__(self) -> int:
        return self.shards.num_shards

    @overload
    def __getitem__(self, i: int) -> object: ...

    @overload
    def __getitem__(self, i: slice) -> list: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._get(i)

    def __iter__(self) -> Iterator:
        # without __getitem__'s checks: tools that go over a million shards (energon simulate)
        return (self._get(i) for i in range(len(self)))

    def _get(self, shard: int) -> object:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} shards)"


class ShardStarts(_View):
    """First global sample index of each shard (what ``leaf.shard_starts`` is); a
    :class:`energon.plan.sharding.SearchableStarts`: a range of a table is read in one go
    (:meth:`load`), searching it reads one page and one block."""

    def _get(self, shard: int) -> int:
        return self.shards.start(shard)

    def search(self, value: int, side: str = "right") -> int:
        return self.shards.search(value, side)

    def load(self, first: int, end: int) -> None:
        self.shards.load(first, end)


class ShardNames(_View):
    def _get(self, shard: int) -> str:
        return self.shards.name(shard)

    def index(self, name: str, start: int = 0, stop: int | None = None) -> int:  # type: ignore[override]
        for shard in range(start, len(self) if stop is None else stop):
            if self.shards.name(shard) == name:
                return shard
        raise ValueError(f"{name!r} is not a shard of this split")


class ShardCounts(_View):
    def _get(self, shard: int) -> int:
        return self.shards.start(shard + 1) - self.shards.start(shard)
