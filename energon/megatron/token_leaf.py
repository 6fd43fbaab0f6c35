"""A loader leaf over GPT windows: token datasets in energon's pipeline.

``TokenLeaf`` exposes a ``GPTTokenDataset`` or ``BlendedTokenDataset`` through the leaf interface the
pipeline uses (``__len__``, ``shard_starts``, ``excluded``, ``load``, ``fingerprint``, ``config``,
``builder``, ``root``, ``split_part``; wrapped in a ``metadataset.resolve.Source``), so token data gets the loader's guarantees: logical-stream order, exact and elastic
save/restore, blending with other leaves. Index ``k`` of the leaf is window ``k`` of the dataset
in megatron-core's served order (already shuffled by the shuffle index); with an unshuffled
energon pipeline the stream therefore reads exactly megatron's sequence.

The leaf pickles as paths and numbers; index files are memory-mapped in the worker on first use.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.errors import SampleException
from energon.megatron.gpt_dataset import (
    BlendedTokenDataset,
    GPTConfig,
    GPTTokenDataset,
    build_gpt_datasets,
)
from energon.megatron.gpt_indices import SPLIT_NAMES


class TokenSampleError(SampleException):
    """A window could not be read (missing or corrupt ``.bin``/``.idx`` or cache file)."""


@dataclasses.dataclass(frozen=True)
class TokenSampleBuilder:
    """The ``builder`` the loader inspects: samples are plain dicts, so no sample type."""

    sample_type: Any = None
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        return {"type": "megatron_gpt_dict"}


class TokenLeaf:
    """One GPT (or blended GPT) dataset as a leaf; samples are Megatron batch dicts.

    Each sample is ``{"tokens", "labels", "loss_mask", "position_ids"[, "attention_mask"],
    "__key__", "__restore_key__", "__subflavors__"}`` (plus ``dataset_id`` for a blend); the
    default task encoder stacks them into ``[B, S]`` tensors.
    ``shard_size`` cuts the index space into pieces of that many windows (what the loader's
    slicing treats as shards); by default the whole dataset is one piece.
    """

    def __init__(
        self,
        dataset: GPTTokenDataset | BlendedTokenDataset,
        *,
        name: str | None = None,
        subflavors: dict[str, Any] | None = None,
        shard_size: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.name = name or _dataset_name(dataset)
        self.builder = TokenSampleBuilder(subflavors=dict(subflavors or {}))
        self.subflavors = self.builder.subflavors
        self.excluded: frozenset[int] = frozenset()
        self.root = self.name
        self.split_part = dataset.split
        self._len = len(dataset)
        step = shard_size or max(self._len, 1)
        self._shard_starts = list(range(0, max(self._len, 1), step))

    @classmethod
    def from_blend(
        cls,
        blend: list[str] | str,
        *,
        config: GPTConfig,
        split: str = "train",
        num_samples: int | None = None,
        **kwargs: Any,
    ) -> TokenLeaf:
        """Leaf for ``--data-path``-style tokens (``"w1 p1 w2 p2"`` or ``"p1"``) and one split."""
        # other splits get 0 samples: their datasets are described but never built (lazy)
        sizes: list[int | None] = [0, 0, 0]
        sizes[SPLIT_NAMES.index(split)] = num_samples
        dataset = build_gpt_datasets(blend, sizes, config)[SPLIT_NAMES.index(split)]
        if dataset is None:
            raise ValueError(f"split {split!r} is empty with split={config.split!r}")
        return cls(dataset, **kwargs)

    def __len__(self) -> int:
        return self._len

    @property
    def shard_starts(self) -> list[int]:
        return self._shard_starts

    @property
    def remote(self) -> bool:
        """Token files in object storage: windows a stream will read are hinted to the prefetcher."""
        return bool(getattr(self.dataset, "remote", False))

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        """Hint that windows ``[first, end)`` will be read soon: their byte ranges are fetched on
        background threads (each window is one to a few ranges of the ``.bin``)."""
        from energon.source.shard_reader import shard_reader

        reader = shard_reader()
        for k in range(first, min(end, self._len)):
            for url, start, stop in self.dataset.byte_spans(k):
                reader.prefetch_bytes(url, start, stop, later)

    def load(self, index: int, decoder: Any, restore_key: tuple) -> dict[str, Any]:
        """Window ``index`` as Megatron's batch dict (``decoder`` is unused: tokens need none)."""
        try:
            sample = self.dataset[index]
        except (OSError, ValueError, IndexError) as e:
            raise TokenSampleError(f"{self.name} window {index}: {type(e).__name__}: {e}") from e
        sample["__key__"] = f"{self.name}/{index}"
        sample["__restore_key__"] = restore_key
        sample["__subflavors__"] = dict(self.subflavors)
        return sample

    def fingerprint(self) -> dict[str, Any]:
        """The index hash covers prefixes, split, seed, lengths, tokenizer and sample counts."""
        return {
            "path": self.name,
            "split_part": self.split_part,
            "megatron": type(self.dataset).__name__,
            "hash": self.dataset.unique_description_hash,
            "len": self._len,
        }

    def config(self) -> dict[str, Any]:
        return {
            **self.fingerprint(),
            "name": self.name,
            "sequence_length": self.dataset.config.sequence_length,
            "sample": self.builder.config(),
        }


def _dataset_name(dataset: GPTTokenDataset | BlendedTokenDataset) -> str:
    if isinstance(dataset, BlendedTokenDataset):
        return f"blend-{dataset.unique_description_hash[:8]}-{dataset.split}"
    return f"{dataset.dataset_path or 'mock'}-{dataset.split}"


# --------------------------------------------------------------------------------------------------
# task encoders that blend token datasets with other data

_BOOKKEEPING_KEYS = ("__key__", "__restore_key__", "__subflavors__")  # what token samples carry


def is_token_sample(sample: Any) -> bool:
    """True for a sample of a token leaf (a Megatron batch dict), False for e.g. a ``Sample``."""
    return isinstance(sample, dict) and "tokens" in sample and "labels" in sample


def token_sample(token_ids: Any, config: GPTConfig, *, like: Any = None) -> dict[str, Any]:
    """Megatron's batch dict for ``token_ids`` (any length), shaped exactly like a token leaf's samples.

    The ids are cut to ``sequence_length + add_extra_token`` or padded with ``config.pad_token``, then
    turned into ``tokens``/``labels``/``loss_mask``/``position_ids``[/``attention_mask``] with the same
    rules as windows of a ``.bin/.idx`` prefix (padding is loss-masked). ``like`` (the sample being
    encoded: a ``Sample`` or a dict) passes on ``__key__``, ``__restore_key__`` and ``__subflavors__``,
    so the result batches together with token samples and stays restorable. Use it in
    ``encode_sample`` to turn multimodal/text samples into the token samples' format.
    """
    import numpy as np

    from energon.megatron.gpt_dataset import megatron_sample

    want = config.sequence_length + config.extra
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)[:want]
    document = len(ids)  # one sample is one document
    if len(ids) < want:
        ids = np.concatenate([ids, np.full(want - len(ids), config.pad_token, np.int64)])
    sample = megatron_sample(ids, [document], config)
    if like is not None:
        for key in _BOOKKEEPING_KEYS:
            value = like.get(key) if isinstance(like, dict) else getattr(like, key, None)
            sample[key] = dict(value or {}) if key == "__subflavors__" else value
    return sample
