"""The fast blend-index builders are array-equal to the plain reference loop (megatron-core's rule)."""

from __future__ import annotations

import numpy as np
import pytest

from energon.megatron import blend_native
from energon.megatron import gpt_indices as gi


def reference_blend(weights, size):
    """The rule as megatron-core's helper states it, one numpy argmax per sample (slow, obvious)."""
    w = np.asarray(weights, dtype=np.float64)
    counts = np.zeros(len(w), dtype=np.float64)
    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    for i in range(size):
        d = int(np.argmax(w * max(float(i), 1.0) - counts))
        dataset_index[i] = d
        sample_index[i] = counts[d]
        counts[d] += 1
    return dataset_index, sample_index


def reference_exhaustive(sizes):
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    total = int(sizes_arr.sum())
    w = sizes_arr / float(total)
    counts = np.zeros(len(w), dtype=np.float64)
    spent = sizes_arr <= 0
    dataset_index = np.zeros(total, dtype=np.int16)
    sample_index = np.zeros(total, dtype=np.int64)
    for i in range(total):
        error = w * max(float(i), 1.0) - counts
        error[spent] = -np.inf
        d = int(np.argmax(error))
        dataset_index[i] = d
        sample_index[i] = counts[d]
        counts[d] += 1
        spent[d] = counts[d] >= sizes_arr[d]
    return dataset_index, sample_index


def weight_cases():
    rng = np.random.default_rng(1234)
    cases = [
        [1.0],
        [0.5, 0.5],  # exact ties every other step
        [1, 1, 1],  # 1/3 each: ties broken by the lowest index
        [0.25, 0.25, 0.5, 0.0],  # a zero weight is never drawn
        [1e-9, 1.0, 1e-7],  # tiny weights
        [0.1] * 10,  # many equal weights
        [3, 1, 1, 3, 2, 2],  # repeated values (ties between non-adjacent datasets)
        [0.7, 0.2, 0.1],
    ]
    for num in (2, 3, 5, 17, 40, 300):
        w = rng.random(num)
        cases.append((w / w.sum()).tolist())
        tiny = rng.random(num) * np.where(rng.random(num) < 0.3, 1e-6, 1.0)
        cases.append((tiny / tiny.sum()).tolist())
        rounded = np.round(rng.random(num), 1) + 0.1  # many exact ties
        cases.append((rounded / rounded.sum()).tolist())
    return cases


CASES = weight_cases()


def implementations():
    impls = [("python", lambda w, n: gi.blending_indices_python(np.asarray(w, np.float64), n))]
    if blend_native.load() is not None:
        impls.append(("native", lambda w, n: blend_native.blend(blend_native.load(), w, n)))
    impls.append(("public", gi.build_blending_indices))
    return impls


@pytest.mark.parametrize("name,impl", implementations(), ids=[n for n, _ in implementations()])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_blend_equals_the_reference_loop(name, impl, case):
    weights = CASES[case]
    size = 3000 if len(weights) < 100 else 1200
    ours = impl(weights, size)
    theirs = reference_blend(weights, size)
    assert ours[0].dtype == np.int16 and ours[1].dtype == np.int64
    assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])


def test_blend_sizes_zero_and_one():
    for size in (0, 1, 2):
        ours = gi.build_blending_indices([0.3, 0.7], size)
        theirs = reference_blend([0.3, 0.7], size)
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])


SIZE_CASES = [
    [3, 0, 5],
    [1],
    [0, 0, 4],
    [10, 10, 10],
    [1, 1000, 1],
    [7, 3, 11, 2, 0, 9],
    np.random.default_rng(5).integers(0, 200, 30).tolist(),
    np.random.default_rng(6).integers(1, 5, 60).tolist(),
]


@pytest.mark.parametrize("sizes", SIZE_CASES)
def test_exhaustive_equals_the_reference_loop(sizes):
    theirs = reference_exhaustive(sizes)
    arr = np.asarray(sizes, dtype=np.int64)
    w = arr / float(arr.sum())
    impls = [
        gi.build_exhaustive_blending_indices(sizes),
        gi.exhaustive_blending_indices_python(w, arr),
    ]
    lib = blend_native.load()
    if lib is not None:
        impls.append(blend_native.blend_exhaustive(lib, w, arr))
    for ours in impls:
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])
        assert np.bincount(ours[0], minlength=len(sizes)).tolist() == list(sizes)


def test_large_blend_native_equals_python():
    lib = blend_native.load()
    if lib is None:
        pytest.skip("no C compiler: only the Python loop is available")
    rng = np.random.default_rng(7)
    w = rng.random(50)
    w /= w.sum()
    a = blend_native.blend(lib, w, 200_000)
    b = gi.blending_indices_python(w, 200_000)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_disabled_native_falls_back(monkeypatch):
    monkeypatch.setenv("ENERGON_NO_NATIVE", "1")
    assert blend_native.load() is None
    ours = gi.build_blending_indices([0.2, 0.5, 0.3], 500)
    theirs = reference_blend([0.2, 0.5, 0.3], 500)
    assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])
