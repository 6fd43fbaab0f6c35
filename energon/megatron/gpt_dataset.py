"""GPT token datasets (map-style) over ``.bin/.idx`` prefixes, compatible with megatron-core.

``GPTTokenDataset`` serves the fixed-length windows of one prefix and split; ``BlendedTokenDataset``
mixes several by weight; ``build_gpt_datasets`` turns a blend (``[w1, p1, w2, p2, ...]``) and the
per-split sample counts into the train/valid/test datasets exactly as megatron-core's
``BlendedMegatronDatasetBuilder`` does, so the sample order and the cache files are the same.

Start-up is lazy by construction: a constructor computes only cache file *names* (a hash of the
config); index arrays are memory-mapped on first access, and built (then saved atomically) only if
they are missing. With a prepared cache (``energon prepare-cache``) and a sequences file
(``energon build-sequences``) no process builds anything, reads any ``.idx`` header or waits on a
barrier; each opens exactly the files of the samples it touches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from energon import atomic, epath
from energon.megatron import gpt_indices as gi
from energon.megatron.indexed import IndexedTokens, RangeReader, bin_path
from energon.remote.cache import cache_dir


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """What shapes the samples (mirrors megatron-core's ``GPTDatasetConfig`` fields of the same name).

    ``tokenizer`` is what megatron hashes for the tokenizer: an object with ``unique_identifiers``
    or a plain mapping (e.g. ``{"class": "HuggingFaceTokenizer", "tokenizer_path": [...]}``); use
    the same as the megatron run to share its cache.
    """

    sequence_length: int
    random_seed: int = 1234
    split: str | None = "969, 30, 1"
    tokenizer: Any = None
    eod_token: int | None = None
    pad_token: int = -1
    add_extra_token_to_sequence: bool = True
    drop_last_partial_validation_sequence: bool = True
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    create_attention_mask: bool = True
    path_to_cache: str | None = None
    mid_level_dataset_surplus: float = 0.005
    sequences_path: str | None = None
    mock: bool = False
    mock_vocab_size: int = 100
    inter_document_masking: bool = False

    @property
    def split_matrix(self) -> list[tuple[float, float] | None] | None:
        """Book-ends of the splits; None for per-split blends (megatron hashes it as null)."""
        if self.split is None:
            return None
        return gi.split_matrix(gi.parse_split(self.split))

    @property
    def extra(self) -> int:
        return int(bool(self.add_extra_token_to_sequence))


class MockTokens:
    """megatron-core's mock corpus: 100,000 documents, document i counts 1..len-1 then EOD.

    No I/O at all: the throughput ceiling of the GPT path. Lengths come from a local generator.
    """

    size = 100_000
    max_sequence_length = 4096
    remote = False

    def __init__(self, vocab_size: int = 100, eod_token: int = 0) -> None:
        self.vocab_size = vocab_size
        self.eod_token = eod_token
        rng = np.random.default_rng(seed=0)
        self.sequence_lengths = rng.integers(
            1, self.max_sequence_length, size=self.size, dtype=np.int32
        )
        self.prefix = None

    def use_range_reader(self, read_range: RangeReader) -> None:
        """Nothing is read: the corpus is computed."""

    def __len__(self) -> int:
        return self.size

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        n = int(self.sequence_lengths[index])
        doc = np.empty(n, dtype=np.int64)
        doc[:-1] = (np.arange(1, n)) % self.vocab_size
        doc[-1] = self.eod_token
        if length is None:
            length = n - offset
        return doc[offset : offset + length]


def load_sequences_file(path: str | None) -> dict[str, list[int]]:
    """``{prefix: [num_sequences, num_documents + 1]}`` written by ``energon build-sequences``."""
    if path is None:
        return {}
    with open(path) as f:
        return json.load(f)


def open_prefix(prefix: str, sequences: Mapping[str, Sequence[int]] | None = None) -> IndexedTokens:
    """A lazy reader; with an entry in ``sequences`` even its header is never read for counting."""
    known = (sequences or {}).get(prefix)
    if known is None:
        return IndexedTokens(prefix)
    return IndexedTokens(prefix, num_sequences=int(known[0]), num_documents_plus_one=int(known[1]))


def _save_npy_atomically(path: str, array: np.ndarray) -> None:
    """Concurrent builders of the same cache never expose a half-written file (no barrier needed)."""
    with atomic.replacing(path, suffix=".npy") as tmp:
        np.save(tmp, array, allow_pickle=True)


def _write_text_atomically(path: str, text: str) -> None:
    atomic.atomic_write_text(path, text)


def npy_shape(path: str) -> tuple[int, ...]:
    """Shape from a ``.npy`` header (reads ~128 bytes, not the array)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, _, _ = read_header(f)
    return shape


class _CachedArrays:
    """Named ``.npy`` index files: memory-mapped on first use, built by ``build()`` if missing."""

    def __init__(self, directory: str | None, names: dict[str, str], arrays: Sequence[str]) -> None:
        self.directory = directory
        self.names = names
        self.array_names = tuple(arrays)
        self._arrays: dict[str, np.ndarray] | None = None

    def path(self, name: str) -> str | None:
        return None if self.directory is None else os.path.join(self.directory, self.names[name])

    def present(self) -> bool:
        if self.directory is None:
            return False
        return all(os.path.isfile(self.path(n)) for n in (*self.array_names, "description"))

    def get(self, build: Any, description: str) -> dict[str, np.ndarray]:
        if self._arrays is None:
            if self.present():
                self._arrays = {
                    n: np.load(self.path(n), allow_pickle=True, mmap_mode="r")
                    for n in self.array_names
                }
            else:
                self._arrays = dict(zip(self.array_names, build()))
                self.save(description)
        return self._arrays

    def save(self, description: str) -> None:
        if self.directory is None or self._arrays is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        _write_text_atomically(self.path("description"), description)
        for n in self.array_names:
            _save_npy_atomically(self.path(n), np.asarray(self._arrays[n]))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}  # workers re-map; never pickle arrays


