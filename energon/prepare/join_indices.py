"""``energon prepare mix.yaml``: build the index of every ``join`` of every split of a
metadataset (the file format is :mod:`energon.format.join_index`), and remove stale ones."""

from __future__ import annotations

import os
from typing import Any

from energon.format.join_index import build_join_index, cache_dir, join_index_name
from energon.metadataset.config import Blend, Join, load_metadataset
from energon.metadataset.join_members import resolve_join_member


def _joins_of(node: Any) -> list[Join]:
    if isinstance(node, Join):
        return [node]
    if isinstance(node, Blend):
        return [j for entry in node.entries for j in _joins_of(entry)]
    return []


def prepare_metadataset(path: str | os.PathLike, *, progress: bool = True) -> list[str]:
    """Build every join index of every split of the metadataset; remove stale ones. Returns a report."""
    path = os.path.abspath(os.fspath(path))
    mds = load_metadataset(path)
    folder = cache_dir(path)
    produced: set[str] = set()
    report: list[str] = []
    for split_part, node in mds.splits.items():
        for join in _joins_of(node):
            members = [
                resolve_join_member(m, mds.directory, join.split_part or split_part)
                for m in join.members
            ]
            name = join_index_name(members)
            produced.add(name)
            target = os.path.join(folder, name)
            if os.path.exists(target):
                report.append(f"{split_part}: join index up to date ({name})")
                continue
            rows, total = build_join_index(members, target)
            message = (
                f"Joined all {rows} samples" if rows == total else f"Joined {rows}/{total} samples"
            )
            report.append(f"{split_part}: {message} ({name})")
    if os.path.isdir(folder):
        for stale in sorted(set(os.listdir(folder)) - produced):
            os.remove(os.path.join(folder, stale))
            report.append(f"Cleanup cache file {stale}")
    return report
