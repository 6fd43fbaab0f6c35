"""``.nv-meta/shard_table.bin``: every split's shards and where their samples start, in blocks that
one rank can read on its own.

``.info.json`` and the split config are the source of truth, but they list every shard: a rank
that reads them pays for the whole dataset at start-up (about 37 us per shard here, 40 s at a
million shards, and a full read of the shard list from shared storage by every rank at every
restart). This table, written by ``prepare`` next to them, answers the questions a rank asks
(how many samples a split has; which shards hold samples ``[a, b)``, their names, sizes and
``tar_file_id``) by reading a fixed front part and the few blocks that cover its own range.
The reference does not know the file and ignores it.

Layout (little-endian)::

    [0, 8)     magic b"ENSHTAB\\x01"
    [8, 16)    u64  front_end: bytes [0, front_end) are everything but the blocks
    [16, 24)   u64  length of the JSON header
    [24, ...)  JSON header, then zero bytes up to a multiple of 8
    per split: summary, (blocks + 1) x (u64 first sample, u64 byte offset) of each block, the
               last entry (samples, end of the last block); then the split's excluded sample
               indices (u64, sorted)
    blocks:    per block of ``block_shards`` shards (m of them): m x u64 first sample of each
               shard, m x u64 tar_file_id, (m + 1) x u64 name offsets into the names that
               follow (UTF-8), zero bytes up to a multiple of 8

The header binds the table to what it was made from: the content of ``index.uuid`` (every
prepare, ours or the reference's, writes a new one), the byte size of ``.info.json`` and the
SHA-256 of the split config file. A table that does not match is not used
(:func:`open_shard_table` says why) and loading falls back to reading ``.info.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from energon import epath
from energon.errors import DatasetInfoError, UnknownSplitError
from energon.format.layout import INDEX_UUID_FILENAME, MAIN_FOLDER_NAME, SHARD_TABLE_FILENAME

MAGIC = b"ENSHTAB\x01"
FORMAT_VERSION = 1
MAX_SUMMARY_BLOCKS = 2048  # the summary every rank reads stays below 32 KiB per split
MIN_BLOCK_SHARDS = 32
_U64 = np.dtype("<u8")


def shards_digest(names: Iterable[str], counts: Iterable[int]) -> str:
    """SHA-256 of a split's shard list (``name\\tcount\\n`` per shard): what a loader state's
    fingerprint records of a dataset instead of the list itself."""
    h = hashlib.sha256()
    for name, count in zip(names, counts):
        h.update(f"{name}\t{int(count)}\n".encode())
    return h.hexdigest()


def shards_fingerprint(num_shards: int, samples: int, digest: str) -> dict:
    """What a leaf's fingerprint says of its shards: their number, their samples and the digest
    of the list (a state stays small at a million shards; older states listed every shard, see
    :func:`energon.state.check_state_shape`)."""
    return {"count": num_shards, "samples": samples, "sha256": digest}


def listed_shards_fingerprint(names: Sequence[str], counts: Sequence[int]) -> dict:
    """:func:`shards_fingerprint` of shards listed in full."""
    return shards_fingerprint(len(names), int(sum(counts)), shards_digest(names, counts))


def block_shards_for(num_shards: int) -> int:
    """Shards per block: at least MIN_BLOCK_SHARDS, and few enough blocks for the summary."""
    return max(MIN_BLOCK_SHARDS, -(-num_shards // MAX_SUMMARY_BLOCKS))


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class SplitShards:
    """One split as the table stores it: its shards in order (whole-shard excludes removed) and
    the global indices of its excluded samples."""

    names: Sequence[str]
    excluded: Sequence[int] = ()


def shard_table_bytes(
    shard_counts: dict[str, int],
    splits: dict[str, SplitShards],
    *,
    index_uuid: str,
    info_size: int,
    split_config: str,
    split_sha256: str,
    checksums: bool,
    warnings: Sequence[str] = (),
) -> bytes:
    """The content of ``shard_table.bin``. ``shard_counts`` is ``.info.json``'s mapping (its
    order numbers the shards: ``tar_file_id``)."""
    tar_ids = {name: i for i, name in enumerate(shard_counts)}
    parts = {name: _split_parts(split, shard_counts, tar_ids) for name, split in splits.items()}
    entries, offset = {}, 0
    for name, p in parts.items():
        entries[name] = p.entry(offset)
        offset += p.front_size
    header = {
        "format": FORMAT_VERSION,
        "index_uuid": index_uuid,
        "info_size": info_size,
        "split_config": split_config,
        "split_sha256": split_sha256,
        "checksums": checksums,
        "warnings": list(warnings),
        "splits": entries,  # offsets relative to the end of the header (see front_start)
    }
    text = json.dumps(header).encode()
    front_end = front_start(len(text)) + offset
    out = bytearray(MAGIC)
    out += np.array([front_end, len(text)], dtype=_U64).tobytes() + text
    out += bytes(front_start(len(text)) - len(out))
    block_offset = front_end
    for p in parts.values():
        out += p.front(block_offset)
        block_offset += p.blocks_size
    for p in parts.values():
        for block in p.blocks:
            out += block
    return bytes(out)


def front_start(header_length: int) -> int:
    """Where the splits' summaries begin: after the header, at a multiple of 8."""
    return _pad8(24 + header_length)


