"""What blend weights share: samples, or a size per sample (``blend_by``).

By default a blend's weights are shares of the *samples* drawn. A dataset of long documents and one
of short captions blended 50/50 that way are far from 50/50 in tokens, and so in compute. With
``blend_by`` the weights are shares of a per-sample *size* instead: ``"tokens"``, ``"bytes"``, or
what a function of the sample's :class:`~energon.source.meta.SampleMeta` returns.

The size comes from what the dataset's index knows (part sizes, byte ranges, media metadata, token
counts), never from the data, and never from timing: the blend picks the source of the next sample
before the sample is read, and the ledger, ``energon blend-plan`` and ``energon simulate`` compute
the same sizes from the same index, so the order stays a pure function of the configuration
(DESIGN.md section 7). A size that only the decoded sample knows (a tokenizer's exact count) must be
estimated from the index, or stored with the data first (docs/metadatasets.md says how).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from energon.plan.sharding import slice_bounds
from energon.source.meta import SampleMeta, WebdatasetMeta, meta_reader

#: the built-in sizes, by name
BUILTIN_SIZES = ("samples", "tokens", "bytes")
#: parts whose bytes count as text for the ``tokens`` estimate
TEXT_PARTS = frozenset({"txt", "text", "json", "jsonl", "md", "html", "cls"})
BYTES_PER_TOKEN = 4
BLOCK = 1024  # at most this many WebDataset samples sized at once (part of a slice)
CACHED_BLOCKS = 256

SizeFunction = Callable[[SampleMeta], float]


class SampleBytes:
    """The built-in ``bytes``: the sample's bytes in its file (all parts of a tar sample with their
    headers, a JSONL record's line, a token window's bytes)."""

    def __call__(self, meta: SampleMeta) -> float:
        return float(meta.byte_size or 0)

    def of_shard(self, reader: WebdatasetMeta, shard: int, begin: int, end: int) -> np.ndarray:
        """Samples ``begin <= i < end`` of a WebDataset shard at once, from its memory-mapped
        ``.tar.idx``."""
        from energon.source.webdataset import tar_byte_index

        offsets = tar_byte_index(reader.leaf.shard_path(shard)).offsets
        return np.diff(offsets[begin : end + 1]).astype(np.float64)


class EstimatedTokens:
    """The built-in ``tokens``: a token dataset's token count; otherwise the bytes of the text parts
    (a JSONL record: the whole record) divided by 4, at least 1. An estimate: for a tokenizer's
    exact count, see docs/metadatasets.md."""

    def __call__(self, meta: SampleMeta) -> float:
        known = meta.tokens
        if known is not None:
            return float(known)
        parts = meta.part_sizes
        if parts:
            text = sum(size for name, size in parts.items() if _is_text(name))
        else:
            text = meta.byte_size or 0
        return _tokens_of_text(text)

    def of_shard(self, reader: WebdatasetMeta, shard: int, begin: int, end: int) -> np.ndarray:
        """Samples ``begin <= i < end`` of a WebDataset shard at once, from one query of their
        part sizes."""
        text = [0] * (end - begin)
        for inner, name, size in reader.shard_part_rows(shard, begin, end):
            if _is_text(name):
                text[inner - begin] += size
        text = np.asarray(text, dtype=np.float64)
        return np.maximum(1.0, np.ceil(text / BYTES_PER_TOKEN))


def _tokens_of_text(text: int) -> float:
    return float(max(1, math.ceil(text / BYTES_PER_TOKEN)))


@functools.cache
def _is_text(part: str) -> bool:
    return part.rsplit(".", 1)[-1].lower() in TEXT_PARTS


sample_bytes = SampleBytes()
estimated_tokens = EstimatedTokens()
_FUNCTIONS: dict[str, SizeFunction] = {"tokens": estimated_tokens, "bytes": sample_bytes}


@dataclasses.dataclass(frozen=True)
class BlendBy:
    """What a blend's weights share: ``name`` is ``"samples"``, ``"tokens"``, ``"bytes"`` or the
    dotted name of a user function ``SampleMeta -> size`` (``function``)."""

    name: str = "samples"
    function: SizeFunction | None = None

    @property
    def by_size(self) -> bool:
        return self.function is not None

    @classmethod
    def of(cls, value: Any) -> BlendBy:
        """``value``: a :class:`BlendBy`, None (samples), a built-in name, or a function of a
        :class:`SampleMeta` (module level, so that worker processes can import it)."""
        if value is None or isinstance(value, BlendBy):
            return value or cls()
        if isinstance(value, str):
            if value not in BUILTIN_SIZES:
                raise ValueError(
                    f"blend_by must be one of {', '.join(BUILTIN_SIZES)} or a function of a "
                    f"SampleMeta, got {value!r}"
                )
            return cls(value, _FUNCTIONS.get(value))
        if callable(value):
            module = getattr(value, "__module__", "?")
            return cls(f"{module}.{getattr(value, '__qualname__', type(value).__name__)}", value)
        raise TypeError(
            f"blend_by must be a name ({', '.join(BUILTIN_SIZES)}) or a function of a SampleMeta, "
            f"got {type(value).__name__}"
        )

    def unit(self) -> str:
        """What the shares count, for reports: ``samples``, ``tokens``, ``bytes`` or ``size``."""
        return self.name if self.name in BUILTIN_SIZES else "size"


class SampleSizes:
    """``size(source, index)``: the size of a pipeline's samples under one size function.

    WebDataset samples are sized a *block* at a time, one query for the block (three for a user
    function) instead of several per sample: up to :data:`BLOCK` samples of one of the slices the
    stream reads (``bounds[source]``: the slice boundaries of its readers, cut at shard starts), so
    that what is sized is what is read next, and each sample is sized about once per epoch; the
    last :data:`CACHED_BLOCKS` blocks are kept. Without ``bounds`` the slices are the shards inside
    ``ranges[source]``. Other leaves answer from their memory-mapped indices sample by sample.
    """

    def __init__(
        self,
        leaves: Sequence[Any],
        function: SizeFunction,
        name: str = "",
        ranges: Sequence[tuple[int, int]] | None = None,
        bounds: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.leaves = list(leaves)
        self.function = function
        self.name = name or getattr(function, "__qualname__", "size")
        self.ranges = list(ranges) if ranges is not None else [(0, len(leaf)) for leaf in leaves]
        if bounds is None:
            bounds = [
                slice_bounds(start, end, [int(s) for s in leaf.shard_starts], None)
                for leaf, (start, end) in zip(self.leaves, self.ranges)
            ]
        self.bounds = [[int(b) for b in source_bounds] for source_bounds in bounds]
        self._readers: dict[int, Any] = {}
        self._blocks: dict[tuple[int, int], list[float]] = {}
        self._last: tuple[int, int, int, list[float]] | None = None  # source, first, end, sizes

    def __getstate__(self) -> dict[str, Any]:
        names = ("leaves", "function", "name", "ranges", "bounds")
        return {key: getattr(self, key) for key in names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def _reader(self, source: int) -> Any:
        reader = self._readers.get(source)
        if reader is None:
            reader = self._readers[source] = meta_reader(self.leaves[source])
        return reader

    def size(self, source: int, index: int) -> float:
        last = self._last
        if last is not None and last[0] == source and last[1] <= index < last[2]:
            return last[3][index - last[1]]  # the block of the last pick
        reader = self._reader(source)
        if not isinstance(reader, WebdatasetMeta):
            return self._checked(SampleMeta(reader, source, index))
        bounds = self.bounds[source]
        number = bisect.bisect_right(bounds, index) - 1  # the slice, then the block in it
        if not 0 <= number < len(bounds) - 1:
            raise IndexError(
                f"sample {index} of source {source} is outside this stream's range "
                f"{self.ranges[source]}"
            )
        start = bounds[number]
        first = start + (index - start) // BLOCK * BLOCK
        block = self._blocks.get((source, first))
        if block is None:  # blocks are read through once an epoch: the oldest go first
            end = min(bounds[number + 1], first + BLOCK)
            block = self._blocks[(source, first)] = self._sized(reader, source, first, end)
            if len(self._blocks) > CACHED_BLOCKS:
                del self._blocks[next(iter(self._blocks))]
        self._last = (source, first, first + len(block), block)
        return block[index - first]

    def _sized(self, reader: WebdatasetMeta, source: int, first: int, end: int) -> list[float]:
        """The sizes of samples ``first <= i < end`` (inside one shard): a built-in's vectorised
        ``of_shard``, else the function on each sample's metadata (filled for the block at
        once)."""
        shard, begin = reader.locate(first)
        finish = begin + (end - first)
        of_shard = getattr(self.function, "of_shard", None)
        if of_shard is None:
            metas = reader.shard_metas(source, shard, begin, finish)
            return [self._checked(meta) for meta in metas]
        values = of_shard(reader, shard, begin, finish).tolist()
        for i, value in enumerate(values):
            if not (value > 0 and math.isfinite(value)):
                self._checked(SampleMeta(reader, source, first + i))  # raises, naming the sample
        return values

    def _checked(self, meta: SampleMeta) -> float:
        value = self.function(meta)
        try:
            size = float(value)
        except (TypeError, ValueError):
            size = float("nan")
        if not (math.isfinite(size) and size > 0):
            raise ValueError(
                f"blend_by {self.name} gave {value!r} for sample {meta.index} (key {meta.key!r}) "
                f"of {meta.dataset} [{meta.split_part}]: sizes must be finite numbers > 0 (a size "
                "of 0 would never move the blend)"
            )
        return size
