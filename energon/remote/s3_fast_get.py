"""Ranged GETs of S3 objects through a presigned URL and a plain connection pool.

Why: a botocore ``get_object`` call spends about 2-3 ms of CPU before and after the transfer (request
building, signing, event hooks, user-agent strings, response parsing). A loader of small samples
makes hundreds of ranged reads per second per process, so that CPU is taken from decoding. A
presigned URL is signed once per object (the ``Range`` header is not part of the signature) and
then every ranged read is a bare HTTP request: about a third of the CPU.

The fast path only ever serves successful answers. Anything it cannot handle as botocore would (a
redirect, an error status other than 5xx/429, a proxy configured in the environment) falls back to
botocore for that read, so errors keep their precise messages. Messages never contain the presigned
URL (it carries the access key id and a signature). ``ENERGON_S3_FAST_GET=0`` turns it off.
"""

from __future__ import annotations

import os
import time

from energon.errors import ThrottledError, UseBotocore
from energon.remote.forksafe import ForkSafeLock
from energon.remote.stats import STATS

_SIGN_FOR_S = 900  # validity of a presigned URL
_REUSE_FOR_S = 600  # re-sign well before it expires (and after rotated credentials settle)
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")

_lock = ForkSafeLock()
_pools: dict[int, object] = {}  # pid -> urllib3.PoolManager
_signed: dict[tuple[int, str], tuple[float, str]] = {}  # (pid, url) -> (reuse until, signed URL)


def enabled() -> bool:
    if os.environ.get("ENERGON_S3_FAST_GET", "1") == "0":
        return False
    return not any(os.environ.get(name) for name in _PROXY_VARIABLES)


def read_into(
    client, bucket: str, key: str, url: str, start: int, end: int, buf: bytearray
) -> None:
    """Append bytes ``[start, end)`` of the object to ``buf`` with one ranged GET (raises on a
    broken transfer, after keeping what arrived, so that the caller can resume)."""
    import urllib3

    signed = _signed_url(client, bucket, key, url)
    try:
        response = _pool().request(
            "GET",
            signed,
            headers={"Range": f"bytes={start}-{end - 1}"},
            preload_content=False,
            retries=False,
            redirect=False,
            timeout=urllib3.Timeout(
                connect=float(os.environ.get("ENERGON_S3_CONNECT_TIMEOUT", "10")),
                read=float(os.environ.get("ENERGON_S3_READ_TIMEOUT", "30")),
            ),
        )
    except urllib3.exceptions.HTTPError as e:
        raise ConnectionError(f"{type(e).__name__} while reading {url}") from None
    try:
        if response.status in (429, 503):
            raise ThrottledError(f"HTTP {response.status} (slow down) reading {url}")
        if response.status >= 500:
            raise ConnectionError(f"HTTP {response.status} reading {url}")
        if response.status != 206:
            raise UseBotocore()
        wanted = end - start
        have = len(buf)
        while len(buf) - have < wanted:
            chunk = response.read(min(1 << 20, wanted - (len(buf) - have)))
            if not chunk:
                break
            buf.extend(chunk)
            STATS.add(bytes_read=len(chunk))
    except urllib3.exceptions.HTTPError as e:
        raise ConnectionError(f"{type(e).__name__} while reading {url}") from None
    finally:
        response.release_conn()


def forget(url: str) -> None:
    """Drop the presigned URL of ``url`` (e.g. after an answer the fast path could not use)."""
    with _lock:
        _signed.pop((os.getpid(), url), None)


def reset() -> None:
    """Forget presigned URLs and connections (the endpoint or credentials changed)."""
    with _lock:
        _signed.clear()
        _pools.clear()


def _signed_url(client, bucket: str, key: str, url: str) -> str:
    now = time.monotonic()
    cache_key = (os.getpid(), url)
    hit = _signed.get(cache_key)
    if hit is not None and now < hit[0]:
        return hit[1]
    signed = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_SIGN_FOR_S
    )
    with _lock:
        _signed[cache_key] = (now + _REUSE_FOR_S, signed)
    return signed


def _pool():
    pid = os.getpid()
    pool = _pools.get(pid)
    if pool is None:
        import urllib3
        from botocore.httpsession import get_cert_path

        ca_bundle = os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
        with _lock:
            pool = _pools.setdefault(
                pid, urllib3.PoolManager(maxsize=32, cert_reqs="CERT_REQUIRED", ca_certs=ca_bundle)
            )
    return pool
