"""``SavableSampleBuffer`` (``megatron.energon.wrappers.buffer``): a list of samples whose state is
their restore keys, for custom wrappers written in the reference's style.

energon's own buffers (shuffle, packing, grouping) are stages with plain-data state; this class
gives reference-style code the same contract: ``save_state()`` returns the buffered samples'
restore keys (plain data), and after ``restore_state`` the samples are regenerated on first access
from those keys by the wrapped dataset's ``restore_sample``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from energon.compat.savable import FlexState, Savable
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SavableDataset,
    WorkerConfig,
    get_sample_restore_key,
)

__all__ = [
    "BaseWrapperDataset",
    "FlexState",
    "SavableDataset",
    "SavableSampleBuffer",
    "WorkerConfig",
    "get_sample_restore_key",
]


class SavableSampleBuffer(Savable):
    """Buffered samples of ``dataset``; the state is their restore keys."""

    def __init__(self, dataset: Any, *, worker_config: WorkerConfig) -> None:
        self.dataset = dataset
        self.worker_config = worker_config
        self._buffer: list[Any] = []
        self._restore_keys: list[Any] = []
        self._pending: list[Any] | None = None  # keys restored but not regenerated yet

    # -- the buffer --------------------------------------------------------------------------
    @property
    def buffer(self) -> list[Any]:
        self._materialize()
        return self._buffer

    def worker_start(self) -> None:
        self._materialize()

    def append(self, sample: Any) -> Any:
        self._materialize()
        self._buffer.append(sample)
        self._restore_keys.append(get_sample_restore_key(sample))
        return sample

    def extend(self, samples: list[Any], restore_keys: Iterable[Any] | None = None) -> None:
        self._materialize()
        keys = list(restore_keys) if restore_keys is not None else None
        self._buffer.extend(samples)
        self._restore_keys.extend(keys or [get_sample_restore_key(s) for s in samples])

    def append_iter(self) -> Iterator[Any]:
        """Buffers each sample of the wrapped dataset and yields it."""
        for sample in self.dataset:
            yield self.append(sample)

    def pop(self, index: int) -> Any:
        self._materialize()
        self._restore_keys.pop(index)
        return self._buffer.pop(index)

    def flush(self) -> tuple[list[Any], list[Any]]:
        """All buffered samples and their restore keys; the buffer is empty afterwards."""
        self._materialize()
        samples, keys = self._buffer, self._restore_keys
        self._buffer, self._restore_keys = [], []
        return samples, keys

    def clear(self) -> None:
        self._buffer, self._restore_keys, self._pending = [], [], None

    def restore_key(self) -> tuple[Any, ...]:
        return tuple(self._restore_keys if self._pending is None else self._pending)

    def restore_samples(self, index: tuple[Any, ...]) -> list[Any]:
        """Regenerate samples from restore keys (through the wrapped dataset)."""
        restore = getattr(self.dataset, "restore_sample", None)
        if restore is None:
            raise TypeError(
                f"SavableSampleBuffer: {type(self.dataset).__name__} cannot regenerate samples "
                "from restore keys (it has no restore_sample)"
            )
        return [restore(key) for key in index]

    def _materialize(self) -> None:
        if self._pending is not None:
            keys, self._pending = self._pending, None
            self._buffer = self.restore_samples(tuple(keys))
            self._restore_keys = list(keys)

    # -- state -------------------------------------------------------------------------------
    def save_state(self) -> FlexState:
        return FlexState(buffer=list(self.restore_key()))

    def restore_state(self, state: FlexState | None) -> None:
        self.clear()
        if state is not None and state["buffer"]:
            self._pending = list(state["buffer"])

    def reset_state_own(self) -> None:
        self.clear()

    # -- sizes and description -----------------------------------------------------------------
    def len_worker(self, worker_idx: int | None = None) -> int:
        return len(self.restore_key())

    def len_rank(self) -> int:
        return len(self.restore_key())

    def __len__(self) -> int:
        return len(self.restore_key())

    def __getitem__(self, index: int | slice) -> Any:
        return self.buffer[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.buffer)

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__}

    def debug_print(self, indent: str = "") -> str:
        keys = self.restore_key()
        return f"{indent}SavableSampleBuffer({len(keys)} samples: {list(keys)[:8]})"
