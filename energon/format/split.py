"""``split.yaml``: which shards belong to which split, and what to exclude.

Lists are stored brace-collapsed (``parts/data-{000..099}.tar``) so that a dataset with thousands
of shards keeps a small, reviewable file; readers brace-expand every entry. Collapsing keeps the
order of the list, because that order is the order in which a split's shards are concatenated.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import yaml
from braceexpand import braceexpand

from energon import epath
from energon.errors import SplitConfigError, UnknownSplitError
from energon.format.layout import (
    MAIN_FOLDER_NAME,
    SPLIT_YAML_FILENAME,
    PathLike,
    atomic_write_text,
    nv_meta_dir,
)

_NUMBER_RE = re.compile(r"(\d+)")


# ---------------------------------------------------------------------------------------------
# Brace expansion and collapse


def expand_braces(pattern: str) -> list[str]:
    """``data-{0..2}.tar`` -> ``["data-0.tar", "data-1.tar", "data-2.tar"]`` (padding kept)."""
    return list(braceexpand(pattern))


def expand_all(patterns: Iterable[str]) -> list[str]:
    return [name for pattern in patterns for name in expand_braces(pattern)]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("{", "\\{").replace("}", "\\}")


def _tokens(name: str) -> list[str]:
    """Alternating text / digit tokens; digit runs sit at odd positions."""
    return _NUMBER_RE.split(name)


def _increment_position(a: list[str], b: list[str]) -> int | None:
    """The one digit token where ``b`` is ``a`` + 1 with the same width, if that is the only change."""
    if len(a) != len(b):
        return None
    changed = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(changed) != 1:
        return None
    pos = changed[0]
    if pos % 2 == 1 and len(a[pos]) == len(b[pos]) and int(b[pos]) == int(a[pos]) + 1:
        return pos
    return None


def _continues_run(a: list[str], b: list[str], pos: int) -> bool:
    return _increment_position(a, b) == pos


def _render(tokens: list[str], pos: int, last: str | None = None) -> str:
    if last is None:
        return "".join(_escape(t) for t in tokens)
    head = "".join(_escape(t) for t in tokens[:pos])
    tail = "".join(_escape(t) for t in tokens[pos + 1 :])
    return f"{head}{{{tokens[pos]}..{last}}}{tail}"


def collapse_braces(names: Sequence[str]) -> list[str]:
    """Order-preserving brace collapse, the inverse of :func:`expand_all`.

    Maximal runs of consecutive names that differ in exactly one number, which grows by one at a
    constant width, become ``prefix{first..last}suffix``; everything else stays literal.
    """
    tokenized = [_tokens(n) for n in names]
    out: list[str] = []
    i = 0
    while i < len(tokenized):
        pos = (
            _increment_position(tokenized[i], tokenized[i + 1]) if i + 1 < len(tokenized) else None
        )
        if pos is None:
            out.append(_render(tokenized[i], 0))
            i += 1
            continue
        j = i + 1
        while j + 1 < len(tokenized) and _continues_run(tokenized[j], tokenized[j + 1], pos):
            j += 1
        out.append(_render(tokenized[i], pos, tokenized[j][pos]))
        i = j + 1
    if expand_all(out) != list(names):  # a safety net: never write a list that reads back wrong
        raise SplitConfigError(f"brace collapse does not round-trip for {list(names)[:5]}...")
    return out


# ---------------------------------------------------------------------------------------------
# Reading and writing


@dataclass
class SplitConfig:
    split_parts: dict[str, list[str]]  # brace-EXPANDED shard lists
    exclude: list[str] = field(default_factory=list)  # brace-expanded
    source: str = ""

    def _known_shards(self) -> set[str]:
        return {shard for shards in self.split_parts.values() for shard in shards}

    def shards(self, split_part: str) -> list[str]:
        """The split's shards in order, without shards excluded as a whole."""
        if split_part not in self.split_parts:
            raise UnknownSplitError(
                f"{self.source or 'split config'}: invalid split part {split_part!r}; "
                f"defined: {sorted(self.split_parts)}"
            )
        excluded = set(self.exclude)
        return [s for s in self.split_parts[split_part] if s not in excluded]

    def sample_excludes(self) -> set[tuple[str, str]]:
        """``(shard name, sample key)`` pairs from ``<shard>/<key>`` exclude entries (a tar
        shard, or a Parquet/Arrow file, of some split, then a key)."""
        known = self._known_shards()
        pairs = (split_sample_entry(entry, known) for entry in self.exclude if entry not in known)
        return {pair for pair in pairs if pair is not None}


def split_sample_entry(entry: str, known: set[str]) -> tuple[str, str] | None:
    """``(shard, key)`` of an exclude entry ``<shard>/<key>`` whose shard is in ``known`` (the
    longest such shard name; a key may itself contain ``/``), else None."""
    cut = entry.rfind("/")
    while cut > 0:
        if entry[:cut] in known and cut + 1 < len(entry):
            return entry[:cut], entry[cut + 1 :]
        cut = entry.rfind("/", 0, cut)
    return None


def read_split(root: PathLike, split_config: str = SPLIT_YAML_FILENAME) -> SplitConfig:
    """Read ``.nv-meta/<split_config>``; for the default name, fall back to ``split.json``."""
    if epath.is_remote(root):
        return _read_remote_split(root, split_config)
    meta = nv_meta_dir(root)
    path = meta / split_config
    if not path.is_file() and split_config == SPLIT_YAML_FILENAME:
        path = meta / "split.json"
    if not path.is_file():
        raise SplitConfigError(f"{meta / split_config}: split config not found")
    return _parse_split(_load(path.read_bytes(), path.suffix == ".json", str(path)), str(path))


