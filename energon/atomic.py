"""Writing a file so that a reader sees a complete old or a complete new one, never half of it.

Every writer of metadata, caches and reports goes through here: the data goes to a temporary file
in the target's folder (same file system) and is renamed over the target. This is the one home of
that rule; :mod:`energon.format.layout` re-exports it for the writers of a dataset's ``.nv-meta``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

PathLike = str | os.PathLike


def temp_name_for(target: PathLike) -> Path:
    """A unique temporary name in the target's folder (same file system, so rename is atomic)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")


@contextlib.contextmanager
def replacing(
    target: PathLike, *, suffix: str = "", mode_like: PathLike | None = None
) -> Iterator[Path]:
    """Write the new ``target`` at the temporary path this yields: when the block ends it is
    renamed over ``target``; when the block raises it is removed and ``target`` is untouched.
    ``suffix`` ends the temporary name (``np.save`` adds ``.npy`` to a name without it)."""
    tmp = temp_name_for(target)
    if suffix:
        tmp = tmp.with_name(tmp.name + suffix)
    try:
        yield tmp
        copy_permissions(mode_like, tmp)
        os.replace(tmp, target)
    except BaseException:
        remove_quietly(tmp)
        raise


def atomic_write_bytes(target: PathLike, data: bytes, *, mode_like: PathLike | None = None) -> None:
    """Write ``data`` to ``target`` through a temporary file and a rename."""
    with replacing(target, mode_like=mode_like) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_write_text(target: PathLike, text: str, *, mode_like: PathLike | None = None) -> None:
    atomic_write_bytes(target, text.encode("utf-8"), mode_like=mode_like)


def copy_permissions(source: PathLike | None, target: PathLike) -> None:
    """Give a generated file its source's permission bits plus owner read/write (best effort).

    Datasets are often shared by a group; the metadata should be as readable as the shards.
    """
    if source is None:
        return
    try:
        os.chmod(target, (os.stat(source).st_mode & 0o777) | 0o600)
    except OSError:
        pass


def remove_quietly(path: PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
