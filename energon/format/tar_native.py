"""The common case of a tar header walk, in C: what makes ``prepare`` fast on small samples.

:func:`energon.format.tar.scan_tar` walks a shard's headers in Python at about 10 us per member,
most of it interpreter work per header. This walk does the same in a small C loop (compiled on
first use by :mod:`energon.native`) for shards whose members all have plain headers (v7 or ustar
with the 155-byte prefix, no GNU long names, no PAX records): it reads one 512-byte header block
per ``pread`` and skips payloads, except where they are tiny (at most 1 KiB: the next header lies
in the same page anyway), where one call reads 64 KiB of headers and payloads; it verifies every
checksum, and returns the members as arrays. Anything else (an extended header, a gzip file, a
damaged or truncated header) makes it give up on the shard, and the Python walk, which knows
every header kind and names every error precisely, does it instead: the result is the same
either way (``tests/format/test_tar.py`` compares them).

The members are then grouped into samples in C as well (:func:`group_members`: the key and part
of every name, consecutive parts of one key together), the rules of
:func:`energon.format.tar._group_members` for every name but the odd ones (a newline, a last
component starting with a dot), which it leaves to Python; a test compares both on generated
names.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading

import numpy as np

from energon import native

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 512
#define BUF (64 * 1024)

static int64_t parse_number(const unsigned char *f, int n, int *ok) {
    *ok = 1;
    if (f[0] & 0x80) {
        if (f[0] == 0xFF) { *ok = 0; return 0; }
        int64_t v = 0;
        for (int i = 1; i < n; i++) {
            if (v >> 55) { *ok = 0; return 0; }
            v = (v << 8) | f[i];
        }
        return v;
    }
    int i = 0, seen = 0;
    int64_t v = 0;
    while (i < n && f[i] == ' ') i++;
    for (; i < n && f[i] != 0 && f[i] != ' '; i++) {
        if (f[i] < '0' || f[i] > '7') { *ok = 0; return 0; }
        v = v * 8 + (f[i] - '0');
        seen = 1;
    }
    for (; i < n && f[i] != 0; i++) if (f[i] != ' ') { *ok = 0; return 0; }
    (void)seen;
    return v;
}

static int checksum_ok(const unsigned char *h) {
    int ok;
    int64_t stored = parse_number(h + 148, 8, &ok);
    if (!ok) return 0;
    int64_t u = 0, s = 0;
    for (int i = 0; i < BLOCK; i++) {
        unsigned char c = (i >= 148 && i < 156) ? ' ' : h[i];
        u += c;
        s += (signed char)c;
    }
    return stored == u || stored == s;
}

static int is_zero(const unsigned char *h) {
    for (int i = 0; i < BLOCK; i++) if (h[i]) return 0;
    return 1;
}

/* Fills the arrays with the members from offset `start` on. Returns their number; *status is 0
   at the end of the archive (*next = its offset: the end-of-archive marker or the file size),
   1 when the arrays are full (*next = where to go on), -1 to let Python walk this shard (an
   extended header, a damaged, truncated or compressed file). */
int64_t walk(int fd, int64_t file_size, int64_t start, int64_t cap, int64_t names_cap,
             int64_t *header_off, int64_t *data_off, int64_t *sizes, unsigned char *types,
             int64_t *name_end, char *names, int64_t *next, int64_t *status) {
    static __thread unsigned char buf[BUF];
    int64_t buf_start = -1, buf_len = 0, off = start, n = 0, used = 0, last_payload = BUF;
    *status = -1;
    while (1) {
        *next = off;
        if (off == file_size) { *status = 0; return n; }
        if (off + BLOCK > file_size) return n;
        if (n >= cap || used + 257 > names_cap) { *status = 1; return n; }
        if (buf_start < 0 || off < buf_start || off + BLOCK > buf_start + buf_len) {
            int64_t want = last_payload <= 2 * BLOCK ? BUF : BLOCK;
            if (want > file_size - off) want = file_size - off;
            ssize_t got = pread(fd, buf, (size_t)want, off);
            if (got < BLOCK) return n;
            buf_start = off; buf_len = got;
        }
        const unsigned char *h = buf + (off - buf_start);
        if (off == 0 && h[0] == 0x1f && h[1] == 0x8b) return n;
        if (is_zero(h)) { *status = 0; return n; }
        if (!checksum_ok(h)) return n;
        unsigned char t = h[156];
        if (t == 'L' || t == 'K' || t == 'x' || t == 'g' || t == 'X' || t == 'S') return n;
        int ok;
        int64_t size = parse_number(h + 124, 12, &ok);
        if (!ok || size < 0) return n;
        int name_len = 0;
        while (name_len < 100 && h[name_len]) name_len++;
        if (t == 0 && name_len && h[name_len - 1] == '/') return n;  /* an old-style folder */
        int prefix_len = 0;
        if (h[345] && memcmp(h + 257, "ustar\0", 6) == 0)
            while (prefix_len < 155 && h[345 + prefix_len]) prefix_len++;
        if (prefix_len) {
            memcpy(names + used, h + 345, prefix_len); used += prefix_len;
            names[used++] = '/';
        }
        memcpy(names + used, h, name_len); used += name_len;
        names[used++] = 0;
        int has_payload = !(t >= '1' && t <= '6');
        int64_t padded = has_payload ? (size + BLOCK - 1) / BLOCK * BLOCK : 0;
        if (has_payload && off + BLOCK + size > file_size) return n;
        header_off[n] = off; data_off[n] = off + BLOCK; sizes[n] = has_payload ? size : 0;
        types[n] = t; name_end[n] = used;
        n++;
        last_payload = padded;
        off += BLOCK + padded;
    }
}

/* Groups a shard's members into samples as energon.format.tar._group_members does: regular
   files only, names under a "__...__" first folder skipped, key = the name up to the first dot of
   its last component, part = the rest; consecutive members with the same key form one sample.
   names: n names, each ended by a NUL. Returns -1 (let Python group them) for a name with a
   newline or a last component starting with a dot, where the regular expressions have subtle
   rules. Out: each sample's first header offset; each part's sample, payload offset and size;
   the keys and the part names, each ended by a NUL; counts = samples, parts and the bytes of
   both. */
int64_t group(const char *names, int64_t n, const unsigned char *types,
              const int64_t *header_off, const int64_t *data_off, const int64_t *sizes,
              int64_t *sample_header, int64_t *part_sample, int64_t *part_off,
              int64_t *part_size, char *keys, char *parts, int64_t *counts) {
    int64_t samples = 0, nparts = 0, kused = 0, pused = 0, cur_len = -1;
    const char *cur_key = NULL, *name = names;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = (int64_t)strlen(name);
        const char *next = name + len + 1;
        unsigned char t = types[i];
        if (memchr(name, '\n', (size_t)len)) return -1;
        if (!(t == '0' || t == 0 || t == '7')) { name = next; continue; }
        const char *slash = memchr(name, '/', (size_t)len);
        int64_t first = slash ? slash - name : len;
        if (first >= 4 && name[0] == '_' && name[1] == '_' && name[first - 1] == '_' &&
            name[first - 2] == '_') { name = next; continue; }
        int64_t last = len;  /* where the last component starts */
        while (last > 0 && name[last - 1] != '/') last--;
        const char *dot = memchr(name + last, '.', (size_t)(len - last));
        if (!dot) { name = next; continue; }
        int64_t d = dot - name;
        if (d == last) return -1;
        if (d != cur_len || memcmp(name, cur_key, (size_t)d) != 0) {
            sample_header[samples++] = header_off[i];
            memcpy(keys + kused, name, (size_t)d); kused += d; keys[kused++] = 0;
            cur_key = name; cur_len = d;
        }
        part_sample[nparts] = samples - 1;
        part_off[nparts] = data_off[i];
        part_size[nparts] = sizes[i];
        nparts++;
        memcpy(parts + pused, dot + 1, (size_t)(len - d - 1)); pused += len - d - 1;
        parts[pused++] = 0;
        name = next;
    }
    counts[0] = samples; counts[1] = nparts; counts[2] = kused; counts[3] = pused;
    return 0;
}
"""