class GPTTokenDataset:
    """The windows of one prefix and split, in megatron-core's order; ``ds[k]`` is its batch dict."""

    class_name = "GPTDataset"

    def __init__(
        self,
        tokens: IndexedTokens | MockTokens,
        *,
        dataset_path: str | None,
        split: str,
        num_samples: int | None,
        config: GPTConfig,
        split_range: tuple[float, float] | None = None,
    ) -> None:
        if split not in gi.SPLIT_NAMES:
            raise ValueError(f"split must be one of {gi.SPLIT_NAMES}, not {split!r}")
        self.tokens = tokens
        self.dataset_path = dataset_path
        self.split = split
        self.num_samples = num_samples
        self.config = config
        self._sequence_ids: np.ndarray | None = None
        self.split_range = split_range
        if isinstance(tokens, MockTokens):
            self.class_name = "MockGPTDataset"
        self.unique_identifiers = gi.gpt_identifiers(
            class_name=self.class_name,
            dataset_path=dataset_path,
            num_samples=num_samples,
            split=split,
            random_seed=config.random_seed,
            sequence_length=config.sequence_length,
            split_string=config.split,
            split_matrix_=config.split_matrix,
            tokenizer=config.tokenizer,
        )
        self.unique_description = gi.description(self.unique_identifiers)
        self.unique_description_hash = gi.description_hash(self.unique_identifiers)
        self._cache = _CachedArrays(
            self._cache_directory(),
            gi.cache_file_names(
                self.unique_description_hash, self.class_name, split, gi.GPT_ARRAYS
            ),
            gi.GPT_ARRAYS,
        )

    def _cache_directory(self) -> str | None:
        if self.config.path_to_cache is not None:
            return self.config.path_to_cache
        if self.config.mock or self.dataset_path is None:
            return None
        if epath.is_remote(self.dataset_path):  # index files are built and mapped locally
            digest = hashlib.sha256(self.dataset_path.encode()).hexdigest()[:16]
            return str(cache_dir() / "megatron" / digest / f"{self.class_name}_indices")
        return os.path.join(self.dataset_path, "cache", f"{self.class_name}_indices")

    # -- indices ----------------------------------------------------------------------------------
    @property
    def sequence_ids(self) -> np.ndarray:
        """The split's sequence ids (reads the sequence count: header or sequences file)."""
        if self._sequence_ids is None:
            bookend = self.split_range
            if bookend is None and self.config.split_matrix is not None:
                bookend = self.config.split_matrix[gi.SPLIT_NAMES.index(self.split)]
            if bookend is None:
                raise ValueError(f"split {self.split!r} is empty in {self.config.split!r}")
            self._sequence_ids = gi.split_sequence_ids(len(self.tokens), bookend)
        return self._sequence_ids

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        drop_last = self.split != "valid" or self.config.drop_last_partial_validation_sequence
        return gi.build_gpt_indices(
            self.tokens.sequence_lengths,
            self.sequence_ids,
            num_samples=self.num_samples,
            sequence_length=self.config.sequence_length,
            seed=self.config.random_seed,
            add_extra_token=self.config.add_extra_token_to_sequence,
            drop_last_partial=drop_last,
        )

    def indices(self) -> dict[str, np.ndarray]:
        """``document_index``, ``sample_index``, ``shuffle_index``: mapped from cache or built."""
        return self._cache.get(self._build, self.unique_description)

    @property
    def cache_present(self) -> bool:
        return self._cache.present()

    def cache_paths(self) -> dict[str, str | None]:
        return {n: self._cache.path(n) for n in (*gi.GPT_ARRAYS, "description")}

    def __len__(self) -> int:
        if self._cache._arrays is None and self._cache.present():
            return npy_shape(self._cache.path("shuffle_index"))[0]
        return int(self.indices()["sample_index"].shape[0]) - 1

    # -- samples ----------------------------------------------------------------------------------
    def _parts(self, k: int) -> list[tuple[int, int, int | None]]:
        """(sequence id, token offset, length or None for the rest) of window ``k``'s parts."""
        arrays = self.indices()
        if not 0 <= k < len(arrays["shuffle_index"]):
            raise IndexError(f"sample {k} out of range [0, {len(arrays['shuffle_index'])})")
        j = int(arrays["shuffle_index"][k])
        doc_index = arrays["document_index"]
        (b, b_off), (e, e_off) = arrays["sample_index"][j], arrays["sample_index"][j + 1]
        b, b_off, e, e_off = int(b), int(b_off), int(e), int(e_off)
        extra = self.config.extra
        if b == e:
            return [(int(doc_index[b]), b_off, e_off - b_off + extra)]
        return [
            (int(doc_index[b]), b_off, None),
            *[(int(doc_index[i]), 0, None) for i in range(b + 1, e)],
            (int(doc_index[e]), 0, e_off + extra),
        ]

    @property
    def remote(self) -> bool:
        """The tokens are in object storage (reads benefit from :meth:`byte_spans` hints)."""
        return self.tokens.remote

    def use_range_reader(self, read_range: RangeReader) -> None:
        """Read remote token bytes with ``read_range`` (see :class:`IndexedTokens`)."""
        self.tokens.use_range_reader(read_range)

    def byte_spans(self, k: int) -> list[tuple[str, int, int]]:
        """(token file, start, end) of the byte ranges window ``k`` reads."""
        url = bin_path(self.tokens.prefix)
        return [(url, *self.tokens.byte_spans(i, off, n)) for i, off, n in self._parts(k)]

    def window(self, k: int) -> np.ndarray:
        """The ``S + x`` token ids (int64) of window ``k`` in served order, padded with ``pad_token``."""
        return self.window_and_documents(k)[0]

    def window_and_documents(self, k: int) -> tuple[np.ndarray, list[int]]:
        """Window ``k`` and the lengths of the documents it is made of (padding not included)."""
        pieces = [self.tokens.get(i, off, n) for i, off, n in self._parts(k)]
        text = np.concatenate(pieces).astype(np.int64)
        want = self.config.sequence_length + self.config.extra
        if len(text) < want:
            text = np.concatenate(
                [text, np.full(want - len(text), self.config.pad_token, np.int64)]
            )
        return text, [len(p) for p in pieces]

    def __getitem__(self, k: int) -> dict[str, Any]:
        return megatron_sample(*self.window_and_documents(k), self.config)


