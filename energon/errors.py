"""Errors and the per-sample error policy.

A bad sample must never be lost silently: it is either raised, or skipped *and counted*, and a run of
consecutive failures beyond the tolerance stops the job with the last error attached.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any


class EnergonError(Exception):
    """Base class of energon's own errors."""


class EmptyDatasetError(EnergonError):
    """A split, subset or stream holds no samples."""


class SampleException(EnergonError, ValueError):
    """A single sample could not be read, decoded or encoded."""

    @classmethod
    def from_sample_key(cls, key: str, message: str = "") -> SampleException:
        return cls(f"Sample {key!r}: {message}")


class FatalSampleError(SampleException):
    """Never skipped: stops the loader (too many consecutive failures, or a programming error)."""

    @classmethod
    def from_sample(cls, sample: Any, message: str) -> FatalSampleError:
        key = getattr(sample, "__key__", None)
        return cls(f"{message} (sample {key!r})")


class StateError(EnergonError, ValueError):
    """A saved loader state cannot be restored into this loader."""


class SkipSample(Exception):  # noqa: N818 - the reference's public name
    """Raise inside a task encoder hook to drop the current sample without counting it as an error."""


# Errors that indicate broken code rather than a broken sample: never skipped.
SYSTEM_EXCEPTIONS: tuple[type[BaseException], ...] = (
    SystemError,
    SyntaxError,
    ImportError,
    StopIteration,
    StopAsyncIteration,
    MemoryError,
    RecursionError,
    ReferenceError,
    NameError,
    UnboundLocalError,
    FatalSampleError,
)


def log_exception(exc: BaseException, sample: Any = None, sources: Sequence | None = None) -> None:
    """Default handler: print the error with where the sample came from; the sample is skipped."""
    lines = ["Sample skipped after an error:"]
    lines += traceback.format_exception(type(exc), exc, exc.__traceback__)
    for src in sources or ():
        names = ",".join(getattr(src, "file_names", ()) or ())
        lines.append(
            f" - {getattr(src, 'dataset_path', '?')}[{getattr(src, 'index', '?')}] "
            f"{getattr(src, 'shard_name', '?')} {names}"
        )
    print("\n".join(lines), file=sys.stderr, flush=True)


def reraise_exception(
    exc: BaseException, sample: Any = None, sources: Sequence | None = None
) -> None:
    """Handler that turns every sample error into a hard failure."""
    raise exc


ErrorHandler = Callable[..., None]


class ErrorPolicy:
    """Applies a handler to per-sample errors and fails after ``tolerance`` consecutive failures.

    ``tolerance=0`` disables the limit. Counters are exposed for reporting (``skipped``).
    """

    __slots__ = ("name", "handler", "tolerance", "consecutive", "skipped")

    def __init__(self, name: str, handler: ErrorHandler, tolerance: int = 100) -> None:
        self.name = name
        self.handler = handler
        self.tolerance = tolerance
        self.consecutive = 0
        self.skipped = 0

    def succeeded(self) -> None:
        self.consecutive = 0

    def failed(
        self, exc: BaseException, sample: Any = None, sources: Sequence | None = None
    ) -> None:
        """Handle one failure: raise fatal errors, otherwise call the handler and count the skip.

        The exception gets a note naming the hook, the sample key and where the sample came from,
        so both a logged and a re-raised error say which sample broke which hook.
        """
        if sources is None:
            sources = _sources_of(sample)
        _add_note(exc, _describe_failure(self.name, sample, sources))
        if isinstance(exc, SYSTEM_EXCEPTIONS):
            if isinstance(exc, FatalSampleError):
                raise exc
            raise FatalSampleError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        self.handler(exc, sample, sources)
        self.skipped += 1
        self.consecutive += 1
        if self.tolerance and self.consecutive >= self.tolerance:
            raise FatalSampleError(
                f"{self.name} failed {self.consecutive} times in a row; likely the code or the "
                f"dataset is broken. Last error: {type(exc).__name__}: {exc}"
            ) from exc


def _sources_of(sample: Any) -> Sequence | None:
    if isinstance(sample, dict):
        return sample.get("__sources__")
    return getattr(sample, "__sources__", None)


def _key_of(sample: Any) -> Any:
    if isinstance(sample, dict):
        return sample.get("__key__")
    if isinstance(sample, list | tuple):
        return [_key_of(s) for s in sample]
    return getattr(sample, "__key__", None)


def _describe_failure(hook: str, sample: Any, sources: Sequence | None) -> str:
    where = ", ".join(
        f"{getattr(s, 'dataset_path', '?')}/{getattr(s, 'shard_name', '?')}"
        for s in (sources or ())
    )
    text = f"energon: in hook {hook!r}"
    key = _key_of(sample)
    if key is not None:
        text += f" for sample {key!r}"
    return text + (f" from {where}" if where else "")


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)
