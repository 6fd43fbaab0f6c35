"""``msc://profile/path`` objects through multi-storage-client, with the semantics of :mod:`.s3`.

A profile names a storage backend in the multi-storage-client configuration (the file named by
``MSC_CONFIG``, else msc's usual search paths): an S3-compatible bucket, a POSIX folder, GCS, Azure,
... The functions here mirror :mod:`energon.remote.s3` (``head``, ``read_range``, ``download``,
``write_bytes``, ``list_keys``, ...): both modules implement
:class:`energon.remote.store.RemoteStore`, so :mod:`energon.epath` treats both schemes alike.

Retries: every request goes through :func:`energon.remote.retry.with_retries` and is counted in
:data:`energon.remote.stats.STATS`. msc's own retry loop is switched off (the profile's ``retry``
section is ignored) and, for S3-type profiles, botocore's too (``total_max_attempts: 1``), so
that no retry happens out of sight of the counters. ``requests`` counts calls into the storage
client (one per read part, write, copy, delete, metadata lookup or listing); msc may
issue more than one HTTP request for some of them (a listing fetches all its pages, a ``delete``
asks for the object's metadata first).

Clients are created lazily, one per (profile, process id), so forked or spawned workers make their
own. Nothing here is pickled. Credentials come from the msc configuration (or the environment it
references) and are scrubbed from every message this module produces.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from energon.errors import EnergonError, TransientRemoteError
from energon.remote.forksafe import ForkSafeLock
from energon.remote.retry import RemoteError, RemoteNotFoundError, is_throttling, with_retries
from energon.remote.stats import STATS
from energon.remote.store import split_url

T = TypeVar("T")

INSTALL_HINT = (
    "msc:// paths need the multi-storage-client package: pip install 'energon-loader[msc]'"
)

# One ranged read per part: a transfer that breaks resumes at the last complete part.
_PART = 8 << 20

# Provider types built on botocore, whose own retries we switch off.
_BOTOCORE_TYPES = {"s3", "s8k", "gcs_s3", "ais_s3"}

# Config keys whose string values are credentials (scrubbed from messages).
_SECRET_KEY_RE = re.compile(
    r"secret|password|passwd|token|credential|private|access_key|account_key|sas|signature",
    re.IGNORECASE,
)
_ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_USERINFO_RE = re.compile(r"(://)[^/\s@]+@")
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

_lock = ForkSafeLock()
_clients: dict[tuple[str, int], Any] = {}
_secrets: set[str] = set()


def _import_msc():
    try:
        import multistorageclient
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return multistorageclient


# ---------------------------------------------------------------------------------------------
# Credentials never leave this module


def _collect_secrets(config: Any, under_secret_key: bool = False) -> None:
    """Remember credential values of an msc config dict (and of environment variables it names)."""
    if isinstance(config, dict):
        for key, value in config.items():
            _collect_secrets(value, under_secret_key or bool(_SECRET_KEY_RE.search(str(key))))
    elif isinstance(config, list):
        for value in config:
            _collect_secrets(value, under_secret_key)
    elif isinstance(config, str) and under_secret_key:
        refs = [a or b for a, b in _ENV_REF_RE.findall(config)]
        for name in refs:
            value = os.environ.get(name)
            if value and len(value) >= 4:
                _secrets.add(value)
        if not refs and len(config) >= 4:
            _secrets.add(config)


def _collect_config_file_secrets() -> None:
    """Best effort: credentials in the ``MSC_CONFIG`` file even if msc cannot parse it."""
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            _secrets.add(value)
    path = os.environ.get("MSC_CONFIG")
    if not path or not os.path.isfile(path):
        return
    try:
        import yaml

        with open(path, encoding="utf-8") as f:
            _collect_secrets(yaml.safe_load(f))  # YAML also reads JSON
    except Exception:
        pass


def redact(text: str) -> str:
    """``text`` with every known credential, and the user info of URLs, replaced by ``***``."""
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _USERINFO_RE.sub(r"\1***@", text)


def _brief(exc: BaseException) -> str:
    """Type and first line of an exception, credential-free and short."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > 300:
        text = text[:300] + "..."
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


# ---------------------------------------------------------------------------------------------
# Clients


def _tune_profile(profile: dict[str, Any]) -> None:
    """Retries go through :func:`with_retries` only; timeouts default to the ``s3`` module's."""
    profile.pop("retry", None)
    provider = profile.get("storage_provider") or {}
    if provider.get("type") in _BOTOCORE_TYPES:
        options = provider.setdefault("options", {})
        options["retries"] = {"total_max_attempts": 1, "mode": "standard"}
        options.setdefault(
            "connect_timeout", float(os.environ.get("ENERGON_S3_CONNECT_TIMEOUT", "10"))
        )
        options.setdefault("read_timeout", float(os.environ.get("ENERGON_S3_READ_TIMEOUT", "30")))


