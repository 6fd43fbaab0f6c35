"""Errors and the per-sample error policy.

Every exception class energon defines is an ``EnergonError`` and is defined here, so the whole tree
is in one place (modules re-export the ones they raise, e.g. ``energon.format.tar.TarFormatError``;
only signals private to one module, named ``_Like``, live there).
Each error also keeps the builtin base class callers catch today (``ValueError`` for bad data or
configuration, ``OSError`` for storage, ...), so ``except ValueError`` keeps working:

    EnergonError (Exception)
        ArgumentError (ValueError)
            ArgumentTypeError (TypeError)
        EmptyDatasetError
        StateError (ValueError)
        NotSimulableError (ValueError)
        PaddingError (TypeError)
        BalanceCostError (ValueError)
        PlanStoreError (ValueError)
        SampleException (ValueError)
            FatalSampleError
                ErrorBudgetExceeded
            SampleReadError
                DamagedSampleError
                    TruncatedShardError (OSError)
            WorkerLostError
            DecodeError
            DecodeTimeoutError
            AVDecodeError
            FieldAccessError
            TokenSampleError
        SkipSample
        DatasetNotFoundError (FileNotFoundError)
        DatasetNotPreparedError (FileNotFoundError)
            SampleTablesMissingError
        DatasetInfoError (ValueError)
        SplitConfigError (ValueError)
        UnknownSplitError (KeyError)
        DatasetConfigError (ValueError)
        MetadatasetError (ValueError)
        TarFormatError (ValueError)
            DuplicateKeyInShardError
        TarIndexError (ValueError)
        DuplicateSampleKeyError (ValueError)
        JsonlFormatError (ValueError)
        ParquetFormatError (ValueError)
        IndexedFormatError (ValueError)
        PrepareError
            EmptyShardError (ValueError)
            ShardReadError (OSError)
        RemoteError (OSError)
            RemoteNotFoundError (FileNotFoundError)
        TransientRemoteError (ConnectionError)
            ThrottledError
        UseBotocore
        MegatronEnergonInstalledError (RuntimeError)
        MissingDependencyError (ImportError)
        WatchdogTimeout (TimeoutError)
        JsonValueError (ValueError)
        GcFreezeError (RuntimeError)
        WorkerRecoveryError (RuntimeError)
        ClusterError (RuntimeError)
            RayNotInstalledError (ImportError)

A bad sample must never be lost silently: a ``SampleException`` is either raised, or skipped *and
counted*, and a run of consecutive failures beyond the tolerance stops the job with the last error
attached. Skips are also counted per source dataset against an :class:`ErrorBudget` (rates over
windows, counts, complete failure), reported by ``loader.error_report()`` (docs/errors.md). Errors in ``SYSTEM_EXCEPTIONS`` (broken code, not broken data) are never skipped.
``RemoteError`` is final (permanent, or retries exhausted); ``TransientRemoteError`` is the one that
another attempt may not hit, so it is deliberately not a ``RemoteError``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol


class EnergonError(Exception):
    """Base class of energon's own errors."""


class ArgumentError(EnergonError, ValueError):
    """A public function (or an ``energon`` command) got a bad argument. ``argument`` is its name,
    so that the command line can say which option it was (``--from-step`` for ``from_step``)."""

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        self.reason = reason
        super().__init__(f"{argument}: {reason}")

    def __reduce__(self):  # keeps the fields across process boundaries (loader workers)
        return (type(self), (self.argument, self.reason))


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (``except TypeError`` catches it, as it caught the builtin)."""


class EmptyDatasetError(EnergonError):
    """A split, subset or stream holds no samples."""


class StateError(EnergonError, ValueError):
    """A saved loader state cannot be restored into this loader."""


class PaddingError(EnergonError, TypeError):
    """A filler item cannot be flagged as padding (its type cannot carry ``__padding__``)."""


# ---------------------------------------------------------------------------------------------
# One sample is bad: handled by the error policy


class NotSimulableError(EnergonError, ValueError):
    """The ledger (or a cursor edit) would need to read data to know what a configuration does:
    a hook decides from decoded samples. The message names the hook and what would make it
    knowable (``@uses_sample_meta``, a journal)."""


class BalanceCostError(EnergonError, ValueError):
    """A sample lacks what the balance cost model needs: one line naming the field, the sample
    key and the dataset (instead of a bare ``AttributeError`` from deep inside planning)."""


class PlanStoreError(EnergonError, ValueError):
    """A balanced plan store (``Balance(plan_store=...)``) holds a damaged plan or plans that do
    not continue this run's streams (energon.balance.store)."""


