"""Parsing metadataset YAML (V2 and the older V1) into a small tree of nodes, strictly.

Every mapping is checked against the keys its node type accepts, so a typo is an error naming the
file and the key instead of a silently ignored setting. Nothing is resolved or opened here.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import yaml

from energon.errors import DatasetNotFoundError, MetadatasetError
from energon.format.typeref import ENERGON_MODULE_ALIASES
from energon.megatron.gpt_indices import parse_split
from energon.pipeline.blend_by import BUILTIN_SIZES
from energon.plan.schedules import KINDS as SCHEDULE_KINDS
from energon.plan.schedules import UNITS as SCHEDULE_UNITS
from energon.plan.schedules import WeightSchedule

Weight = float | WeightSchedule  # a blend weight: fixed, or a schedule over the training run


@dataclasses.dataclass(frozen=True)
class Subset:
    """``subset: {range: [start, end]}``: ratios (``"20%"``) or absolute sample indices."""

    start: float
    end: float | None  # None = "end" (absolute only)
    absolute: bool

    def window(self, begin: int, finish: int) -> tuple[int, int]:
        """This subset applied inside the window ``[begin, finish)``."""
        if self.absolute:
            end = finish if self.end is None else min(finish, begin + int(self.end))
            return min(begin + int(self.start), end), end
        size = finish - begin
        return begin + int(self.start * size), begin + int((self.end or 0.0) * size)


@dataclasses.dataclass
class Reference:
    """A dataset directory, a JSONL file or another metadataset YAML."""

    path: str
    split_part: str | None = None
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)
    shuffle_over_epochs_multiplier: float | None = 1
    dataset_config: str | None = None
    split_config: str | None = None
    aux: dict[str, str] = dataclasses.field(default_factory=dict)
    subset: Subset | None = None
    weight: Weight = 1.0
    repetitions: float = 1.0
    token_config: dict[str, Any] | None = None  # only for Megatron token prefixes (or nested YAMLs)
    where: str = ""  # "<file>: splits.train.blend[0]", for error messages
    pack_whole: bool = False  # packing never splits its samples across packs


@dataclasses.dataclass
class JoinMember:
    path: str
    split_part: str | None = None
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)
    shuffle_over_epochs_multiplier: float | None = 1
    dataset_config: str | None = None
    split_config: str | None = None
    nonmatch: str = "error"
    name: str | None = None


@dataclasses.dataclass
class Join:
    members: list[JoinMember]
    joiner: dict[str, str] | None = None
    split_part: str | None = None
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)
    shuffle_over_epochs_multiplier: float | None = 1
    subset: Subset | None = None
    weight: Weight = 1.0
    repetitions: float = 1.0
    named: bool = False
    where: str = ""
    pack_whole: bool = False


@dataclasses.dataclass
class Blend:
    """``blend`` (mode "weight") or ``blend_epochized`` (mode "repetitions")."""

    mode: str
    entries: list[Any]
    subset: Subset | None = None
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)
    weight: Weight = 1.0
    repetitions: float = 1.0
    token_config: dict[str, Any] | None = None
    where: str = ""
    pack_whole: bool = False  # ... for every dataset below
    # what the weights share (``blend`` only): a built-in name, {__module__, __function__} or,
    # from Python, a function
    blend_by: Any = None


@dataclasses.dataclass
class Metadataset:
    path: str  # the YAML file ("" for a Python-built one)
    splits: dict[str, Any]
    token_config: dict[str, Any] | None = None  # default for every token prefix in this file
    global_batch_size: int | None = None  # converts weight schedules given in steps to samples

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path) if self.path else os.getcwd()


_REFERENCE_KEYS = {
    "path",
    "split_part",
    "subflavors",
    "shuffle_over_epochs_multiplier",
    "dataset_config",
    "split_config",
    "aux",
    "subset",
    "token_config",
    "pack_whole",
}
_JOIN_MEMBER_KEYS = {
    "path",
    "split_part",
    "subflavors",
    "shuffle_over_epochs_multiplier",
    "dataset_config",
    "split_config",
    "nonmatch",
}
_JOIN_KEYS = {
    "join",
    "joiner",
    "split_part",
    "subflavors",
    "shuffle_over_epochs_multiplier",
    "subset",
    "pack_whole",
}
_BLEND_KEYS = {"subset", "subflavors", "token_config", "pack_whole"}
_NONMATCH = ("error", "skip", "none")


def load_metadataset(path: str) -> Metadataset:
    """Read and validate a metadataset YAML file (V2 with ``__class__: MetadatasetV2``, else V1)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise DatasetNotFoundError(f"metadataset {path} does not exist")
    with open(path) as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise MetadatasetError(f"{path}: invalid YAML: {e}") from e
    return parse_metadataset(data, path)


