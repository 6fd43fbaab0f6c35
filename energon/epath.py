"""One path type for datasets: local paths, ``file://`` URLs, ``s3://bucket/key`` objects and
``msc://profile/key`` objects (multi-storage-client profiles).

Paths are plain strings so that everything holding one stays picklable and cheap to send to worker
processes; the functions here dispatch on the scheme. Local paths are made absolute; remote paths
are normalised (``.``/``..`` removed) with POSIX rules, because ``os.path`` would mangle the ``//``
of a URL. Remote access (clients, retries, caching) lives in :mod:`energon.remote`: one module per
scheme (``s3``, ``msc``) implementing :class:`~energon.remote.store.RemoteStore`, picked by
:func:`_store` (the one place that dispatches on the scheme). The remote modules import their client
libraries (boto3, multi-storage-client) only on first use.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import shutil
from collections.abc import Iterator

from energon.atomic import atomic_write_bytes, remove_quietly, replacing
from energon.remote import RemoteNotFoundError, msc, s3
from energon.remote import cache as remote_cache
from energon.remote.store import RemoteStore

REMOTE_SCHEMES = ("s3://", "msc://")


def is_remote(path: str | os.PathLike) -> bool:
    """True for object-store URLs (``s3://``, ``msc://``)."""
    return isinstance(path, str) and path.startswith(REMOTE_SCHEMES)


def _store(path: str) -> RemoteStore:
    """The store that speaks ``path``'s scheme."""
    return msc if path.startswith("msc://") else s3


def is_absolute(path: str) -> bool:
    """Absolute local path, ``file://`` URL or remote URL (a relative join returns it unchanged)."""
    return is_remote(path) or path.startswith("file://") or os.path.isabs(path)


def normalize(path: str | os.PathLike) -> str:
    """Absolute local path (``file://`` stripped) or a normalised remote URL."""
    path = os.fspath(path)
    if path.startswith("file://"):
        path = path[len("file://") :]
    if not is_remote(path):
        return os.path.abspath(path)
    scheme, rest = path.split("://", 1)
    bucket, _, key = rest.partition("/")
    if not key:
        return f"{scheme}://{bucket}"
    parts: list[str] = []
    for part in key.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ValueError(f"{path}: '..' goes above the bucket")
            parts.pop()
        else:
            parts.append(part)
    return f"{scheme}://{bucket}/" + "/".join(parts)


def join(base: str | os.PathLike, *parts: str) -> str:
    """``base / part / ...``; an absolute part (or URL) replaces what came before."""
    result = os.fspath(base)
    for part in parts:
        part = os.fspath(part)
        if is_absolute(part):
            result = part
        elif is_remote(result):
            result = normalize(posixpath.join(result, part))
        else:
            result = os.path.join(result, part)
    return result


def resolve(path: str, base_dir: str) -> str:
    """``path`` relative to ``base_dir`` (local or remote), normalised; absolute paths stay."""
    if is_absolute(path):
        return normalize(path)
    if is_remote(base_dir):
        return join(base_dir, path)
    return os.path.normpath(os.path.join(base_dir, path))


def dirname(path: str) -> str:
    if is_remote(path):
        head, _ = path.rstrip("/").rsplit("/", 1)
        return head if "://" in head and head.split("://", 1)[1] else path
    return os.path.dirname(path)


def exists(path: str) -> bool:
    """A file, or a folder (for remote: any object under ``path/``)."""
    if not is_remote(path):
        return os.path.exists(normalize(path))
    return is_file(path) or is_dir(path)


def is_file(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(normalize(path))
    try:
        _store(path).head(path)
        return True
    except RemoteNotFoundError:
        return False


def is_dir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(normalize(path))
    return _store(path).is_dir(path)


def read_bytes(path: str) -> bytes:
    if not is_remote(path):
        with open(normalize(path), "rb") as f:
            return f.read()
    return _store(path).read_bytes(path)


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a file (one ranged GET for remote objects)."""
    if not is_remote(path):
        with open(normalize(path), "rb") as f:
            return os.pread(f.fileno(), end - start, start)
    return _store(path).read_range(path, start, end)


def stat(path: str) -> tuple[int, str]:
    """(size, etag); local files report ``mtime_ns`` as their etag."""
    if not is_remote(path):
        st = os.stat(normalize(path))
        return st.st_size, str(st.st_mtime_ns)
    return _store(path).head(path)


def write_bytes(path: str, data: bytes) -> None:
    """Write atomically: temporary file + rename, or temporary object + copy + delete."""
    if not is_remote(path):
        atomic_write_bytes(normalize(path), data)
        return
    _store(path).write_bytes(path, data)


def upload(local: str, path: str) -> None:
    """Copy the local file ``local`` to ``path`` atomically, streamed (never whole in memory)."""
    if not is_remote(path):
        with replacing(normalize(path)) as tmp:
            shutil.copyfile(local, tmp)
        return
    _store(path).upload(local, path)


def remove(path: str) -> None:
    """Delete a file or object; a missing one is not an error."""
    if not is_remote(path):
        remove_quietly(normalize(path))
        return
    _store(path).delete(path)


def walk(root: str) -> Iterator[str]:
    """All files under ``root`` (full paths), sorted."""
    if not is_remote(root):
        root = normalize(root)
        found = [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names]
        yield from sorted(found)
        return
    yield from sorted(_store(root).list_keys(root.rstrip("/") + "/"))


def glob(root: str, pattern: str) -> list[str]:
    """Files under ``root`` whose path relative to ``root`` matches ``pattern`` (fnmatch rules)."""
    prefix = root.rstrip("/") + "/" if is_remote(root) else normalize(root) + os.sep
    return [p for p in walk(root) if fnmatch.fnmatch(p[len(prefix) :], pattern)]


def download(path: str, target: str) -> int:
    """Copy ``path`` into the local file ``target`` (streamed for remote objects); returns its size."""
    if not is_remote(path):
        shutil.copyfile(normalize(path), target)
        return os.path.getsize(target)
    return _store(path).download(path, target)


def basename(path: str) -> str:
    """The last path component (``s3://b/a/ds`` -> ``ds``)."""
    if is_remote(path):
        return path.rstrip("/").rsplit("/", 1)[-1]
    return os.path.basename(normalize(path))


def local_copy(path: str) -> str:
    """A local file with the content of ``path`` (remote objects go through the cache)."""
    if not is_remote(path):
        return normalize(path)
    return remote_cache.local_copy(path, _store(path))