class SampleException(EnergonError, ValueError):
    """A single sample could not be read, decoded or encoded."""

    @classmethod
    def from_sample_key(cls, key: str, message: str = "") -> SampleException:
        return cls(f"Sample {key!r}: {message}")

    @classmethod
    def from_sample(cls, sample: Any, message: str = "") -> SampleException:
        """The error for ``sample``, shown in one line as the reference shows it
        (``Sample {...} failed: message``)."""
        from energon.sample_text import format_sample_compact  # (imports torch: only when used)

        text = f"Sample {format_sample_compact(sample)} failed"
        return cls(f"{text}: {message}" if message else text)


class FatalSampleError(SampleException):
    """Never skipped: stops the loader (too many consecutive failures, or a programming error)."""


class ErrorBudgetExceeded(FatalSampleError):
    """Too many samples of a source dataset (or of all sources) failed: see :class:`ErrorBudget`."""


class SampleReadError(SampleException):
    """A sample's bytes could not be read, split or decoded."""


class DamagedSampleError(SampleReadError):
    """A sample's bytes are not what ``prepare`` indexed (a damaged tar header, a checksum that
    does not match). Names the shard, the byte offset and the sample key when it is known."""

    def __init__(self, path: str, offset: int, message: str, key: str | None = None) -> None:
        self.path = path
        self.offset = offset
        self.key = key
        self.message = message
        sample = f" sample {key!r}" if key is not None else ""
        super().__init__(f"{path}{sample} at byte offset {offset}: {message}")

    def __reduce__(self):  # keeps the fields across process boundaries (loader workers)
        return (type(self), (self.path, self.offset, self.message, self.key))


class TruncatedShardError(DamagedSampleError, OSError):
    """A shard ends (or is gone) before a byte range its index names: truncated, deleted or
    replaced since it was prepared."""


class WorkerLostError(SampleException):
    """The loader worker that handled this sample died (a signal, ``os._exit``, the OOM killer)
    or was stopped because it was stuck on it; the sample is skipped where the stream meets it
    again in the replacement worker (see docs/observability.md, "When a worker dies")."""


class DecodeError(SampleException):
    """A part could not be decoded; names the part (and the sample key when known)."""

    def __init__(self, message: str, *, part_name: str, key: str | None = None) -> None:
        where = f"sample {key!r}, part {part_name!r}" if key is not None else f"part {part_name!r}"
        super().__init__(f"{where}: {message}")
        self.part_name = part_name
        self.key = key


class DecodeTimeoutError(SampleException):
    """Work on one sample took longer than its deadline; handled by the error policy like any
    other bad sample (skipped and counted, or raised)."""


class AVDecodeError(SampleException):
    """Media could not be opened or decoded (corrupt, truncated, unsupported codec, bad request).

    A ``SampleException``, so the loader's error policy skips and counts (or raises) the sample
    instead of letting the worker die.
    """


class FieldAccessError(SampleException):
    """No option of a field's spec could be resolved for a sample."""

    def __init__(
        self, field: str, spec: str | None = None, key: str | None = None, reason: str = ""
    ) -> None:
        """``FieldAccessError(field, spec, key, reason)``; with one argument (the reference's
        ``megatron.energon.flavors.webdataset.field_access`` form) that is the message."""
        if spec is None:
            super().__init__(field)
        else:
            super().__init__(
                f"Sample {key!r}: cannot fill field {field!r} from field map spec {spec!r}: "
                f"{reason}"
            )
        self.field = field
        self.spec = spec
        self.key = key


class TokenSampleError(SampleException):
    """A window could not be read (missing or corrupt ``.bin``/``.idx`` or cache file)."""


