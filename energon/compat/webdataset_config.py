"""``megatron.energon.flavors.webdataset.config``: the names of the ``.nv-meta`` files."""

from __future__ import annotations

import re

from energon.compat.webdataset.prepare import INDEX_BATCH_SIZE
from energon.format.layout import MAIN_FOLDER_NAME

__all__ = [
    "INDEX_BATCH_SIZE",
    "INDEX_SQLITE_FILENAME",
    "INDEX_UUID_FILENAME",
    "INFO_JSON_FILENAME",
    "INFO_YAML_FILENAME",
    "JOIN_INDEX_FILENAME",
    "MAIN_FOLDER_NAME",
    "SPLIT_YAML_FILENAME",
    "skip_meta_re",
    "split_name_re",
]

split_name_re = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
skip_meta_re = re.compile(r"__[^/]*__($|/)")
JOIN_INDEX_FILENAME = "join_index.bin"
INDEX_SQLITE_FILENAME = "index.sqlite"
INDEX_UUID_FILENAME = "index.uuid"
INFO_JSON_FILENAME = ".info.json"
INFO_YAML_FILENAME = ".info.yaml"
SPLIT_YAML_FILENAME = "split.yaml"