_lib: ctypes.CDLL | None | bool = False  # False: not tried yet
_CAP = 1 << 16  # members per call


def _library() -> ctypes.CDLL | None:
    global _lib
    if _lib is False:
        lib = native.load_library("tar_walk", _SOURCE)
        if lib is not None:
            p = ctypes.c_void_p
            lib.walk.restype = ctypes.c_int64
            lib.walk.argtypes = [ctypes.c_int, *[ctypes.c_int64] * 4, *[p] * 8]
            lib.group.restype = ctypes.c_int64
            lib.group.argtypes = [p, ctypes.c_int64, *[p] * 11]
        _lib = lib
    return _lib  # type: ignore[return-value]


def available() -> bool:
    return _library() is not None


@dataclasses.dataclass
class Members:
    """Every member of a shard, as arrays, and where the archive ends. ``names_blob`` holds the
    names, each ended by a NUL (valid UTF-8: checked while walking)."""

    names_blob: bytes
    header_offsets: np.ndarray
    data_offsets: np.ndarray
    sizes: np.ndarray
    types: bytes
    end: int

    @property
    def names(self) -> list[str]:
        return self.names_blob.decode("utf-8").split("\0")[: len(self.types)]


@dataclasses.dataclass
class Grouped:
    """A shard's samples as columns: each sample's key and first header offset, and each part's
    sample (its number in the shard), name, payload offset and size, in tar order."""

    keys: list[str]
    header_offsets: list[int]
    part_sample: list[int]
    part_names: list[str]
    part_offsets: list[int]
    part_sizes: list[int]


