"""Helpers shared by the format / prepare / CLI tests: real tar shards with real image bytes.

Shards are written with Python's ``tarfile`` (the format used by webdataset's ShardWriter), so the
tests check our parser against an independent writer.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from PIL import Image


def png_bytes(seed: int, size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (seed % 256, (seed * 7) % 256, 99)).save(buf, "PNG")
    return buf.getvalue()


def jpeg_bytes(seed: int, size: int = 16) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), ((seed * 3) % 256, 10, seed % 256)).save(buf, "JPEG")
    return buf.getvalue()


def write_tar(
    path: Path,
    members: Iterable[tuple[str, bytes]],
    *,
    fmt: int = tarfile.GNU_FORMAT,
    extra: Sequence[tarfile.TarInfo] = (),
) -> Path:
    """Write ``members`` (name, payload) into a tar; ``extra`` members (dirs, links) go first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as tf:
        for info in extra:
            tf.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    return path


def captioning_members(keys: Iterable[int], *, with_json: bool = False) -> list[tuple[str, bytes]]:
    members = []
    for k in keys:
        members.append((f"{k:06d}.png", png_bytes(k)))
        members.append((f"{k:06d}.txt", f"caption of sample {k}".encode()))
        if with_json:
            members.append((f"{k:06d}.json", json.dumps({"caption": f"caption {k}"}).encode()))
    return members


def make_captioning_shards(
    root: Path,
    counts: Sequence[int] = (30, 20),
    *,
    with_json: bool = False,
    fmt: int = tarfile.GNU_FORMAT,
) -> list[str]:
    """Shards ``parts/data-<i>.tar`` holding consecutive keys 000000... (like the reference tests)."""
    names = []
    start = 0
    for i, count in enumerate(counts):
        name = f"parts/data-{i}.tar"
        write_tar(
            root / name,
            captioning_members(range(start, start + count), with_json=with_json),
            fmt=fmt,
        )
        names.append(name)
        start += count
    return names
