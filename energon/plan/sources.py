"""A leaf dataset as the plan sees it (:class:`Source`): which of its samples, with what weight or
repetitions. The metadataset resolver (:mod:`energon.metadataset.resolve`) makes them from YAML;
the pipeline, the loader and the tools below the resolver only read them, so they live here."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from energon.plan.schedules import WeightSchedule
    from energon.source.leaf import LeafDataset


@dataclasses.dataclass
class Source:
    """One leaf dataset as the plan sees it: which samples, with what weight or repetitions."""

    leaf: LeafDataset
    start: int
    end: int
    weight: float = 1.0
    repetitions: float = 1.0
    shuffle_over_epochs: int | None = 1
    aux: dict[str, str] = dataclasses.field(default_factory=dict)
    # the blends above this source, outermost first: (blend level, entry number)
    weight_path: tuple[tuple[BlendLevel, int], ...] = ()
    pack_whole: bool = False  # packing never splits its samples across packs

    def __len__(self) -> int:
        return self.end - self.start

    def fingerprint(self) -> dict[str, Any]:
        return {
            **self.leaf.fingerprint(),
            "range": [self.start, self.end],
            "weight": self.weight,
            "repetitions": self.repetitions,
            "shuffle_over_epochs": self.shuffle_over_epochs,
            **({"pack_whole": True} if self.pack_whole else {}),
        }

    def config(self) -> dict[str, Any]:
        return {**self.leaf.config(), **self.fingerprint(), "aux": self.aux}


@dataclasses.dataclass(eq=False)
class BlendLevel:
    """One weight blend of the tree: its entries' weights as schedules on the sample clock."""

    schedules: tuple[WeightSchedule, ...]
