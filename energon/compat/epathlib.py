"""``megatron.energon.epathlib``: ``EPath``, the reference's path class, over ``energon.epath``.

Local paths (made absolute), ``file://`` URLs, ``msc://profile/key`` and ``s3://bucket/key``. The
POSIX profile ``msc://__filesystem__/x`` is the local path ``/x``. Holding only the path string, an
``EPath`` pickles without credentials.
"""

from __future__ import annotations

import datetime
import glob as pyglob
import io
import os
import re
import stat as stat_module
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from energon import epath as _epath
from energon.compat.deprecation import warn_deprecated

__path__: list[str] = []  # a package for the alias: epathlib.epath maps here

__all__ = [
    "DEFAULT_PROFILE_NAME",
    "EPath",
    "NVDATASET_CACHE_DIR",
    "RESERVED_POSIX_PROFILE_NAME",
    "warn_deprecated",
]

DEFAULT_PROFILE_NAME = "__filesystem__"
RESERVED_POSIX_PROFILE_NAME = DEFAULT_PROFILE_NAME  # multi-storage-client's local-file profile
# Where the reference kept local copies of remote files; energon's remote cache is configured
# with ENERGON_CACHE_DIR (docs/remote.md). None unless set, as with the reference.
NVDATASET_CACHE_DIR = os.environ.get("NVDATASET_CACHE_DIR")


def _canonical(path: str) -> str:
    if path.startswith("rclone://"):
        warn_deprecated("rclone:// paths are deprecated; use msc://", stacklevel=3)
        path = "msc://" + path[len("rclone://") :]
    local_msc = f"msc://{DEFAULT_PROFILE_NAME}"
    if path == local_msc or path.startswith(local_msc + "/"):
        path = path[len(local_msc) :] or "/"
    return _epath.normalize(path)


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


class _UploadOnClose(io.BytesIO):
    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def close(self) -> None:
        if not self.closed:
            _epath.write_bytes(self.target, self.getvalue())
        super().close()