def megatron_sample(
    text: np.ndarray, document_lengths: Sequence[int], config: GPTConfig
) -> dict[str, Any]:
    """megatron-core's GPT batch dict from one window (see docs/megatron.md for the semantics).

    ``tokens``/``labels`` int64 ``[S]`` (labels shifted by one), ``loss_mask`` float32 (0 on padding and,
    with ``eod_mask_loss``, on EOD), ``position_ids`` int64 (reset after EOD if asked),
    ``attention_mask`` bool ``[1, S, S]`` with True = masked (only if ``create_attention_mask``).
    With ``inter_document_masking`` the window's document boundaries replace the attention mask:
    ``cu_seqlens`` and ``max_seqlen`` (``document_lengths``: the window's pieces, padding excluded).
    """
    import torch

    text_t = torch.from_numpy(text).long()
    pad = config.pad_token
    if config.add_extra_token_to_sequence:
        tokens, labels = text_t[:-1].contiguous(), text_t[1:].contiguous()
    else:
        tokens = text_t
        labels = torch.roll(text_t, shifts=-1, dims=0)
        labels[-1] = pad
    attention_mask, loss_mask, position_ids = _masks_and_position_ids(tokens, config)
    loss_mask[labels == pad] = 0.0
    tokens[tokens == pad] = 0
    labels[labels == pad] = 0
    if config.inter_document_masking:
        cu_seqlens, max_seqlen = _document_boundaries(document_lengths, config)
        return {
            "tokens": tokens,
            "labels": labels,
            "loss_mask": loss_mask,
            "position_ids": _positions_per_document(position_ids, cu_seqlens),
            "cu_seqlens": cu_seqlens,
            "max_seqlen": max_seqlen,
        }
    sample = {"tokens": tokens, "labels": labels}
    if attention_mask is not None:
        sample["attention_mask"] = attention_mask
    sample["loss_mask"] = loss_mask
    sample["position_ids"] = position_ids
    return sample