class SkipSample(EnergonError):  # noqa: N818 - the reference's public name
    """Raise inside a task encoder hook to drop the current sample without counting it as an error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # the reference's signature; keywords are refused alike


# ---------------------------------------------------------------------------------------------
# A dataset, its metadata or a config is missing or malformed


class DatasetNotFoundError(EnergonError, FileNotFoundError):
    """A dataset, metadataset or data file a configuration (or an argument) names does not exist."""


class DatasetNotPreparedError(EnergonError, FileNotFoundError):
    """A path that must be a prepared dataset lacks its ``.nv-meta`` files: run ``energon prepare``."""


class SampleTablesMissingError(DatasetNotPreparedError):
    """A tool that looks samples up by key (or by shard number) needs ``index.sqlite``, which a
    dataset prepared with ``--no-sample-tables`` does not have; the message says how to build it."""


class DatasetInfoError(EnergonError, ValueError):
    """``.info.json`` / ``.info.yaml`` is missing or malformed."""


class SplitConfigError(EnergonError, ValueError):
    """``split.yaml`` is missing or malformed."""


class UnknownSplitError(EnergonError, KeyError):
    """A split name that the split config does not define."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DatasetConfigError(EnergonError, ValueError):
    """``dataset.yaml`` is malformed; the message names the file and the key."""


class MetadatasetError(EnergonError, ValueError):
    """A metadataset is malformed; the message names the file and the offending key or value."""


class TarFormatError(EnergonError, ValueError):
    """A tar file is truncated or corrupt. Names the file and the byte offset of the problem."""

    def __init__(self, path: str, offset: int, message: str) -> None:
        self.path = path
        self.offset = offset
        self.message = message
        super().__init__(f"{path or '<tar>'}: at byte offset {offset}: {message}")

    def __reduce__(self):  # keeps the error intact across process boundaries (prepare workers)
        return (type(self), (self.path, self.offset, self.message))


class DuplicateKeyInShardError(TarFormatError):
    """A sample key appears twice in one shard, separated by another sample."""

    def __init__(self, path: str, key: str, first_offset: int, second_offset: int) -> None:
        self.key = key
        self.first_offset = first_offset
        self.second_offset = second_offset
        super().__init__(
            path,
            second_offset,
            f"duplicate sample key {key!r}: first seen at byte offset {first_offset}, again at "
            f"byte offset {second_offset} after other samples (the parts of a sample must be "
            "consecutive in the tar, and keys must be unique)",
        )

    def __reduce__(self):
        return (type(self), (self.path, self.key, self.first_offset, self.second_offset))


class TarIndexError(EnergonError, ValueError):
    """A ``.tar.idx`` file is missing, has a bad size, or is asked for a sample it does not have."""


class DuplicateSampleKeyError(EnergonError, ValueError):
    """The same sample key occurs twice in the dataset (keys must be unique across all shards).
    ``sample_key`` (also ``key``) is the key; ``first`` / ``second`` where it occurs, when known."""

    def __init__(
        self, sample_key: str, first: str | None = None, second: str | None = None
    ) -> None:
        self.sample_key = sample_key
        self.first = first
        self.second = second
        where = f": first in {first}, again in {second}" if first or second else ""
        super().__init__(
            f"Duplicate sample key {sample_key!r}{where}. Sample keys must be unique across all "
            "shards of a dataset; rename the members (e.g. prefix them with the shard name) and "
            "prepare again."
        )

    @property
    def key(self) -> str:
        return self.sample_key

    def __reduce__(self):
        return (type(self), (self.sample_key, self.first, self.second))


class JsonlFormatError(EnergonError, ValueError):
    """The JSONL file or its index is malformed (names the file and line or offset)."""


class ParquetFormatError(EnergonError, ValueError):
    """A Parquet or Arrow file, or a Parquet dataset's index, is malformed (names the file)."""


class IndexedFormatError(EnergonError, ValueError):
    """A ``.bin``/``.idx`` pair is malformed, truncated or inconsistent."""


class PrepareError(EnergonError):
    """``prepare`` cannot index the dataset; the message says which shard and why."""


class EmptyShardError(PrepareError, ValueError):
    """A shard holds no samples (every shard must contribute at least one)."""


class ShardReadError(PrepareError, OSError):
    """A shard file cannot be opened or read."""

    def __str__(self) -> str:
        return str(self.args[0])


# ---------------------------------------------------------------------------------------------
# Object storage