class EPath:
    """A path to a local file or an object in object storage, with a pathlib-like interface."""

    __slots__ = ("_path",)

    def __init__(self, initial_path: str | EPath | Path) -> None:
        if isinstance(initial_path, EPath):
            self._path = initial_path._path
        else:
            self._path = _canonical(os.fspath(initial_path))

    # -- identity ------------------------------------------------------------------------------
    def __str__(self) -> str:
        return self._path

    def __fspath__(self) -> str:
        return self._path

    def __repr__(self) -> str:
        return f"EPath({self._path!r})"

    def __hash__(self) -> int:
        return hash(self._path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EPath) and other._path == self._path

    def __lt__(self, other: EPath) -> bool:
        return self._path < other._path

    def __truediv__(self, other: str | EPath | Path) -> EPath:
        return EPath(_epath.join(self._path, str(other)))

    def __getstate__(self) -> str:
        return self._path

    def __setstate__(self, state: str) -> None:
        self._path = state

    def is_local(self) -> bool:
        return not _epath.is_remote(self._path)

    @property
    def profile(self) -> str:
        return DEFAULT_PROFILE_NAME if self.is_local() else _epath.split_remote(self._path)[0]

    @property
    def internal_path(self) -> str:
        return self._path if self.is_local() else "/" + _epath.split_remote(self._path)[1]

    @property
    def url(self) -> str:
        return self._path

    @property
    def display_name(self) -> str:
        return self._path

    def local_path(self) -> Path:
        if not self.is_local():
            raise ValueError(f"{self} is not a local path")
        return Path(self._path)

    @property
    def name(self) -> str:
        return _epath.basename(self._path)

    @property
    def parent(self) -> EPath:
        return EPath(_epath.dirname(self._path))

    def with_suffix(self, suffix: str) -> EPath:
        head, name = self._path.rsplit("/", 1) if "/" in self._path else ("", self._path)
        stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
        return EPath(f"{head}/{stem}{suffix}" if head else f"{stem}{suffix}")

    def relative_to(self, other: EPath | str) -> str:
        base = EPath(other)._path.rstrip("/")
        if not (self._path == base or self._path.startswith(base + "/")):
            raise ValueError(f"{self} is not below {base}")
        return self._path[len(base) :].lstrip("/")

    # -- queries -------------------------------------------------------------------------------
    def is_file(self) -> bool:
        return _epath.is_file(self._path)

    def is_dir(self) -> bool:
        return _epath.is_dir(self._path)

    def exists(self) -> bool:
        return _epath.exists(self._path)

    def size(self) -> int:
        return _epath.stat(self._path)[0]

    def stat(self) -> Any:
        """The file's (or folder's) metadata as multi-storage-client's ``ObjectMetadata``: key
        (without the leading ``/``; folders end with ``/``), size, last modification (UTC),
        type (``file`` / ``directory``) and, for objects, the etag."""
        from multistorageclient.types import ObjectMetadata

        if self.is_local():
            st = os.stat(self._path)  # FileNotFoundError for a missing path, as the reference
            is_dir = stat_module.S_ISDIR(st.st_mode)
            return ObjectMetadata(
                key=self._path.lstrip("/") + ("/" if is_dir else ""),
                content_length=0 if is_dir else st.st_size,
                last_modified=datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc),
                type="directory" if is_dir else "file",
            )
        size, etag = _epath.stat(self._path)
        return ObjectMetadata(
            key=_epath.split_remote(self._path)[1],
            content_length=size,
            last_modified=datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
            etag=etag,
        )

    @property
    def fs(self) -> Any:
        """The multi-storage-client ``StorageClient`` of this path's profile."""
        from energon.remote.msc import client

        return client(self.profile)

    def glob(self, pattern: str) -> Iterator[EPath]:
        """Paths below this folder matching ``pattern`` (``*`` stays within one folder level,
        ``**`` spans any number): files and, on local disks, folders (object stores have none).
        Local results come in directory order, as the reference gives them."""
        if self.is_local():
            for found in pyglob.glob(os.path.join(self._path, pattern), recursive=True):
                yield EPath(found)
            return
        regex = re.compile(_glob_regex(pattern))
        base = self._path.rstrip("/") + "/"
        for found in _epath.walk(self._path):
            if regex.fullmatch(found[len(base) :]):
                yield EPath(found)

    def walk(self) -> Iterator[EPath]:
        """Every file below this folder (no folders), sorted."""
        for found in _epath.walk(self._path):
            yield EPath(found)

    # -- content -------------------------------------------------------------------------------
    def open(
        self, mode: str = "r", block_size: int | None = None, prefetch_file: bool = False
    ) -> IO:
        if mode not in ("r", "rb", "w", "wb"):
            raise ValueError(f"EPath.open: mode {mode!r} is not supported (r, rb, w, wb)")
        if self.is_local():
            if "w" in mode:
                os.makedirs(os.path.dirname(self._path), exist_ok=True)
            return open(self._path, mode)  # noqa: SIM115 - the caller closes it
        if mode == "rb":
            return io.BytesIO(_epath.read_bytes(self._path))
        if mode == "r":
            return io.StringIO(_epath.read_text(self._path))
        buffer = _UploadOnClose(self._path)
        return buffer if mode == "wb" else io.TextIOWrapper(buffer, encoding="utf-8")

    def read_bytes(self) -> bytes:
        return _epath.read_bytes(self._path)

    def read_text(self) -> str:
        return _epath.read_text(self._path)

    def write_bytes(self, data: bytes) -> None:
        if self.is_local():
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
        _epath.write_bytes(self._path, data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def mkdir(self, exist_ok: bool = True, parents: bool = False) -> None:
        """Local folders are created, with their parents; object stores have no folders."""
        if self.is_local():
            os.makedirs(self._path, exist_ok=exist_ok)

    def copy(self, target: EPath | str) -> None:
        target = EPath(target)
        if self.is_dir():
            for found in self.walk():
                (target / found.relative_to(self)).write_bytes(found.read_bytes())
            return
        target.write_bytes(self.read_bytes())

    def unlink(self) -> None:
        if self.is_local():
            os.unlink(self._path)
            return
        _epath._store(self._path).delete(self._path)  # noqa: SLF001

    def move(self, target: EPath | str) -> None:
        self.copy(target)
        self.unlink()