def _document_boundaries(document_lengths: Sequence[int], config: GPTConfig) -> tuple[Any, Any]:
    """``cu_seqlens`` (int32 ``[S + 1]``, padded with ``S`` so samples stack) and ``max_seqlen``.

    The extra label token belongs to no input position, and padding joins the last document, so
    the boundaries always end at ``S`` (megatron-core's rules).
    """
    import torch

    lengths = [int(n) for n in document_lengths]
    if config.add_extra_token_to_sequence and lengths:
        lengths[-1] -= 1
        if lengths[-1] == 0:
            lengths.pop()
    seq = config.sequence_length
    shortfall = seq - sum(lengths)
    if shortfall > 0:
        if lengths:
            lengths[-1] += shortfall
        else:
            lengths.append(shortfall)
    bounds = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)
    max_seqlen = (bounds[1:] - bounds[:-1]).max()
    cu_seqlens = torch.full((seq + 1,), seq, dtype=torch.int32)
    cu_seqlens[: bounds.numel()] = bounds
    return cu_seqlens, max_seqlen


def _positions_per_document(position_ids: Any, cu_seqlens: Any) -> Any:
    """Position ids that restart at 0 at every document boundary."""
    import torch

    out = position_ids.clone()
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds, bounds[1:]):
        if end > start:
            out[start:end] = torch.arange(end - start, dtype=torch.long)
    return out


def _masks_and_position_ids(tokens: Any, config: GPTConfig) -> tuple[Any, Any, Any]:
    """Causal mask (True = masked), loss mask and position ids, with per-document resets if asked."""
    import torch

    n = tokens.numel()
    eod = config.eod_token
    allowed = torch.tril(torch.ones((n, n))).unsqueeze(0) if config.create_attention_mask else None
    loss_mask = torch.ones(n, dtype=torch.float)
    if config.eod_mask_loss and eod is not None:
        loss_mask[tokens == eod] = 0.0
    position_ids = torch.arange(n, dtype=torch.long)
    if eod is not None and (config.reset_position_ids or config.reset_attention_mask):
        previous = 0
        for i in torch.nonzero(tokens == eod).flatten().tolist():
            if config.reset_attention_mask and allowed is not None:
                allowed[0, i + 1 :, : i + 1] = 0
            if config.reset_position_ids:
                position_ids[i + 1 :] -= i + 1 - previous
                previous = i + 1
    attention_mask = allowed < 0.5 if allowed is not None else None
    return attention_mask, loss_mask, position_ids


