"""Retry policy for object-store requests: exponential backoff with full jitter.

Transient failures (connection resets, timeouts, HTTP 5xx, throttling) are retried; anything else
is permanent and raised at once, so a missing object or a denied request fails fast. Every attempt
holds a place of the process's adaptive concurrency limit (:mod:`energon.remote.concurrency`), which
shrinks when the store throttles.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

from energon.errors import RemoteError, RemoteNotFoundError
from energon.remote.concurrency import process_limit
from energon.remote.stats import STATS

T = TypeVar("T")

_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
}


def max_attempts() -> int:
    """``ENERGON_REMOTE_MAX_ATTEMPTS`` (default 10): tries per request, first one included."""
    return max(1, int(os.environ.get("ENERGON_REMOTE_MAX_ATTEMPTS", "10")))


def _backoff(attempt: int) -> float:
    """Full-jitter backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    base = float(os.environ.get("ENERGON_REMOTE_BACKOFF_BASE", "0.1"))
    cap = float(os.environ.get("ENERGON_REMOTE_BACKOFF_MAX", "10"))
    return random.uniform(0, min(cap, base * (2**attempt)))


def is_transient(exc: BaseException) -> bool:
    """True for failures that another try may not hit (network, timeouts, 5xx, throttling)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return err.get("Code") in _TRANSIENT_CODES or int(status or 0) >= 500
    if isinstance(exc, RemoteError):
        return False
    import http.client

    import urllib3.exceptions

    transient = (BotoCoreError, OSError, http.client.HTTPException, urllib3.exceptions.HTTPError)
    return isinstance(exc, transient)


_THROTTLING_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
}


def is_throttling(exc: BaseException) -> bool:
    """True when the store asks us to slow down (``SlowDown``, HTTP 503 or 429), anywhere in the
    exception's chain; errors raised by our own store modules say so with ``throttled = True``."""
    try:
        from botocore.exceptions import ClientError
    except ImportError:  # an msc-only install
        ClientError = ()  # noqa: N806

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if getattr(e, "throttled", False):
            return True
        if ClientError and isinstance(e, ClientError):
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if status in (429, 503) or e.response.get("Error", {}).get("Code") in _THROTTLING_CODES:
                return True
        todo += [e.__cause__, e.__context__]
    return False


def describe(exc: BaseException) -> str:
    """A short, credential-free description of a failure."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{err.get('Code', 'error')} (HTTP {status}): {err.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}"


def is_not_found(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return False
    code = exc.response.get("Error", {}).get("Code")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket") or status == 404


def with_retries(what: str, call: Callable[[], T]) -> T:
    """Run ``call`` with retries on transient failures; ``what`` names the object in errors."""
    attempts = max_attempts()
    limit = process_limit()
    for attempt in range(attempts):
        try:
            with limit.slot():
                result = call()
            limit.succeeded()
            return result
        except Exception as e:
            if is_throttling(e):
                limit.throttled()
            if is_not_found(e):
                raise RemoteNotFoundError(f"{what}: object not found ({describe(e)})") from None
            if not is_transient(e):
                raise RemoteError(f"{what}: {describe(e)}") from None
            if attempt + 1 >= attempts:
                raise RemoteError(
                    f"{what}: giving up after {attempts} attempts: {describe(e)}"
                ) from e
            STATS.add_retry(what.partition(" bytes [")[0])  # the object, without the range
            time.sleep(_backoff(attempt))
    raise AssertionError("unreachable")
