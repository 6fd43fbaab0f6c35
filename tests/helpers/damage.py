"""Damaging prepared datasets in place, for tests of the error policy and budgets.

``spoil_text_payloads`` overwrites the first payload byte of chosen ``.txt`` members with ``0xff``
(invalid UTF-8): sizes and offsets stay, so the prepared index still matches and each chosen sample
fails to decode (a ``SampleReadError`` naming shard and offset) while its neighbours load.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path


def spoil_text_payloads(shard: Path, spoil: Callable[[int, str], bool]) -> dict[str, int]:
    """Spoil member number ``i`` (key ``key``) of ``shard`` where ``spoil(i, key)``; returns the
    spoiled keys with the byte offset of their tar header."""
    targets = []
    with tarfile.open(shard) as tar:
        for i, member in enumerate(m for m in tar.getmembers() if m.name.endswith(".txt")):
            key = member.name.rsplit("/", 1)[-1].rsplit(".", 1)[0]
            if spoil(i, key):
                targets.append((key, member.offset, member.offset_data))
    with open(shard, "r+b") as f:
        for _, _, data_offset in targets:
            f.seek(data_offset)
            f.write(b"\xff")
    return {key: offset for key, offset, _ in targets}
