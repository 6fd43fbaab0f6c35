"""Tar header parsing (prepare) and sample splitting (load), checked against Python's tarfile."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from energon.format import tar_native
from energon.format.tar import (
    DuplicateKeyInShardError,
    TarFormatError,
    _checksum_ok,
    _group_members,
    _native_members,
    iter_tar_members,
    scan_tar,
    split_member_name,
    split_sample_bytes,
)
from tests.helpers.tarfiles import png_bytes, write_tar

LONG_DIR = "d" * 120


def _reference_members(path):
    with tarfile.open(path) as tf:
        return [
            (m.name, m.offset, m.offset_data, m.size if m.isreg() else 0) for m in tf.getmembers()
        ]


def _our_members(path):
    with open(path, "rb") as f:
        return [
            (m.name, m.header_offset, m.data_offset, m.size)
            for m in iter_tar_members(f, path=str(path))
        ]


def _mixed_members():
    return [
        ("000000.txt", b"short"),
        (f"{LONG_DIR}/000001.png", png_bytes(1)),  # needs GNU longname / PAX path
        ("000002.jpg", b"x" * 513),  # payload spans two blocks
        ("0000ü3.txt", b"non-ascii name"),
        ("000004.txt", b""),
    ]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_match_tarfile(tmp_path, fmt):
    d = tarfile.TarInfo("adir")
    d.type = tarfile.DIRTYPE
    link = tarfile.TarInfo("alink.txt")
    link.type = tarfile.SYMTYPE
    link.linkname = "x" * 150  # GNU longlink 'K' / PAX linkpath
    path = write_tar(tmp_path / "a.tar", _mixed_members(), fmt=fmt, extra=[d, link])
    assert _our_members(path) == _reference_members(path)


def test_ustar_prefix_names_match_tarfile(tmp_path):
    name = "sub/" * 30 + "000001.txt"  # fits ustar's 155-byte prefix + 100-byte name
    path = write_tar(tmp_path / "u.tar", [(name, b"abc")], fmt=tarfile.USTAR_FORMAT)
    assert _our_members(path) == _reference_members(path)
    assert _our_members(path)[0][0] == name


def test_extended_headers_belong_to_member_offset(tmp_path):
    path = write_tar(tmp_path / "g.tar", _mixed_members(), fmt=tarfile.GNU_FORMAT)
    members = _our_members(path)
    long_member = members[1]
    assert long_member[0] == f"{LONG_DIR}/000001.png"
    # the 'L' header block + its name payload block come before the real header
    assert long_member[2] - long_member[1] == 3 * 512


def test_pax_global_header_is_ignored_but_counts_in_offset(tmp_path):
    path = tmp_path / "pg.tar"
    with tarfile.open(
        path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}
    ) as tf:
        info = tarfile.TarInfo("000000.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    assert _our_members(path) == _reference_members(path)
    scan = scan_tar(path)
    assert [s[0] for s in scan.samples] == ["000000"]


def _pax_header(records: dict[str, str]) -> bytes:
    body = b""
    for key, value in records.items():
        rec = f" {key}={value}\n".encode()
        length = len(rec) + 1
        length = len(rec) + len(str(length))
        body += f"{length}{rec.decode()}".encode()
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = len(body)
    header = info.tobuf(format=tarfile.USTAR_FORMAT)
    return header + body + b"\0" * (-len(body) % 512)


def test_pax_path_and_size_override(tmp_path):
    payload = b"0123456789"
    pax = _pax_header({"path": "over/ridden.name.txt", "size": str(len(payload))})
    info = tarfile.TarInfo("short.txt")
    info.size = 0  # overridden by the PAX size record
    member = info.tobuf(format=tarfile.USTAR_FORMAT) + payload + b"\0" * (512 - len(payload))
    path = tmp_path / "pax.tar"
    path.write_bytes(pax + member + b"\0" * 1024)
    ours = _our_members(path)
    assert ours == [("over/ridden.name.txt", 0, len(pax) + 512, len(payload))]
    assert ours == _reference_members(path)
    buf = path.read_bytes()
    assert [(n, bytes(v)) for n, v in split_sample_bytes(buf[: len(pax) + 1024])] == [
        ("over/ridden.name.txt", payload)
    ]


def test_split_member_name():
    assert split_member_name("a/b/000001.img1.jpg") == ("a/b/000001", "img1.jpg")
    assert split_member_name("x.tar.gz") == ("x", "tar.gz")
    assert split_member_name("noext") is None
    assert split_member_name("dir.v1/noext") is None
    assert split_member_name("__meta__") is None
    assert split_member_name("__x__/000.txt") is None
    assert split_member_name("a__x__.txt") == ("a__x__", "txt")


def test_scan_groups_consecutive_members_and_skips_others(tmp_path):
    d = tarfile.TarInfo("folder")
    d.type = tarfile.DIRTYPE
    members = [
        ("__meta__/info.txt", b"{}"),  # skipped: a __name__ folder
        ("000000.jpg", b"a"),
        ("000000.txt", b"bb"),
        ("README", b"no dot: not a part"),
        ("000001.jpg", b"ccc"),
    ]
    path = write_tar(tmp_path / "s.tar", members, extra=[d])
    scan = scan_tar(path)
    ref = {m[0]: m for m in _reference_members(path)}
    assert [(k, off) for k, off, _ in scan.samples] == [
        ("000000", ref["000000.jpg"][1]),
        ("000001", ref["000001.jpg"][1]),
    ]
    assert scan.samples[0][2] == [
        ("jpg", ref["000000.jpg"][2], 1),
        ("txt", ref["000000.txt"][2], 2),
    ]
    with tarfile.open(path) as tf:
        tf.getmembers()
        end = tf.offset  # tarfile's position after the last member = start of the end marker
    assert scan.end_offset == end
    assert scan.sample_offsets() == [ref["000000.jpg"][1], ref["000001.jpg"][1], end]


def test_non_consecutive_duplicate_key_names_both_offsets(tmp_path):
    members = [("000000.jpg", b"a"), ("000001.jpg", b"b"), ("000000.txt", b"c")]
    path = write_tar(tmp_path / "dup.tar", members)
    with pytest.raises(DuplicateKeyInShardError) as err:
        scan_tar(path)
    assert err.value.first_offset == 0
    assert err.value.second_offset == 2048
    msg = str(err.value)
    assert "000000" in msg and "dup.tar" in msg and "0" in msg and "2048" in msg


def test_truncated_payload_names_file_and_offset(tmp_path):
    path = write_tar(tmp_path / "t.tar", [("000000.bin", b"x" * 5000), ("000001.bin", b"y" * 5000)])
    data = path.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:8000])  # inside the second member's payload
    with pytest.raises(TarFormatError) as err:
        scan_tar(cut)
    assert err.value.path == str(cut)
    assert err.value.offset == 5632  # header of the member whose payload is cut
    assert "truncated" in str(err.value) and str(cut) in str(err.value) and "5632" in str(err.value)


def test_truncated_header_block(tmp_path):
    path = write_tar(tmp_path / "t.tar", [("000000.bin", b"x" * 100)])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(path.read_bytes()[:1300])  # half of the header block after the first member
    with pytest.raises(TarFormatError) as err:
        scan_tar(cut)
    assert err.value.offset == 1024 and "header block" in str(err.value)


def test_bad_checksum_is_reported_at_its_header(tmp_path):
    path = write_tar(tmp_path / "c.tar", [(f"{i:06d}.txt", b"abc") for i in range(5)])
    data = bytearray(path.read_bytes())
    data[3 * 1024 + 10] ^= 0x55  # corrupt the name of the 4th member's header
    path.write_bytes(bytes(data))
    with pytest.raises(TarFormatError) as err:
        scan_tar(path)
    assert err.value.offset == 3 * 1024
    assert "checksum" in str(err.value)


def test_corrupt_size_field_reports_the_header_not_a_side_effect(tmp_path):
    path = write_tar(tmp_path / "c.tar", [(f"{i:06d}.txt", b"abc") for i in range(3)])
    data = bytearray(path.read_bytes())
    data[1024 + 124 : 1024 + 135] = b"77777777777"  # huge size, checksum now wrong
    path.write_bytes(bytes(data))
    with pytest.raises(TarFormatError) as err:
        scan_tar(path)
    assert err.value.offset == 1024 and "checksum" in str(err.value)


def test_gzip_compressed_shard_is_refused_clearly(tmp_path):
    plain = write_tar(tmp_path / "p.tar", [("000000.txt", b"abc")])
    tgz = tmp_path / "p.tgz"
    tgz.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(TarFormatError, match="gzip-compressed"):
        scan_tar(tgz)


def test_missing_end_marker_is_accepted(tmp_path):
    path = write_tar(tmp_path / "p.tar", [("000000.txt", b"abc")])
    trimmed = tmp_path / "trimmed.tar"
    trimmed.write_bytes(path.read_bytes()[:1024])
    scan = scan_tar(trimmed)
    assert scan.sample_offsets() == [0, 1024]


def test_split_sample_bytes_returns_payloads(tmp_path):
    members = [("000000.png", png_bytes(3)), ("000000.txt", b"caption"), ("000001.txt", b"next")]
    d = tarfile.TarInfo("000000.dir")
    d.type = tarfile.DIRTYPE
    path = write_tar(tmp_path / "s.tar", members)
    scan = scan_tar(path)
    offsets = scan.sample_offsets()
    data = path.read_bytes()
    first = split_sample_bytes(data[offsets[0] : offsets[1]], base_offset=offsets[0])
    assert [(n, bytes(v)) for n, v in first] == members[:2]
    assert all(isinstance(v, memoryview) for _, v in first)
    view = memoryview(data)[offsets[1] : offsets[2]]
    assert [(n, bytes(v)) for n, v in split_sample_bytes(view)] == [members[2]]
    bytearray_result = split_sample_bytes(bytearray(data[offsets[0] : offsets[1]]))
    assert [n for n, _ in bytearray_result] == ["000000.png", "000000.txt"]


def test_split_sample_bytes_long_names_and_skipped_members(tmp_path):
    d = tarfile.TarInfo("adir")
    d.type = tarfile.DIRTYPE
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = write_tar(
            tmp_path / f"l{fmt}.tar", [(f"{LONG_DIR}/000001.png", b"img")], fmt=fmt, extra=[d]
        )
        got = split_sample_bytes(path.read_bytes())
        assert [(n, bytes(v)) for n, v in got] == [(f"{LONG_DIR}/000001.png", b"img")]


def test_split_sample_bytes_detects_stale_range(tmp_path):
    path = write_tar(tmp_path / "s.tar", [("000000.bin", b"x" * 2000)])
    data = path.read_bytes()
    with pytest.raises(TarFormatError) as err:
        split_sample_bytes(data[:1024], base_offset=4096, path="s.tar")
    assert err.value.offset == 4096 and "s.tar" in str(err.value)
    shifted = data[512:1536]  # starts inside a payload: not a header
    with pytest.raises(TarFormatError, match="checksum"):
        split_sample_bytes(shifted, base_offset=512, path="s.tar")


def _with_checksum(header: bytes, value: int) -> bytes:
    return header[:148] + b"%06o\x00 " % value + header[156:]


def _plain_sums(header: bytes) -> tuple[int, int]:
    """The unsigned and signed header sums, spelled out byte by byte (the checksum field as spaces)."""
    body = header[:148] + b" " * 8 + header[156:]
    return sum(body), sum(b - 256 if b >= 128 else b for b in body)


@given(st.binary(min_size=512, max_size=512), st.sampled_from(["unsigned", "signed", "wrapped"]))
def test_header_checksum_is_exact(header, which):
    unsigned, signed = _plain_sums(header)
    stored = {"unsigned": unsigned, "signed": signed, "wrapped": unsigned + 65521}[which]
    if stored < 0:
        return  # a negative sum cannot be written as octal
    header = _with_checksum(header, stored)
    assert _checksum_ok(header) == (stored in (unsigned, signed))
    assert _checksum_ok(header) != (which == "wrapped")


def test_header_checksum_of_the_largest_sums():
    # every byte 0xff: each piece summed by zlib is at its largest; a sum off by one is refused
    header = bytes([0xFF]) * 512
    unsigned, signed = _plain_sums(header)
    assert _checksum_ok(_with_checksum(header, unsigned))
    assert not _checksum_ok(_with_checksum(header, unsigned - 1))
    assert not _checksum_ok(_with_checksum(header, unsigned + 1))


def test_split_sample_bytes_reads_ustar_prefixes_and_refuses_a_damaged_header(tmp_path):
    name = "sub/" * 30 + "000001.txt"
    path = write_tar(tmp_path / "u.tar", [(name, b"abc")], fmt=tarfile.USTAR_FORMAT)
    data = path.read_bytes()
    assert [(n, bytes(v)) for n, v in split_sample_bytes(data)] == [(name, b"abc")]
    damaged = bytearray(data)
    damaged[400] ^= 0x01  # inside the prefix: the sum is off by one
    with pytest.raises(TarFormatError, match="checksum") as err:
        split_sample_bytes(bytes(damaged), base_offset=2048, path="u.tar")
    assert err.value.offset == 2048


def test_tar_format_error_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(TarFormatError("a.tar", 512, "bad")))
    assert (err.path, err.offset, str(err)) == ("a.tar", 512, "a.tar: at byte offset 512: bad")
    dup = pickle.loads(pickle.dumps(DuplicateKeyInShardError("a.tar", "k", 0, 1024)))
    assert (dup.key, dup.first_offset, dup.second_offset) == ("k", 0, 1024)


def test_prepare_reads_only_headers(tmp_path, monkeypatch):
    """Payload bytes are never read: every pread is a header block or an extended-header payload
    (the Python walk, spied on), and the C walk reads one block per member."""
    path = write_tar(tmp_path / "big.tar", [(f"{i:06d}.bin", os.urandom(3000)) for i in range(20)])
    assert tar_native.available()
    first = _bytes_read()
    before = _bytes_read()  # reading /proc/self/io counts too: the same amount every time
    native = scan_tar(path)
    after = _bytes_read()
    assert after - before - (before - first) == 21 * 512  # 20 headers, the end-of-archive block
    reads = []
    real_pread = os.pread

    def spy(fd, n, offset):
        reads.append((n, offset))
        return real_pread(fd, n, offset)

    monkeypatch.setattr(tar_native, "_lib", None)  # the Python walk
    monkeypatch.setattr(os, "pread", spy)
    python = scan_tar(path)
    monkeypatch.setattr(os, "pread", real_pread)
    assert (python.samples, python.end_offset) == (native.samples, native.end_offset)
    header_offsets = {m[1] for m in _reference_members(path)} | {python.end_offset}
    assert reads
    for n, offset in reads:
        assert n <= 512 and offset in header_offsets


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])


@pytest.mark.parametrize("fmt", ["v7", "oldgnu", "gnu", "ustar", "posix"])
def test_gnu_tar_archives_split_like_tarfile(tmp_path, fmt):
    """Archives written by GNU tar itself (not Python's tarfile) in each of its formats: the
    indexed samples split into the members and payloads tarfile reads."""
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    src = tmp_path / "src"
    names = ["000000.txt", "000000.json", "000001.txt", "0000ü2.txt"]
    if fmt != "v7":  # v7 stores at most 99 characters and no prefix
        names.append("sub/" * 30 + "000003.txt")  # ustar prefix, GNU longname or PAX path
    for i, name in enumerate(names):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(bytes([i]) * (100 + 300 * i))
    archive = tmp_path / f"{fmt}.tar"
    subprocess.run(
        ["tar", f"--format={fmt}", "--sort=name", "-cf", str(archive), "-C", str(src), *names],
        check=True,
        capture_output=True,
        timeout=600,
    )
    with tarfile.open(archive) as tf:
        expected = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isreg()}
    data = archive.read_bytes()
    offsets = scan_tar(archive).sample_offsets()
    got = {}
    for start, end in zip(offsets, offsets[1:]):
        for name, payload in split_sample_bytes(data[start:end], base_offset=start):
            got[name] = bytes(payload)
    assert got == expected and len(got) == len(names)


def test_headers_with_signed_checksums_are_read(tmp_path):
    """Some old writers summed the header as signed chars; tarfile reads such archives, so do we
    (in prepare's scan and in the load-time split)."""
    path = write_tar(tmp_path / "s.tar", [("000000.txt", b"abc"), ("000001.txt", b"de")])
    data = bytearray(path.read_bytes())
    for header in (0, 1024):
        # high bytes after the name's NUL: not part of the name, but part of the sum
        data[header + 20 : header + 24] = "éèêë".encode("latin-1")
        _, signed = _plain_sums(bytes(data[header : header + 512]))
        data[header + 148 : header + 156] = b"%06o\x00 " % signed
    path.write_bytes(bytes(data))
    with tarfile.open(path) as tf:
        expected = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    offsets = scan_tar(path).sample_offsets()
    got = [
        (name, bytes(payload))
        for start, end in zip(offsets, offsets[1:])
        for name, payload in split_sample_bytes(bytes(data[start:end]))
    ]
    assert got == expected == [("000000.txt", b"abc"), ("000001.txt", b"de")]


def _scans_both_ways(path, monkeypatch):
    """(C walk or None, Python walk) of one shard; errors as their messages."""

    def scan():
        try:
            result = scan_tar(path)
            return result.samples, result.end_offset
        except (TarFormatError, DuplicateKeyInShardError) as e:
            return str(e)

    native = tar_native.walk_headers(str(path))
    fast = scan()
    with monkeypatch.context() as m:
        m.setattr(tar_native, "_lib", None)
        return native, fast, scan()


PLAIN = [
    (f"{i:06d}.{part}", bytes([i]) * n)
    for i, (part, n) in enumerate(
        [("txt", 5), ("jpg", 513), ("json", 0), ("txt", 1024), ("cls", 3)]
    )
]


@pytest.mark.parametrize(
    "case",
    ["v7", "ustar", "ustar prefix", "dirs and links", "pax", "gnu longname", "two parts"],
)
def test_the_c_walk_and_the_python_walk_agree(tmp_path, monkeypatch, case):
    assert tar_native.available()
    members, fmt, extra = PLAIN, tarfile.USTAR_FORMAT, []
    if case == "v7":
        fmt = tarfile.USTAR_FORMAT  # tarfile writes no v7; blank the magic below
    if case == "ustar prefix":
        members = [("sub/" * 30 + "000001.txt", b"abc"), *PLAIN]
    if case == "dirs and links":
        folder, link = tarfile.TarInfo("adir"), tarfile.TarInfo("000009.lnk")
        folder.type, link.type, link.linkname = tarfile.DIRTYPE, tarfile.SYMTYPE, "000000.txt"
        extra = [folder, link]
    if case == "pax":
        fmt = tarfile.PAX_FORMAT
        members = [("0000ü1.txt", b"x"), *PLAIN]
    if case == "gnu longname":
        fmt, members = tarfile.GNU_FORMAT, [(f"{LONG_DIR}/000001.png", b"png"), *PLAIN]
    if case == "two parts":
        members = [("000001.txt", b"a"), ("000001.json", b"{}"), ("000002.txt", b"b")]
    path = write_tar(tmp_path / "t.tar", members, fmt=fmt, extra=extra)
    if case == "v7":
        _blank_magic(path)
    native, fast, python = _scans_both_ways(path, monkeypatch)
    assert fast == python
    falls_back = case in ("pax", "gnu longname")
    assert (native is None) == falls_back


def _blank_magic(path) -> None:
    """Turn every ustar header into a v7 one (no magic; checksums fixed)."""
    data = bytearray(path.read_bytes())
    for offset in range(0, len(data), 512):
        block = data[offset : offset + 512]
        if block[257:263] == b"ustar\x00":
            block[257:265] = bytes(8)
            block[148:156] = b" " * 8
            block[148:156] = b"%06o\x00 " % sum(block)
            data[offset : offset + 512] = block
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["checksum", "truncated", "duplicate key"])
def test_the_c_walk_leaves_damaged_shards_to_the_python_walk(tmp_path, monkeypatch, damage):
    members = [*PLAIN, ("000000.txt", b"again")] if damage == "duplicate key" else PLAIN
    path = write_tar(tmp_path / "d.tar", members, fmt=tarfile.USTAR_FORMAT)
    data = bytearray(path.read_bytes())
    if damage == "checksum":
        data[2560 + 3] ^= 1  # the third member's name (after a 513-byte payload)
    if damage == "truncated":
        data = data[: 512 * 4 + 100]
    path.write_bytes(bytes(data))
    native, fast, python = _scans_both_ways(path, monkeypatch)
    assert fast == python
    assert isinstance(python, str)  # an error, the same message either way


_NAME_CHARS = st.text(alphabet="ab_./\nü", max_size=9)
_TYPES = st.sampled_from(b"0\x0075")


@given(st.lists(st.tuples(_NAME_CHARS, _TYPES), max_size=12))
def test_the_c_grouping_and_the_python_grouping_agree(members):
    """Names made of the characters the grouping rules turn on (dots, slashes, underscores of
    ``__meta__`` folders, newlines, non-ASCII) and member types: the C grouping gives the same
    samples and parts as the regular expressions, or leaves the shard to them."""
    assert tar_native.available()
    n = len(members)
    offsets = np.arange(n, dtype=np.int64) * 1024
    sizes = np.arange(n, dtype=np.int64) % 7
    found = tar_native.Members(
        b"".join(name.encode() + b"\0" for name, _ in members),
        offsets,
        offsets + 512,
        sizes,
        bytes(t for _, t in members),
        n * 1024,
    )
    native = tar_native.group_members(found)
    try:
        python = _group_members(_native_members(found), "t.tar")
    except DuplicateKeyInShardError:
        python = None
    if native is None:  # a name with a newline or a last component starting with a dot
        assert any("\n" in name or name.rsplit("/", 1)[-1].startswith(".") for name, _ in members)
        return
    if python is None:
        assert len(set(native.keys)) < len(native.keys)
        return
    assert (
        native.keys,
        native.header_offsets,
        native.part_sample,
        native.part_names,
        native.part_offsets,
        native.part_sizes,
    ) == (
        python.keys,
        python.header_offsets,
        python.part_sample,
        python.part_names,
        python.part_offsets,
        python.part_sizes,
    )
