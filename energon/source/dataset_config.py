"""``.nv-meta/dataset.yaml``: how the parts of a raw sample become a sample object.

Three forms are understood (the reference's): a sample type with a ``field_map``; a sample type with a
``sample_loader`` function from ``.nv-meta/sample_loader.py`` (plus ``part_filter``); or the crude
class style (``__class__: CrudeWebdataset``) which yields plain dicts for cookers. The deprecated
flavor classes (``CaptioningWebdataset`` ...) are accepted and mapped onto the first form.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import yaml

from energon import epath
from energon.errors import DatasetConfigError
from energon.format.layout import DATASET_YAML_FILENAME, MAIN_FOLDER_NAME
from energon.format.typeref import resolve_class
from energon.samples import CrudeSample, Sample
from energon.source.fieldmap import resolve_field_map
from energon.source.sample_loader import load_part_filter, load_sample_loader

ACCEPTED_KEYS = {
    "sample_type",
    "field_map",
    "sample_loader",
    "part_filter",
    "subflavors",
    "split_config",
    "decoder",
    "split_part",
    "training",
    "worker_config",
    "shuffle_over_epochs",
    "parallel_shard_iters",
    "max_samples_per_sequence",
    "subset",
    "allow_pickle",  # energon only: unpickle this dataset's pkl/pyd/pickle parts
}

_FLAVOR_SAMPLE_TYPES = {
    "CaptioningWebdataset": "CaptioningSample",
    "ImageWebdataset": "ImageSample",
    "ImageClassificationWebdataset": "ImageClassificationSample",
    "InterleavedWebdataset": "InterleavedSample",
    "MultiChoiceVQAWebdataset": "MultiChoiceVQASample",
    "OCRWebdataset": "OCRSample",
    "SimilarityInterleavedWebdataset": "SimilarityInterleavedSample",
    "TextWebdataset": "TextSample",
    "VidQAWebdataset": "VidQASample",
    "VQAOCRWebdataset": "VQAOCRSample",
    "VQAWebdataset": "VQASample",
}


# Always set by the loader, whatever a sample_loader returns (its __key__ is kept).
_FRAMEWORK_FIELDS = ("__restore_key__", "__subflavors__", "__sources__", "__shard__")


@dataclasses.dataclass
class SampleBuilder:
    """Builds one sample from its decoded parts; picklable (functions are re-loaded by path)."""

    kind: str  # "field_map" | "sample_loader" | "crude"
    sample_type: Any = None
    field_map: Any = None
    sample_loader: Callable | None = None
    part_filter: Callable[[str], bool] | None = None
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)
    split_config: str | None = None
    allow_pickle: bool = False  # the dataset's owner trusts its pickled parts

    def wants_part(self, part: str) -> bool:
        """Only parts that will be used are decoded."""
        if self.kind == "field_map":
            return part in self.field_map.parts
        if self.part_filter is None:
            return True
        return bool(self.part_filter(part))

    def build(self, parts: dict[str, Any], base: dict[str, Any], shard_name: str) -> Any:
        """``base`` holds ``__key__``, ``__restore_key__``, ``__subflavors__``, ``__sources__``."""
        if self.kind == "field_map":
            parts["__key__"] = base["__key__"]
            return self.sample_type(**base, **self.field_map.apply(parts))
        if self.kind == "crude":
            return CrudeSample({**parts, **base, "__shard__": shard_name})
        loaded = dict(self.sample_loader({**parts, **base, "__shard__": shard_name}))
        for name in _FRAMEWORK_FIELDS:
            loaded.pop(name, None)
        return self.sample_type(**{**base, **loaded})

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "subflavors": self.subflavors}
        if self.sample_type is not None:
            out["sample_type"] = f"{self.sample_type.__module__}.{self.sample_type.__qualname__}"
        if self.field_map is not None:
            out["field_map"] = dict(self.field_map.specs)
        return out


def read_dataset_yaml(root: str, name: str = DATASET_YAML_FILENAME) -> dict[str, Any]:
    path = epath.join(root, MAIN_FOLDER_NAME, name)
    try:
        text = epath.read_text(path)
    except (FileNotFoundError, IsADirectoryError):
        raise DatasetConfigError(
            f"{path} does not exist: the dataset has no loader definition. Run `energon prepare "
            f"{root}` and create a dataset.yaml (or pass dataset_config=...)."
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DatasetConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise DatasetConfigError(
            f"{path}: expected a mapping at the top level, got {type(data).__name__}"
        )
    return data


def parse_dataset_config(root: str, data: dict[str, Any], *, where: str) -> SampleBuilder:
    """Validate a ``dataset.yaml`` mapping and turn it into a :class:`SampleBuilder`."""
    data = dict(data)
    class_name = data.pop("__class__", None)
    module = data.pop("__module__", None)
    if class_name is not None:
        return _parse_class_style(root, module or "energon", class_name, data, where)
    unknown = set(data) - ACCEPTED_KEYS
    if unknown:
        raise DatasetConfigError(
            f"{where}: unknown key(s) {sorted(unknown)}; accepted: {sorted(ACCEPTED_KEYS)}"
        )
    if "sample_type" not in data:
        raise DatasetConfigError(
            f"{where}: missing 'sample_type' (or a __class__ such as CrudeWebdataset)"
        )
    sample_type = _resolve_sample_type(data["sample_type"], where)
    return _builder_for_sample_type(root, sample_type, data, where)


def _allow_pickle(data: dict[str, Any], where: str) -> bool:
    value = data.get("allow_pickle", False)
    if not isinstance(value, bool):
        raise DatasetConfigError(f"{where}: 'allow_pickle' must be true or false, got {value!r}")
    return value


def _resolve_sample_type(ref: Any, where: str) -> type:
    if not isinstance(ref, dict) or "__class__" not in ref:
        raise DatasetConfigError(
            f"{where}: 'sample_type' must be a mapping with __module__ and __class__, got {ref!r}"
        )
    cls = resolve_class(ref.get("__module__", "energon"), ref["__class__"], where=where)
    if not (isinstance(cls, type) and issubclass(cls, Sample)):
        raise DatasetConfigError(
            f"{where}: sample_type {ref['__class__']!r} is not a Sample subclass"
        )
    return cls


def _builder_for_sample_type(
    root: str, sample_type: type, data: dict[str, Any], where: str
) -> SampleBuilder:
    has_map = data.get("field_map") is not None
    has_loader = data.get("sample_loader") is not None
    if has_map == has_loader:
        raise DatasetConfigError(f"{where}: give exactly one of 'field_map' and 'sample_loader'")
    subflavors = dict(data.get("subflavors") or {})
    split_config = data.get("split_config")
    if has_map:
        if data.get("part_filter") is not None:
            raise DatasetConfigError(f"{where}: 'part_filter' cannot be combined with 'field_map'")
        try:
            field_map = resolve_field_map(data["field_map"], sample_type)
        except (TypeError, ValueError) as e:
            raise DatasetConfigError(f"{where}: {e}") from e
        return SampleBuilder(
            "field_map",
            sample_type=sample_type,
            field_map=field_map,
            subflavors=subflavors,
            split_config=split_config,
            allow_pickle=_allow_pickle(data, where),
        )
    nv_meta = epath.join(root, MAIN_FOLDER_NAME)
    if data.get("part_filter") is None:
        raise DatasetConfigError(f"{where}: 'sample_loader' needs a 'part_filter'")
    return SampleBuilder(
        "sample_loader",
        sample_type=sample_type,
        sample_loader=load_sample_loader(nv_meta, data["sample_loader"]),
        part_filter=load_part_filter(nv_meta, data["part_filter"]),
        subflavors=subflavors,
        split_config=split_config,
        allow_pickle=_allow_pickle(data, where),
    )


def _parse_class_style(
    root: str, module: str, class_name: str, data: dict[str, Any], where: str
) -> SampleBuilder:
    if class_name == "CrudeWebdataset":
        unknown = set(data) - {"subflavors", "part_filter", "split_config", "allow_pickle"}
        if unknown:
            raise DatasetConfigError(f"{where}: CrudeWebdataset does not accept {sorted(unknown)}")
        part_filter = None
        if data.get("part_filter") is not None:
            part_filter = load_part_filter(epath.join(root, MAIN_FOLDER_NAME), data["part_filter"])
        return SampleBuilder(
            "crude",
            part_filter=part_filter,
            subflavors=dict(data.get("subflavors") or {}),
            split_config=data.get("split_config"),
            allow_pickle=_allow_pickle(data, where),
        )
    if class_name in _FLAVOR_SAMPLE_TYPES:
        warnings.warn(
            f"{where}: {class_name} is deprecated; use sample_type + field_map instead",
            FutureWarning,
            stacklevel=2,
        )
        sample_type = resolve_class("energon", _FLAVOR_SAMPLE_TYPES[class_name], where=where)
        return _builder_for_sample_type(root, sample_type, data, where)
    if class_name == "StandardWebdatasetFactory":
        return parse_dataset_config(root, data, where=where)
    cls = resolve_class(module, class_name, where=where)
    raise DatasetConfigError(f"{where}: unsupported dataset class {cls!r}")


def load_sample_builder(root: str, dataset_config: str = DATASET_YAML_FILENAME) -> SampleBuilder:
    data = read_dataset_yaml(root, dataset_config)
    return parse_dataset_config(
        root, data, where=epath.join(root, MAIN_FOLDER_NAME, dataset_config)
    )
