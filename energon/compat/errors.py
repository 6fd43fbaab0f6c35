"""``megatron.energon.errors``: energon's error types plus the reference's ``ErrorContext`` and
``handle_restore_errors`` helpers (both over :class:`energon.errors.ErrorPolicy`)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

from energon.errors import (
    SYSTEM_EXCEPTIONS,
    EmptyDatasetError,
    EnergonError,
    ErrorPolicy,
    FatalSampleError,
    SampleException,
    SkipSample,
    StateError,
    log_exception,
    reraise_exception,
)
from energon.sample_text import format_sample_compact, format_sample_detailed
from energon.samples.source_info import SourceInfo, get_source_info

__all__ = [
    "SYSTEM_EXCEPTIONS",
    "EmptyDatasetError",
    "EnergonError",
    "ErrorContext",
    "FatalSampleError",
    "SampleException",
    "SkipSample",
    "SourceInfo",
    "StateError",
    "format_sample_compact",
    "format_sample_detailed",
    "get_source_info",
    "handle_restore_errors",
    "log_exception",
    "reraise_exception",
]


class ErrorContext:
    """``with ctx.handle_errors(sample):`` around user code: ``SkipSample`` drops the sample
    silently, system errors are fatal, others go to ``handler`` and count towards ``tolerance``
    consecutive failures (then ``FatalSampleError``)."""

    def __init__(self, name: str, handler: Callable[..., None], tolerance: int = 100) -> None:
        self.name = name
        self._policy = ErrorPolicy(name, handler, tolerance)

    @contextmanager
    def handle_errors(self, sample: Any) -> Generator[None, None, None]:
        try:
            yield
        except SkipSample:
            return
        except GeneratorExit:
            raise
        except BaseException as e:  # noqa: BLE001 - the policy decides
            if not isinstance(e, Exception) and not isinstance(e, SYSTEM_EXCEPTIONS):
                raise
            self._policy.failed(e, sample)
        else:
            self._policy.succeeded()

    def reset(self) -> None:
        self._policy.consecutive = 0


@contextmanager
def handle_restore_errors(
    error_handler: Callable[..., None], sample: Any
) -> Generator[None, None, None]:
    """Errors while regenerating a sample from its restore key: a skip is unexpected there."""
    try:
        yield
    except (SkipSample, GeneratorExit) as e:
        skip = ValueError(f"Unexpected skip sample {sample!r} during restoration: {e!r}")
        error_handler(skip, sample, None)
    except SYSTEM_EXCEPTIONS as e:
        if isinstance(e, FatalSampleError):
            raise
        raise FatalSampleError(f"restoring {sample!r}: {type(e).__name__}: {e}") from e
    except Exception as e:
        error_handler(e, sample, None)  # (exception, sample, sources) as every handler