def parse_metadataset(data: Any, path: str = "") -> Metadataset:
    where = path or "<metadataset>"
    if not isinstance(data, dict):
        raise MetadatasetError(f"{where}: expected a mapping at the top level")
    data = dict(data)
    module = data.pop("__module__", None)
    cls = data.pop("__class__", None)
    if module is not None and module not in ENERGON_MODULE_ALIASES:
        raise MetadatasetError(
            f"{where}: __module__ must be megatron.energon or energon, got {module!r}"
        )
    _check_keys(data, {"splits", "token_config", "global_batch_size"}, where)
    token_config = parse_token_config(data.get("token_config"), where)
    global_batch_size = data.get("global_batch_size")
    if global_batch_size is not None and not (
        _is_int(global_batch_size) and global_batch_size >= 1
    ):
        raise MetadatasetError(
            f"{where}: global_batch_size must be an integer >= 1 (samples per training step), "
            f"got {global_batch_size!r}"
        )
    splits = data.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise MetadatasetError(
            f"{where}: 'splits' must be a non-empty mapping of split name -> dataset"
        )
    if cls in (None, "Metadataset"):
        parsed = {
            name: _parse_v1_split(node, f"{where}: splits.{name}") for name, node in splits.items()
        }
    elif cls == "MetadatasetV2":
        parsed = {
            name: parse_node(node, f"{where}: splits.{name}") for name, node in splits.items()
        }
    else:
        raise MetadatasetError(
            f"{where}: unknown metadataset class {cls!r} (MetadatasetV2 or Metadataset)"
        )
    return Metadataset(path, parsed, token_config=token_config, global_batch_size=global_batch_size)