def group_members(found: Members) -> Grouped | None:
    """The members grouped into samples in C, or None: the C code is not available, or a name
    needs the regular expressions' subtle rules (Python groups those). A key that comes back
    after another one is not looked for here (``scan_tar`` checks the keys are distinct)."""
    lib = _library()
    if lib is None:
        return None
    n = len(found.types)
    sample_header, part_sample, part_off, part_size = (np.empty(n, np.int64) for _ in range(4))
    keys = ctypes.create_string_buffer(len(found.names_blob) + 1)
    parts = ctypes.create_string_buffer(len(found.names_blob) + 1)
    counts = np.zeros(4, np.int64)
    columns = [
        np.ascontiguousarray(a, np.int64)
        for a in (found.header_offsets, found.data_offsets, found.sizes)
    ]
    rc = lib.group(
        found.names_blob,
        n,
        found.types,
        *(a.ctypes.data for a in columns),
        *(a.ctypes.data for a in (sample_header, part_sample, part_off, part_size)),
        keys,
        parts,
        counts.ctypes.data,
    )
    if rc < 0:
        return None
    samples, nparts, key_bytes, part_bytes = counts.tolist()
    return Grouped(
        keys.raw[:key_bytes].decode("utf-8").split("\0")[:samples],
        sample_header[:samples].tolist(),
        part_sample[:nparts].tolist(),
        parts.raw[:part_bytes].decode("utf-8").split("\0")[:nparts],
        part_off[:nparts].tolist(),
        part_size[:nparts].tolist(),
    )


def walk_headers(path: str) -> Members | None:
    """The members of the shard at ``path``, or None: the C walk is not available, or the shard
    needs the Python walk (see the module docstring)."""
    lib = _library()
    if lib is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        return _walk_all(lib, fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


class _Buffers(threading.local):
    """The arrays one walk fills, made once per thread (a 4 MiB name buffer costs as much to
    clear as a small shard takes to walk)."""

    def __init__(self) -> None:
        self.arrays = [np.empty(_CAP, dtype=np.int64) for _ in range(4)]
        self.types = np.empty(_CAP, dtype=np.uint8)
        self.names = ctypes.create_string_buffer(_CAP * 64)


_buffers = _Buffers()


def _walk_all(lib: ctypes.CDLL, fd: int, size: int) -> Members | None:
    header_off, data_off, sizes, name_end = _buffers.arrays
    types, names = _buffers.types, _buffers.names
    nxt, status = ctypes.c_int64(0), ctypes.c_int64(0)
    parts: list[tuple] = []
    start = 0
    while True:
        n = lib.walk(
            fd,
            size,
            start,
            _CAP,
            len(names),
            header_off.ctypes.data,
            data_off.ctypes.data,
            sizes.ctypes.data,
            types.ctypes.data,
            name_end.ctypes.data,
            names,
            ctypes.byref(nxt),
            ctypes.byref(status),
        )
        if status.value < 0:
            return None
        used = int(name_end[n - 1]) if n else 0
        blob = names.raw[:used]
        try:
            blob.decode("utf-8")  # a name that is not UTF-8: the Python walk says so
        except UnicodeDecodeError:
            return None
        parts.append(
            (
                blob,
                header_off[:n].copy(),
                data_off[:n].copy(),
                sizes[:n].copy(),
                types[:n].tobytes(),
            )
        )
        start = nxt.value
        if status.value == 0:
            break
    return Members(
        b"".join(p[0] for p in parts),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        np.concatenate([p[3] for p in parts]),
        b"".join(p[4] for p in parts),
        start,
    )
