"""The extension point behind the task encoder's ``build_*`` hooks.

Megatron-Energon builds every pipeline by calling overridable task-encoder methods
(``build_train_datasets``, ``build_val_datasets``, ``build_batch``, ``build_encode_sample``,
``build_cook_crude_sample``, ``_load_dataset``) that compose wrapper datasets. energon builds its own
pipeline from a :class:`~energon.pipeline.spec.PipelineSpec` instead (exact blends, even validation
ranks, elastic state). ``TaskEncoder`` declares those hooks so that one class serves both: a task
encoder that overrides none of them gets energon's pipeline; one that overrides any of them asks
for the reference's composition, which the compatibility layer (``energon.compat.task_encoder``)
provides by registering a :class:`Composition` here when it is imported. The core never imports it.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

BUILD_HOOKS = (
    "build_train_datasets",
    "build_val_datasets",
    "build_batch",
    "build_encode_sample",
    "build_cook_crude_sample",
    "_load_dataset",
)


class DatasetBlendMode(enum.Enum):
    """How the loaded datasets are combined."""

    NONE = "none"
    DATASET_WEIGHT = "dataset_weight"
    SAMPLE_REPETITIONS = "sample_repetitions"


class Composition(Protocol):
    """Builds a dataset from a task encoder's ``build_*`` hooks, and gives their default bodies."""

    def compose(self, task_encoder: Any, spec: Any, worker_config: Any) -> Any:
        """The dataset ``get_train_dataset`` / ``get_val_dataset`` return for ``spec``."""

    def build_train_datasets(self, task_encoder: Any, **options: Any) -> Any: ...

    def build_val_datasets(self, task_encoder: Any, **options: Any) -> Any: ...

    def build_batch(self, task_encoder: Any, dataset: Any, **options: Any) -> Any: ...

    def build_encode_sample(self, task_encoder: Any, dataset: Any, **options: Any) -> Any: ...

    def build_cook_crude_sample(self, task_encoder: Any, dataset: Any, **options: Any) -> Any: ...

    def load_dataset(
        self, task_encoder: Any, dataset: Any, worker_rotation_offset: int, worker_config: Any
    ) -> Any: ...


_registered: Composition | None = None


def register_composition(composition: Composition) -> None:
    """Install the composition behind the ``build_*`` hooks (done by ``energon.compat``)."""
    global _registered
    _registered = composition


def composition() -> Composition:
    """The registered composition; a clear error when the compatibility layer is not loaded."""
    if _registered is None:
        raise NotImplementedError(
            "the build_* task-encoder hooks are Megatron-Energon's composition, which lives in "
            "energon.compat: import the task encoder from `energon` or `megatron.energon` (or "
            "`import energon.compat.task_encoder`) instead of energon.task_encoder"
        )
    return _registered
