"""Which kind of leaf dataset a path is, decided once, and opening it as that kind.

This is the one place that looks at a path to tell a prepared WebDataset, an indexed JSONL file and
a Megatron token prefix apart; a join is described by a :class:`~energon.source.join.JoinSpec`.
The opened leaf carries the decision as ``leaf.kind``; nothing downstream probes paths again.
"""

from __future__ import annotations

import os
from typing import Any

from energon import epath
from energon.errors import DatasetNotFoundError, DatasetNotPreparedError
from energon.format.layout import (
    DATASET_YAML_FILENAME,
    INFO_JSON_FILENAME,
    INFO_YAML_FILENAME,
    MAIN_FOLDER_NAME,
)
from energon.format.parquet import PARQUET_INFO_FILENAME, table_format
from energon.megatron.gpt_dataset import GPTConfig
from energon.source.join import JoinLeaf, JoinSpec
from energon.source.jsonl import JsonlLeaf
from energon.source.leaf import LeafDataset
from energon.source.parquet import ParquetLeaf
from energon.source.tokens import TokenLeaf
from energon.source.webdataset import WebdatasetLeaf


def detect_kind(target: str | JoinSpec) -> str:
    """``"webdataset"``, ``"jsonl"``, ``"tokens"``, ``"parquet"`` or ``"join"``; a clear error
    naming the path (``FileNotFoundError``) for anything else.

    ``*.jsonl`` is a JSONL file; ``X`` with ``X.idx`` and ``X.bin`` a Megatron token prefix; a folder
    with ``.nv-meta/.info.json`` (or the legacy ``.info.yaml``) a prepared WebDataset; a Parquet or
    Arrow file, a folder with ``.nv-meta/parquet.json``, or an unprepared folder that holds Parquet
    or Arrow files (and no tar shards) a Parquet dataset.
    """
    if isinstance(target, JoinSpec):
        return "join"
    path = os.fspath(target)
    if path.endswith(".jsonl"):
        return "jsonl"
    if table_format(path) is not None:
        return "parquet"
    if _is_token_prefix(path):
        return "tokens"
    nv_meta = epath.join(path, MAIN_FOLDER_NAME)
    # the info file first: for an object store, asking whether the folder exists is a listing
    if epath.is_file(epath.join(nv_meta, INFO_JSON_FILENAME)) or epath.is_file(
        epath.join(nv_meta, INFO_YAML_FILENAME)
    ):
        return "webdataset"
    if not epath.exists(path):
        raise DatasetNotFoundError(f"dataset {path} does not exist")
    if epath.is_file(epath.join(nv_meta, PARQUET_INFO_FILENAME)) or _holds_table_files(path):
        return "parquet"
    raise DatasetNotPreparedError(
        f"{path} is not a prepared dataset (no {epath.join(nv_meta, INFO_JSON_FILENAME)}), a .jsonl "
        f"file or a Megatron token prefix (<prefix>.bin and <prefix>.idx): run `energon prepare "
        f"{path}`"
    )


def _holds_table_files(path: str) -> bool:
    """An unprepared local folder with Parquet/Arrow files and no tar shards (used as it is)."""
    if epath.is_remote(path) or not os.path.isdir(path):
        return False
    suffixes = [
        os.path.splitext(name)[1].lower() for _, _, names in os.walk(path) for name in names
    ]
    return any(table_format("x" + s) for s in suffixes) and not {".tar", ".tgz"} & set(suffixes)


def _is_token_prefix(path: str) -> bool:
    """``<path>.idx`` and ``<path>.bin`` exist (locally, or as remote objects)."""
    if epath.is_remote(path):
        return path.rsplit("/", 1)[-1] != "" and epath.is_file(path + ".idx")
    return os.path.exists(path + ".idx") and os.path.exists(path + ".bin")


def open_leaf(
    target: str | JoinSpec,
    *,
    split_part: str,
    kind: str | None = None,
    subflavors: dict[str, Any] | None = None,
    dataset_config: str | None = None,
    split_config: str | None = None,
    token_config: GPTConfig | None = None,
) -> LeafDataset:
    """The leaf dataset of ``target``, opened as its kind.

    ``kind``: the result of an earlier :func:`detect_kind` (saves probing the path again).
    ``dataset_config``/``split_config`` are for WebDatasets, ``token_config`` (an
    :class:`~energon.megatron.gpt_dataset.GPTConfig`) is required for token prefixes.
    """
    if isinstance(target, JoinSpec):
        return JoinLeaf(target, subflavors=dict(subflavors or {}))
    path = os.fspath(target)
    kind = kind or detect_kind(path)
    if kind == "jsonl":
        return JsonlLeaf.open(path, subflavors=subflavors)
    if kind == "tokens":
        if token_config is None:
            raise ValueError(f"{path} is a Megatron token prefix: it needs a token_config")
        return TokenLeaf.open(
            path, split_part=split_part, config=token_config, subflavors=subflavors
        )
    if kind == "parquet":
        return ParquetLeaf.open(
            path,
            split_part=split_part,
            split_config=split_config,
            dataset_config=dataset_config or DATASET_YAML_FILENAME,
            subflavors=subflavors,
        )
    if kind == "webdataset":
        return WebdatasetLeaf.open(
            path,
            split_part=split_part,
            split_config=split_config,
            dataset_config=dataset_config or DATASET_YAML_FILENAME,
            subflavors=subflavors,
        )
    raise ValueError(f"{path}: cannot open a leaf of kind {kind!r} from a path")
