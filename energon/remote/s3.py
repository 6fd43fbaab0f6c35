"""S3 operations with retries, resumable ranged reads and counters (a
:class:`~energon.remote.store.RemoteStore`).

The boto3 client is created lazily, once per process (keyed by pid, so a forked worker makes its
own) and configured the usual way: ``AWS_*`` environment variables, ``AWS_ENDPOINT_URL``, profiles.
Botocore's own retries are disabled so that every retry goes through :mod:`energon.remote.retry`
and is counted. Nothing here is pickled, and no credential ever appears in a message.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

from energon.remote import s3_fast_get
from energon.remote.forksafe import ForkSafeLock
from energon.remote.retry import RemoteError, with_retries
from energon.remote.stats import STATS
from energon.remote.store import split_url

_CHUNK = 1 << 20
_client_lock = ForkSafeLock()
_client: tuple[int, object] | None = None


def client():
    """The process's S3 client (timeouts from ``ENERGON_S3_CONNECT_TIMEOUT``/``_READ_TIMEOUT``)."""
    global _client
    with _client_lock:
        if _client is None or _client[0] != os.getpid():
            import boto3
            from botocore.config import Config

            config = Config(
                connect_timeout=float(os.environ.get("ENERGON_S3_CONNECT_TIMEOUT", "10")),
                read_timeout=float(os.environ.get("ENERGON_S3_READ_TIMEOUT", "30")),
                retries={"total_max_attempts": 1, "mode": "standard"},  # no hidden retry
                max_pool_connections=32,
            )
            _client = (os.getpid(), boto3.session.Session().client("s3", config=config))
        return _client[1]


def reset_client() -> None:
    """Forget the cached client (after changing endpoint or credentials, e.g. in tests)."""
    global _client
    with _client_lock:
        _client = None
    s3_fast_get.reset()


def head(url: str) -> tuple[int, str]:
    """(size, etag) of an object; raises :class:`RemoteNotFoundError` if it does not exist."""
    bucket, key = split_url(url)

    def call() -> tuple[int, str]:
        STATS.add(requests=1)
        r = client().head_object(Bucket=bucket, Key=key)
        return int(r["ContentLength"]), str(r.get("ETag", "")).strip('"')

    return with_retries(url, call)


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)``; a broken transfer resumes from the last byte received."""
    if end <= start:
        return b""
    bucket, key = split_url(url)
    buf = bytearray()

    def call() -> None:
        STATS.add(requests=1)
        pos = start + len(buf)
        if s3_fast_get.enabled():
            try:
                s3_fast_get.read_into(client(), bucket, key, url, pos, end, buf)
            except s3_fast_get.UseBotocore:
                s3_fast_get.forget(url)  # and let botocore do this read (precise errors)
            else:
                if len(buf) != end - start:
                    raise ConnectionError(f"short body: {len(buf)} of {end - start} bytes")
                return
        r = client().get_object(Bucket=bucket, Key=key, Range=f"bytes={pos}-{end - 1}")
        body = r["Body"]
        try:
            while len(buf) < end - start:
                chunk = body.read(min(_CHUNK, end - start - len(buf)))
                if not chunk:
                    break
                buf.extend(chunk)
                STATS.add(bytes_read=len(chunk))
        finally:
            body.close()
        if len(buf) != end - start:
            raise ConnectionError(f"short body: {len(buf)} of {end - start} bytes")

    with_retries(f"{url} bytes [{start}, {end})", call)
    return bytes(buf)


def download(url: str, target: str) -> int:
    """Stream the whole object into the local file ``target`` (resuming after a broken transfer).

    Memory use stays at one chunk however large the object is; returns the number of bytes.
    """
    size, _ = head(url)
    bucket, key = split_url(url)
    with open(target, "wb") as f:
        if size == 0:
            return 0

        def call() -> None:
            STATS.add(requests=1)
            pos = f.tell()
            r = client().get_object(Bucket=bucket, Key=key, Range=f"bytes={pos}-{size - 1}")
            body = r["Body"]
            try:
                while f.tell() < size:
                    chunk = body.read(min(_CHUNK, size - f.tell()))
                    if not chunk:
                        break
                    f.write(chunk)
                    STATS.add(bytes_read=len(chunk))
            finally:
                body.close()
            if f.tell() != size:
                raise ConnectionError(f"short body: {f.tell()} of {size} bytes")

        with_retries(url, call)
    return size


def read_bytes(url: str) -> bytes:
    """The whole object (HEAD for the size, then one resumable ranged read)."""
    size, _ = head(url)
    return read_range(url, 0, size)


def write_bytes(url: str, data: bytes) -> None:
    """Upload ``data`` under a temporary key, then copy it over ``url`` and delete the temporary.

    A reader sees either the old object or the complete new one, never a partial upload, and an
    interrupted upload leaves at most a stray ``.tmp`` object.
    """
    bucket, key = split_url(url)
    tmp_key = f"{key}.{uuid.uuid4().hex[:12]}.tmp"

    def put() -> None:
        STATS.add(requests=1)
        client().put_object(Bucket=bucket, Key=tmp_key, Body=data)

    def copy() -> None:
        STATS.add(requests=1)
        client().copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": tmp_key})

    with_retries(url, put)
    STATS.add(bytes_written=len(data))
    try:
        with_retries(url, copy)
    finally:
        delete(f"s3://{bucket}/{tmp_key}")


def upload(local: str, url: str) -> None:
    """Upload the local file ``local`` to ``url`` like :func:`write_bytes`, but streamed from disk
    in parts (multipart upload and copy above 8 MiB), so files of any size (a large
    ``index.sqlite``, beyond the 5 GB single-request limit) never sit in memory whole."""
    bucket, key = split_url(url)
    tmp_key = f"{key}.{uuid.uuid4().hex[:12]}.tmp"
    size = os.path.getsize(local)

    def put() -> None:
        STATS.add(requests=1)
        client().upload_file(local, bucket, tmp_key)

    def copy() -> None:
        STATS.add(requests=1)
        client().copy({"Bucket": bucket, "Key": tmp_key}, bucket, key)

    with_retries(url, put)
    STATS.add(bytes_written=size)
    try:
        with_retries(url, copy)
    finally:
        delete(f"s3://{bucket}/{tmp_key}")


def delete(url: str) -> None:
    bucket, key = split_url(url)

    def call() -> None:
        STATS.add(requests=1)
        client().delete_object(Bucket=bucket, Key=key)

    with_retries(url, call)


def list_keys(url_prefix: str) -> Iterator[str]:
    """URLs of all objects whose key starts with the prefix of ``url_prefix``."""
    bucket, prefix = split_url(url_prefix)
    token: str | None = None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kwargs["ContinuationToken"] = token

        def call(kwargs=kwargs):
            STATS.add(requests=1)
            return client().list_objects_v2(**kwargs)

        page = with_retries(url_prefix, call)
        for item in page.get("Contents", []):
            yield f"s3://{bucket}/{item['Key']}"
        if not page.get("IsTruncated"):
            return
        token = page.get("NextContinuationToken")


def is_dir(url: str) -> bool:
    """True if some object lives under ``url/`` (object stores have no real folders)."""
    prefix = url.rstrip("/") + "/"
    return next(iter(list_keys(prefix)), None) is not None


__all__ = [
    "RemoteError",
    "client",
    "delete",
    "download",
    "head",
    "is_dir",
    "list_keys",
    "read_bytes",
    "read_range",
    "reset_client",
    "split_url",
    "upload",
    "write_bytes",
]
