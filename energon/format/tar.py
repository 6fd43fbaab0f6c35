"""Tar headers, parsed by hand.

Two jobs with different needs share this module:

* ``prepare`` walks every header of every shard once. It must never read payload bytes (shards
  can be terabytes on network file systems), so :func:`iter_tar_members` reads one 512-byte block
  per header with ``pread`` and jumps over payloads.
* At load time the loader has already cut one sample's byte range out of a shard (using the
  ``.tar.idx``); :func:`split_sample_bytes` splits that in-memory range into its members. This is
  the hot path, so it uses plain slicing and integer parsing, no ``tarfile`` objects.

Supported header flavours: v7, POSIX ustar (with the 155-byte name prefix), GNU (``L`` long name,
``K`` long link name, base-256 numbers) and PAX (``x`` per-member records with ``path`` and
``size`` overrides; ``g`` global records are skipped). Like Python's ``TarInfo.offset``, the header
offset of a member is the offset of its FIRST header block, extended headers included, so sample
byte ranges written by us and by the reference are identical.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from energon.errors import DuplicateKeyInShardError, TarFormatError
from energon.format.tar_native import Members, group_members, walk_headers

BLOCK_SIZE = 512

SPLIT_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
SKIP_META_RE = re.compile(r"__[^/]*__($|/)")

# Type flags (byte 156 of a header).
_REGULAR_TYPES = frozenset(b"0\x007")  # regular, old-style regular, contiguous
_GNU_LONGNAME = ord("L")
_GNU_LONGLINK = ord("K")
_PAX_MEMBER = ord("x")
_PAX_GLOBAL = ord("g")
_GNU_SPARSE = ord("S")
_SOLARIS_EXTENDED = ord("X")
_DIRECTORY = ord("5")
_EXTENDED_TYPES = frozenset(
    (_GNU_LONGNAME, _GNU_LONGLINK, _PAX_MEMBER, _PAX_GLOBAL, _SOLARIS_EXTENDED)
)
# Members whose payload (if any) follows the header. Like tarfile, unknown types are treated as
# having a payload; links, directories and devices have none whatever their size field says.
_NO_PAYLOAD_TYPES = frozenset(b"123456")

_POSIX_MAGIC = b"ustar\x00"
_CHECKSUM_BLANK = 8 * 32  # the checksum field counts as 8 spaces
_ZERO_BLOCK = bytes(BLOCK_SIZE)
_adler32 = zlib.adler32


def split_member_name(name: str) -> tuple[str, str] | None:
    """Split a member name into (sample key, part name), or None if the member is not a sample part.

    The key is the optional directory prefix plus the last component up to its FIRST dot, the part
    is the rest (``a/b/0001.img.jpg`` -> ``("a/b/0001", "img.jpg")``). Names like ``__meta__`` and
    names whose last component has no dot are not sample parts.
    """
    if SKIP_META_RE.match(name):
        return None
    m = SPLIT_NAME_RE.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2)


@dataclass(frozen=True, slots=True)
class TarMember:
    name: str  # full member name (after GNU longname / PAX path resolution)
    header_offset: int  # offset of the first header block of this member (incl. extended headers)
    data_offset: int  # offset of the payload
    size: int  # payload size
    is_file: bool


@dataclass(slots=True)
class TarScan:
    """The result of scanning one shard's headers, grouped into samples, as columns.

    ``keys`` and ``header_offsets`` (the offset of each sample's first header) have one entry per
    sample; ``part_sample`` (the sample's number in the shard), ``part_names``, ``part_offsets``
    (of the payload) and ``part_sizes`` one per part; all in tar order. ``end_offset`` is where
    the end-of-archive marker starts (the end of the last sample). Columns, not a tuple per
    sample: ``prepare`` hands them to sqlite as they are.
    """

    keys: list[str] = field(default_factory=list)
    header_offsets: list[int] = field(default_factory=list)
    part_sample: list[int] = field(default_factory=list)
    part_names: list[str] = field(default_factory=list)
    part_offsets: list[int] = field(default_factory=list)
    part_sizes: list[int] = field(default_factory=list)
    end_offset: int = 0

    @property
    def samples(self) -> list[tuple[str, int, list[tuple[str, int, int]]]]:
        """``(key, header_offset, [(part, data_offset, size), ...])`` of each sample."""
        samples: list[tuple[str, int, list[tuple[str, int, int]]]] = [
            (key, offset, []) for key, offset in zip(self.keys, self.header_offsets)
        ]
        for sample, part, offset, size in zip(
            self.part_sample, self.part_names, self.part_offsets, self.part_sizes
        ):
            samples[sample][2].append((part, offset, size))
        return samples

    def sample_offsets(self) -> list[int]:
        """The ``.tar.idx`` entries: each sample's first header offset, then the end offset."""
        return [*self.header_offsets, self.end_offset]


# ---------------------------------------------------------------------------------------------
# Header field parsing


def _parse_number(field_bytes: bytes) -> int:
    """Parse a numeric header field: NUL/space-terminated octal, or GNU base-256 (high bit set).

    Raises ValueError for anything else.
    """
    first = field_bytes[0]
    if first & 0x80:
        value = int.from_bytes(field_bytes[1:], "big")
        if first == 0xFF:  # negative base-256 (never valid for sizes; kept for completeness)
            value -= 1 << (8 * (len(field_bytes) - 1))
        return value
    digits = _cut_at_nul(field_bytes)
    return int(digits, 8) if digits.strip() else 0


def _cut_at_nul(raw: bytes) -> bytes:
    return raw.partition(b"\x00")[0]


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _check_utf8(name: str, path: str, offset: int) -> None:
    """Member names must be UTF-8: keys are text everywhere (index.sqlite, states, logs), and two
    differently broken names must not collapse into one key."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape")
        raise TarFormatError(
            path, offset, f"member name {shown!r} is not valid UTF-8; rename the member"
        ) from None


def _unsigned_sum(header: bytes | memoryview) -> int:
    """The header's byte sum with its checksum field (bytes 148-155) counted as 8 spaces.

    Every sample's headers are checked at load time, and ``sum()`` over 512 Python ints is slow.
    Adler-32 keeps ``1 + (sum of the bytes) mod 65521`` in its low 16 bits; over a piece of at
    most 256 bytes the sum cannot reach 65521, so zlib's C loop gives the exact sum of each piece.
    """
    return (
        (_adler32(header[:148]) & 0xFFFF)
        + (_adler32(header[156:404]) & 0xFFFF)
        + (_adler32(header[404:BLOCK_SIZE]) & 0xFFFF)
        + _CHECKSUM_BLANK
        - 3  # the three Adler-32 starting values
    )


def _checksum_ok(header: bytes | memoryview) -> bool:
    """Validate the header checksum; like tarfile, both unsigned and signed sums are accepted."""
    stored = _stored_checksum(bytes(header[148:156]))
    if stored is None:
        return False
    unsigned = _unsigned_sum(header)
    if stored == unsigned:
        return True
    # old writers summed signed chars: every byte >= 128 counts 256 less
    high_bytes = sum(1 for b in bytes(header[:148]) + bytes(header[156:BLOCK_SIZE]) if b >= 128)
    return stored == unsigned - 256 * high_bytes


def _header_name(header: bytes) -> str:
    """The member name stored in a plain header: ustar prefix + '/' + name, or just name."""
    name = _cut_at_nul(header[0:100])
    if header[345] and header[257:263] == _POSIX_MAGIC:  # a prefix that is not empty
        name = _cut_at_nul(header[345:500]) + b"/" + name
    return _decode_name(name)


def _parse_pax_records(payload: bytes, path: str, offset: int) -> dict[str, str]:
    """Parse PAX extended header records: ``"<len> <key>=<value>\\n"`` repeated."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(payload):
        if payload[pos] == 0:  # some writers pad the record area with NULs
            break
        space = payload.find(b" ", pos)
        if space < 0:
            raise TarFormatError(path, offset, "malformed PAX extended header (no record length)")
        try:
            length = int(payload[pos:space])
        except ValueError:
            raise TarFormatError(
                path, offset, "malformed PAX extended header (bad record length)"
            ) from None
        record = payload[space + 1 : pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise TarFormatError(path, offset, "malformed PAX extended header record")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _padded(size: int) -> int:
    return (size + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE


# ---------------------------------------------------------------------------------------------
# Walking a tar file's headers (prepare)

_CHECK_BATCH = 4096  # headers whose checksums are verified together


class _HeaderWalker:
    """Reads header blocks and small extended-header payloads of one tar file with pread.

    Checksums are verified in batches with numpy (summing 512 bytes in Python would cost more than
    all other header parsing together). Any error raised while walking first re-checks the pending
    headers, so a corrupt header is reported as such, at its own offset.
    """

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.file_size = os.fstat(fd).st_size
        self._unchecked: list[bytes] = []
        self._unchecked_offsets: list[int] = []

    def read_exact(self, offset: int, length: int, what: str) -> bytes:
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise TarFormatError(
                self.path,
                offset,
                f"truncated tar: {what} needs {length} bytes, file ends at {self.file_size}",
            )
        return data

    def header(self, offset: int) -> bytes | None:
        """The header block at ``offset``, or None at the end of the archive."""
        if offset == self.file_size:
            return None  # no end-of-archive marker: accepted, as tarfile does
        if offset == 0 and os.pread(self.fd, 2, 0) == b"\x1f\x8b":
            raise TarFormatError(
                self.path,
                0,
                "gzip-compressed tar: compressed shards cannot be indexed for random access; "
                "decompress it to a plain .tar first",
            )
        block = self.read_exact(offset, BLOCK_SIZE, "header block")
        if block == _ZERO_BLOCK:
            return None
        self._unchecked.append(block)
        self._unchecked_offsets.append(offset)
        if len(self._unchecked) >= _CHECK_BATCH:
            self.verify()
        return block

    def verify(self) -> None:
        """Check the checksums of all headers read since the last check."""
        if not self._unchecked:
            return
        blocks = np.frombuffer(b"".join(self._unchecked), dtype=np.uint8).reshape(-1, BLOCK_SIZE)
        sums = blocks.sum(axis=1, dtype=np.int64) - blocks[:, 148:156].sum(axis=1, dtype=np.int64)
        sums += _CHECKSUM_BLANK
        headers, offsets = self._unchecked, self._unchecked_offsets
        self._unchecked, self._unchecked_offsets = [], []
        for header, offset, computed in zip(headers, offsets, sums.tolist()):
            if _stored_checksum(header[148:156]) != computed and not _checksum_ok(header):
                raise TarFormatError(self.path, offset, "invalid tar header (checksum mismatch)")


def _stored_checksum(field_bytes: bytes) -> int | None:
    try:
        return _parse_number(field_bytes)
    except ValueError:
        return None


def _next_member(walker: _HeaderWalker, offset: int) -> tuple[str, int, int, int, bool, int] | None:
    """Parse the member at ``offset`` (with its extended headers).

    Returns ``(name, header_offset, data_offset, size, is_file, next_offset)``, or None at the end.
    """
    first_offset = offset
    long_name: str | None = None
    pax: dict[str, str] | None = None
    while True:
        header = walker.header(offset)
        if header is None:
            if offset != first_offset:
                raise TarFormatError(
                    walker.path, offset, "extended header not followed by a member"
                )
            return None
        typeflag = header[156]
        size = _parse_number(header[124:136])
        if typeflag not in _EXTENDED_TYPES:
            break
        payload = walker.read_exact(offset + BLOCK_SIZE, size, "extended header payload")
        if typeflag == _PAX_GLOBAL and offset == first_offset:
            # Like tarfile: a global header is not part of the next member's header offset.
            first_offset = offset + BLOCK_SIZE + _padded(size)
        if typeflag == _GNU_LONGNAME:
            long_name = _decode_name(_cut_at_nul(payload))
        elif typeflag == _PAX_MEMBER or typeflag == _SOLARIS_EXTENDED:
            pax = pax or {}
            pax.update(_parse_pax_records(payload, walker.path, offset))
        # K (long link name) and g (global PAX records) do not affect name, size or grouping.
        offset += BLOCK_SIZE + _padded(size)
    if typeflag == _GNU_SPARSE:
        raise TarFormatError(walker.path, first_offset, "GNU sparse members are not supported")
    if pax is not None and "path" in pax:
        name = pax["path"]
    elif long_name is not None:
        name = long_name
    else:
        name = _header_name(header)
    _check_utf8(name, walker.path, first_offset)
    if pax is not None and "size" in pax:
        size = int(pax["size"])
    is_dir = typeflag == _DIRECTORY or (typeflag == 0 and name.endswith("/"))
    if is_dir:
        name = name.rstrip("/")
        size = 0
    elif typeflag in _NO_PAYLOAD_TYPES:
        size = 0
    data_offset = offset + BLOCK_SIZE
    if data_offset + size > walker.file_size:
        raise TarFormatError(
            walker.path,
            first_offset,
            f"truncated tar: member {name!r} needs {size} payload bytes from offset "
            f"{data_offset}, file ends at {walker.file_size}",
        )
    is_file = typeflag in _REGULAR_TYPES and not is_dir
    return name, first_offset, data_offset, size, is_file, data_offset + _padded(size)


def _walk(walker: _HeaderWalker) -> Iterator[tuple[str, int, int, int, bool, int]]:
    """All members in order; headers are verified before the walk ends (or reports an error)."""
    offset = 0
    try:
        while True:
            member = _next_member(walker, offset)
            if member is None:
                break
            yield member
            offset = member[5]
    except (TarFormatError, ValueError) as error:
        walker.verify()  # a corrupt header explains most other errors: report it instead
        if isinstance(error, TarFormatError):
            raise
        raise TarFormatError(walker.path, offset, f"invalid tar header ({error})") from None
    walker.verify()


def iter_tar_members(f, *, path: str = "") -> Iterator[TarMember]:
    """Yield every member of a tar file, reading only headers (payloads are skipped over).

    ``f`` is a binary file object with a real file descriptor (``fileno()``). Raises
    :class:`TarFormatError` on a bad checksum, a truncated header or payload, or a compressed file;
    checksums are verified in batches, so the error may come a few members after the bad header
    was read, but always before the iteration ends.
    """
    for name, header_offset, data_offset, size, is_file, _ in _walk(
        _HeaderWalker(f.fileno(), path)
    ):
        yield TarMember(name, header_offset, data_offset, size, is_file)


def scan_tar(path: str | os.PathLike, *, display_path: str | None = None) -> TarScan:
    """Scan a shard's headers and group its members into samples.

    Consecutive regular files with the same key form one sample; other members are skipped. A key
    that comes back after another key started (a non-consecutive duplicate) is an error naming
    both offsets: reading such a shard would silently produce two half samples.

    The headers are walked in C where that is possible (:mod:`energon.format.tar_native`: plain
    headers, about 1 us per member), else in Python (every header kind, precise errors).
    """
    shown = display_path if display_path is not None else os.fspath(path)
    native = walk_headers(os.fspath(path))
    if native is not None:
        grouped = group_members(native)
        if grouped is not None and len(set(grouped.keys)) == len(grouped.keys):
            g = grouped
            return TarScan(
                g.keys,
                g.header_offsets,
                g.part_sample,
                g.part_names,
                g.part_offsets,
                g.part_sizes,
                native.end,
            )
        # names the C grouping leaves to Python, or a key that comes back: Python names it
        return _group_members(_native_members(native), shown)
    with open(path, "rb", buffering=0) as f:
        return _group_members(_walk(_HeaderWalker(f.fileno(), shown)), shown)


def _native_members(found: Members) -> Iterator[tuple[str, int, int, int, bool, int]]:
    """The C walk's members as :func:`_walk` yields them (the names of members that are not
    regular files do not matter: they are skipped)."""
    padded = (found.sizes + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    return zip(
        found.names,
        found.header_offsets.tolist(),
        found.data_offsets.tolist(),
        found.sizes.tolist(),
        [t in _REGULAR_TYPES for t in found.types],
        (found.data_offsets + padded).tolist(),
    )


def _group_members(members: Iterator[tuple[str, int, int, int, bool, int]], shown: str) -> TarScan:
    """Consecutive regular files with the same key into samples (the rules the C grouping of
    :func:`energon.format.tar_native.group_members` follows for ordinary names)."""
    scan = TarScan()
    keys, parts = scan.keys, scan.part_sample
    first_offset_of_key: dict[str, int] = {}
    current_key: str | None = None
    split_match = SPLIT_NAME_RE.match
    skip_match = SKIP_META_RE.match
    for name, header_offset, data_offset, size, is_file, next_offset in members:
        scan.end_offset = next_offset
        if not is_file or skip_match(name):
            continue
        m = split_match(name)
        if m is None:
            continue
        key, part = m.groups()
        if key != current_key:
            if key in first_offset_of_key:
                raise DuplicateKeyInShardError(shown, key, first_offset_of_key[key], header_offset)
            first_offset_of_key[key] = header_offset
            current_key = key
            keys.append(key)
            scan.header_offsets.append(header_offset)
        parts.append(len(keys) - 1)
        scan.part_names.append(part)
        scan.part_offsets.append(data_offset)
        scan.part_sizes.append(size)
    return scan


# ---------------------------------------------------------------------------------------------
# Splitting one sample's bytes (load time, hot path)


def split_sample_bytes(
    buf: bytes | bytearray | memoryview, *, base_offset: int = 0, path: str = ""
) -> list[tuple[str, memoryview]]:
    """Split the bytes of one sample (a range cut by the tar index) into its regular-file members.

    Returns ``[(member_name, payload)]`` with payloads as zero-copy memoryviews into ``buf``.
    Directories, links and extended headers are skipped. ``base_offset`` is the range's offset in
    the shard and is only used to report the absolute byte offset of a corrupt header.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    # Headers are parsed from small bytes copies; payloads stay zero-copy views into ``buf``.
    whole = buf if isinstance(buf, bytes) else None
    end = len(view)
    members: list[tuple[str, memoryview]] = []
    pos = 0
    long_name: str | None = None
    pax: dict[str, str] | None = None
    while pos + BLOCK_SIZE <= end:
        header = (
            whole[pos : pos + BLOCK_SIZE]
            if whole is not None
            else view[pos : pos + BLOCK_SIZE].tobytes()
        )
        if header == _ZERO_BLOCK:
            break
        if not _checksum_ok(header):
            raise TarFormatError(
                path, base_offset + pos, "invalid tar header (checksum mismatch) in sample range"
            )
        typeflag = header[156]
        size = _parse_number(header[124:136])
        data_pos = pos + BLOCK_SIZE
        if typeflag in _EXTENDED_TYPES:
            if data_pos + size > end:
                raise TarFormatError(
                    path, base_offset + pos, "extended header runs past sample end"
                )
            payload = view[data_pos : data_pos + size].tobytes()
            if typeflag == _GNU_LONGNAME:
                long_name = _decode_name(_cut_at_nul(payload))
            elif typeflag in (_PAX_MEMBER, _SOLARIS_EXTENDED):
                pax = _parse_pax_records(payload, path, base_offset + pos)
            pos = data_pos + _padded(size)
            continue
        if pax is not None:
            name = pax.get("path") or long_name or _header_name(header)
            size = int(pax.get("size", size))
        else:
            name = long_name if long_name is not None else _header_name(header)
        _check_utf8(name, path, base_offset + pos)
        long_name = None
        pax = None
        if typeflag in _NO_PAYLOAD_TYPES or (typeflag == 0 and name.endswith("/")):
            pos = data_pos
            continue
        if data_pos + size > end:
            raise TarFormatError(
                path,
                base_offset + pos,
                f"member {name!r} runs past the end of the sample's byte range (stale .tar.idx?)",
            )
        if typeflag in _REGULAR_TYPES:
            members.append((name, view[data_pos : data_pos + size]))
        pos = data_pos + _padded(size)
    return members
