"""The token leaf: GPT windows of Megatron ``.bin/.idx`` token files in energon's pipeline.

``TokenLeaf`` exposes a ``GPTTokenDataset`` or ``BlendedTokenDataset`` (built by
:mod:`energon.megatron`) as a :class:`~energon.source.leaf.LeafDataset`, so token data gets the
loader's guarantees: logical-stream order, exact and elastic save/restore, blending with other
leaves. Index ``k`` of the leaf is window ``k`` of the dataset in megatron-core's served order
(already shuffled by the shuffle index); with an unshuffled energon pipeline the stream therefore
reads exactly megatron's sequence.

The leaf pickles as paths and numbers; index files are memory-mapped in the worker on first use.
Remote token files are read through the process's shard reader, so the windows a stream hints are
prefetched in the background.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.errors import TokenSampleError
from energon.megatron.gpt_dataset import (
    BlendedTokenDataset,
    GPTConfig,
    GPTTokenDataset,
    build_gpt_datasets,
)
from energon.megatron.gpt_indices import SPLIT_NAMES
from energon.source.shard_reader import shard_reader

#: energon split names -> megatron-core's
MEGATRON_SPLITS = {"train": "train", "val": "valid", "valid": "valid", "test": "test"}


@dataclasses.dataclass(frozen=True)
class TokenSampleBuilder:
    """The ``builder`` the loader inspects: samples are plain dicts, so no sample type."""

    sample_type: Any = None
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)
    kind: str = "tokens"

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

    kind = "tokens"

    def __init__(
        self,
        dataset: GPTTokenDataset | BlendedTokenDataset,
        *,
        name: str | None = None,
        subflavors: dict[str, Any] | None = None,
        shard_size: int | None = None,
    ) -> None:
        self.dataset = dataset
        dataset.use_range_reader(_read_token_bytes)
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
    def open(
        cls,
        prefix: str,
        *,
        split_part: str,
        config: GPTConfig,
        subflavors: dict[str, Any] | None = None,
    ) -> TokenLeaf:
        """The windows of one ``<prefix>.bin/.idx`` in energon's split ``split_part`` (train, val
        or test: the parts of ``config.split``)."""
        if split_part not in MEGATRON_SPLITS:
            raise ValueError(f"token datasets have splits train, val and test, not {split_part!r}")
        return cls.from_blend(
            [prefix], config=config, split=MEGATRON_SPLITS[split_part], subflavors=subflavors
        )

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
        return self.dataset.remote

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        """Hint that windows ``[first, end)`` will be read soon: their byte ranges are fetched on
        background threads (each window is one to a few ranges of the ``.bin``)."""
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


def _read_token_bytes(url: str, start: int, end: int) -> bytes:
    """How token datasets of a leaf read remote ``.bin`` ranges: through the shard reader's chunk
    cache (exact ranges, no read-ahead), where prefetched windows wait."""
    return shard_reader().read(url, start, end)


def _dataset_name(dataset: GPTTokenDataset | BlendedTokenDataset) -> str:
    if isinstance(dataset, BlendedTokenDataset):
        return f"blend-{dataset.unique_description_hash[:8]}-{dataset.split}"
    return f"{dataset.dataset_path or 'mock'}-{dataset.split}"