class BlendedTokenDataset:
    """Samples of several GPT datasets mixed by weight (deterministic, no RNG), as megatron-core."""

    class_name = "BlendedDataset"

    def __init__(
        self,
        datasets: Sequence[GPTTokenDataset],
        weights: Sequence[float] | Sequence[int],
        size: int | None,
        config: GPTConfig,
    ) -> None:
        if not datasets:
            raise ValueError("a blend needs at least one dataset")
        if len(datasets) > 32766:
            raise ValueError("a blend holds at most 32766 datasets (int16 dataset index)")
        self.datasets = list(datasets)
        self.split = datasets[0].split
        self.weights = gi.normalize_weights(weights) if size is not None else list(weights)
        self.size = size
        self.config = config
        self.unique_identifiers = gi.blended_identifiers(
            [d.unique_identifiers for d in self.datasets], self.split, self.weights, size
        )
        self.unique_description = gi.description(self.unique_identifiers)
        self.unique_description_hash = gi.description_hash(self.unique_identifiers)
        self._cache = _CachedArrays(
            config.path_to_cache,
            gi.cache_file_names(
                self.unique_description_hash, self.class_name, self.split, gi.BLEND_ARRAYS
            ),
            gi.BLEND_ARRAYS,
        )

    def _build(self) -> tuple[np.ndarray, np.ndarray]:
        if self.size is not None:
            dataset_index, sample_index = gi.build_blending_indices(self.weights, self.size)
        else:
            dataset_index, sample_index = gi.build_exhaustive_blending_indices(self.weights)
        self._check_no_oversampling(dataset_index)
        return dataset_index, sample_index

    def _check_no_oversampling(self, dataset_index: np.ndarray) -> None:
        ids, counts = np.unique(dataset_index, return_counts=True)
        for d, count in zip(ids.tolist(), counts.tolist()):
            if len(self.datasets[d]) < count:
                raise IndexError(
                    f"the {self.split} blend draws {count} samples from dataset {d} "
                    f"({self.datasets[d].dataset_path}) which has only {len(self.datasets[d])}; "
                    f"raise mid_level_dataset_surplus (now {self.config.mid_level_dataset_surplus})"
                )

    def indices(self) -> dict[str, np.ndarray]:
        return self._cache.get(self._build, self.unique_description)

    @property
    def cache_present(self) -> bool:
        return self._cache.present()

    def __len__(self) -> int:
        if self.size is not None:
            return self.size
        return int(sum(self.weights))

    def locate(self, k: int) -> tuple[int, int]:
        arrays = self.indices()
        return int(arrays["dataset_index"][k]), int(arrays["dataset_sample_index"][k])

    def window(self, k: int) -> np.ndarray:
        d, j = self.locate(k)
        return self.datasets[d].window(j)

    @property
    def remote(self) -> bool:
        return any(d.remote for d in self.datasets)

    def use_range_reader(self, read_range: RangeReader) -> None:
        """Read remote token bytes of every blended dataset with ``read_range``."""
        for dataset in self.datasets:
            dataset.use_range_reader(read_range)

    def byte_spans(self, k: int) -> list[tuple[str, int, int]]:
        d, j = self.locate(k)
        return self.datasets[d].byte_spans(j)

    def __getitem__(self, k: int) -> dict[str, Any]:
        d, j = self.locate(k)
        dataset_id = self.indices()["dataset_index"].dtype.type(d)  # int16, as megatron-core's
        return {"dataset_id": dataset_id, **self.datasets[d][j]}


# --------------------------------------------------------------------------------------------------
# building train/valid/test like BlendedMegatronDatasetBuilder


def parse_data_path(tokens: Sequence[str] | str) -> tuple[list[str], list[float] | None]:
    """``"w1 p1 w2 p2"`` (weights) or ``"p1 p2"`` (no weights) -> (prefixes, weights or None)."""
    if isinstance(tokens, str):
        tokens = tokens.split()
    tokens = list(tokens)
    if len(tokens) % 2 == 0 and tokens:
        try:
            weights = [float(t) for t in tokens[0::2]]
        except ValueError:
            return tokens, None
        return tokens[1::2], weights
    return tokens, None


