"""``<shard>.tar.idx``: the byte offset of every sample in a shard.

The file is a flat array of native-endian uint64 (``struct`` format ``"Q"``), no header: entry ``i``
is the offset of the first tar header of sample ``i``, and one extra final entry is the end of the
last sample. Sample ``i`` therefore spans ``[idx[i], idx[i+1])``, and ``len = entries - 1``.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from energon.errors import TarIndexError
from energon.format.layout import INFO_JSON_FILENAME, PathLike, remove_quietly, temp_name_for

TAR_INDEX_SUFFIX = ".tar.idx"


def tar_index_path(tar_path: PathLike) -> PathLike:
    """``data.tar`` -> ``data.tar.idx``, ``x.tgz`` -> ``x.tar.idx`` (the last suffix is replaced).

    Returns a ``str`` for a ``str`` argument and a ``Path`` otherwise. Remote URLs are handled as
    strings, since ``Path`` would collapse the ``//`` after the scheme.
    """
    if isinstance(tar_path, str) and "://" in tar_path:
        head, _, name = tar_path.rpartition("/")
        stem, dot, _ = name.rpartition(".")
        return f"{head}/{stem if dot else name}{TAR_INDEX_SUFFIX}"
    result = Path(tar_path)
    result = (
        result.with_suffix(TAR_INDEX_SUFFIX)
        if result.suffix
        else result.with_name(result.name + TAR_INDEX_SUFFIX)
    )
    return str(result) if isinstance(tar_path, str) else result


def tar_index_size(samples: int) -> int:
    """Bytes of the ``.tar.idx`` of a shard of ``samples`` samples (one offset each, one end)."""
    return 8 * (samples + 1)


def encode_offsets(offsets: Sequence[int]) -> bytes:
    """The bytes of a ``.tar.idx`` file for these offsets."""
    return array("Q", offsets).tobytes()


def write_tar_index_temp(index_path: PathLike, offsets: Sequence[int]) -> Path:
    """Write the index to a temporary file next to ``index_path``; the caller renames it.

    ``prepare`` uses this to publish all indices only after every shard was scanned successfully.
    """
    tmp = temp_name_for(index_path)
    try:
        with open(tmp, "wb") as f:
            f.write(encode_offsets(offsets))
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp


def write_tar_index(index_path: PathLike, offsets: Sequence[int]) -> None:
    """Write ``<shard>.tar.idx`` atomically (temporary file + rename)."""
    tmp = write_tar_index_temp(index_path, offsets)
    try:
        os.replace(tmp, index_path)
    except BaseException:
        remove_quietly(tmp)
        raise


class TarIndex:
    """Read-only, memory-mapped view of a ``.tar.idx`` file.

    The file is opened lazily on first access and not pickled, so instances are cheap to send to
    worker processes and hold no file handles until used. Opening checks what is cheap to check:
    the size, that offsets increase, and (given ``expected_samples``, the count ``.info.json``
    records) the number of samples, which the file size tells without reading the entries.
    ``name`` is how errors call the file (a remote index is read through a local copy).
    """

    def __init__(
        self,
        index_path: PathLike,
        *,
        expected_samples: int | None = None,
        name: str | None = None,
        expected_from: str = INFO_JSON_FILENAME,
    ) -> None:
        self.index_path = os.fspath(index_path)
        self.expected_samples = expected_samples
        self.expected_from = expected_from
        self.name = name or self.index_path
        self._offsets: np.ndarray | None = None
        # CRC-32 of each sample's bytes, when the dataset has checksums (set by the reader that
        # opens the index, see energon.format.checksums)
        self.checksums: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_offsets": None, "checksums": None}

    @property
    def offsets(self) -> np.ndarray:
        """All entries (``len(self) + 1`` uint64 values), memory-mapped."""
        if self._offsets is None:
            self._offsets = self._open()
        return self._offsets

    def _open(self) -> np.ndarray:
        try:
            size = os.path.getsize(self.index_path)
        except FileNotFoundError:
            raise TarIndexError(
                f"{self.name}: tar index not found; run 'energon prepare' on the dataset "
                "(--tar-index-only is enough)"
            ) from None
        if size == 0 or size % 8:
            raise TarIndexError(
                f"{self.name}: invalid tar index size {size} (must be a non-zero multiple of 8); "
                "the file is damaged: run 'energon prepare --tar-index-only'"
            )
        found = size // 8 - 1
        if self.expected_samples is not None and found != self.expected_samples:
            raise TarIndexError(
                f"{self.name}: the tar index has {found} samples, but {self.expected_from} says "
                f"the shard has {self.expected_samples}: the metadata does not match; prepare "
                "the dataset again"
            )
        # A plain ndarray over the mapping: indexing it is much cheaper than np.memmap's.
        with open(self.index_path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        offsets = np.frombuffer(mapping, dtype="<u8")
        _check_increasing(offsets, self.name)
        return offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> int:
        return int(self.offsets[i])

    def byte_range(self, i: int) -> tuple[int, int]:
        """(start, end) byte offsets of sample ``i`` in the shard."""
        n = len(self)
        if not 0 <= i < n:
            raise TarIndexError(f"{self.name}: sample index {i} out of range (0..{n - 1})")
        start, end = self.offsets[i : i + 2].tolist()
        return start, end


def _check_increasing(offsets: np.ndarray, name: str) -> None:
    """Every sample spans at least one header block: offsets strictly increase (one vectorised
    pass over the mapping; a damaged entry would otherwise become a giant or negative read)."""
    bad = np.flatnonzero(offsets[1:] <= offsets[:-1])
    if len(bad):
        i = int(bad[0])
        raise TarIndexError(
            f"{name}: damaged tar index: entry {i + 1} ({int(offsets[i + 1])}) does not follow "
            f"entry {i} ({int(offsets[i])}); run 'energon prepare --tar-index-only'"
        )
