"""A member of a ``join`` in a metadataset resolved to its prepared dataset and split: what both
the resolver (to open the join) and ``energon prepare mix.yaml`` (to build its index) start from."""

from __future__ import annotations

import os

from energon.errors import DatasetNotPreparedError, MetadatasetError
from energon.format.join_index import JoinMemberSplit
from energon.format.layout import DATASET_YAML_FILENAME, SPLIT_YAML_FILENAME, nv_meta_dir
from energon.format.parquet import is_prepared_parquet
from energon.format.split import read_split
from energon.metadataset.config import JoinMember


def resolve_join_member(member: JoinMember, base_dir: str, split_part: str) -> JoinMemberSplit:
    """The member's dataset (relative to ``base_dir``) and split (its own, else ``split_part``)."""
    root = (
        member.path
        if os.path.isabs(member.path)
        else os.path.normpath(os.path.join(base_dir, member.path))
    )
    if not nv_meta_dir(root).is_dir():
        raise DatasetNotPreparedError(
            f"join member {root} is not a prepared dataset (run `energon prepare {root}`)"
        )
    split = read_split(root, member.split_config or SPLIT_YAML_FILENAME)
    part = member.split_part or split_part
    if part not in split.split_parts:
        raise MetadatasetError(
            f"join member {root}: no split {part!r}; splits: {sorted(split.split_parts)}"
        )
    shards = list(split.split_parts[part])
    return JoinMemberSplit(
        root=root,
        split_part=part,
        shards=shards,
        excluded_shards=set(split.exclude) & set(shards),
        excluded_keys={pair for pair in split.sample_excludes() if pair[0] in shards},
        nonmatch=member.nonmatch,
        dataset_config=member.dataset_config or DATASET_YAML_FILENAME,
        split_config=member.split_config or SPLIT_YAML_FILENAME,
        name=member.name,
        kind="parquet" if is_prepared_parquet(root) else "webdataset",
    )
