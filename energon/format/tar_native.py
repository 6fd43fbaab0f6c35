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
        _lib = lib
    return _lib  # type: ignore[return-value]


def available() -> bool:
    return _library() is not None


@dataclasses.dataclass
class Members:
    """Every member of a shard, as arrays (names as a list), and where the archive ends."""

    names: list[str]
    header_offsets: np.ndarray
    data_offsets: np.ndarray
    sizes: np.ndarray
    types: bytes
    end: int


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
        try:
            text = names.raw[:used].decode("utf-8")  # a name that is not UTF-8: Python says so
        except UnicodeDecodeError:
            return None
        parts.append(
            (
                text.split("\0")[:n],
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
        [name for p in parts for name in p[0]],
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        np.concatenate([p[3] for p in parts]),
        b"".join(p[4] for p in parts),
        start,
    )
