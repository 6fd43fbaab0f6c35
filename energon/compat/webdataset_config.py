"""``megatron.energon.flavors.webdataset.config``: the names of the ``.nv-meta`` files."""

from __future__ import annotations

import re

from energon.compat.webdataset.prepare import INDEX_BATCH_SIZE
from energon.format.layout import INDEX_SQLITE_FILENAME as INDEX_SQLITE_FILENAME
from energon.format.layout import INDEX_UUID_FILENAME as INDEX_UUID_FILENAME
from energon.format.layout import INFO_JSON_FILENAME as INFO_JSON_FILENAME
from energon.format.layout import INFO_YAML_FILENAME as INFO_YAML_FILENAME
from energon.format.layout import MAIN_FOLDER_NAME
from energon.format.layout import SPLIT_YAML_FILENAME as SPLIT_YAML_FILENAME

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
