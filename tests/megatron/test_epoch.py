"""EpochIndex tools: per-epoch reshuffling without global RNG, and the user-facing checker."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from energon.megatron.epoch_index import (
    EpochIndex,
    IdentityMultiEpochDatasetWrapper,
    MultiEpochDatasetResampler,
    check_determinism,
    epoch_generator,
)


class Augmenting:
    """A well-behaved dataset: noise from a local generator derived from the EpochIndex."""

    def __len__(self):
        return 10

    def __getitem__(self, index: EpochIndex):
        rng = epoch_generator(42, index)
        return {"idx": index.idx, "noise": torch.from_numpy(rng.normal(size=3))}


class UsesGlobalRng(Augmenting):
    def __getitem__(self, index):
        return {"idx": index.idx, "noise": torch.rand(3)}


class SeedsGlobalRng(Augmenting):
    def __getitem__(self, index):
        np.random.seed(index.idx)  # noqa: NPY002 - the misbehaviour under test
        return {"idx": index.idx, "noise": np.random.rand(3)}  # noqa: NPY002


def test_resampler_reshuffles_each_epoch_deterministically():
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    ds = MultiEpochDatasetResampler(Augmenting(), num_epochs=3, seed=7)
    assert len(ds) == 30
    order = [ds.epoch_index(i) for i in range(30)]
    epochs = [[o.idx for o in order[e * 10 : (e + 1) * 10]] for e in range(3)]
    assert all(sorted(e) == list(range(10)) for e in epochs)  # every sample once per epoch
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled per epoch
    again = MultiEpochDatasetResampler(Augmenting(), num_epochs=3, seed=7)
    assert [again.epoch_index(i) for i in reversed(range(30))] == order[::-1]  # random access
    other_seed = MultiEpochDatasetResampler(Augmenting(), num_epochs=3, seed=8)
    assert [other_seed.epoch_index(i) for i in range(30)] != order
    assert random.getstate() == before[0] and np.array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])
    unshuffled = MultiEpochDatasetResampler(Augmenting(), num_samples=15, shuffle=False)
    assert [unshuffled.epoch_index(i) for i in range(15)][9:11] == [
        EpochIndex(0, 9),
        EpochIndex(1, 0),
    ]
    with pytest.raises(IndexError):
        unshuffled[15]


def test_identity_wrapper_passes_ints_through():
    wrapped = IdentityMultiEpochDatasetWrapper(list("abc"))
    assert len(wrapped) == 3 and wrapped[EpochIndex(5, 2)] == "c" and wrapped[1] == "b"
    resampled = MultiEpochDatasetResampler(wrapped, num_epochs=2, seed=0)
    assert sorted(resampled[i] for i in range(6)) == list("aabbcc")


def test_checker_accepts_a_well_behaved_dataset():
    report = check_determinism(Augmenting())
    assert report.ok and len(report.checked) == 16


@pytest.mark.parametrize(
    "dataset,problem",
    [(UsesGlobalRng(), "global RNG state"), (SeedsGlobalRng(), "changed the global")],
)
def test_checker_catches_global_rng_use(dataset, problem):
    state = torch.get_rng_state()
    with pytest.raises(AssertionError, match=problem):
        check_determinism(dataset, num_epochs=1, max_indices=2)
    assert torch.equal(state, torch.get_rng_state())  # the checker restores what it scrambled
    report = check_determinism(dataset, [EpochIndex(0, 1)], raise_on_error=False)
    assert not report.ok


def test_checker_catches_nondeterminism():
    class Counter(Augmenting):
        calls = 0

        def __getitem__(self, index):
            self.calls += 1
            return self.calls

    with pytest.raises(AssertionError, match="two reads"):
        check_determinism(Counter(), [EpochIndex(0, 0)])
