"""Task encoders: the user's hooks (``base``), cooking of crude samples (``cooking``) and a
ready-made sequence packer (``packing``)."""

from energon.task_encoder.base import (
    AugmentTaskEncoder,
    DefaultTaskEncoder,
    SkipSample,
    TaskEncoder,
    hook_context,
    last_packing_round,
    may_split,
    stateless,
    uses_sample_meta,
)
from energon.task_encoder.cooking import Cooker, basic_sample_keys, cooker, select_cooker

__all__ = [
    "AugmentTaskEncoder",
    "Cooker",
    "DefaultTaskEncoder",
    "SkipSample",
    "TaskEncoder",
    "basic_sample_keys",
    "cooker",
    "hook_context",
    "last_packing_round",
    "may_split",
    "select_cooker",
    "stateless",
    "uses_sample_meta",
]
