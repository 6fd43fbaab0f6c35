"""Local copies of small remote files (tar indices, sqlite) that are read with random access.

A copy lives under ``ENERGON_CACHE_DIR`` (default ``~/.cache/energon``) as ``<sha256(url)>.bin``
next to a ``.json`` note of the remote size and etag it was made from; it is used again only while
HEAD still reports the same size and etag, so a re-prepared dataset is fetched anew. Copies are
written to a temporary file and renamed, so concurrent workers never see half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from energon.remote.forksafe import ForkSafeLock
from energon.remote.store import RemoteStore


def cache_dir() -> Path:
    """``ENERGON_CACHE_DIR``, else ``~/.cache/energon``, else a folder in the temp dir."""
    configured = os.environ.get("ENERGON_CACHE_DIR")
    if configured:
        return Path(configured)
    home = Path(os.path.expanduser("~"))
    if home.is_dir() and os.access(home, os.W_OK):
        return home / ".cache" / "energon"
    return Path(tempfile.gettempdir()) / "energon-cache"


_validated: dict[tuple[int, str], str] = {}  # (pid, url) -> local copy checked in this process
_fetching = ForkSafeLock()  # one fetch at a time: a prefetch thread and the reader that asks for
# the same index at the same moment would each fetch it (index files are small)


def local_copy(url: str, store: RemoteStore) -> str:
    """A local file with the current content of the remote object ``url`` (read through ``store``);
    checked against the remote size and ETag once per process (index files do not change under a
    running job)."""
    known = _validated.get((os.getpid(), url))
    if known is not None and os.path.exists(known):
        return known
    with _fetching:
        known = _validated.get((os.getpid(), url))
        if known is not None and os.path.exists(known):
            return known
        path = _fresh_local_copy(url, store)
        _validated[(os.getpid(), url)] = path
    return path


def _fresh_local_copy(url: str, store: RemoteStore) -> str:
    size, etag = store.head(url)
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stem = hashlib.sha256(url.encode()).hexdigest()
    data_path, note_path = folder / f"{stem}.bin", folder / f"{stem}.json"
    wanted = {"url": url, "size": size, "etag": etag}
    if _is_current(data_path, note_path, wanted):
        return str(data_path)
    _atomic_write(data_path, store.read_range(url, 0, size))
    _atomic_write(note_path, json.dumps(wanted).encode())
    return str(data_path)


def _is_current(data_path: Path, note_path: Path, wanted: dict) -> bool:
    try:
        note = json.loads(note_path.read_text())
        return note == wanted and data_path.stat().st_size == wanted["size"]
    except (OSError, ValueError):
        return False


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
