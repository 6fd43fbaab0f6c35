"""Optional per-sample checksums (``energon prepare --checksums``): ``.nv-meta/checksums/<shard>.crc32``.

Without them a flipped payload bit is delivered as a wrong caption or a wrong pixel, silently, and a
shard regenerated with the same layout (same member sizes) reads as valid. With them the loader
compares a CRC-32 of every sample's bytes (the whole range the ``.tar.idx`` names: headers and
payloads) with the one recorded at prepare time; a mismatch is a damaged sample, skipped and
counted like any other. CRC-32 (``zlib``) runs at several GB/s, so the check costs little next to
reading and decoding.

One file per shard, next to nothing the reference reads, so datasets stay loadable by it::

    8 bytes   magic ``b"ENCRC32\\x01"``
    4 bytes   CRC-32 of the shard's ``.tar.idx`` bytes (little-endian uint32)
    4 bytes   number of samples (little-endian uint32)
    4 bytes   per sample: CRC-32 of its byte range (little-endian uint32)

The ``.tar.idx`` checksum binds the file to the index it was made with: an index rebuilt since (by
the reference's prepare, say) makes the checksums a clear error instead of a flood of mismatches.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence

import numpy as np

from energon.errors import TarIndexError
from energon.format.layout import (
    CHECKSUMS_FOLDER_NAME,
    CHECKSUMS_SUFFIX,
    MAIN_FOLDER_NAME,
    PathLike,
)

MAGIC = b"ENCRC32\x01"
_HEADER = struct.Struct("<8sII")
_READ_CHUNK = 8 << 20


def checksum_rel_path(shard: str) -> str:
    """Where a shard's checksums live, relative to the dataset root."""
    return f"{MAIN_FOLDER_NAME}/{CHECKSUMS_FOLDER_NAME}/{shard}{CHECKSUMS_SUFFIX}"


def checksums_size(samples: int) -> int:
    """Bytes of the checksum file of a shard of ``samples`` samples."""
    return _HEADER.size + 4 * samples


def crc32(data: bytes | bytearray | memoryview | np.ndarray, value: int = 0) -> int:
    return zlib.crc32(data, value)


def sample_checksums(path: PathLike, offsets: Sequence[int]) -> list[int]:
    """CRC-32 of each sample's byte range ``[offsets[i], offsets[i+1])`` of the file at ``path``,
    read once, front to back."""
    sums = []
    with open(path, "rb", buffering=0) as f:
        f.seek(offsets[0])
        for start, end in zip(offsets[:-1], offsets[1:]):
            value, left = 0, end - start
            while left:
                chunk = f.read(min(left, _READ_CHUNK))
                if not chunk:
                    raise OSError(f"{path}: ends before byte {end} while computing checksums")
                value = zlib.crc32(chunk, value)
                left -= len(chunk)
            sums.append(value)
    return sums


def encode_checksums(index_bytes: bytes, sums: Sequence[int]) -> bytes:
    """The bytes of a checksum file for a shard whose ``.tar.idx`` is ``index_bytes``."""
    header = _HEADER.pack(MAGIC, zlib.crc32(index_bytes), len(sums))
    return header + np.asarray(sums, dtype="<u4").tobytes()


def read_checksums(path: PathLike, name: str, index_offsets: np.ndarray) -> np.ndarray:
    """The per-sample checksums of a shard, checked against its (memory-mapped) tar index.

    ``name`` is how errors call the file. A file that is damaged, or was made for another index
    (the shard was prepared again without ``--checksums``), is a :class:`TarIndexError`.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise TarIndexError(
            f"{name}: checksum file missing (the dataset has checksums, but not for this shard); "
            "prepare the dataset again with --checksums"
        ) from None
    count = len(index_offsets) - 1
    if len(data) < _HEADER.size:
        raise TarIndexError(f"{name}: damaged checksum file ({len(data)} bytes)")
    magic, index_crc, stored = _HEADER.unpack_from(data)
    if magic != MAGIC or stored != count or len(data) != _HEADER.size + 4 * count:
        raise TarIndexError(
            f"{name}: damaged checksum file, or one for another shard (expects {count} samples)"
        )
    if index_crc != zlib.crc32(index_offsets.astype("<u8", copy=False)):
        raise TarIndexError(
            f"{name}: the checksums were made for another .tar.idx (the shard was indexed again "
            "since, e.g. by another tool); prepare the dataset again with --checksums"
        )
    return np.frombuffer(data, dtype="<u4", offset=_HEADER.size)


def remove_tree_quietly(path: PathLike) -> None:
    """Remove a folder of checksum files (and the folder), if it exists."""
    import shutil

    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