class RemoteError(EnergonError, OSError):
    """A request to object storage failed for good (permanent error, or retries exhausted)."""


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """The object does not exist."""


class TransientRemoteError(EnergonError, ConnectionError):
    """A failure another attempt may not hit (retried by ``energon.remote.retry.with_retries``)."""


class ThrottledError(TransientRemoteError):
    """The store answered 503 / 429 (retried, and the process lowers its concurrency)."""

    throttled = True


class UseBotocore(EnergonError):  # noqa: N818 - a signal, not a failure
    """This read is not for the S3 fast path: do it through botocore (never leaves ``remote/``)."""


# ---------------------------------------------------------------------------------------------
# Set-up


class MegatronEnergonInstalledError(EnergonError, RuntimeError):
    """A real megatron-energon is installed; ``energon.megatron_alias`` would shadow it."""


class MissingDependencyError(EnergonError, ImportError):
    """An optional package a feature needs is not installed; the message says which, and how to
    install it."""


class WatchdogTimeout(EnergonError, TimeoutError):
    """No batch arrived within the loader's watchdog timeout (``fail_on_timeout=True``); the
    message holds the stacks of the main process and every worker, and what each worker was on."""


class JsonValueError(EnergonError, ValueError):
    """Raw (JSON/YAML) data that does not fit the expected type; ``path``: where, from the root
    (``megatron.energon.typed_converter``)."""

    def __init__(
        self, msg: str, expected_type: Any, value: Any, path: str, stage: tuple[int, ...]
    ) -> None:
        super().__init__(msg)
        self.expected_type = expected_type
        self.value = value
        self.path = path
        self.stage = stage


class GcFreezeError(EnergonError, RuntimeError):
    """Garbage collection could not be frozen as asked (``megatron.energon.wrappers.gc_dataset``)."""


class WorkerRecoveryError(EnergonError, RuntimeError):
    """A lost loader worker was not replaced: recovery is off, or the restart budgets of
    :class:`~energon.loader.recovery.WorkerRecovery` are spent. The message lists every loss of
    the pass: the worker, why it ended, and the sample it was on."""


class ClusterError(EnergonError, RuntimeError):
    """The Ray cluster cannot run what energon asks of it: no cluster at the address, or an actor
    that cannot be placed or started within its time limit (the message says what it asked for and
    what the cluster has). See docs/ray.md."""


class RayNotInstalledError(ClusterError, ImportError):
    """Ray workers or ``prepare --ray`` were asked for, but Ray is not installed
    (``pip install 'energon-loader[ray]'``)."""


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


def log_exception(e: BaseException, sample: Any = None, sources: Sequence | None = None) -> None:
    """Default handler: print the error with where the sample came from; the sample is skipped.
    (Parameter names are the reference's, for handlers called by keyword.)"""
    lines = ["Sample skipped after an error:"]
    lines += traceback.format_exception(type(e), e, e.__traceback__)
    for src in sources or ():
        names = ",".join(getattr(src, "file_names", ()) or ())
        lines.append(
            f" - {getattr(src, 'dataset_path', '?')}[{getattr(src, 'index', '?')}] "
            f"{getattr(src, 'shard_name', '?')} {names}"
        )
    print("\n".join(lines), file=sys.stderr, flush=True)


def reraise_exception(
    e: BaseException, _sample: Any = None, _sources: Sequence | None = None
) -> None:
    """Handler that turns every sample error into a hard failure."""
    raise e


ErrorHandler = Callable[..., None]


class FailureAccount(Protocol):
    """Where a stream counts its lost samples (:class:`energon.pipeline.error_account.ErrorAccount`)."""

    def failed(
        self,
        keys: Sequence[Any],
        exc: BaseException,
        sample: Any,
        reads: Sequence[int] | None = None,
    ) -> None:
        """``keys`` (restore keys) name the samples lost to ``exc``; may raise ErrorBudgetExceeded.
        ``reads``: samples read per source when the lost one was read, if that was earlier."""