def _check_keys(data: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise MetadatasetError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _parse_v1_split(node: Any, where: str) -> Blend:
    if not isinstance(node, dict) or "datasets" not in node:
        raise MetadatasetError(f"{where}: a V1 split needs 'datasets: [...]'")
    _check_keys(node, {"datasets"}, where)
    entries = []
    for i, entry in enumerate(node["datasets"] or []):
        entry_where = f"{where}.datasets[{i}]"
        if not isinstance(entry, dict):
            raise MetadatasetError(f"{entry_where}: expected a mapping")
        entry = dict(entry)
        weight = _weight(entry.pop("weight", 1.0), entry_where)
        subflavor = entry.pop("subflavor", None)
        _check_keys(entry, _REFERENCE_KEYS - {"aux", "subset"}, entry_where)
        ref = _reference(entry, entry_where)
        if subflavor is not None:
            warnings.warn(
                f"{entry_where}: 'subflavor' is deprecated; use subflavors",
                FutureWarning,
                stacklevel=2,
            )
            ref.subflavors = {"__subflavor__": subflavor, **ref.subflavors}
        ref.weight = weight
        entries.append(ref)
    if not entries:
        raise MetadatasetError(f"{where}: 'datasets' is empty")
    return Blend("weight", entries)


def parse_node(node: Any, where: str) -> Any:
    """A V2 node: a reference, ``blend``, ``blend_epochized`` or ``join``."""
    if not isinstance(node, dict):
        raise MetadatasetError(f"{where}: expected a mapping, got {type(node).__name__}")
    node = dict(node)
    weight = _weight(node.pop("weight", 1.0), where)
    repetitions = _repetitions(node.pop("repetitions", 1.0), where)
    if "blend" in node or "blend_epochized" in node:
        if "blend" in node and "blend_epochized" in node:
            raise MetadatasetError(f"{where}: use either 'blend' or 'blend_epochized', not both")
        key = "blend" if "blend" in node else "blend_epochized"
        _check_keys(node, _BLEND_KEYS | {key} | ({"blend_by"} if key == "blend" else set()), where)
        items = node[key]
        if not isinstance(items, list) or not items:
            raise MetadatasetError(f"{where}: '{key}' must be a non-empty list")
        mode = "weight" if key == "blend" else "repetitions"
        other = "repetitions" if mode == "weight" else "weight"
        for i, item in enumerate(items):
            if isinstance(item, dict) and other in item:
                hint = (
                    " (each dataset's count per pass is fixed by repetitions; weight schedules "
                    "are only for 'blend')"
                    if key == "blend_epochized"
                    else ""
                )
                raise MetadatasetError(
                    f"{where}.{key}[{i}]: '{other}' is not allowed in '{key}'{hint}"
                )
        entries = [parse_node(item, f"{where}.{key}[{i}]") for i, item in enumerate(items)]
        return Blend(
            mode,
            entries,
            subset=_subset(node.get("subset"), where),
            subflavors=_dict(node.get("subflavors"), where, "subflavors"),
            weight=weight,
            repetitions=repetitions,
            token_config=parse_token_config(node.get("token_config"), where),
            where=where,
            blend_by=_blend_by(node.get("blend_by"), where),
            pack_whole=_flag(node, "pack_whole", where),
        )
    if "join" in node:
        return _parse_join(node, where, weight, repetitions)
    if "path" not in node:
        raise MetadatasetError(f"{where}: needs 'path', 'blend', 'blend_epochized' or 'join'")
    _check_keys(node, _REFERENCE_KEYS, where)
    ref = _reference(node, where)
    ref.weight, ref.repetitions = weight, repetitions
    return ref


def _reference(node: dict, where: str) -> Reference:
    path = node["path"]
    if not isinstance(path, str) or not path:
        raise MetadatasetError(f"{where}: 'path' must be a non-empty string")
    aux = _dict(node.get("aux"), where, "aux")
    for name, value in aux.items():
        if not isinstance(value, str):
            raise MetadatasetError(f"{where}: aux.{name} must be a path string")
    return Reference(
        path=path,
        split_part=_optional_str(node.get("split_part"), where, "split_part"),
        subflavors=_dict(node.get("subflavors"), where, "subflavors"),
        shuffle_over_epochs_multiplier=_multiplier(
            node.get("shuffle_over_epochs_multiplier", 1), where
        ),
        dataset_config=_optional_str(node.get("dataset_config"), where, "dataset_config"),
        split_config=_optional_str(node.get("split_config"), where, "split_config"),
        aux=aux,
        subset=_subset(node.get("subset"), where),
        token_config=parse_token_config(node.get("token_config"), where),
        where=where,
        pack_whole=_flag(node, "pack_whole", where),
    )


def _flag(node: dict, key: str, where: str) -> bool:
    value = node.get(key, False)
    if not isinstance(value, bool):
        raise MetadatasetError(f"{where}: '{key}' must be true or false, got {value!r}")
    return value


def _parse_join(node: dict, where: str, weight: Weight, repetitions: float) -> Join:
    _check_keys(node, _JOIN_KEYS, where)
    raw = node["join"]
    named = isinstance(raw, dict)
    items = list(raw.items()) if named else [(None, m) for m in (raw or [])]
    if len(items) < 2:
        raise MetadatasetError(f"{where}: 'join' needs at least two datasets")
    members = []
    for i, (name, item) in enumerate(items):
        member_where = f"{where}.join[{name if named else i}]"
        if not isinstance(item, dict):
            raise MetadatasetError(f"{member_where}: expected a mapping")
        _check_keys(item, _JOIN_MEMBER_KEYS, member_where)
        nonmatch = item.get("nonmatch", "error")
        if nonmatch not in _NONMATCH:
            raise MetadatasetError(
                f"{member_where}: nonmatch must be one of {_NONMATCH}, got {nonmatch!r}"
            )
        ref = _reference(
            {"path": item.get("path")} | {k: v for k, v in item.items() if k != "nonmatch"},
            member_where,
        )
        members.append(
            JoinMember(
                path=ref.path,
                split_part=ref.split_part,
                subflavors=ref.subflavors,
                shuffle_over_epochs_multiplier=ref.shuffle_over_epochs_multiplier,
                dataset_config=ref.dataset_config,
                split_config=ref.split_config,
                nonmatch=nonmatch,
                name=name,
            )
        )
    if members[0].nonmatch != "error":
        raise MetadatasetError(
            f"{where}: the first (primary) join member must have nonmatch: error"
        )
    joiner = node.get("joiner")
    if joiner is not None and not (
        isinstance(joiner, dict) and ("__class__" in joiner or "__function__" in joiner)
    ):
        raise MetadatasetError(
            f"{where}: 'joiner' must be {{__module__, __class__ | __function__}}"
        )
    return Join(
        members=members,
        joiner=joiner,
        split_part=_optional_str(node.get("split_part"), where, "split_part"),
        subflavors=_dict(node.get("subflavors"), where, "subflavors"),
        shuffle_over_epochs_multiplier=_multiplier(
            node.get("shuffle_over_epochs_multiplier", 1), where
        ),
        subset=_subset(node.get("subset"), where),
        weight=weight,
        repetitions=repetitions,
        named=named,
        where=where,
        pack_whole=_flag(node, "pack_whole", where),
    )


def _blend_by(value: Any, where: str) -> Any:
    """``blend_by``: ``samples``, ``tokens``, ``bytes`` or ``{__module__, __function__}`` (a
    function of a SampleMeta); resolved, with the allow-list of user code, by the resolver."""
    if value is None or callable(value) or value in BUILTIN_SIZES:
        return value  # a callable: given in Python (Blender), trusted like any code
    if isinstance(value, dict) and set(value) <= {"__module__", "__function__"}:
        if isinstance(value.get("__function__"), str):
            return dict(value)
    raise MetadatasetError(
        f"{where}: blend_by must be one of {', '.join(BUILTIN_SIZES)} or "
        f"{{__module__: ..., __function__: ...}} (a function of a SampleMeta), got {value!r}"
    )


def _weight(value: Any, where: str) -> Weight:
    """A number >= 0, or a weight schedule (a mapping naming one kind; see parse_weight)."""
    if isinstance(value, WeightSchedule | dict):
        return parse_weight(value, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise MetadatasetError(
            f"{where}: weight must be a number >= 0 or a schedule ({{{' | '.join(SCHEDULE_KINDS)}: "
            f"...}}), got {value!r}"
        )
    return float(value)


def parse_weight(value: Any, where: str) -> Weight:
    """A blend weight schedule, checked key by key; a schedule whose value never changes is its
    number. The forms (``unit: samples | steps`` optional, default samples)::

        {constant: 2}
        {step: [[0, 1.0], [5000, 0.5]]}                       # 1.0 from 0, 0.5 from 5000 on
        {piecewise_linear: [[0, 1.0], [5000, 0.5], [8000, 0.2]]}
        {linear: {start: 8000, end: 10000, from: 1.0, to: 0.1}}
        {cosine: {start: 0, end: 10000, from: 1.0, to: 0.1}}
    """
    if isinstance(value, WeightSchedule):
        schedule = value
    else:
        data = dict(value)
        unit = data.pop("unit", "samples")
        if unit not in SCHEDULE_UNITS:
            raise MetadatasetError(
                f"{where}: weight.unit must be 'samples' or 'steps', got {unit!r}"
            )
        _check_keys(data, set(SCHEDULE_KINDS), f"{where}: weight")
        if len(data) != 1:
            raise MetadatasetError(
                f"{where}: weight must name exactly one schedule ({', '.join(SCHEDULE_KINDS)}), "
                f"got {sorted(data) or 'none'}"
            )
        ((kind, body),) = data.items()
        schedule = _schedule(kind, body, unit, f"{where}: weight.{kind}")
    if schedule.is_constant:
        return schedule.points[0][1]
    return schedule


def _schedule(kind: str, body: Any, unit: str, where: str) -> WeightSchedule:
    if kind == "constant":
        return WeightSchedule.constant(_weight_number(body, where))
    if kind in ("step", "piecewise_linear"):
        if not isinstance(body, list) or not body:
            raise MetadatasetError(f"{where} must be a non-empty list of [time, weight] points")
        points = []
        for i, point in enumerate(body):
            if not isinstance(point, list | tuple) or len(point) != 2:
                raise MetadatasetError(f"{where}[{i}] must be a [time, weight] pair, got {point!r}")
            points.append(
                (_time(point[0], f"{where}[{i}]"), _weight_number(point[1], f"{where}[{i}]"))
            )
        for i in range(1, len(points)):
            if points[i][0] <= points[i - 1][0]:
                raise MetadatasetError(
                    f"{where}[{i}]: times must increase, got {points[i][0]} after "
                    f"{points[i - 1][0]}"
                )
        return WeightSchedule(kind, tuple(points), unit)
    if not isinstance(body, dict):
        raise MetadatasetError(f"{where} must be a mapping {{start, end, from, to}}")
    _check_keys(body, {"start", "end", "from", "to"}, where)
    missing = sorted({"start", "end", "from", "to"} - set(body))
    if missing:
        raise MetadatasetError(f"{where} needs {', '.join(missing)} (start, end, from, to)")
    start, end = _time(body["start"], f"{where}.start"), _time(body["end"], f"{where}.end")
    if end <= start:
        raise MetadatasetError(f"{where}: end must be after start, got start {start}, end {end}")
    points = ((start, _weight_number(body["from"], f"{where}.from")),)
    points += ((end, _weight_number(body["to"], f"{where}.to")),)
    return WeightSchedule(kind, points, unit)


def _time(value: Any, where: str) -> int:
    if not _is_int(value) or value < 0:
        raise MetadatasetError(
            f"{where}: times must be integers >= 0 (samples or steps), got {value!r}"
        )
    return int(value)


def _weight_number(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < float("inf")
    ):
        raise MetadatasetError(f"{where}: weights must be numbers >= 0, got {value!r}")
    return float(value)


def _repetitions(value: Any, where: str) -> float:
    if isinstance(value, dict):
        raise MetadatasetError(
            f"{where}: repetitions must be a number > 0; weight schedules are only for 'blend' "
            "weights (an epochized blend fixes each dataset's count per pass)"
        )
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise MetadatasetError(f"{where}: repetitions must be a number > 0, got {value!r}")
    return float(value)


def _multiplier(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise MetadatasetError(
            f"{where}: shuffle_over_epochs_multiplier must be null, -1 or an integer >= 1, got {value!r}"
        )
    return value


def _dict(value: Any, where: str, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MetadatasetError(f"{where}: '{key}' must be a mapping")
    return dict(value)


def _optional_str(value: Any, where: str, key: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MetadatasetError(f"{where}: '{key}' must be a string")
    return value


def _subset(value: Any, where: str) -> Subset | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"range"}:
        raise MetadatasetError(f"{where}: subset must be {{range: [start, end]}}")
    rng = value["range"]
    if not isinstance(rng, list) or len(rng) != 2:
        raise MetadatasetError(f"{where}: subset range must be [start, end]")
    start, end = rng
    if isinstance(start, str) and start.endswith("%"):
        if not (isinstance(end, str) and end.endswith("%")):
            raise MetadatasetError(f"{where}: subset range mixes percentages and indices")
        a, b = _percent(start, where), _percent(end, where)
        if not 0 <= a <= b <= 1:
            raise MetadatasetError(f"{where}: subset range must satisfy 0% <= start <= end <= 100%")
        return Subset(a, b, absolute=False)
    if (
        not isinstance(start, int)
        or isinstance(start, bool)
        or not (isinstance(end, int) or end == "end")
    ):
        raise MetadatasetError(
            f"{where}: subset range must be two percentages or two indices (end may be 'end')"
        )
    if end != "end" and not 0 <= start <= end:
        raise MetadatasetError(
            f"{where}: subset range needs 0 <= start <= end, got [{start}, {end}]"
        )
    return Subset(float(start), None if end == "end" else float(end), absolute=True)


def _percent(text: str, where: str) -> float:
    try:
        return float(text[:-1]) / 100.0
    except ValueError:
        raise MetadatasetError(f"{where}: bad percentage {text!r}") from None


# --------------------------------------------------------------------------------------------------
# token_config: the GPT settings of Megatron token prefixes (energon.megatron.GPTConfig fields)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_split_string(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    try:
        parse_split(value)
    except ValueError:
        return False
    return True


# key -> (check, what the value must be); the keys are GPTConfig's fields that make sense in YAML
TOKEN_CONFIG_FIELDS: dict[str, tuple[Any, str]] = {
    "sequence_length": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "random_seed": (_is_int, "an integer"),
    "split": (_check_split_string, 'null or a split string like "969, 30, 1"'),
    "tokenizer": (lambda v: True, "anything (what megatron hashes for the tokenizer)"),
    "eod_token": (lambda v: v is None or _is_int(v), "null or an integer"),
    "pad_token": (_is_int, "an integer"),
    "add_extra_token_to_sequence": (lambda v: isinstance(v, bool), "true or false"),
    "drop_last_partial_validation_sequence": (lambda v: isinstance(v, bool), "true or false"),
    "reset_position_ids": (lambda v: isinstance(v, bool), "true or false"),
    "reset_attention_mask": (lambda v: isinstance(v, bool), "true or false"),
    "eod_mask_loss": (lambda v: isinstance(v, bool), "true or false"),
    "create_attention_mask": (lambda v: isinstance(v, bool), "true or false"),
    "path_to_cache": (lambda v: v is None or isinstance(v, str), "null or a path"),
    "mid_level_dataset_surplus": (
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
        "a number >= 0",
    ),
    "sequences_path": (lambda v: v is None or isinstance(v, str), "null or a path"),
    "inter_document_masking": (lambda v: isinstance(v, bool), "true or false"),
}
# relative to the folder of the YAML file that sets them
TOKEN_CONFIG_PATHS = ("path_to_cache", "sequences_path")


def parse_token_config(value: Any, where: str) -> dict[str, Any] | None:
    """A validated ``token_config`` mapping (a subset of GPTConfig's fields), or None if absent.

    Every key and value is checked, so a typo names the file, the node and the key.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MetadatasetError(
            f"{where}: 'token_config' must be a mapping of GPTConfig fields, got "
            f"{type(value).__name__}"
        )
    _check_keys(value, set(TOKEN_CONFIG_FIELDS), f"{where}: token_config")
    for key, item in value.items():
        check, expected = TOKEN_CONFIG_FIELDS[key]
        if not check(item):
            raise MetadatasetError(f"{where}: token_config.{key} must be {expected}, got {item!r}")
    return dict(value)