def _split_datasets(
    prefix: str | None,
    split_ranges: Sequence[tuple[float, float] | None],
    sizes: Sequence[int | None],
    config: GPTConfig,
    sequences: Mapping[str, Sequence[int]],
) -> list[GPTTokenDataset | None]:
    """One GPT dataset per non-empty split of one prefix (or of the mock corpus)."""
    if config.mock:
        tokens: Any = MockTokens(config.mock_vocab_size, config.eod_token or 0)
    else:
        tokens = open_prefix(prefix, sequences)
    out: list[GPTTokenDataset | None] = []
    for i, name in enumerate(gi.SPLIT_NAMES):
        if split_ranges[i] is None:
            out.append(None)
            continue
        out.append(
            GPTTokenDataset(
                tokens,
                dataset_path=prefix,
                split=name,
                num_samples=sizes[i],
                config=config,
                split_range=split_ranges[i],
            )
        )
    return out


def build_gpt_datasets(
    blend: Sequence[str] | str | None,
    sizes: Sequence[int | None],
    config: GPTConfig,
    *,
    blend_per_split: Sequence[Sequence[str] | str | None] | None = None,
) -> list[GPTTokenDataset | BlendedTokenDataset | None]:
    """[train, valid, test] datasets for a blend, as megatron-core's builder makes them.

    ``blend`` is ``--data-path``'s tokens (``"w1 p1 w2 p2"`` or ``"p1 p2"``) split by ``config.split``;
    ``blend_per_split`` gives one blend per split instead (each over the whole of its prefixes).
    ``sizes`` are the requested sample counts per split (None = one epoch). With
    ``config.mock`` the blend is ignored and the mock corpus is split.
    """
    sequences = load_sequences_file(config.sequences_path)
    if config.mock:
        return _split_datasets(None, config.split_matrix, sizes, config, sequences)
    if blend_per_split is not None:
        config = dataclasses.replace(config, split=None)
        return [
            _per_split_dataset(i, b, sizes, config, sequences) if b else None
            for i, b in enumerate(blend_per_split)
        ]
    if blend is None:
        raise ValueError("give a blend, blend_per_split, or mock=True")
    prefixes, weights = parse_data_path(blend)
    return _blend_splits(prefixes, weights, config.split_matrix, sizes, config, sequences)


def _per_split_dataset(i, blend, sizes, config, sequences):
    spoof_ranges: list[tuple[float, float] | None] = [None] * 3
    spoof_ranges[i] = (0.0, 1.0)
    spoof_sizes: list[int | None] = [0] * 3
    spoof_sizes[i] = sizes[i]
    prefixes, weights = parse_data_path(blend)
    return _blend_splits(prefixes, weights, spoof_ranges, spoof_sizes, config, sequences)[i]


def _blend_splits(prefixes, weights, split_ranges, sizes, config, sequences):
    if weights is not None:
        weights = gi.normalize_weights(weights)
    if len(prefixes) == 1 and weights is None:
        return _split_datasets(prefixes[0], split_ranges, sizes, config, sequences)
    if weights is None:
        buffer = [[None] * 3 for _ in prefixes]
        target = None
    else:
        target = gi.samples_per_dataset(weights, sizes)
        buffer = gi.samples_per_dataset(weights, sizes, config.mid_level_dataset_surplus)
    per_prefix = [
        _split_datasets(p, split_ranges, buffer[d], config, sequences)
        for d, p in enumerate(prefixes)
    ]
    out: list[BlendedTokenDataset | None] = [None] * 3
    for i in range(3):
        if split_ranges[i] is None:
            continue
        mids = [per_prefix[d][i] for d in range(len(prefixes))]
        if weights is not None and sizes[i] is not None:
            out[i] = BlendedTokenDataset(mids, weights, sum(t[i] for t in target), config)
        elif weights is None:
            lengths = [len(m) for m in mids]
            size = None if sizes[i] is None else min(sizes[i], sum(lengths))
            out[i] = BlendedTokenDataset(mids, lengths, size, config)
        else:
            raise ValueError("weights need a requested size for every split")
    return out
