"""``megatron.energon.rng``: random generators under the reference's names.

``WorkerRng`` is a local ``torch.Generator`` seeded from the worker config (the logical stream's
seed when called inside a loader, see ``energon.task_encoder.base.hook_context``); it draws like the
reference (``torch.randint`` per draw) and its state is the generator's state as bytes.
``SystemRng`` seeds, saves and restores the *global* ``random``/``numpy``/``torch`` generators. The
library never calls it: it exists for user code that asks for exactly that (as
``@stateless(restore_seeds=True)`` does around one call).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any, TypeVar

import numpy as np
import torch

from energon.compat.savable import FlexState, Savable
from energon.plan.rng import stable_seed
from energon.samples.edataclass import edataclass
from energon.task_encoder.base import hook_context
from energon.worker import WorkerConfig

__all__ = [
    "FlexState",
    "Savable",
    "SystemRng",
    "SystemRngState",
    "WorkerConfig",
    "WorkerRng",
    "edataclass",
]

T = TypeVar("T")


@dataclasses.dataclass
class SystemRngState:
    """The states of the global generators (library-specific types, only for restoring)."""

    torch: Any
    numpy: Any
    random: Any


class SystemRng:
    """Seeds, saves or restores the global ``torch``, ``numpy`` and ``random`` generators."""

    @staticmethod
    def get_seed_from_args(*args: Any) -> int:
        """A 32-bit seed from the ``str()`` of each argument (the same number as the reference)."""
        text = "|".join(str(arg) for arg in args)
        return int.from_bytes(hashlib.sha1(text.encode()).digest()[:4], "big")

    @staticmethod
    def seed(seed: int) -> None:
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)

    @staticmethod
    def seed_args(*args: Any) -> None:
        SystemRng.seed(SystemRng.get_seed_from_args(*args))

    @staticmethod
    def save_state() -> SystemRngState:
        return SystemRngState(
            torch=torch.get_rng_state(), numpy=np.random.get_state(), random=random.getstate()
        )

    @staticmethod
    def restore_state(state: SystemRngState) -> None:
        torch.set_rng_state(state.torch)
        np.random.set_state(state.numpy)
        random.setstate(state.random)


class WorkerRng(Savable):
    """A deterministic generator of one worker (inside a loader: of the logical stream being
    computed), independent of the global generators."""

    rng: torch.Generator

    def __init__(self, worker_config: WorkerConfig) -> None:
        self.worker_config = worker_config
        seed = stable_seed(
            worker_config.seed_offset, "WorkerRng", worker_config.rank, hook_context.seed
        )
        self.rng = torch.Generator()
        self.rng.manual_seed(seed % (1 << 63))

    def randbelow(self, n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=self.rng).item())

    def choice_idx(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, replacement=True, generator=self.rng).item())

    def choice(self, l: list[T], probs: torch.Tensor | None = None) -> T:  # noqa: E741
        if probs is None:
            return l[self.randbelow(len(l))]
        return l[self.choice_idx(probs)]

    def shuffle(self, l: list[T]) -> list[T]:  # noqa: E741
        """A new list with the entries of ``l`` in random order."""
        order = torch.randperm(len(l), generator=self.rng).tolist()
        return [l[i] for i in order]

    def rand_pop(self, l: list[T]) -> T:  # noqa: E741
        return l.pop(self.randbelow(len(l)))

    def save_state(self) -> FlexState:
        return FlexState(rng=bytes(self.rng.get_state().numpy().tobytes()))

    def restore_state(self, state: FlexState | None) -> None:
        if state is None:
            self.__init__(self.worker_config)
            return
        data = torch.frombuffer(bytearray(state["rng"]), dtype=torch.uint8)
        self.rng.set_state(data.clone())
