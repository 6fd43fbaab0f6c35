"""``.nv-meta/.info.json``: which energon version prepared the dataset, and samples per shard.

The key order of ``shard_counts`` is meaningful: it is the shard order given to ``prepare`` and
defines ``tar_file_id`` in ``index.sqlite``. The legacy ``.info.yaml`` is read as a fallback and,
when present, kept in sync on write (older tools read only that file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata

import yaml

from energon import epath
from energon.errors import DatasetInfoError
from energon.format.layout import (
    INFO_JSON_FILENAME,
    INFO_YAML_FILENAME,
    MAIN_FOLDER_NAME,
    PathLike,
    atomic_write_text,
    nv_meta_dir,
)

_INFO_KEYS = {"energon_version", "shard_counts"}
_INFO_FILENAMES = (INFO_JSON_FILENAME, INFO_YAML_FILENAME)


@dataclass(frozen=True)
class DatasetInfo:
    energon_version: str | None
    shard_counts: dict[str, int]

    @property
    def total_samples(self) -> int:
        return sum(self.shard_counts.values())


def current_energon_version() -> str | None:
    """The installed package version, recorded in ``.info.json`` for later diagnosis."""
    try:
        return metadata.version("energon-loader")
    except metadata.PackageNotFoundError:
        return None


def has_info(root: PathLike) -> bool:
    """True if the dataset was prepared (either info file exists)."""
    if epath.is_remote(root):
        meta_url = epath.join(root, MAIN_FOLDER_NAME)
        return any(epath.is_file(epath.join(meta_url, n)) for n in _INFO_FILENAMES)
    meta = nv_meta_dir(root)
    return (meta / INFO_JSON_FILENAME).is_file() or (meta / INFO_YAML_FILENAME).is_file()


def read_dataset_info(root: PathLike) -> DatasetInfo:
    """Read ``.info.json`` (or the legacy ``.info.yaml``), strictly: unknown keys are errors."""
    if epath.is_remote(root):
        return _read_remote_info(root)
    meta = nv_meta_dir(root)
    json_path, yaml_path = meta / INFO_JSON_FILENAME, meta / INFO_YAML_FILENAME
    if json_path.is_file():
        path = json_path
    elif yaml_path.is_file():
        path = yaml_path
    else:
        raise DatasetInfoError(
            f"{meta}: no {INFO_JSON_FILENAME} found; is this a prepared dataset? "
            "Run 'energon prepare' first."
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetInfoError(f"{path}: not UTF-8 text ({e}); the file is damaged") from None
    return _parse_info(_load(text, path.name, str(path)), str(path))


def _load(text: str, name: str, path: str) -> object:
    """JSON or YAML text as data; a damaged file is an error naming it."""
    try:
        return json.loads(text) if name == INFO_JSON_FILENAME else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise DatasetInfoError(
            f"{path}: not valid {'JSON' if name == INFO_JSON_FILENAME else 'YAML'} ({e}); the "
            "file is damaged: prepare the dataset again"
        ) from None


def _read_remote_info(root: str) -> DatasetInfo:
    """The remote variant of :func:`read_dataset_info` (object URLs instead of ``Path``)."""
    meta = epath.join(root, MAIN_FOLDER_NAME)
    for name in _INFO_FILENAMES:
        path = epath.join(meta, name)
        if epath.is_file(path):
            try:
                text = epath.read_bytes(path).decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetInfoError(
                    f"{path}: not UTF-8 text ({e}); the file is damaged"
                ) from None
            return _parse_info(_load(text, name, path), path)
    raise DatasetInfoError(
        f"{meta}: no {INFO_JSON_FILENAME} found; is this a prepared dataset? "
        "Run 'energon prepare' first."
    )


def _parse_info(raw: object, path: str) -> DatasetInfo:
    if not isinstance(raw, dict):
        raise DatasetInfoError(f"{path}: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - _INFO_KEYS
    if unknown:
        raise DatasetInfoError(f"{path}: unknown keys {sorted(unknown)}")
    counts = raw.get("shard_counts")
    if not isinstance(counts, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in counts.items()
    ):
        raise DatasetInfoError(
            f"{path}: 'shard_counts' must map shard names to sample counts (integers >= 0)"
        )
    version = raw.get("energon_version")
    if version is not None and not isinstance(version, str):
        raise DatasetInfoError(f"{path}: 'energon_version' must be a string or null")
    return DatasetInfo(energon_version=version, shard_counts=dict(counts))


def read_info(root: PathLike) -> dict[str, int]:
    """Shard relative path -> sample count, in ``.info.json`` key order."""
    return read_dataset_info(root).shard_counts


def info_json_text(shard_counts: dict[str, int], energon_version: str | None) -> str:
    """The exact text of ``.info.json`` (``json.dump(indent=2)``, as the reference writes it)."""
    return json.dumps({"energon_version": energon_version, "shard_counts": shard_counts}, indent=2)


def write_info(
    root: PathLike,
    shard_counts: dict[str, int],
    energon_version: str | None,
    *,
    mode_like: PathLike | None = None,
) -> None:
    """Write ``.info.json`` atomically (and ``.info.yaml`` too if one exists already)."""
    meta = nv_meta_dir(root)
    meta.mkdir(parents=True, exist_ok=True)
    yaml_path = meta / INFO_YAML_FILENAME
    if yaml_path.is_file():
        content = {"energon_version": energon_version, "shard_counts": shard_counts}
        atomic_write_text(yaml_path, yaml.safe_dump(content, sort_keys=False), mode_like=mode_like)
    atomic_write_text(
        meta / INFO_JSON_FILENAME,
        info_json_text(shard_counts, energon_version),
        mode_like=mode_like,
    )
