"""Blend indices as a tiny C loop, compiled on first use when a C compiler is there (else None).

megatron-core's blend rule is inherently sequential (each choice changes the counts the next one
compares), O(samples x datasets): in Python it costs microseconds per sample. This module holds a
20-line C version of exactly the same float64 arithmetic, built with ``cc`` the first time it is
needed (:mod:`energon.native`). Nothing here is required: without a compiler (or with
``ENERGON_NO_NATIVE=1``) ``load()`` returns None and ``gpt_indices`` uses its Python loop.

Bit-equality with the Python loop (and with megatron-core's C++ helper) rests on: IEEE float64
throughout, ``-ffp-contract=off`` (no fused multiply-add, which would round ``w*x - c`` once instead
of twice), no ``-ffast-math``, the same ``max(i, 1)`` and the same strict ``>`` (first max wins).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from energon import native

SOURCE = r"""
#include <stdint.h>

/* weights[k] * max(i, 1) - counts[k]; the first largest wins (strict >), as megatron-core does. */
void energon_blend(const double *weights, int64_t num_datasets, int64_t size,
                   int16_t *dataset_index, int64_t *sample_index, int64_t *counts) {
    for (int64_t i = 0; i < size; ++i) {
        double x = (double)i > 1.0 ? (double)i : 1.0;
        int64_t best_k = 0;
        double best = weights[0] * x - (double)counts[0];
        for (int64_t k = 1; k < num_datasets; ++k) {
            double error = weights[k] * x - (double)counts[k];
            if (error > best) {
                best = error;
                best_k = k;
            }
        }
        dataset_index[i] = (int16_t)best_k;
        sample_index[i] = counts[best_k];
        counts[best_k] += 1;
    }
}

/* The same over the datasets that still have samples left (sizes[k] > counts[k]). */
void energon_blend_exhaustive(const double *weights, const int64_t *sizes, int64_t num_datasets,
                              int64_t total, int16_t *dataset_index, int64_t *sample_index,
                              int64_t *counts) {
    for (int64_t i = 0; i < total; ++i) {
        double x = (double)i > 1.0 ? (double)i : 1.0;
        int64_t best_k = -1;
        double best = 0.0;
        for (int64_t k = 0; k < num_datasets; ++k) {
            if (counts[k] >= sizes[k]) continue;
            double error = weights[k] * x - (double)counts[k];
            if (best_k < 0 || error > best) {
                best = error;
                best_k = k;
            }
        }
        dataset_index[i] = (int16_t)best_k;
        sample_index[i] = counts[best_k];
        counts[best_k] += 1;
    }
}
"""

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def load() -> Any:
    """The loaded library (``ctypes.CDLL``), or None where it cannot be built or is disabled."""
    if native.disabled():
        return None
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]
        lib = native.load_library("blend", SOURCE)
        if lib is not None:
            p = ctypes.c_void_p
            i64 = ctypes.c_int64
            lib.energon_blend.argtypes = [p, i64, i64, p, p, p]
            lib.energon_blend.restype = None
            lib.energon_blend_exhaustive.argtypes = [p, p, i64, i64, p, p, p]
            lib.energon_blend_exhaustive.restype = None
        _loaded["lib"] = lib
        return lib


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def blend(lib: Any, weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.ascontiguousarray(weights, dtype=np.float64)
    counts = np.zeros(len(w), dtype=np.int64)
    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    if size > 0:
        lib.energon_blend(
            _ptr(w), len(w), size, _ptr(dataset_index), _ptr(sample_index), _ptr(counts)
        )
    return dataset_index, sample_index


def blend_exhaustive(
    lib: Any, weights: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    w = np.ascontiguousarray(weights, dtype=np.float64)
    sz = np.ascontiguousarray(sizes, dtype=np.int64)
    total = int(sz.sum())
    counts = np.zeros(len(w), dtype=np.int64)
    dataset_index = np.zeros(total, dtype=np.int16)
    sample_index = np.zeros(total, dtype=np.int64)
    if total > 0:
        lib.energon_blend_exhaustive(
            _ptr(w), _ptr(sz), len(w), total, _ptr(dataset_index), _ptr(sample_index), _ptr(counts)
        )
    return dataset_index, sample_index
