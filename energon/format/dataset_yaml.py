"""``.nv-meta/dataset.yaml``: how raw samples become typed samples (the prepare wizard's output).

Three shapes are written, all readable by the reference (``__module__: megatron.energon`` names
its classes, which we mirror under the same names):

* a sample type + ``field_map`` (sample field -> part name, with ``a,b`` fallbacks and
  ``json[key]`` accessors),
* a sample type + ``sample_loader``/``part_filter`` pointing at a ``sample_loader.py`` next to it,
* the crude class style (``CrudeWebdataset``): plain dicts, turned into samples by a cooker.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from energon import epath
from energon.format.layout import (
    DATASET_YAML_FILENAME,
    MAIN_FOLDER_NAME,
    SAMPLE_LOADER_FILENAME,
    PathLike,
    atomic_write_text,
    nv_meta_dir,
)

SAMPLE_TYPE_MODULE = "megatron.energon"
CRUDE_CLASS_NAME = "CrudeWebdataset"


def field_map_dataset_yaml(sample_type: str, field_map: dict[str, str]) -> dict[str, Any]:
    return {
        "sample_type": {"__module__": SAMPLE_TYPE_MODULE, "__class__": sample_type},
        "field_map": dict(field_map),
    }


def sample_loader_dataset_yaml(sample_type: str) -> dict[str, Any]:
    return {
        "sample_type": {"__module__": SAMPLE_TYPE_MODULE, "__class__": sample_type},
        "sample_loader": f"{SAMPLE_LOADER_FILENAME}:sample_loader",
        "part_filter": f"{SAMPLE_LOADER_FILENAME}:part_filter",
    }


def crude_dataset_yaml() -> dict[str, Any]:
    return {"__module__": SAMPLE_TYPE_MODULE, "__class__": CRUDE_CLASS_NAME}


def dataset_yaml_text(content: dict[str, Any]) -> str:
    return yaml.dump(content, sort_keys=False)


def write_dataset_yaml(
    root: PathLike,
    content: dict[str, Any],
    name: str = DATASET_YAML_FILENAME,
    *,
    mode_like: PathLike | None = None,
) -> Path | str:
    """Write ``.nv-meta/<name>`` atomically; returns its path (a URL for a remote dataset)."""
    if epath.is_remote(root):
        url = epath.join(root, MAIN_FOLDER_NAME, name)
        epath.write_bytes(url, dataset_yaml_text(content).encode("utf-8"))
        return url
    meta = nv_meta_dir(root)
    meta.mkdir(parents=True, exist_ok=True)
    target = meta / name
    atomic_write_text(target, dataset_yaml_text(content), mode_like=mode_like)
    return target


def read_dataset_yaml(root: PathLike, name: str = DATASET_YAML_FILENAME) -> dict[str, Any] | None:
    """The parsed ``dataset.yaml`` (plain data, nothing imported), or None if absent."""
    if epath.is_remote(root):
        url = epath.join(root, MAIN_FOLDER_NAME, name)
        if not epath.is_file(url):
            return None
        content = yaml.safe_load(epath.read_text(url))
        return content if isinstance(content, dict) else None
    path = nv_meta_dir(root) / name
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        content = yaml.safe_load(f)
    return content if isinstance(content, dict) else None


def describe_sample_type(content: dict[str, Any] | None) -> str:
    """A one-line description of what a ``dataset.yaml`` produces (for ``energon info``).

    Handles both the ``sample_type`` style and the class style (crude datasets have no sample type).
    """
    if not content:
        return "unknown (no dataset.yaml)"
    sample_type = content.get("sample_type")
    if isinstance(sample_type, dict) and "__class__" in sample_type:
        return str(sample_type["__class__"])
    if "__class__" in content:
        cls = str(content["__class__"])
        if cls == CRUDE_CLASS_NAME:
            return f"crude ({cls}: plain dicts, needs a cooker)"
        return f"{cls} (class-style dataset.yaml)"
    return "unknown (dataset.yaml has no sample_type)"


def sample_loader_template(fields: Sequence[tuple[str, str]], part_names: Sequence[str]) -> str:
    """Source of a starter ``sample_loader.py`` for the given sample fields and found parts."""
    lines = [
        '"""Turns one raw sample into the keyword arguments of the sample type.',
        "",
        "`raw` holds the decoded parts keyed by part name (e.g. raw['jpg']) plus __key__,",
        "__restore_key__ and __sources__. Fill in every TODO, then check with `energon preview`.",
        '"""',
        "",
        "",
        "def sample_loader(raw: dict) -> dict:",
        "    return dict(",
        '        __key__=raw["__key__"],',
    ]
    lines += [
        f'        {name}=raw["TODO"],  # expected type: {type_name}' for name, type_name in fields
    ]
    lines += [
        "    )",
        "",
        "",
        "def part_filter(part: str) -> bool:",
        '    """Only these parts are read from the tar and decoded."""',
        f"    return part in {tuple(part_names)!r}",
        "",
    ]
    return "\n".join(lines)


def write_sample_loader_template(
    root: PathLike,
    fields: Sequence[tuple[str, str]],
    part_names: Sequence[str],
    *,
    overwrite: bool = False,
) -> bool:
    """Write ``.nv-meta/sample_loader.py`` unless it exists (and ``overwrite`` is False).

    Returns whether the file was written; an existing loader is the user's code and is kept.
    """
    target = nv_meta_dir(root) / SAMPLE_LOADER_FILENAME
    if target.exists() and not overwrite:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, sample_loader_template(fields, part_names))
    return True