class ErrorPolicy:
    """Applies a handler to per-sample errors and fails after ``tolerance`` consecutive failures
    of this hook; the stream's ``account`` counts every lost sample per source against the error
    budget.

    ``tolerance=0`` disables the limit. Counters are exposed for reporting (``skipped``).
    """

    __slots__ = ("name", "handler", "tolerance", "consecutive", "skipped", "account")

    def __init__(
        self,
        name: str,
        handler: ErrorHandler,
        tolerance: int = 100,
        account: FailureAccount | None = None,
    ) -> None:
        self.name = name
        self.handler = handler
        self.tolerance = tolerance
        self.consecutive = 0
        self.skipped = 0
        self.account = account

    def succeeded(self) -> None:
        self.consecutive = 0

    def failed(
        self,
        exc: BaseException,
        sample: Any = None,
        sources: Sequence | None = None,
        keys: Sequence[Any] = (),
        reads: Sequence[int] | None = None,
    ) -> None:
        """Handle one failure: raise fatal errors, otherwise call the handler and count the skip.

        The exception gets a note naming the hook, the sample key and where the sample came from,
        so both a logged and a re-raised error say which sample broke which hook. ``keys`` are the
        restore keys of the samples lost (for the per-source budget); ``reads`` the samples read
        per source when they were read, where the stage reports the failure later (read-ahead).
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
        if self.account is not None and keys:
            self.account.failed(keys, exc, sample, reads)
        if self.tolerance and self.consecutive >= self.tolerance:
            raise FatalSampleError(
                f"{self.name} failed {self.consecutive} times in a row; likely the code or the "
                f"dataset is broken. Last error: {type(exc).__name__}: {exc}"
            ) from exc


ERROR_BUDGET_ENV = "ENERGON_ERROR_BUDGET"


@dataclasses.dataclass(frozen=True)
class ErrorBudget:
    """When samples skipped after errors stop a run (see docs/errors.md).

    Per source dataset, in every logical stream: more than ``max_rate`` of a window of ``window``
    samples read from it failed; or every sample a finished (validation) stream read from it failed.
    Over all sources of a stream: more than ``max_total_rate`` of a window of ``window`` samples.
    Per rank: more than ``max_skipped`` samples of one source, or ``max_total_skipped`` in total
    (``None``: no count limit). ``max_rate=1`` switches a rate off. A log line about new skips is
    written at most every ``log_interval_s`` seconds (0: at every new skip; None: never).

    The defaults stop a run when a source is mostly broken and never because of a few bad samples.
    ``ENERGON_ERROR_BUDGET="max_rate=0.2,window=500,max_total_skipped=none"`` changes them for every
    dataset built without an explicit ``error_budget=``.
    """

    max_rate: float = 0.5
    window: int = 1000
    max_total_rate: float = 0.5
    max_skipped: int | None = None
    max_total_skipped: int | None = None
    log_interval_s: float | None = 300.0

    def __post_init__(self) -> None:
        for name in ("max_rate", "max_total_rate"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"ErrorBudget.{name} must be in (0, 1], got {getattr(self, name)}")
        if self.window < 1:
            raise ValueError(f"ErrorBudget.window must be >= 1, got {self.window}")
        for name in ("max_skipped", "max_total_skipped", "log_interval_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"ErrorBudget.{name} must be >= 0 or None, got {value}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ErrorBudget:
        """The defaults, changed by ``ENERGON_ERROR_BUDGET`` (``name=value`` pairs, comma-separated;
        ``none`` for no limit)."""
        text = (os.environ if environ is None else environ).get(ERROR_BUDGET_ENV, "").strip()
        if not text:
            return cls()
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for item in text.split(","):
            name, sep, raw = (part.strip() for part in item.partition("="))
            if not sep or name not in kinds:
                raise ValueError(
                    f"{ERROR_BUDGET_ENV}={text!r}: {item.strip()!r} is not name=value with a name of "
                    f"{', '.join(kinds)}"
                )
            try:
                values[name] = _parse_budget_value(raw, kinds[name])
            except ValueError:
                raise ValueError(
                    f"{ERROR_BUDGET_ENV}={text!r}: bad value {raw!r} for {name}"
                ) from None
        return cls(**values)


def _parse_budget_value(raw: str, kind: str) -> Any:
    if raw.lower() == "none":
        if "None" not in kind:
            raise ValueError(raw)
        return None
    return int(raw) if kind.startswith("int") else float(raw)


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
