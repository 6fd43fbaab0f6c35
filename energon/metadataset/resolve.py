"""Turning a metadataset tree (or a plain path) into the flat list of sources the plan reads.

Inheritance follows the reference: ``split_part`` of a reference overrides the inherited split name;
``subflavors`` merge top-down with outer levels winning, on top of the leaf's ``dataset.yaml``;
weights are normalised per blend and multiplied through nesting (weight schedules too: a nested
schedule times an outer one, see :class:`energon.plan.schedules.Mixture`); repetitions multiply;
``shuffle_over_epochs_multiplier``: ``None`` anywhere wins, else ``-1`` anywhere, else the product;
subset ratios apply inside the window of the level below them (innermost first).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import yaml

from energon import epath
from energon.format.join_index import cache_dir, join_index_name
from energon.format.typeref import resolve_class
from energon.megatron.gpt_dataset import GPTConfig
from energon.metadataset.config import (
    TOKEN_CONFIG_PATHS,
    Blend,
    Join,
    MetadatasetError,
    Reference,
    Subset,
    Weight,
    load_metadataset,
    parse_metadataset,
    parse_token_config,
)
from energon.metadataset.join_members import resolve_join_member
from energon.pipeline.blend_by import BlendBy
from energon.plan.schedules import Mixture, WeightSchedule
from energon.plan.sources import BlendLevel, Source
from energon.source.join import JoinSpec
from energon.source.kinds import detect_kind, open_leaf
from energon.source.leaf import LeafDataset

TINY_WEIGHT = 1e-3


@dataclasses.dataclass
class Resolved:
    sources: list[Source]
    mode: str  # "none" (one source), "weight", "repetitions"
    mixture: Mixture | None = None  # a weight blend with schedules
    global_batch_size: int | None = None  # of the outermost metadataset file, if it sets one
    blend_by: BlendBy = dataclasses.field(default_factory=BlendBy)  # what the weights share


@dataclasses.dataclass(frozen=True)
class _Context:
    split_part: str
    base_dir: str
    training: bool
    subflavors: dict[str, Any]
    weight: float = 1.0
    repetitions: float = 1.0
    shuffle: int | None = 1
    ratios: tuple[Subset, ...] = ()
    dataset_config: str | None = None
    split_config: str | None = None
    mds_path: str = ""
    global_batch_size: int | None = None  # converts schedules in steps (innermost file wins)
    weight_path: tuple[tuple[BlendLevel, int], ...] = ()
    token_config: Any = None  # the token_config= argument: a GPTConfig (or a mapping), the default
    # token_config mappings of the YAML levels above (inner levels win), with the place last set
    token_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    token_where: str = ""
    in_blend: bool = False  # below a blend (blend_by may only be set on the outermost one)
    pack_whole: bool = False  # a level above says: never split these samples across packs


class Blender:
    """A weighted blend built in Python: ``Blender([("/data/a", 0.6), ("/data/b", 0.4)])``.

    Usable wherever a dataset path is; equivalent to a YAML ``blend`` of the same references.
    Entries may also be dicts with any reference keys (``{"path": ..., "weight": ..., "subflavors": ...}``).
    A weight may be a :class:`~energon.plan.schedules.WeightSchedule` (or its YAML mapping);
    ``global_batch_size`` converts schedules given in steps (as the YAML's top-level key does).
    """

    def __init__(
        self,
        entries: list[tuple[Any, Any] | dict[str, Any]],
        *,
        global_batch_size: int | None = None,
        blend_by: Any = None,
    ) -> None:
        self.global_batch_size = global_batch_size
        self.blend_by = blend_by
        items = []
        for entry in entries:
            if isinstance(entry, dict):
                items.append(dict(entry))
            else:
                path, weight = entry
                items.append({"path": os.fspath(path), "weight": weight})
        self.entries = items

    def as_metadataset(self, split_part: str) -> dict[str, Any]:
        blend: dict[str, Any] = {"blend": self.entries}
        if self.blend_by is not None:
            blend["blend_by"] = self.blend_by
        mds: dict[str, Any] = {"__class__": "MetadatasetV2", "splits": {split_part: blend}}
        if self.global_batch_size is not None:
            mds["global_batch_size"] = self.global_batch_size
        return mds


def resolve_dataset(
    path: Any,
    *,
    split_part: str,
    training: bool,
    subflavors: dict[str, Any] | None = None,
    shuffle_over_epochs_multiplier: int | None = 1,
    dataset_config: str | None = None,
    split_config: str | None = None,
    token_config: Any = None,
    global_batch_size: int | None = None,
) -> Resolved:
    """Sources of ``path`` (dataset dir, ``.jsonl``, Megatron token prefix, metadataset ``.yaml``,
    ``Blender`` or dict). ``global_batch_size`` converts weight schedules given in steps, unless
    the metadataset file sets its own."""
    ctx = _Context(
        global_batch_size=global_batch_size,
        split_part=split_part,
        base_dir=os.getcwd(),
        training=training,
        subflavors=dict(subflavors or {}),
        shuffle=shuffle_over_epochs_multiplier,
        dataset_config=dataset_config,
        split_config=split_config,
        token_config=token_config,
    )
    if isinstance(path, Blender):
        mds = parse_metadataset(path.as_metadataset(split_part))
        return _finish(_resolve_split(mds, split_part, ctx), training)
    if isinstance(path, dict):
        return _finish(_resolve_split(parse_metadataset(path), split_part, ctx), training)
    ref = Reference(path=os.fspath(path))
    return _finish(_resolve_reference(ref, ctx), training)


def _finish(resolved: Resolved, training: bool) -> Resolved:
    sources = resolved.sources
    _warn_duplicates(sources)
    mixture = None
    if resolved.mode == "weight":
        mixture = _mixture(sources)
        if mixture is None:
            sources = _normalise_weights(sources)
        else:
            sources, mixture = _normalise_scheduled(sources, mixture)
    if not sources:
        raise MetadatasetError("the metadataset has no datasets with a non-zero weight")
    mode = resolved.mode if len(sources) > 1 or resolved.mode == "repetitions" else "none"
    if not training:
        mode = "none" if len(sources) == 1 else "concat"
    if mode != "weight":
        mixture = None
    blend_by = resolved.blend_by if mode == "weight" else BlendBy()
    return Resolved(sources, mode, mixture, resolved.global_batch_size, blend_by)


def _mixture(sources: list[Source]) -> Mixture | None:
    """The blend tree above ``sources`` as weight functions; None when no weight changes over time
    (fixed weights keep their resolved numbers, so their order is what it always was)."""
    levels: dict[int, tuple[int, BlendLevel]] = {}
    paths = []
    for source in sources:
        path = []
        for level, entry in source.weight_path:
            index, _ = levels.setdefault(id(level), (len(levels), level))
            path.append((index, entry))
        paths.append(tuple(path))
    ordered = [level for _, level in sorted(levels.values(), key=lambda item: item[0])]
    mixture = Mixture(tuple(level.schedules for level in ordered), tuple(paths))
    return None if mixture.is_constant else mixture


def _normalise_scheduled(sources: list[Source], mixture: Mixture) -> tuple[list[Source], Mixture]:
    """Drop sources whose scheduled weight is 0 at all times, check that some source has weight at
    every time, and set each source's ``weight`` to its share at the start."""
    times = mixture.check_times()
    table = [mixture.weights_at(t) for t in times]
    for t, weights in zip(times, table):
        if sum(weights) <= 0:
            raise MetadatasetError(
                f"the blend weights are all 0 at global sample {t}: some dataset must have a "
                "positive weight at every time"
            )
    kept, paths = [], []
    for i, source in enumerate(sources):
        peak = max(weights[i] / sum(weights) for weights in table)
        if peak == 0:
            warnings.warn(
                f"{_name(source)} has weight 0 at all times and is left out of the blend",
                stacklevel=4,
            )
            continue
        if peak < TINY_WEIGHT:
            warnings.warn(
                f"{_name(source)} has a tiny blend weight (at most {peak:.2e}): it will rarely be "
                "sampled",
                stacklevel=4,
            )
        kept.append(source)
        paths.append(mixture.paths[i])
    mixture = Mixture(mixture.levels, tuple(paths))
    start = mixture.weights_at(0)
    for source, weight in zip(kept, start):
        source.weight = weight / sum(start)
    return kept, mixture


def _normalise_weights(sources: list[Source]) -> list[Source]:
    kept = []
    for source in sources:
        if source.weight == 0:
            warnings.warn(
                f"{_name(source)} has weight 0 and is left out of the blend", stacklevel=4
            )
        else:
            kept.append(source)
    total = sum(s.weight for s in kept) or 1.0
    for source in kept:
        source.weight /= total
        if source.weight < TINY_WEIGHT:
            warnings.warn(
                f"{_name(source)} has a tiny blend weight ({source.weight:.2e}): it will rarely be "
                "sampled",
                stacklevel=4,
            )
    return kept


def _warn_duplicates(sources: list[Source]) -> None:
    seen: dict[tuple, int] = {}
    for source in sources:
        key = (source.leaf.fingerprint()["path"], source.leaf.split_part, source.start, source.end)
        seen[key] = seen.get(key, 0) + 1
    for (path, split, _, _), count in seen.items():
        if count > 1:
            warnings.warn(
                f"{path} (split {split}) is reached {count} times through different blend paths; its "
                "samples will be seen proportionally more often",
                stacklevel=4,
            )


def _name(source: Source) -> str:
    return f"{source.leaf.fingerprint()['path']} [{source.leaf.split_part}]"


def _resolve_split(mds, split_part: str, ctx: _Context) -> Resolved:
    if split_part not in mds.splits:
        raise MetadatasetError(
            f"{mds.path or '<metadataset>'}: no split {split_part!r}; splits: {sorted(mds.splits)}"
        )
    ctx = dataclasses.replace(ctx, base_dir=mds.directory, mds_path=mds.path)
    if mds.global_batch_size is not None:
        ctx = dataclasses.replace(ctx, global_batch_size=mds.global_batch_size)
    ctx = _with_token_config(ctx, mds.token_config, f"{mds.path or '<metadataset>'}: token_config")
    resolved = _resolve_node(mds.splits[split_part], ctx)
    if mds.global_batch_size is not None:  # the outermost file's is the run's step size
        resolved.global_batch_size = mds.global_batch_size
    return resolved


def _resolve_node(node: Any, ctx: _Context) -> Resolved:
    if isinstance(node, Blend):
        return _resolve_blend(node, ctx)
    if isinstance(node, Join):
        return Resolved([_resolve_join(node, ctx)], "none")
    return _resolve_reference(node, ctx)


def _with_subflavors(ctx: _Context, own: dict[str, Any]) -> _Context:
    """Outer levels win over inner ones on conflicting keys."""
    return dataclasses.replace(ctx, subflavors={**own, **ctx.subflavors})


def _with_subset(ctx: _Context, subset: Subset | None, where: str, leaf: bool) -> _Context:
    if subset is None:
        return ctx
    if subset.absolute and not leaf:
        raise MetadatasetError(
            f"{where}: absolute subset ranges are only allowed for a leaf dataset"
        )
    return dataclasses.replace(ctx, ratios=ctx.ratios + (subset,))


def _with_token_config(ctx: _Context, mapping: dict[str, Any] | None, where: str) -> _Context:
    """Field-wise override of the token settings inherited so far (paths relative to the YAML)."""
    if not mapping:
        return ctx
    own = dict(mapping)
    for key in TOKEN_CONFIG_PATHS:
        if own.get(key) is not None:
            own[key] = _absolute(own[key], ctx.base_dir)
    return dataclasses.replace(
        ctx, token_overrides={**ctx.token_overrides, **own}, token_where=where
    )


def _resolve_blend(node: Blend, ctx: _Context) -> Resolved:
    blend_by = _resolve_blend_by(node, ctx)
    ctx = dataclasses.replace(ctx, in_blend=True, pack_whole=ctx.pack_whole or node.pack_whole)
    ctx = _with_token_config(ctx, node.token_config, f"{node.where}: token_config")
    ctx = _with_subflavors(ctx, node.subflavors)
    ctx = _with_subset(ctx, node.subset, "blend", leaf=False)
    level = None
    if node.mode == "weight":
        level = BlendLevel(
            tuple(
                _in_samples(entry.weight, ctx, f"{node.where}.blend[{i}]")
                for i, entry in enumerate(node.entries)
            )
        )
        starts = [_fixed_or_start(entry.weight) for entry in node.entries]
        total = sum(starts)
    sources: list[Source] = []
    for i, entry in enumerate(node.entries):
        child = ctx
        if level is not None:
            child = dataclasses.replace(
                ctx,
                weight=ctx.weight * (starts[i] / total if total else 0.0),
                weight_path=ctx.weight_path + ((level, i),),
            )
        else:
            child = dataclasses.replace(ctx, repetitions=ctx.repetitions * entry.repetitions)
        resolved = _resolve_node(entry, child)
        if len(resolved.sources) > 1 and resolved.mode != node.mode:
            raise MetadatasetError(
                "Can only blend datasets which are of the same blend mode (blend vs blend_epochized)"
            )
        sources += resolved.sources
    return Resolved(sources, node.mode, blend_by=blend_by)


def _resolve_blend_by(node: Blend, ctx: _Context) -> BlendBy:
    """What the blend's weights share; only the outermost blend of a split may say (the weights
    of nested blends multiply into one mix over all leaves)."""
    value = node.blend_by
    if value is None:
        return BlendBy()
    where = node.where or "blend"
    if ctx.in_blend:
        raise MetadatasetError(
            f"{where}: blend_by is set on a blend nested inside another blend; set it on the "
            "outermost blend of the split (one mix over all datasets, one measure of size)"
        )
    if isinstance(value, dict):
        value = resolve_class(
            value.get("__module__", "energon"), value["__function__"], where=where, function=True
        )
    try:
        return BlendBy.of(value)
    except (TypeError, ValueError) as e:
        raise MetadatasetError(f"{where}: {e}") from e


def _fixed_or_start(weight: Weight) -> float:
    """A fixed weight, or a schedule's weight at the start (for the sources' start weights)."""
    return weight.value_at(0) if isinstance(weight, WeightSchedule) else weight


def _in_samples(weight: Weight, ctx: _Context, where: str) -> WeightSchedule:
    if not isinstance(weight, WeightSchedule):
        return WeightSchedule.constant(weight)
    if weight.unit == "steps" and ctx.global_batch_size is None:
        raise MetadatasetError(
            f"{where}: the weight schedule is in steps, but no global batch size converts steps "
            "to samples: set global_batch_size at the metadataset's top level, pass "
            "get_train_dataset(..., global_batch_size=...), or give the schedule in samples"
        )
    return weight.in_samples(ctx.global_batch_size)


def _resolve_reference(ref: Reference, ctx: _Context) -> Resolved:
    path = _absolute(ref.path, ctx.base_dir)
    split_part = ref.split_part or ctx.split_part
    ctx = _with_subflavors(ctx, ref.subflavors)
    ctx = dataclasses.replace(
        ctx,
        shuffle=_combine_shuffle(ctx.shuffle, ref.shuffle_over_epochs_multiplier),
        pack_whole=ctx.pack_whole or ref.pack_whole,
    )
    ctx = _with_token_config(ctx, ref.token_config, f"{ref.where}: token_config")
    if path.endswith(".yaml"):
        if ref.dataset_config or ref.split_config or ref.aux:
            raise MetadatasetError(
                f"{path}: dataset_config, split_config and aux cannot be set on a reference to a "
                "metadataset"
            )
        ctx = _with_subset(ctx, ref.subset, path, leaf=False)
        return _resolve_split(_load_metadataset(path), split_part, ctx)
    leaf = _open_leaf(path, split_part, ref, ctx)
    start, end = _apply_subsets(0, len(leaf), ref.subset, ctx.ratios)
    if start >= end:
        raise MetadatasetError(f"{path}: the subset of split {split_part!r} is empty")
    aux = {name: _aux_path(value, ctx.base_dir) for name, value in ref.aux.items()}
    source = Source(
        leaf=leaf,
        start=start,
        end=end,
        weight=ctx.weight,
        repetitions=ctx.repetitions,
        shuffle_over_epochs=ctx.shuffle,
        aux=aux,
        weight_path=ctx.weight_path,
        pack_whole=ctx.pack_whole,
    )
    return Resolved([source], "none")


def _open_leaf(path: str, split_part: str, ref: Reference, ctx: _Context) -> LeafDataset:
    kind = detect_kind(path)
    if ref.token_config and kind != "tokens":
        raise MetadatasetError(
            f"{ref.where}: token_config is only for Megatron token prefixes (<prefix>.bin and "
            f"<prefix>.idx), but {path} is not one"
        )
    if kind != "tokens":
        return open_leaf(
            path,
            kind=kind,
            split_part=split_part,
            subflavors=ctx.subflavors,
            split_config=ref.split_config or ctx.split_config,
            dataset_config=ref.dataset_config or ctx.dataset_config,
        )
    # a Megatron .bin/.idx prefix: GPT windows of megatron-core's sample index for the split
    where = f"{ref.where} ({path})" if ref.where else path
    config = _token_config(ctx, where)
    try:
        return open_leaf(
            path, kind=kind, split_part=split_part, subflavors=ctx.subflavors, token_config=config
        )
    except ValueError as e:
        raise MetadatasetError(f"{where}: {e}") from e


def _token_config(ctx: _Context, where: str) -> GPTConfig:
    """The ``token_config=`` argument (a GPTConfig or mapping) overridden field by field by the
    YAML's ``token_config`` mappings (metadataset top level, blends, the entry itself)."""
    base = ctx.token_config
    if isinstance(base, dict):
        base = parse_token_config(base, "token_config argument")
        base = GPTConfig(**base) if "sequence_length" in base else base
    if base is not None and not isinstance(base, GPTConfig | dict):
        raise TypeError(
            f"token_config must be an energon.megatron GPTConfig or a mapping, not {type(base).__name__}"
        )
    overrides = ctx.token_overrides
    if isinstance(base, GPTConfig):
        return dataclasses.replace(base, **overrides) if overrides else base
    merged = {**(base or {}), **overrides}
    if "sequence_length" not in merged:
        if ctx.token_where or ctx.mds_path:
            raise MetadatasetError(
                f"{where} is a Megatron token dataset, but no token_config sets sequence_length "
                f"(last token_config: {ctx.token_where or 'none'}): add token_config: "
                "{sequence_length: ...} to the entry, an enclosing blend or the metadataset's top "
                "level, or pass token_config=GPTConfig(sequence_length=...) to get_train_dataset / "
                "get_val_dataset"
            )
        raise MetadatasetError(
            f"{where} is a Megatron token dataset: pass token_config=GPTConfig(sequence_length=...) "
            "(from energon.megatron) to get_train_dataset / get_val_dataset"
        )
    return GPTConfig(**merged)


def _resolve_joiner(ref: dict[str, str], where: str) -> Any:
    """A joiner reference: a sample class (joined with ``from_joined``) or a plain function, both
    resolved through the allow-list of :mod:`energon.format.typeref`."""
    module = ref.get("__module__", "energon")
    if "__function__" in ref:
        return resolve_class(module, ref["__function__"], where=where, function=True)
    joiner = resolve_class(module, ref["__class__"], where=where)
    if not callable(getattr(joiner, "from_joined", None)):
        raise MetadatasetError(
            f"{where}: joiner class {ref['__class__']!r} has no from_joined (use a Sample class, "
            "or __function__ for a joining function)"
        )
    return joiner


def _resolve_join(node: Join, ctx: _Context) -> Source:
    """A source over the prepared join index of ``node`` (built by ``energon prepare mix.yaml``)."""
    split_part = node.split_part or ctx.split_part
    members = [resolve_join_member(m, ctx.base_dir, split_part) for m in node.members]
    if not ctx.mds_path:
        raise MetadatasetError("joins are only supported inside a metadataset YAML file")
    index_path = os.path.join(cache_dir(ctx.mds_path), join_index_name(members))
    joiner = None
    if node.joiner is not None:
        joiner = _resolve_joiner(node.joiner, ctx.mds_path)
    leaf = open_leaf(
        JoinSpec(tuple(members), index_path, joiner),
        split_part=split_part,
        subflavors={**node.subflavors, **ctx.subflavors},
    )
    start, end = _apply_subsets(0, len(leaf), node.subset, ctx.ratios)
    return Source(
        leaf=leaf,
        start=start,
        end=end,
        weight=ctx.weight,
        repetitions=ctx.repetitions,
        shuffle_over_epochs=_combine_shuffle(ctx.shuffle, node.shuffle_over_epochs_multiplier),
        weight_path=ctx.weight_path,
        pack_whole=ctx.pack_whole or node.pack_whole,
    )


def _apply_subsets(
    start: int, end: int, own: Subset | None, ratios: tuple[Subset, ...]
) -> tuple[int, int]:
    """Own range first (absolute or ratio), then the inherited ratios from the innermost out."""
    if own is not None:
        start, end = own.window(start, end)
    for subset in reversed(ratios):
        start, end = subset.window(start, end)
    return start, end


def _combine_shuffle(outer: int | None, inner: int | None) -> int | None:
    if outer is None or inner is None:
        return None
    if outer == -1 or inner == -1:
        return -1
    return int(outer * inner)


def _load_metadataset(path: str) -> Any:
    """A metadataset YAML, local or remote (a remote one resolves relative paths remotely)."""
    if not epath.is_remote(path):
        return load_metadataset(path)
    try:
        data = yaml.safe_load(epath.read_text(path))
    except yaml.YAMLError as e:
        raise MetadatasetError(f"{path}: invalid YAML: {e}") from e
    return parse_metadataset(data, path)


def _absolute(path: str, base_dir: str) -> str:
    if epath.is_remote(path) or epath.is_remote(base_dir) or path.startswith("file://"):
        return epath.resolve(path, base_dir)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))


