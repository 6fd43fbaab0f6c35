"""JSONL text -> Megatron ``.bin/.idx`` token files (what megatron's ``tools/preprocess_data.py`` does).

The tokenizer is named by a string so that every worker process builds its own copy:

- ``bytes``: the built-in byte-level tokenizer (ids 0..255 are the UTF-8 bytes, 256 is EOD);
- ``path/to/tokenizer.json``: a local Hugging Face tokenizer (needs the ``tokenizers`` package);
- ``module:function``: any importable callable ``str -> list[int]``; if the function has an
  ``eod`` / ``vocab_size`` attribute it is used.

Each JSON line is one document; each key in ``json_keys`` gets its own output
``<output_prefix>_<key>_document``. Documents are tokenized in parallel processes, in chunks, and
written in input order, so the output does not depend on the number of workers.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon.megatron.indexed import TokenFileWriter, optimal_dtype


class ByteTokenizer:
    """UTF-8 bytes as token ids, EOD = 256: a tokenizer for tests and demos that needs no files."""

    vocab_size = 257
    eod = 256
    unique_identifiers = {"class": "ByteTokenizer"}

    def __call__(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class HFJsonTokenizer:
    """A local Hugging Face ``tokenizer.json`` through the ``tokenizers`` package."""

    def __init__(self, path: str, eod: int | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise RuntimeError(
                f"{path}: reading a tokenizer.json needs the 'tokenizers' package "
                "(pip install tokenizers)"
            ) from e
        self._tok = Tokenizer.from_file(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eod = eod if eod is not None else self._find_eod()
        self.unique_identifiers = {"class": "HFJsonTokenizer", "tokenizer_path": [path]}

    def _find_eod(self) -> int | None:
        for name in ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"):
            tid = self._tok.token_to_id(name)
            if tid is not None:
                return tid
        return None

    def __call__(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids


@dataclass
class LoadedTokenizer:
    fn: Callable[[str], Sequence[int]]
    eod: int | None
    vocab_size: int | None


def load_tokenizer(spec: str, *, eod: int | None = None) -> LoadedTokenizer:
    """Resolve ``bytes`` / ``tokenizer.json`` / ``module:function`` (see the module docstring)."""
    if spec == "bytes":
        tok: Any = ByteTokenizer()
    elif spec.endswith(".json"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"tokenizer file {spec} not found")
        tok = HFJsonTokenizer(spec, eod)
    elif ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            tok = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot import tokenizer {spec!r}: {e}") from e
        if not callable(tok):
            raise ValueError(f"tokenizer {spec!r} is not callable")
    else:
        raise ValueError(
            f"unknown tokenizer {spec!r}: use 'bytes', a tokenizer.json path or 'module:function'"
        )
    return LoadedTokenizer(
        fn=tok,
        eod=eod if eod is not None else getattr(tok, "eod", None),
        vocab_size=getattr(tok, "vocab_size", None),
    )


# -- worker side ----------------------------------------------------------------------------------

_worker_tokenizer: LoadedTokenizer | None = None


def _init_worker(spec: str, eod: int | None) -> None:
    global _worker_tokenizer  # per-process tokenizer, set once by the pool initializer
    _worker_tokenizer = load_tokenizer(spec, eod=eod)


def _tokenize_chunk(
    args: tuple[list[str], Sequence[str], bool],
) -> tuple[list[list[np.ndarray | None]], int]:
    """Lines -> for each line, for each key, the token array (None for an empty document)."""
    lines, keys, append_eod = args
    tok = _worker_tokenizer
    out = []
    nbytes = 0
    for line in lines:
        nbytes += len(line)
        if not line.strip():
            continue
        record = json.loads(line)
        per_key: list[np.ndarray | None] = []
        for key in keys:
            ids = list(tok.fn(record[key]))
            if append_eod and ids:
                ids.append(tok.eod)
            per_key.append(np.asarray(ids, dtype=np.int64) if ids else None)
        out.append(per_key)
    return out, nbytes


def _chunks(paths: Sequence[str], lines_per_chunk: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                chunk.append(line)
                if len(chunk) >= lines_per_chunk:
                    yield chunk
                    chunk = []
    if chunk:
        yield chunk


def preprocess_jsonl(
    inputs: Sequence[str],
    output_prefix: str,
    *,
    tokenizer: str,
    json_keys: Sequence[str] = ("text",),
    workers: int = 1,
    append_eod: bool = False,
    eod: int | None = None,
    dtype: Any = None,
    lines_per_chunk: int = 256,
    progress: bool = True,
) -> dict[str, str]:
    """Tokenize JSONL files into one ``.bin/.idx`` per key; returns ``{key: output prefix}``.

    A record whose text tokenizes to nothing becomes an empty document (no sequence, no EOD), as in
    Megatron-LM's ``preprocess_data.py``, so document numbers and document-based splits agree with
    its output; blank lines (no JSON record) are skipped. The token dtype is uint16 when the
    tokenizer's vocabulary fits, else int32 (megatron's choice), unless ``dtype`` is given.
    """
    probe = load_tokenizer(tokenizer, eod=eod)
    if append_eod and probe.eod is None:
        raise ValueError(f"tokenizer {tokenizer!r} has no EOD id: pass eod=...")
    token_dtype = np.dtype(dtype) if dtype is not None else optimal_dtype(probe.vocab_size)
    prefixes = {k: f"{output_prefix}_{k}_document" for k in json_keys}
    writers = {k: TokenFileWriter(p, dtype=token_dtype) for k, p in prefixes.items()}
    total_bytes = sum(os.path.getsize(p) for p in inputs)
    jobs = ((chunk, tuple(json_keys), append_eod) for chunk in _chunks(inputs, lines_per_chunk))
    bar = _progress_bar(total_bytes, progress)
    try:
        for records, nbytes in _map_chunks(jobs, tokenizer, eod, workers):
            for per_key in records:
                for key, ids in zip(json_keys, per_key):
                    if ids is not None:
                        _check_range(ids, token_dtype, key)
                        writers[key].add_item(ids)
                    writers[key].end_document()  # an empty text is an empty document
            bar.update(nbytes)
    finally:
        bar.close()
    for w in writers.values():
        w.finalize()
    return prefixes


def _map_chunks(jobs: Iterator, tokenizer: str, eod: int | None, workers: int) -> Iterator:
    if workers <= 1:
        _init_worker(tokenizer, eod)
        yield from map(_tokenize_chunk, jobs)
        return
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer, eod)) as pool:
        yield from pool.imap(_tokenize_chunk, jobs, chunksize=1)


def _check_range(ids: np.ndarray, dtype: np.dtype, key: str) -> None:
    info = np.iinfo(dtype)
    if ids.size and (ids.min() < info.min or ids.max() > info.max):
        raise ValueError(f"key {key!r}: token ids out of the range of {dtype}; pass a wider dtype")


def _progress_bar(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not enabled)