class _DropRetryNoise(logging.Filter):
    """msc logs every failed attempt as "Non-retryable" since its own retries are off; we retry
    (and report failures in the exceptions we raise), so those records would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Non-retryable error occurred")


_NOISE_FILTER = _DropRetryNoise()


def _build_client(profile: str):
    _import_msc()
    from multistorageclient import StorageClient, StorageClientConfig

    retry_logger = logging.getLogger("multistorageclient.retry")
    if _NOISE_FILTER not in retry_logger.filters:
        retry_logger.addFilter(_NOISE_FILTER)
    _collect_config_file_secrets()
    try:
        config_dict, _ = StorageClientConfig.read_msc_config()
        _collect_secrets(config_dict)
        if profile in ((config_dict or {}).get("profiles") or {}):
            config_dict = copy.deepcopy(config_dict)
            _tune_profile(config_dict["profiles"][profile])
            config = StorageClientConfig.from_dict(config_dict, profile=profile)
        else:
            # rclone profiles, implicit profiles (``_s3-bucket``), or a clear "not found" error
            config = StorageClientConfig.from_file(profile=profile)
        config.retry_config = None  # our retries, counted
        return StorageClient(config)
    except ImportError as e:
        raise ImportError(f"msc://{profile}: {_brief(e)}") from None
    except Exception as e:
        where = os.environ.get("MSC_CONFIG") or "msc's default config paths"
        raise RemoteError(
            f"msc://{profile}: cannot set up a storage client for this profile from the "
            f"multi-storage-client config ({where}): {_brief(e)}"
        ) from None


def client(profile: str):
    """The process's :class:`multistorageclient.StorageClient` for ``profile``."""
    key = (profile, os.getpid())
    with _lock:
        found = _clients.get(key)
        if found is None:
            for stale in [k for k in _clients if k[1] != key[1]]:
                del _clients[stale]  # inherited through fork
            found = _clients[key] = _build_client(profile)
        return found


def reset_client() -> None:
    """Forget the cached clients (after changing ``MSC_CONFIG`` or credentials, e.g. in tests)."""
    with _lock:
        _clients.clear()


# ---------------------------------------------------------------------------------------------
# Failures: missing / permanent / transient


class _ShortRead(EnergonError):
    def __init__(self, got: int, wanted: int) -> None:
        super().__init__(f"short body: {got} of {wanted} bytes")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen or len(seen) > 16:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def classify(exc: BaseException) -> str:
    """``"missing"``, ``"transient"`` or ``"permanent"`` for an exception raised by msc."""
    import http.client

    try:
        from multistorageclient.types import RetryableError
    except ImportError:  # pragma: no cover - msc is installed when we get here
        RetryableError = ()  # noqa: N806
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # POSIX-only installs
        BotoCoreError = ClientError = ()  # noqa: N806
    try:
        from urllib3.exceptions import HTTPError as Urllib3Error
    except ImportError:
        Urllib3Error = ()  # noqa: N806

    for e in _chain(exc):
        if isinstance(e, RemoteError):
            return "missing" if isinstance(e, RemoteNotFoundError) else "permanent"
        if isinstance(e, (FileNotFoundError, NotADirectoryError)):
            return "missing"
        if isinstance(e, (PermissionError, IsADirectoryError)):
            return "permanent"
        if isinstance(e, RetryableError):
            return "transient"
        if ClientError and isinstance(e, ClientError):
            meta = e.response.get("ResponseMetadata", {})
            status = int(meta.get("HTTPStatusCode") or 0)
            code = str(e.response.get("Error", {}).get("Code", ""))
            if status == 404 or code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                return "missing"
            if status >= 500 or status in (408, 429) or code in ("SlowDown", "RequestTimeout"):
                return "transient"
            return "permanent"
        if isinstance(e, (BotoCoreError, http.client.HTTPException, Urllib3Error)):
            return "transient"
        if isinstance(e, (ConnectionError, TimeoutError)):
            return "transient"
        if isinstance(e, OSError) and not isinstance(e, FileExistsError):
            return "transient"  # EIO, ESTALE on network file systems, socket errors
    return "permanent"


_FAILED = object()


def _call(what: str, fn: Callable[[], T]) -> T:
    """Run one storage-client call with our retries; ``what`` names the object in errors."""
    failure: list[BaseException] = []

    def attempt():
        STATS.add(requests=1)
        try:
            return fn()
        except _ShortRead as e:
            raise TransientRemoteError(str(e)) from None
        except Exception as e:
            kind = classify(e)
            if kind == "transient":
                error = TransientRemoteError(_brief(e))
                error.throttled = is_throttling(e)  # SlowDown / 503 / 429: lower the concurrency
                raise error from None
            if kind == "missing":
                failure.append(RemoteNotFoundError(f"{what}: object not found ({_brief(e)})"))
            else:
                failure.append(RemoteError(f"{what}: {_brief(e)}"))
            return _FAILED

    result = with_retries(what, attempt)
    if result is _FAILED:
        raise failure[0]
    return result


# ---------------------------------------------------------------------------------------------
# Operations (same functions and semantics as energon.remote.s3)


