"""``megatron.energon.flavors.jsonl.jsonl_prepare``: programmatic preparation of a JSONL dataset
(``CrudeJsonlDatasetFactory.prepare_dataset(path)``): writes ``<file>.jsonl.idx`` exactly as
``energon prepare <file>.jsonl`` does (:func:`energon.format.jsonl.prepare_jsonl`)."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

from energon import epath
from energon.compat.epathlib import EPath
from energon.compat.jsonl.ijsonl import IJsonlFile, IJsonlIndexWriter
from energon.format.jsonl import prepare_jsonl

__all__ = [
    "EPath",
    "IJsonlFile",
    "IJsonlIndexWriter",
    "JsonlPreparator",
]


class JsonlPreparator:
    """Preparation of a JSONL file (one sample per line)."""

    @staticmethod
    def iter_dataset_content(path: Any) -> Generator[dict[str, Any], None, None]:
        """Each line of the JSONL file as ``{"json": line bytes}``."""
        path = epath.normalize(os.fspath(path))
        local = epath.local_copy(path) if epath.is_remote(path) else path
        with open(local, "rb") as f:
            for line in f:
                if line.strip():
                    yield {"json": line}

    @classmethod
    def prepare_dataset(cls, path: Path | Any) -> int:
        """Write the offset index of the JSONL file; returns its number of samples."""
        return prepare_jsonl(epath.normalize(os.fspath(path)))