class _SplitParts:
    """The encoded blocks of one split, and its summary once the blocks' place is known."""

    def __init__(self, names: list[str], counts: list[int], tar_ids: list[int], excluded) -> None:
        self.num_shards = len(names)
        self.samples = int(sum(counts))
        self.digest = shards_digest(names, counts)
        self.block_shards = block_shards_for(len(names))
        self.excluded = np.asarray(sorted(int(i) for i in excluded), dtype=_U64)
        starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(_U64)
        self.blocks: list[bytes] = []
        self.block_starts: list[int] = []
        for first in range(0, len(names), self.block_shards):
            end = min(first + self.block_shards, len(names))
            self.block_starts.append(int(starts[first]))
            self.blocks.append(
                _encode_block(starts[first:end], tar_ids[first:end], names[first:end])
            )
        self.blocks_size = sum(len(b) for b in self.blocks)
        self.front_size = 16 * (len(self.blocks) + 1) + 8 * len(self.excluded)

    def entry(self, offset: int) -> dict:
        """The split's header entry, its summary ``offset`` bytes after :func:`front_start`."""
        return {
            "shards": self.num_shards,
            "samples": self.samples,
            "sha256": self.digest,
            "block_shards": self.block_shards,
            "summary": offset,
            "blocks": len(self.blocks),
            "excluded": offset + 16 * (len(self.blocks) + 1),
            "excluded_count": len(self.excluded),
        }

    def front(self, block_offset: int) -> bytes:
        """Summary and excluded indices, with the blocks starting at ``block_offset``."""
        offsets = np.cumsum([block_offset] + [len(b) for b in self.blocks], dtype=np.int64)
        summary = np.empty((len(self.blocks) + 1, 2), dtype=_U64)
        summary[:, 0] = [*self.block_starts, self.samples]
        summary[:, 1] = offsets
        return summary.tobytes() + self.excluded.tobytes()


def _split_parts(
    split: SplitShards, shard_counts: dict[str, int], tar_ids: dict[str, int]
) -> _SplitParts:
    missing = [name for name in split.names if name not in shard_counts]
    if missing:
        raise DatasetInfoError(f"the split lists shards that .info.json does not: {missing[:5]}")
    names = list(split.names)
    return _SplitParts(
        names, [shard_counts[n] for n in names], [tar_ids[n] for n in names], split.excluded
    )


