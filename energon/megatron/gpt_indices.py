"""GPT sample indices and blend indices, array-equal to megatron-core's ``GPTDataset``/``BlendedDataset``.

A GPT dataset turns variable-length token sequences into fixed windows of ``S + x`` tokens
(``x = add_extra_token_to_sequence``: consecutive windows overlap by ``x`` so that labels are the
tokens shifted by one). Three arrays describe it:

- **document index** (int32): the split's sequence ids, repeated for every epoch and shuffled;
- **sample index** (``[n+1, 2]``, int32 or int64): where window k starts, as (position in the document
  index, token offset into that sequence);
- **shuffle index** (uint32 or int64): the order in which windows are served.

One ``numpy.random.RandomState(seed)`` is consumed in exactly megatron-core's order (document index,
then shuffle index), so that the arrays, and therefore the data order of a resumed run, are identical.
The generator is local; no global RNG is touched. Everything here is pure numpy (the sample index is
vectorized, no C++ helper is needed).

The cache file names are ``<md5>-<Class>-<split>-<array>.npy`` where the md5 is taken over the same
JSON description megatron-core writes, so a cache built by either tool is a hit for the other.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from energon.megatron import blend_native

SPLIT_NAMES = ("train", "valid", "test")
SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
INT32_MAX = np.iinfo(np.int32).max
UINT32_MAX = np.iinfo(np.uint32).max

# --------------------------------------------------------------------------------------------------
# splits


def normalize_weights(weights: Sequence[float]) -> list[float]:
    """Weights divided by their sum, as Python floats (megatron computes this in float64 numpy)."""
    w = np.asarray(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def parse_split(split: str) -> list[float]:
    """``"969, 30, 1"`` -> normalized ``[train, valid, test]`` fractions (missing entries are 0)."""
    values = [float(v) for v in re.findall(r"[.0-9]+", split)]
    if len(values) > len(SPLIT_NAMES):
        raise ValueError(f"split {split!r} has more than {len(SPLIT_NAMES)} entries")
    values += [0.0] * (len(SPLIT_NAMES) - len(values))
    if sum(values) <= 0:
        raise ValueError(f"split {split!r} has no positive entry")
    return normalize_weights(values)


def split_matrix(fractions: Sequence[float]) -> list[tuple[float, float] | None]:
    """Book-ends ``(lo, hi)`` of each split in [0, 1]; a zero-width split is ``None``.

    The cumulative sums start at the integer 0 and are added left to right, exactly as megatron does,
    because the book-ends are part of the cache hash.
    """
    ends: list[float] = [0]
    for f in fractions:
        ends.append(ends[-1] + f)
    return [None if hi - lo == 0 else (lo, hi) for lo, hi in zip(ends[:-1], ends[1:])]


def split_sequence_ids(num_sequences: int, bookend: tuple[float, float]) -> np.ndarray:
    """The sequence ids (int32) a split covers: ``[round(lo*N), round(hi*N))``."""
    lo = int(round(bookend[0] * float(num_sequences)))
    hi = int(round(bookend[1] * float(num_sequences)))
    return np.arange(lo, hi, dtype=np.int32)


# --------------------------------------------------------------------------------------------------
# GPT indices


def num_epochs_needed(
    tokens_per_epoch: int, num_samples: int | None, sequence_length: int, extra: int
) -> int:
    """Smallest E >= 1 with ``E * tokens_per_epoch >= num_samples * S + extra`` (1 if unbounded)."""
    if num_samples is None:
        return 1
    needed = num_samples * sequence_length + extra
    if tokens_per_epoch <= 0:
        raise ValueError("the split holds no tokens: cannot build any sample")
    return max(1, -(-needed // tokens_per_epoch))


def separate_final_epoch(
    tokens_per_epoch: int,
    num_epochs: int,
    num_samples: int | None,
    sequence_length: int,
    extra: int,
) -> tuple[bool, int]:
    """Whether the last epoch is shuffled apart (it is mostly unused), and the samples before it."""
    if num_epochs == 1 or num_samples is None:
        return False, 0
    sans_final = ((num_epochs - 1) * tokens_per_epoch - extra) // sequence_length
    from_final = num_samples - sans_final
    per_epoch = (tokens_per_epoch - extra) // sequence_length
    return from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch), sans_final


def build_document_index(
    sequence_ids: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate: bool
) -> np.ndarray:
    """The split's ids repeated ``num_epochs`` times and shuffled (the final epoch apart if separate)."""
    if separate and num_epochs > 1:
        first = build_document_index(sequence_ids, num_epochs - 1, rng, False)
        last = build_document_index(sequence_ids, 1, rng, False)
        return np.concatenate((first, last))
    index = np.tile(np.asarray(sequence_ids, dtype=np.int32), num_epochs)
    rng.shuffle(index)
    return index