def _aux_path(value: str, base_dir: str) -> str:
    """An aux reference with its path made absolute (relative to the YAML's folder)."""
    from energon.source.file_store import aux_reference, split_aux_reference

    try:
        kind, target = split_aux_reference(value)
    except ValueError as e:
        raise MetadatasetError(str(e)) from e
    return aux_reference(kind, _absolute(target, base_dir))


@dataclasses.dataclass
class TraversedDatasetReference:
    """One leaf of a metadataset split, as Megatron-Energon's ``traverse_metadataset`` gives it:
    where it is, which split part, its aux sources (name -> path) and the subflavors the hierarchy
    gives it (not those of its own dataset.yaml). Paths are normalised strings here;
    ``energon.traverse_metadataset`` (the reference's shape) gives the same objects with ``EPath``s."""

    path: Any
    split_part: str
    aux: dict[str, Any]
    subflavors: dict[str, Any]


def traverse_metadataset(path: Any, *, split_part: str) -> list[TraversedDatasetReference]:
    """Leaves of one split without opening any dataset (missing ones are no error). A ``join``
    gives each of its members (with the join's subflavors)."""
    from energon.source.file_store import split_aux_reference

    mds = load_metadataset(os.fspath(path))
    out: list[TraversedDatasetReference] = []

    def reference(target: str, split: str, aux: dict[str, str], subflavors: dict) -> None:
        aux_paths = {name: split_aux_reference(v)[1] for name, v in aux.items()}
        out.append(TraversedDatasetReference(target, split, aux_paths, subflavors))

    def walk(node: Any, base_dir: str, split: str, subflavors: dict[str, Any]) -> None:
        if isinstance(node, Blend):
            for entry in node.entries:
                walk(entry, base_dir, split, {**node.subflavors, **subflavors})
            return
        if isinstance(node, Join):
            joined = {**node.subflavors, **subflavors}
            for member in node.members:
                member_split = member.split_part or node.split_part or split
                merged = {**member.subflavors, **joined}
                reference(_absolute(member.path, base_dir), member_split, {}, merged)
            return
        merged = {**node.subflavors, **subflavors}
        target = _absolute(node.path, base_dir)
        own_split = node.split_part or split
        if target.endswith(".yaml") and os.path.exists(target):
            nested = load_metadataset(target)
            walk(nested.splits[own_split], nested.directory, own_split, merged)
            return
        aux = {name: _aux_path(value, base_dir) for name, value in node.aux.items()}
        reference(target, own_split, aux, merged)

    walk(mds.splits[split_part], mds.directory, split_part, {})
    return out
