"""Determinism tools for map-style datasets (Megatron's ``EpochIndex`` contract).

A map-style dataset is reproducible, and resumable from a sample position, when ``dataset[i]``
depends on nothing but ``i``. Multi-epoch training breaks that naively: augmentations differ per
epoch, and shuffling per epoch tends to use the global RNG. The contract here:

- the index carries the epoch: ``EpochIndex(epoch, idx)``;
- all per-sample randomness comes from a *local* generator derived from (seed, epoch, idx)
  (``epoch_generator``), never from the global ``random``/``numpy``/``torch`` state;
- ``__getitem__`` never seeds or advances the global RNGs.

``MultiEpochDatasetResampler`` turns a dataset of N samples into one of ``num_epochs * N`` positions,
reshuffled per epoch from (seed, epoch) alone; ``IdentityMultiEpochDatasetWrapper`` lets a dataset
that takes plain ints sit behind it. ``check_determinism`` verifies the contract on a user's dataset.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np


class EpochIndex(NamedTuple):
    """A sample index with its epoch: the only input a sample may depend on."""

    epoch: int
    idx: int


def epoch_generator(seed: int, index: EpochIndex | int) -> np.random.Generator:
    """A local generator for one sample's randomness, a pure function of (seed, epoch, idx)."""
    if isinstance(index, EpochIndex):
        return np.random.default_rng([seed, index.epoch, index.idx])
    return np.random.default_rng([seed, 0, int(index)])


class MultiEpochDatasetResampler:
    """``num_epochs`` passes over ``dataset``, each in its own deterministic order.

    Position ``i`` maps to ``EpochIndex(epoch, perm_epoch[i % N])`` with ``epoch = i // N`` and
    ``perm_epoch`` a permutation drawn from a local generator seeded by (seed, epoch); without
    ``shuffle`` the permutation is the identity. The wrapped dataset receives the ``EpochIndex``.
    ``num_samples`` (instead of ``num_epochs``) truncates the last epoch.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        num_epochs: int | None = None,
        num_samples: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.dataset = dataset
        self.dataset_len = len(dataset)
        if self.dataset_len <= 0:
            raise ValueError("cannot resample an empty dataset")
        if (num_epochs is None) == (num_samples is None):
            raise ValueError("give exactly one of num_epochs and num_samples")
        self.num_samples = num_samples if num_samples is not None else num_epochs * self.dataset_len
        self.shuffle = shuffle
        self.seed = seed
        self._cached: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.num_samples

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch ``epoch`` (kept for the last epoch used: sequential reads are cheap)."""
        if self._cached is None or self._cached[0] != epoch:
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.dataset_len)
            else:
                order = np.arange(self.dataset_len)
            self._cached = (epoch, order)
        return self._cached[1]

    def epoch_index(self, i: int) -> EpochIndex:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"index {i} out of range [0, {self.num_samples})")
        epoch, position = divmod(int(i), self.dataset_len)
        return EpochIndex(epoch, int(self.permutation(epoch)[position]))

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.epoch_index(i)]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cached": None}


class IdentityMultiEpochDatasetWrapper:
    """Accepts ``EpochIndex`` (or int) and passes ``idx`` to a dataset that knows only ints."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: EpochIndex | int) -> Any:
        if isinstance(index, EpochIndex):
            return self.dataset[index.idx]
        return self.dataset[index]


@dataclasses.dataclass
class DeterminismReport:
    """What ``check_determinism`` verified; ``problems`` is empty when the contract holds."""

    checked: list[Any]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_determinism(
    dataset: Any,
    indices: Iterable[Any] | None = None,
    *,
    num_epochs: int = 2,
    max_indices: int = 8,
    raise_on_error: bool = True,
) -> DeterminismReport:
    """Check the determinism contract on ``dataset``; meant for users' own tests.

    For each index (default: ``EpochIndex(e, i)`` for the first epochs and indices):
    1. two reads give equal samples;
    2. a read after scrambling the global ``random``/``numpy``/``torch`` RNGs gives the same sample
       (randomness must come from the index, through a local generator);
    3. a read leaves the global RNG states exactly as it found them.
    The global RNG states are restored afterwards. Raises ``AssertionError`` listing every problem
    unless ``raise_on_error=False``.
    """
    if indices is None:
        count = min(len(dataset), max_indices)
        indices = [EpochIndex(e, i) for e in range(num_epochs) for i in range(count)]
    indices = list(indices)
    saved = _global_rng_states()
    problems: list[str] = []
    try:
        for index in indices:
            problems += _check_one(dataset, index)
    finally:
        _set_global_rng_states(saved)
    report = DeterminismReport(checked=indices, problems=problems)
    if problems and raise_on_error:
        raise AssertionError("determinism contract violated:\n  " + "\n  ".join(problems))
    return report


def _check_one(dataset: Any, index: Any) -> list[str]:
    problems = []
    before = _global_rng_states()
    first = dataset[index]
    if not _rng_states_equal(before, _global_rng_states()):
        problems.append(f"{index!r}: __getitem__ changed the global random/numpy/torch RNG state")
    if not samples_equal(first, dataset[index]):
        problems.append(f"{index!r}: two reads of the same index differ")
    _scramble_global_rngs()
    if not samples_equal(first, dataset[index]):
        problems.append(
            f"{index!r}: the sample depends on the global RNG state; derive randomness from the "
            "index (energon.megatron.epoch_index.epoch_generator)"
        )
    return problems


def samples_equal(a: Any, b: Any) -> bool:
    """Deep equality over tensors, arrays, mappings, sequences and dataclasses (NaNs equal)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b) or torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        return a_arr.shape == b_arr.shape and np.array_equal(
            a_arr, b_arr, equal_nan=a_arr.dtype.kind in "fc"
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(samples_equal(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            samples_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(samples_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _global_rng_states() -> tuple[Any, Any, Any]:
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_global_rng_states(states: Sequence[Any]) -> None:
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def _rng_states_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    import torch

    numpy_equal = a[1][0] == b[1][0] and np.array_equal(a[1][1], b[1][1]) and a[1][2:] == b[1][2:]
    return a[0] == b[0] and numpy_equal and bool(torch.equal(a[2], b[2]))


def _scramble_global_rngs() -> None:
    """Move the global RNGs to a different state (the checker's own use; restored by the caller)."""
    import torch

    random.seed(0x5EED)
    np.random.seed(0x5EED)  # noqa: NPY002 - deliberately perturbs the global state under test
    torch.manual_seed(0x5EED)