def num_gpt_samples(
    tokens_total: int, sequence_length: int, extra: int, drop_last_partial: bool
) -> int:
    """Number of windows; the rounding up uses single precision, as megatron's C++ helper does."""
    if drop_last_partial:
        return (tokens_total - extra) // sequence_length
    return int(math.ceil(np.float32(tokens_total - extra) / np.float32(sequence_length)))


def build_sample_index(
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
    sequence_length: int,
    num_samples: int,
    extra: int,
) -> np.ndarray:
    """Start of every window as (position in ``document_index``, token offset); ``[n+1, 2]``.

    Window k starts at token ``k*S`` of the concatenated (shuffled) documents. Its row names the
    document in which the previous window's last needed token (``k*S + extra - 1``) falls, so a
    window that ends exactly on a document boundary starts the next one at that document's end,
    matching megatron's walk. Rows past the data are clamped to the last document.
    """
    widest = max(len(document_index), int(sequence_lengths.max()) if len(sequence_lengths) else 0)
    dtype = np.int32 if widest <= INT32_MAX else np.int64
    lengths = np.asarray(sequence_lengths)[document_index].astype(np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    positions = np.arange(num_samples + 1, dtype=np.int64) * sequence_length
    doc = np.searchsorted(starts, positions + extra, side="left") - 1
    past_end = doc >= len(lengths)
    doc = np.minimum(doc, len(lengths) - 1)
    offset = positions - starts[doc]
    if past_end.any():
        offset[past_end] = lengths[-1] - extra
    out = np.empty((num_samples + 1, 2), dtype=dtype)
    out[:, 0] = doc
    out[:, 1] = offset
    out[0] = (0, 0)
    return out


def build_shuffle_index(
    num_samples: int, total_size: int, rng: np.random.RandomState
) -> np.ndarray:
    """A shuffled ``arange(num_samples)``, then a separately shuffled ``arange(num_samples, total)``."""
    dtype = np.uint32 if total_size < UINT32_MAX - 1 else np.int64
    first = np.arange(0, num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_gpt_indices(
    sequence_lengths: np.ndarray,
    sequence_ids: np.ndarray,
    *,
    num_samples: int | None,
    sequence_length: int,
    seed: int,
    add_extra_token: bool = True,
    drop_last_partial: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document index, sample index, shuffle index) exactly as megatron-core's GPTDataset builds them."""
    extra = int(bool(add_extra_token))
    tokens_per_epoch = int(np.sum(np.asarray(sequence_lengths)[sequence_ids], dtype=np.int64))
    epochs = num_epochs_needed(tokens_per_epoch, num_samples, sequence_length, extra)
    separate, sans_final = separate_final_epoch(
        tokens_per_epoch, epochs, num_samples, sequence_length, extra
    )
    rng = np.random.RandomState(seed)  # local: megatron's exact stream, never the global one
    document_index = build_document_index(sequence_ids, epochs, rng, separate)
    n = num_gpt_samples(epochs * tokens_per_epoch, sequence_length, extra, drop_last_partial)
    sample_index = build_sample_index(sequence_lengths, document_index, sequence_length, n, extra)
    shuffle_index = build_shuffle_index(sans_final if separate else n, n, rng)
    return document_index, sample_index, shuffle_index


def gpt_length(
    tokens_per_epoch: int,
    num_samples: int | None,
    sequence_length: int,
    add_extra_token: bool = True,
    drop_last_partial: bool = True,
) -> int:
    """``len(GPTDataset)`` without building anything (what deferred mmap needs)."""
    extra = int(bool(add_extra_token))
    epochs = num_epochs_needed(tokens_per_epoch, num_samples, sequence_length, extra)
    return num_gpt_samples(epochs * tokens_per_epoch, sequence_length, extra, drop_last_partial)


# --------------------------------------------------------------------------------------------------
# blending


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset index int16, sample-in-dataset index int64) of a weighted blend of ``size`` samples.

    Deterministic and without RNG: sample i goes to the dataset furthest behind its share,
    ``argmax_d(w_d * max(i, 1) - count_d)`` in float64 (ties to the lowest d). The rule is
    sequential, so it runs as a small C loop when a C compiler is available (``blend_native``;
    about as fast as megatron-core's helper) and as a Python loop otherwise; both are array-equal.
    """
    w = np.asarray(weights, dtype=np.float64)
    size = int(size)
    if len(w) == 0:
        raise ValueError("a blend needs at least one weight")
    lib = blend_native.load()
    if lib is not None:
        return blend_native.blend(lib, w, size)
    return blending_indices_python(w, size)


def build_exhaustive_blending_indices(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Blend that takes exactly ``sizes[d]`` samples of every dataset, interleaved by their shares."""
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    total = int(sizes_arr.sum())
    w = sizes_arr / float(total)
    lib = blend_native.load()
    if lib is not None:
        return blend_native.blend_exhaustive(lib, w, sizes_arr)
    return exhaustive_blending_indices_python(w, sizes_arr)


# up to this many datasets a plain-float Python loop beats one numpy call per sample
_SCALAR_MAX_DATASETS = 24


def blending_indices_python(w: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The pure-Python fallback of ``build_blending_indices`` (same float64 operations)."""
    num = len(w)
    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    if num <= _SCALAR_MAX_DATASETS:
        # Python floats are IEEE float64: w*x rounds, then - count rounds, exactly as numpy/C++
        weights = [float(v) for v in w]
        counts = [0.0] * num
        rest = range(1, num)
        chosen = [0] * size
        for i in range(size):
            x = float(i) if i > 1 else 1.0
            best_k = 0
            best = weights[0] * x - counts[0]
            for k in rest:
                error = weights[k] * x - counts[k]
                if error > best:
                    best = error
                    best_k = k
            chosen[i] = best_k
            counts[best_k] += 1.0
        dataset_index[:] = chosen
        _fill_sample_index(dataset_index, sample_index, num)
        return dataset_index, sample_index
    counts_f = np.zeros(num, dtype=np.float64)
    buf = np.empty(num, dtype=np.float64)
    for i in range(size):
        np.multiply(w, float(i) if i > 1 else 1.0, out=buf)
        np.subtract(buf, counts_f, out=buf)
        d = int(buf.argmax())
        dataset_index[i] = d
        counts_f[d] += 1.0
    _fill_sample_index(dataset_index, sample_index, num)
    return dataset_index, sample_index


def exhaustive_blending_indices_python(
    w: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The pure-Python fallback of ``build_exhaustive_blending_indices``."""
    num = len(w)
    total = int(np.asarray(sizes).sum())
    weights = [float(v) for v in w]
    limits = [int(v) for v in sizes]
    counts = [0] * num
    live = [k for k in range(num) if limits[k] > 0]
    chosen = [0] * total
    for i in range(total):
        x = float(i) if i > 1 else 1.0
        best_k = -1
        best = 0.0
        for k in live:
            error = weights[k] * x - float(counts[k])
            if best_k < 0 or error > best:
                best = error
                best_k = k
        chosen[i] = best_k
        counts[best_k] += 1
        if counts[best_k] >= limits[best_k]:
            live.remove(best_k)
    dataset_index = np.asarray(chosen, dtype=np.int16)
    sample_index = np.zeros(total, dtype=np.int64)
    _fill_sample_index(dataset_index, sample_index, num)
    return dataset_index, sample_index


def _fill_sample_index(dataset_index: np.ndarray, sample_index: np.ndarray, num: int) -> None:
    """``sample_index[i]`` = how often ``dataset_index[i]`` occurred before i (a running count)."""
    if len(dataset_index) == 0:
        return
    order = np.argsort(dataset_index, kind="stable")
    ids = dataset_index[order].astype(np.int64)
    starts = np.searchsorted(ids, np.arange(num, dtype=np.int64))
    sample_index[order] = np.arange(len(ids), dtype=np.int64) - starts[ids]


def samples_per_dataset(
    normalized_weights: Sequence[float], split_sizes: Sequence[int | None], surplus: float = 0.0
) -> list[list[int | None]]:
    """``ceil(ceil(size * w) * (1 + surplus))`` per dataset and split (mid-level dataset sizes)."""
    return [
        [
            None if size is None else int(math.ceil(math.ceil(size * w) * (1 + surplus)))
            for size in split_sizes
        ]
        for w in normalized_weights
    ]


# --------------------------------------------------------------------------------------------------
# cache names


def description(unique_identifiers: Mapping[str, Any]) -> str:
    """The JSON description megatron-core writes to ``description.txt`` and hashes."""
    return json.dumps(unique_identifiers, indent=4, default=_identifiers_of)


def description_hash(unique_identifiers: Mapping[str, Any]) -> str:
    return hashlib.md5(description(unique_identifiers).encode("utf-8")).hexdigest()


def _identifiers_of(obj: Any) -> Any:
    identifiers = getattr(obj, "unique_identifiers", None)
    if identifiers is None:
        raise TypeError(f"{type(obj).__name__} has no unique_identifiers for the cache description")
    return identifiers


def gpt_identifiers(
    *,
    class_name: str,
    dataset_path: str | None,
    num_samples: int | None,
    split: str,
    random_seed: int,
    sequence_length: int,
    split_string: str | None,
    split_matrix_: Sequence[Any] | None,
    tokenizer: Any,
) -> OrderedDict:
    """The ordered identifiers megatron-core hashes for a GPTDataset (the key of its cache files)."""
    ui: OrderedDict = OrderedDict()
    ui["class"] = class_name
    ui["dataset_path"] = dataset_path
    ui["num_samples"] = num_samples
    ui["index_split"] = split
    ui["random_seed"] = random_seed
    ui["sequence_length"] = sequence_length
    ui["split"] = split_string
    ui["split_matrix"] = None if split_matrix_ is None else list(split_matrix_)
    ui["tokenizer"] = tokenizer
    return ui


def blended_identifiers(
    datasets: Sequence[Mapping[str, Any]], split: str, weights: Sequence[Any], size: int | None
) -> OrderedDict:
    """The ordered identifiers megatron-core hashes for a BlendedDataset."""
    ui: OrderedDict = OrderedDict()
    ui["class"] = "BlendedDataset"
    ui["datasets"] = list(datasets)
    ui["split"] = split
    ui["weights"] = list(weights)
    ui["size"] = size
    return ui


GPT_ARRAYS = ("document_index", "sample_index", "shuffle_index")
BLEND_ARRAYS = ("dataset_index", "dataset_sample_index")


def cache_file_names(digest: str, class_name: str, split: str, arrays: Sequence[str]) -> dict:
    """``{name: "<md5>-<Class>-<split>-<name>.npy"}`` plus ``description`` -> ``...-description.txt``."""
    base = f"{digest}-{class_name}-{split}"
    names = {name: f"{base}-{name}.npy" for name in arrays}
    names["description"] = f"{base}-description.txt"
    return names
