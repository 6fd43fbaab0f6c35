"""``SamplePiece``: part of a sample that packing splits across packs.

A packer that fills every pack to the brim cuts a sample that does not fit the room left in a
pack: its head ends this pack, its rest starts the next one. ``select_samples_to_pack`` asks for a
cut by putting a ``SamplePiece(sample, start, stop)`` into a group instead of the sample; the rest
``SamplePiece(sample, stop, None)`` stays in the packing buffer, first in line, and comes back in the
next call. ``pack_selected_samples`` then gets the pieces and takes units ``[start, stop)`` of the
sample (tokens, in the packer's own measure; energon never looks inside). A piece is saved as
``("Piece", start, stop, key)`` (``energon.pipeline.keys``), so a pack that holds one restores
exactly and the ledger names both parts of a split sample.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, eq=False)
class SamplePiece:
    """Units ``start <= i < stop`` of ``sample`` (``stop`` None: to its end)."""

    sample: Any
    start: int
    stop: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sample, SamplePiece):
            raise TypeError("a SamplePiece holds a whole sample (use piece.sample), not a piece")
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise ValueError(f"a piece starts at an integer >= 0, got {self.start!r}")
        if self.stop is not None and (
            isinstance(self.stop, bool) or not isinstance(self.stop, int) or self.stop <= self.start
        ):
            raise ValueError(
                f"a piece ends after its start ({self.start}) or at None, got {self.stop!r}"
            )

    def cut(self, length: int) -> tuple[SamplePiece, SamplePiece]:
        """This piece's first ``length`` units and the rest."""
        if length <= 0 or (self.stop is not None and self.start + length >= self.stop):
            raise ValueError(f"cannot cut {length} units off {self}: nothing would be left")
        middle = self.start + length
        return SamplePiece(self.sample, self.start, middle), SamplePiece(
            self.sample, middle, self.stop
        )