def head(url: str) -> tuple[int, str]:
    """(size, etag) of an object; raises :class:`RemoteNotFoundError` if it does not exist.

    Backends without ETags (POSIX profiles) report the modification time instead.
    """
    profile, path = split_url(url)
    c = client(profile)
    meta = _call(url, lambda: c.info(path))
    if meta.type != "file":
        raise RemoteNotFoundError(f"{url}: object not found (it is a folder)")
    etag = meta.etag or f"mtime:{meta.last_modified.timestamp():.9f}"
    return int(meta.content_length), str(etag).strip('"')


def _read_into(url: str, start: int, end: int, sink: Callable[[bytes], None]) -> None:
    """Read ``[start, end)`` in parts of at most ``_PART`` bytes, each retried on its own."""
    profile, path = split_url(url)
    c = client(profile)  # first: a missing msc package gets the install hint
    from multistorageclient.types import Range

    posix = c.get_posix_path(path) is not None
    pos = start
    while pos < end:
        size = min(_PART, end - pos)

        def fetch(pos=pos, size=size) -> bytes:
            data = c.read(path, byte_range=Range(offset=pos, size=size))
            if len(data) != size:
                if posix:  # a local file does not heal: it is shorter than the index says
                    raise RemoteError(
                        f"short read at byte offset {pos}: wanted {size} bytes, got {len(data)} "
                        "(the file is truncated or changed since it was prepared)"
                    )
                raise _ShortRead(len(data), size)
            return data

        data = _call(f"{url} bytes [{pos}, {pos + size})", fetch)
        STATS.add(bytes_read=len(data))
        sink(data)
        pos += size


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)``; a broken transfer resumes at the last complete 8 MiB part."""
    if end <= start:
        return b""
    buf = bytearray()
    _read_into(url, start, end, buf.extend)
    return bytes(buf)


def read_bytes(url: str) -> bytes:
    """The whole object (metadata for the size, then resumable ranged reads)."""
    size, _ = head(url)
    return read_range(url, 0, size)


def download(url: str, target: str) -> int:
    """Stream the whole object into the local file ``target``; returns the number of bytes.

    Memory use stays at one part (8 MiB) however large the object is.
    """
    size, _ = head(url)
    with open(target, "wb") as f:
        _read_into(url, 0, size, f.write)
    return size


def write_bytes(url: str, data: bytes) -> None:
    """Write ``data`` under a temporary name, copy it over ``url``, delete the temporary.

    A reader sees either the old object or the complete new one, and an interrupted upload leaves
    at most a stray ``.tmp`` object.
    """
    profile, path = split_url(url)
    c = client(profile)
    tmp_path = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
    _call(url, lambda: c.write(tmp_path, data))
    STATS.add(bytes_written=len(data))
    try:
        _call(url, lambda: c.copy(tmp_path, path))
    finally:
        delete(f"msc://{profile}/{tmp_path}")


def upload(local: str, url: str) -> None:
    """Upload the local file ``local`` to ``url`` like :func:`write_bytes`, streamed from disk by
    the storage client (multipart where the backend has it)."""
    profile, path = split_url(url)
    c = client(profile)
    tmp_path = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
    _call(url, lambda: c.upload_file(tmp_path, local))
    STATS.add(bytes_written=os.path.getsize(local))
    try:
        _call(url, lambda: c.copy(tmp_path, path))
    finally:
        delete(f"msc://{profile}/{tmp_path}")


def delete(url: str) -> None:
    """Delete an object; a missing object is not an error (like S3's DELETE)."""
    profile, path = split_url(url)
    c = client(profile)
    try:
        _call(url, lambda: c.delete(path))
    except RemoteNotFoundError:
        pass


def list_keys(url_prefix: str) -> Iterator[str]:
    """URLs (``msc://profile/...``) of all objects whose path starts with that of ``url_prefix``."""
    profile, prefix = split_url(url_prefix)
    c = client(profile)
    # msc lists folders, not key prefixes: list the prefix's folder and filter
    folder = prefix[: prefix.rfind("/") + 1]

    def fetch() -> list[str]:
        return [m.key for m in c.list(path=folder) if getattr(m, "type", "file") == "file"]

    try:
        keys = _call(url_prefix, fetch)
    except RemoteNotFoundError:
        return  # no such folder: nothing under the prefix
    for key in keys:
        key = key.lstrip("/")
        if key.startswith(prefix):
            yield f"msc://{profile}/{key}"


def is_dir(url: str) -> bool:
    """True if some object lives under ``url/``."""
    profile, path = split_url(url)
    c = client(profile)
    prefix = path.rstrip("/") + "/" if path.strip("/") else ""

    def fetch() -> bool:
        for m in c.list(path=prefix):
            if getattr(m, "type", "file") == "file" and m.key.lstrip("/").startswith(prefix):
                return True
        return False

    try:
        return _call(url, fetch)
    except RemoteNotFoundError:
        return False


__all__ = [
    "INSTALL_HINT",
    "RemoteError",
    "TransientRemoteError",
    "classify",
    "client",
    "delete",
    "download",
    "head",
    "is_dir",
    "list_keys",
    "read_bytes",
    "read_range",
    "redact",
    "reset_client",
    "split_url",
    "write_bytes",
]
