"""Offline start-up work: the index cache (``prepare-cache``) and the sequences file (``build-sequences``).

At scale, start-up cost is what every rank repeats: reading one ``.idx`` header per prefix, building
or checking index arrays, waiting on rank 0. Both are moved offline here. ``prepare_cache`` builds
every index a future run needs (its sample counts follow from the world size and global batch size),
``build_sequences`` writes the per-prefix sequence/document counts into one JSON file in
megatron-core's ``--per-dataset-sequences-path`` format. A run with both reads neither headers nor
builds anything; nothing it does grows with the number of ranks.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from energon import atomic
from energon.megatron.gpt_dataset import (
    BlendedTokenDataset,
    GPTConfig,
    GPTTokenDataset,
    build_gpt_datasets,
    parse_data_path,
)
from energon.megatron.indexed import HEADER_SIZE, INDEX_MAGIC, IndexedFormatError, idx_path


def split_sample_counts(
    *,
    global_batch_size: int,
    train_iters: int | None = None,
    train_samples: int | None = None,
    eval_iters: int = 0,
    eval_interval: int | None = None,
) -> list[int | None]:
    """[train, valid, test] samples Megatron-LM requests (``get_train_valid_test_num_samples``)."""
    if (train_iters is None) == (train_samples is None):
        raise ValueError("give exactly one of train_iters and train_samples")
    train = train_samples if train_samples is not None else train_iters * global_batch_size
    iters = train_iters if train_iters is not None else -(-train_samples // global_batch_size)
    interval = eval_interval or max(iters, 1)
    valid = (iters // interval + 1) * eval_iters * global_batch_size
    test = eval_iters * global_batch_size
    return [train, valid, test]


def read_sequence_counts(prefix: str) -> list[int]:
    """``[num_sequences, document-index length]`` from an ``.idx`` header (34 bytes read)."""
    path = idx_path(prefix)
    with open(path, "rb") as f:
        header = f.read(HEADER_SIZE)
    if len(header) < HEADER_SIZE or header[:9] != INDEX_MAGIC:
        raise IndexedFormatError(f"{path}: not a Megatron MMIDIDX index (bad or short header)")
    n, d = struct.unpack_from("<QQ", header, 18)
    return [int(n), int(d)]


def build_sequences(prefixes: Sequence[str], output: str) -> dict[str, list[int]]:
    """Write ``{prefix: [N, D]}`` for every prefix (keys exactly as given in the data args)."""
    counts = {p: read_sequence_counts(p) for p in dict.fromkeys(prefixes)}
    with atomic.replacing(output) as tmp, open(tmp, "w") as f:
        json.dump(counts, f, indent=1)
    return counts


def prefixes_of(blend: Sequence[str] | str | None) -> list[str]:
    if blend is None:
        return []
    return parse_data_path(blend)[0]


def prepare_cache(
    blend: Sequence[str] | str | None,
    sizes: Sequence[int | None],
    config: GPTConfig,
    *,
    blend_per_split: Sequence[Sequence[str] | str | None] | None = None,
) -> list[dict[str, Any]]:
    """Build (or confirm) every index array of the run into ``config.path_to_cache``.

    Returns one entry per dataset: class, split, length, hash, and whether it was already cached.
    """
    if config.path_to_cache is None:
        raise ValueError("prepare_cache needs config.path_to_cache")
    if config.mock:
        raise ValueError("mock data needs no cache")
    report: list[dict[str, Any]] = []
    for dataset in build_gpt_datasets(blend, sizes, config, blend_per_split=blend_per_split):
        if dataset is not None:
            _build_all(dataset, report)
    return report


def _build_all(
    dataset: GPTTokenDataset | BlendedTokenDataset, report: list[dict[str, Any]]
) -> None:
    if isinstance(dataset, BlendedTokenDataset):
        for child in dataset.datasets:
            _build_all(child, report)
    was_cached = dataset.cache_present
    dataset.indices()
    report.append(
        {
            "class": type(dataset).__name__,
            "split": dataset.split,
            "path": getattr(dataset, "dataset_path", None),
            "len": len(dataset),
            "hash": dataset.unique_description_hash,
            "cached_before": was_cached,
        }
    )