def _encode_block(starts: np.ndarray, tar_ids: Sequence[int], names: Sequence[str]) -> bytes:
    encoded = [name.encode() for name in names]
    name_offsets = np.concatenate(([0], np.cumsum([len(e) for e in encoded], dtype=np.int64)))
    body = (
        starts.astype(_U64).tobytes()
        + np.asarray(tar_ids, dtype=_U64).tobytes()
        + name_offsets.astype(_U64).tobytes()
        + b"".join(encoded)
    )
    return body + bytes(_pad8(len(body)) - len(body))


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


def split_config_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading


class _RangeFile:
    """Byte ranges of a local file (``pread``, the descriptor opened once per process) or of a
    remote object (one ranged GET each). Holds nothing that cannot be pickled."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: tuple[int, int] | None = None  # (pid, descriptor)

    def read(self, start: int, end: int) -> bytes:
        if epath.is_remote(self.path):
            return epath.read_range(self.path, start, end)
        if self._fd is None or self._fd[0] != os.getpid():
            self._fd = (os.getpid(), os.open(self.path, os.O_RDONLY))
        data = os.pread(self._fd[1], end - start, start)
        if len(data) != end - start:
            raise DatasetInfoError(f"{self.path}: truncated (wanted bytes {start}..{end})")
        return data

    def __getstate__(self) -> dict:
        return {"path": self.path, "_fd": None}


@dataclass(frozen=True)
class _Block:
    starts: np.ndarray  # first sample of each shard of the block (u64)
    tar_ids: np.ndarray
    names: tuple[str, ...]


class SplitTable:
    """One split of an opened shard table: lazy, block by block, cached in the process.

    Pickles with the blocks it has read (a rank's own few), so forked or spawned workers do not
    read them again."""

    def __init__(
        self, file: _RangeFile, split: str, entry: dict, summary: np.ndarray, excluded: np.ndarray
    ) -> None:
        self.file = file
        self.split = split
        self.num_shards = int(entry["shards"])
        self.samples = int(entry["samples"])
        self.digest = str(entry["sha256"])
        self.block_shards = int(entry["block_shards"])
        self.summary = summary  # (blocks + 1) x 2: first sample, byte offset
        self.excluded = excluded
        self._blocks: dict[int, _Block] = {}

    def block(self, k: int) -> _Block:
        found = self._blocks.get(k)
        if found is None:
            found = self._blocks[k] = self._read_block(k)
        return found

    def _read_block(self, k: int) -> _Block:
        start, end = int(self.summary[k, 1]), int(self.summary[k + 1, 1])
        data = self.file.read(start, end)
        m = min(self.block_shards, self.num_shards - k * self.block_shards)
        arrays = np.frombuffer(data, dtype=_U64, count=3 * m + 1)
        name_offsets = arrays[2 * m :].astype(np.int64)
        base = 8 * (3 * m + 1)
        names = tuple(
            data[base + a : base + b].decode() for a, b in zip(name_offsets[:-1], name_offsets[1:])
        )
        return _Block(arrays[:m].astype(np.int64), arrays[m : 2 * m].astype(np.int64), names)

    def start(self, shard: int) -> int:
        """First global sample index of ``shard`` (``shard == num_shards``: the sample count)."""
        if shard == self.num_shards:
            return self.samples
        k, i = divmod(shard, self.block_shards)
        if i == 0:  # a block's first shard: in the summary (the end of a rank's last shard
            return int(self.summary[k, 0])  # must not cost it the next block)
        return int(self.block(k).starts[i])

    def name(self, shard: int) -> str:
        k, i = divmod(shard, self.block_shards)
        return self.block(k).names[i]

    def tar_file_id(self, shard: int) -> int:
        k, i = divmod(shard, self.block_shards)
        return int(self.block(k).tar_ids[i])

    def search(self, value: int, side: str = "right") -> int:
        """How many shards start before ``value`` (``side="left"``) or at or before it
        (``"right"``): ``np.searchsorted`` over the starts, reading one block."""
        j = int(np.searchsorted(self.summary[:-1, 0], value, side=side))
        if j == 0:
            return 0
        block = self.block(j - 1)
        return (j - 1) * self.block_shards + int(np.searchsorted(block.starts, value, side=side))

    def shard_of(self, index: int) -> int:
        """The shard that holds global sample ``index`` (empty shards hold nothing)."""
        return self.search(index, "right") - 1

    def block_sizes(self) -> np.ndarray:
        """Bytes of each block (what reading one costs a rank)."""
        return np.diff(self.summary[:, 1])


@dataclass(frozen=True)
class StaleTable:
    """Why a shard table was not used."""

    reason: str


def read_table_header(path: str) -> tuple[dict, _RangeFile, bytes]:
    """(header, file, front part) of the shard table at ``path``; ``FileNotFoundError`` if there
    is none, ``ValueError`` if it is not a shard table or damaged."""
    file = _RangeFile(path)
    first = file.read(0, 16)
    if first[:8] != MAGIC:
        raise ValueError(f"{path} is not a shard table (it starts with {first[:8]!r})")
    front_end = int(np.frombuffer(first, dtype=_U64)[1])
    front = first + file.read(16, front_end)
    text_len = int(np.frombuffer(front[16:24], dtype=_U64)[0])
    return json.loads(front[24 : 24 + text_len]), file, front


def open_shard_table(
    root: str, split_config: str, info_size: int
) -> tuple[dict, _RangeFile, bytes] | StaleTable:
    """The validated header of ``root``'s shard table for ``split_config``, or why not."""
    path = epath.join(root, MAIN_FOLDER_NAME, SHARD_TABLE_FILENAME)
    try:
        opened = read_table_header(path)
    except FileNotFoundError:  # remote: RemoteNotFoundError is one
        return StaleTable("no shard table")
    except DatasetInfoError as e:
        return StaleTable(f"{path} is damaged ({e})")
    except ValueError as e:
        return StaleTable(str(e) if "not a shard table" in str(e) else f"{path} is damaged ({e})")
    reason = _mismatch(opened[0], root, split_config, info_size)
    return StaleTable(reason) if reason else opened


def _mismatch(header: dict, root: str, split_config: str, info_size: int) -> str | None:
    """What makes the table not describe the dataset as it is now (None: it does)."""
    if header.get("format") != FORMAT_VERSION:
        return f"shard table format {header.get('format')} (this energon reads {FORMAT_VERSION})"
    if header["split_config"] != split_config:
        return f"the shard table was made for {header['split_config']}, not {split_config}"
    if header["info_size"] != info_size:
        return ".info.json changed since the shard table was written"
    meta = epath.join(root, MAIN_FOLDER_NAME)
    uuid = epath.read_bytes(epath.join(meta, INDEX_UUID_FILENAME)).decode().strip()
    if uuid != header["index_uuid"]:
        return "the dataset was prepared again since the shard table was written"
    split_bytes = epath.read_bytes(epath.join(meta, split_config))
    if split_config_sha256(split_bytes) != header["split_sha256"]:
        return f"{split_config} changed since the shard table was written"
    return None


def split_table(opened: tuple[dict, _RangeFile, bytes], split: str, source: str) -> SplitTable:
    """The table of split ``split`` (an :class:`UnknownSplitError` if the table has none)."""
    header, file, front = opened
    entry = header["splits"].get(split)
    if entry is None:
        raise UnknownSplitError(
            f"{source}: invalid split part {split!r}; defined: {sorted(header['splits'])}"
        )
    base = front_start(int(np.frombuffer(front[16:24], dtype=_U64)[0]))
    blocks = int(entry["blocks"])
    summary = np.frombuffer(
        front, dtype=_U64, count=2 * (blocks + 1), offset=base + entry["summary"]
    )
    excluded = np.frombuffer(
        front, dtype=_U64, count=int(entry["excluded_count"]), offset=base + entry["excluded"]
    )
    return SplitTable(
        file, split, entry, summary.reshape(-1, 2).astype(np.int64), excluded.astype(np.int64)
    )
