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
    [8, 16)    u64  front_end: bytes [0, front_end) are the front part, read by every rank
    [16, 24)   u64  length of the JSON header
    [24, ...)  JSON header, then zero bytes up to a multiple of 8
    per split: summary, (pages + 1) x (u64 first sample, u64 byte offset) of each page's first
               block (the last entry: the split's samples and the end of its blocks); then the
               split's excluded sample indices (u64, sorted)
    directory: per split, blocks x (u64 first sample, u64 byte offset) of each block
    blocks:    per block of ``block_shards`` shards (m of them): m x u64 first sample of each
               shard, m x u64 tar_file_id, (m + 1) x u64 name offsets into the names that
               follow (UTF-8), zero bytes up to a multiple of 8

Three levels, so that what a rank reads grows with its own shards and not with the dataset:
blocks have a fixed number of shards (32), a page is ``page_blocks`` consecutive blocks, and the
front part lists at most 1,024 pages per split (16 KiB). A rank finds its samples' page in the
front part, reads the directory entries of that page (one read; none when a page is one block)
and then its blocks (one read for a run of adjacent blocks).

The header binds the table to what it was made from: the content of ``index.uuid`` (every
prepare, ours or the reference's, writes a new one), the byte size of ``.info.json`` and the
SHA-256 of the split config file. A table that does not match is not used
(:func:`open_shard_table` says why) and loading falls back to reading ``.info.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from energon import epath
from energon.errors import DatasetInfoError, UnknownSplitError
from energon.format.layout import INDEX_UUID_FILENAME, MAIN_FOLDER_NAME, SHARD_TABLE_FILENAME

MAGIC = b"ENSHTAB\x01"
FORMAT_VERSION = 2  # 1: one level of blocks that grew with the dataset (energon before 11/2026)
BLOCK_SHARDS = 32  # shards per block: a rank reads at most two blocks' worth beyond its own
MAX_PAGES = 1024  # pages per split in the front part that every rank reads (16 KiB)
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


def page_blocks_for(num_blocks: int, max_pages: int = MAX_PAGES) -> int:
    """Blocks per page: few enough pages for the front part (at most ``max_pages``)."""
    return max(1, -(-num_blocks // max_pages))


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
    block_shards: int = BLOCK_SHARDS,
    max_pages: int = MAX_PAGES,
) -> bytes:
    """The content of ``shard_table.bin``. ``shard_counts`` is ``.info.json``'s mapping (its
    order numbers the shards: ``tar_file_id``). ``block_shards`` and ``max_pages`` shape the
    levels (tests make small datasets use all three)."""
    tar_ids = {name: i for i, name in enumerate(shard_counts)}
    parts = {
        name: _split_parts(split, shard_counts, tar_ids, block_shards, max_pages)
        for name, split in splits.items()
    }
    header = {
        "format": FORMAT_VERSION,
        "index_uuid": index_uuid,
        "info_size": info_size,
        "split_config": split_config,
        "split_sha256": split_sha256,
        "checksums": checksums,
        "warnings": list(warnings),
        "splits": _entries(parts),
    }
    text = json.dumps(header).encode()
    front_end = front_start(len(text)) + sum(p.front_size for p in parts.values())
    blocks_at = front_end + sum(p.directory_size for p in parts.values())
    out = bytearray(MAGIC)
    out += np.array([front_end, len(text)], dtype=_U64).tobytes() + text
    out += bytes(front_start(len(text)) - len(out))
    fronts, directories, block_offset = [], [], blocks_at
    for p in parts.values():
        fronts.append(p.front(block_offset))
        directories.append(p.directory(block_offset))
        block_offset += p.blocks_size
    out += b"".join(fronts) + b"".join(directories)
    for p in parts.values():
        for block in p.blocks:
            out += block
    return bytes(out)


def _entries(parts: dict[str, _SplitParts]) -> dict[str, dict]:
    """The header's entry of each split: where its summary lies (bytes after the header, see
    :func:`front_start`) and its directory (bytes after the front part)."""
    entries, summary, directory = {}, 0, 0
    for name, p in parts.items():
        entries[name] = p.entry(summary, directory)
        summary += p.front_size
        directory += p.directory_size
    return entries


def front_start(header_length: int) -> int:
    """Where the splits' summaries begin: after the header, at a multiple of 8."""
    return _pad8(24 + header_length)


class _SplitParts:
    """The encoded blocks of one split, and its summary and directory once the blocks' place is
    known."""

    def __init__(
        self,
        names: list[str],
        counts: list[int],
        tar_ids: list[int],
        excluded,
        block_shards: int,
        max_pages: int,
    ) -> None:
        self.num_shards = len(names)
        self.samples = int(sum(counts))
        self.digest = shards_digest(names, counts)
        self.block_shards = block_shards
        self.excluded = np.asarray(sorted(int(i) for i in excluded), dtype=_U64)
        starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(_U64)
        self.blocks: list[bytes] = []
        self.block_starts: list[int] = []
        for first in range(0, len(names), block_shards):
            end = min(first + block_shards, len(names))
            self.block_starts.append(int(starts[first]))
            self.blocks.append(
                _encode_block(starts[first:end], tar_ids[first:end], names[first:end])
            )
        self.page_blocks = page_blocks_for(len(self.blocks), max_pages)
        self.pages = -(-len(self.blocks) // self.page_blocks)
        self.blocks_size = sum(len(b) for b in self.blocks)
        self.front_size = 16 * (self.pages + 1) + 8 * len(self.excluded)
        self.directory_size = 16 * len(self.blocks)

    def entry(self, summary: int, directory: int) -> dict:
        """The split's header entry: its summary ``summary`` bytes after :func:`front_start`,
        its directory ``directory`` bytes after the front part."""
        return {
            "shards": self.num_shards,
            "samples": self.samples,
            "sha256": self.digest,
            "block_shards": self.block_shards,
            "page_blocks": self.page_blocks,
            "summary": summary,
            "pages": self.pages,
            "blocks": len(self.blocks),
            "directory": directory,
            "excluded": summary + 16 * (self.pages + 1),
            "excluded_count": len(self.excluded),
        }

    def _block_rows(self, block_offset: int) -> np.ndarray:
        """(blocks + 1) x (first sample, byte offset), the blocks starting at ``block_offset``."""
        rows = np.empty((len(self.blocks) + 1, 2), dtype=_U64)
        rows[:, 0] = [*self.block_starts, self.samples]
        rows[:, 1] = np.cumsum([block_offset] + [len(b) for b in self.blocks], dtype=np.int64)
        return rows

    def front(self, block_offset: int) -> bytes:
        """Summary (each page's first block, then the end) and excluded indices."""
        rows = self._block_rows(block_offset)
        summary = np.concatenate((rows[:-1][:: self.page_blocks], rows[-1:]))
        return summary.tobytes() + self.excluded.tobytes()

    def directory(self, block_offset: int) -> bytes:
        """Every block's first sample and byte offset."""
        return self._block_rows(block_offset)[:-1].tobytes()


def _split_parts(
    split: SplitShards,
    shard_counts: dict[str, int],
    tar_ids: dict[str, int],
    block_shards: int,
    max_pages: int,
) -> _SplitParts:
    missing = [name for name in split.names if name not in shard_counts]
    if missing:
        raise DatasetInfoError(f"the split lists shards that .info.json does not: {missing[:5]}")
    names = list(split.names)
    counts = [shard_counts[n] for n in names]
    tar_file_ids = [tar_ids[n] for n in names]
    return _SplitParts(names, counts, tar_file_ids, split.excluded, block_shards, max_pages)


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
        self._opened: _Descriptor | None = None

    def read(self, start: int, end: int) -> bytes:
        if epath.is_remote(self.path):
            return epath.read_range(self.path, start, end)
        if self._opened is None or self._opened.pid != os.getpid():
            self._opened = _Descriptor(self.path)
        data = os.pread(self._opened.fd, end - start, start)
        if len(data) != end - start:
            raise DatasetInfoError(f"{self.path}: truncated (wanted bytes {start}..{end})")
        return data

    def __getstate__(self) -> dict:
        return {"path": self.path, "_opened": None}


class _Descriptor:
    """A read-only descriptor of one process, closed when the table that read through it goes:
    a process that builds datasets again and again (a validation set per evaluation) must not
    keep one descriptor per build until it runs out."""

    def __init__(self, path: str) -> None:
        self.pid = os.getpid()
        self.fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)  # (also at exit, before modules are torn down)


@dataclass(frozen=True)
class _Block:
    starts: np.ndarray  # first sample of each shard of the block (u64)
    tar_ids: np.ndarray
    names: tuple[str, ...]


class SplitTable:
    """One split of an opened shard table: lazy, page by page and block by block, cached in the
    process.

    :meth:`load` reads what a range of samples needs in one read per level (adjacent pages and
    blocks together); single questions (:meth:`start`, :meth:`search`, ...) read what they miss.
    Pickles with the pages and blocks it has read (a rank's own few), so forked or spawned
    workers do not read them again."""

    def __init__(
        self,
        file: _RangeFile,
        split: str,
        entry: dict,
        summary: np.ndarray,
        excluded: np.ndarray,
        directory: int,
    ) -> None:
        self.file = file
        self.split = split
        self.num_shards = int(entry["shards"])
        self.samples = int(entry["samples"])
        self.digest = str(entry["sha256"])
        self.block_shards = int(entry["block_shards"])
        self.page_blocks = int(entry["page_blocks"])
        self.num_blocks = int(entry["blocks"])
        self.summary = summary  # (pages + 1) x 2: first sample, byte offset of each page
        self.directory = directory  # byte offset of the split's directory
        self.excluded = excluded
        self._pages: dict[int, np.ndarray] = {}  # page -> its blocks' (first sample, offset)
        self._blocks: dict[int, _Block] = {}

    # --- what the loader asks

    def load(self, first: int, end: int) -> None:
        """Read now what the shards that hold samples ``[first, end)`` need: the directory of
        their pages in one read and their blocks in another (none for what was read before)."""
        if end <= first or not self.num_blocks:
            return
        self._load_pages(self._page_of(first, "right"), self._page_of(end, "left") + 1)
        a, b = self._block_of(first, "right"), self._block_of(end, "left")
        self._load_blocks(a, max(a, b) + 1)

    def start(self, shard: int) -> int:
        """First global sample index of ``shard`` (``shard == num_shards``: the sample count)."""
        if shard == self.num_shards:
            return self.samples
        k, i = divmod(shard, self.block_shards)
        if i == 0:  # a block's first shard: in its page (the end of a rank's last shard must
            return int(self._block_row(k)[0])  # not cost it the next block)
        return int(self.block(k).starts[i])

    def name(self, shard: int) -> str:
        k, i = divmod(shard, self.block_shards)
        return self.block(k).names[i]

    def tar_file_id(self, shard: int) -> int:
        k, i = divmod(shard, self.block_shards)
        return int(self.block(k).tar_ids[i])

    def search(self, value: int, side: str = "right") -> int:
        """How many shards start before ``value`` (``side="left"``) or at or before it
        (``"right"``): ``np.searchsorted`` over the starts, reading one page and one block."""
        if not int(np.searchsorted(self.summary[:-1, 0], value, side=side)):
            return 0
        k = self._block_of(value, side)
        found = int(np.searchsorted(self.block(k).starts, value, side=side))
        return k * self.block_shards + found

    def shard_of(self, index: int) -> int:
        """The shard that holds global sample ``index`` (empty shards hold nothing)."""
        return self.search(index, "right") - 1

    def block(self, k: int) -> _Block:
        found = self._blocks.get(k)
        if found is None:
            self._load_blocks(k, k + 1)
            found = self._blocks[k]
        return found

    def read_costs(self) -> tuple[np.ndarray, np.ndarray]:
        """(bytes of each block, bytes of each page's directory entries): what reading them
        costs a rank. Reads the whole directory (``energon simulate``; not a rank's path)."""
        if self.page_blocks == 1:  # the summary lists every block; no directory is read
            return np.diff(self.summary[:, 1]), np.zeros(len(self.summary) - 1, dtype=np.int64)
        rows = self._read_rows(0, self.num_blocks)
        offsets = np.append(rows[:, 1], self.summary[-1, 1])
        per_page = np.diff(
            np.append(np.arange(0, self.num_blocks, self.page_blocks), self.num_blocks)
        )
        return np.diff(offsets), 16 * per_page

    # --- the levels

    def _page_of(self, value: int, side: str) -> int:
        """The page whose blocks a search for ``value`` looks at (the first one if none)."""
        j = int(np.searchsorted(self.summary[:-1, 0], value, side=side)) - 1
        return max(j, 0)

    def _block_of(self, value: int, side: str) -> int:
        """The block whose shards a search for ``value`` looks at (the first one if none)."""
        j = self._page_of(value, side)
        if self.page_blocks == 1:
            return j
        starts = self._page(j)[:, 0]
        return j * self.page_blocks + max(int(np.searchsorted(starts, value, side=side)) - 1, 0)

    def _block_row(self, k: int) -> np.ndarray:
        """(first sample, byte offset) of block ``k`` (``num_blocks``: the samples and the end
        of the blocks), from the summary where it is a page's first block."""
        if k == self.num_blocks:
            return self.summary[-1]
        page, i = divmod(k, self.page_blocks)
        return self.summary[page] if i == 0 else self._page(page)[i]

    def _page(self, j: int) -> np.ndarray:
        found = self._pages.get(j)
        if found is None:
            self._load_pages(j, j + 1)
            found = self._pages[j]
        return found

    def _load_pages(self, a: int, b: int) -> None:
        """The directory entries of pages ``[a, b)`` not read yet: one read per run."""
        if self.page_blocks == 1:
            return
        g = self.page_blocks
        for first, end in _missing_runs(self._pages, a, b):
            rows = self._read_rows(first * g, min(end * g, self.num_blocks))
            for j in range(first, end):
                self._pages[j] = rows[(j - first) * g : (j + 1 - first) * g]

    def _read_rows(self, a: int, b: int) -> np.ndarray:
        data = self.file.read(self.directory + 16 * a, self.directory + 16 * b)
        return np.frombuffer(data, dtype=_U64).reshape(-1, 2).astype(np.int64)

    def _load_blocks(self, a: int, b: int) -> None:
        """Blocks ``[a, b)`` not read yet: one read per run of adjacent ones."""
        self._load_pages(a // self.page_blocks, (b - 1) // self.page_blocks + 1)
        for first, end in _missing_runs(self._blocks, a, b):
            offsets = [int(self._block_row(k)[1]) for k in range(first, end + 1)]
            data = self.file.read(offsets[0], offsets[-1])
            for k in range(first, end):
                lo, hi = offsets[k - first] - offsets[0], offsets[k + 1 - first] - offsets[0]
                self._blocks[k] = self._decode_block(k, data[lo:hi])

    def _decode_block(self, k: int, data: bytes) -> _Block:
        m = min(self.block_shards, self.num_shards - k * self.block_shards)
        arrays = np.frombuffer(data, dtype=_U64, count=3 * m + 1)
        name_offsets = arrays[2 * m :].astype(np.int64)
        base = 8 * (3 * m + 1)
        names = tuple(
            data[base + a : base + b].decode() for a, b in zip(name_offsets[:-1], name_offsets[1:])
        )
        return _Block(arrays[:m].astype(np.int64), arrays[m : 2 * m].astype(np.int64), names)


def _missing_runs(cache: dict[int, object], a: int, b: int) -> list[tuple[int, int]]:
    """Runs ``[first, end)`` of the keys in ``[a, b)`` that ``cache`` lacks, in order."""
    runs: list[tuple[int, int]] = []
    for k in range(a, b):
        if k in cache:
            continue
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return runs


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
        return (
            f"the shard table is in format {header.get('format')}, this energon reads format "
            f"{FORMAT_VERSION} (written by another energon version)"
        )
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
    pages = int(entry["pages"])
    summary = np.frombuffer(
        front, dtype=_U64, count=2 * (pages + 1), offset=base + entry["summary"]
    )
    excluded = np.frombuffer(
        front, dtype=_U64, count=int(entry["excluded_count"]), offset=base + entry["excluded"]
    )
    return SplitTable(
        file,
        split,
        entry,
        summary.reshape(-1, 2).astype(np.int64),
        excluded.astype(np.int64),
        directory=len(front) + int(entry["directory"]),
    )