def _load(data: bytes, as_json: bool, path: str) -> object:
    """JSON or YAML bytes as data; a damaged file is an error naming it."""
    try:
        text = data.decode("utf-8")
        return json.loads(text) if as_json else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise SplitConfigError(f"{path}: not valid {'JSON' if as_json else 'YAML'}: {e}") from None


def _read_remote_split(root: str, split_config: str) -> SplitConfig:
    """The remote variant of :func:`read_split` (object URLs instead of ``Path``)."""
    meta = epath.join(root, MAIN_FOLDER_NAME)
    candidates = [split_config] + (["split.json"] if split_config == SPLIT_YAML_FILENAME else [])
    for name in candidates:
        path = epath.join(meta, name)
        if epath.is_file(path):
            raw = _load(epath.read_bytes(path), name.endswith(".json"), path)
            return _parse_split(raw, path)
    raise SplitConfigError(f"{epath.join(meta, split_config)}: split config not found")


def _parse_split(raw: object, path: str) -> SplitConfig:
    if not isinstance(raw, dict):
        raise SplitConfigError(f"{path}: expected a mapping with 'split_parts'")
    unknown = set(raw) - {"split_parts", "exclude"}
    if unknown:
        raise SplitConfigError(f"{path}: unknown keys {sorted(unknown)}")
    parts = raw.get("split_parts")
    if not isinstance(parts, dict):
        raise SplitConfigError(f"{path}: 'split_parts' must map split names to shard lists")
    split_parts: dict[str, list[str]] = {}
    for name, entries in parts.items():
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries or []):
            raise SplitConfigError(f"{path}: split {name!r} must be a list of shard names")
        split_parts[str(name)] = expand_all(entries)
        _check_unique(split_parts[str(name)], str(name), path)
    exclude = raw.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise SplitConfigError(f"{path}: 'exclude' must be a list of strings")
    config = SplitConfig(split_parts=split_parts, exclude=expand_all(exclude), source=path)
    _warn_unmatched_excludes(config)
    return config


def _check_unique(shards: list[str], split: str, path: str) -> None:
    """A shard listed twice in one split would be read twice per epoch, silently."""
    seen: set[str] = set()
    for shard in shards:
        if shard in seen:
            raise SplitConfigError(
                f"{path}: split {split!r} lists shard {shard!r} more than once (after brace "
                "expansion); every shard may appear once per split"
            )
        seen.add(shard)


def _warn_unmatched_excludes(config: SplitConfig) -> None:
    """An exclude entry that names no shard of any split excludes nothing: likely a typo."""
    known = config._known_shards()
    for entry in config.exclude:
        if entry not in known and split_sample_entry(entry, known) is None:
            warn_unmatched_exclude(config.source, entry, "it names no shard of any split")


def warn_unmatched_exclude(source: str, entry: str, why: str) -> None:
    warnings.warn(
        f"{source or 'split config'}: exclude entry {entry!r} matches nothing ({why})",
        UserWarning,
        stacklevel=3,
    )


def split_config_text(
    split_parts: dict[str, list[str]], exclude: Sequence[str] = (), *, as_json: bool = False
) -> str:
    """The text written for a split config (brace-collapsed lists, ``split_parts`` first)."""
    content = {
        "split_parts": {name: collapse_braces(shards) for name, shards in split_parts.items()},
        "exclude": list(exclude),
    }
    if as_json:
        return json.dumps(content, indent=2)
    return yaml.dump(content, sort_keys=False)


def write_split(
    root: PathLike,
    split_parts: dict[str, list[str]],
    exclude: Sequence[str] = (),
    split_config: str = SPLIT_YAML_FILENAME,
    *,
    mode_like: PathLike | None = None,
) -> None:
    """Write ``.nv-meta/<split_config>`` atomically (JSON if the name ends in ``.json``)."""
    meta = nv_meta_dir(root)
    meta.mkdir(parents=True, exist_ok=True)
    text = split_config_text(split_parts, exclude, as_json=split_config.endswith(".json"))
    atomic_write_text(meta / split_config, text, mode_like=mode_like)


def split_by_ratio(
    shards: Sequence[str],
    ratios: Sequence[tuple[str, float]],
    shuffle_seed: int | None = None,
) -> dict[str, list[str]]:
    """Assign whole shards to splits by ratio (cumulative boundaries, rounded down).

    Boundaries are computed with exact fractions of the decimal ratios, so ``7,2,1`` over 10 shards
    gives 7/2/1 shards (floating cumulative sums would round 0.7+0.2 down and lose a shard).
    ``shuffle_seed`` shuffles the shard list first with ``random.Random(seed)`` (reference-compatible).
    """
    if not ratios or any(r < 0 for _, r in ratios) or sum(r for _, r in ratios) <= 0:
        raise ValueError(f"invalid split ratios {list(ratios)}: need non-negative values, sum > 0")
    order = list(shards)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    exact = [Fraction(repr(float(r))) for _, r in ratios]
    total = sum(exact)
    result: dict[str, list[str]] = {}
    start = 0
    cumulative = Fraction(0)
    for (name, _), ratio in zip(ratios, exact):
        cumulative += ratio
        end = int(len(order) * cumulative / total)
        result[name] = order[start:end]
        start = end
    return result


def split_by_patterns(
    shards: Sequence[str], patterns: Sequence[tuple[str, str]]
) -> dict[str, list[str]]:
    """Assign shards to splits by regular expression (``re.match`` on the relative path).

    Each pattern may contain braces and is expanded into several regexes. A shard can land in
    several splits, or in none.
    """
    result: dict[str, list[str]] = {}
    for name, pattern in patterns:
        regexes = [re.compile(p) for p in expand_braces(pattern)]
        matched = [s for s in shards if any(r.match(s) for r in regexes)]
        result.setdefault(name, []).extend(s for s in matched if s not in result[name])
    return result
