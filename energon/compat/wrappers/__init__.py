"""``megatron.energon.wrappers``: the reference's wrapper datasets, one module per wrapper family
(the reference's module paths), as nodes of one composition that runs on energon's stream pipeline
(see ``base``).

Two wrappers change the pass, not the stream: ``EpochizeDataset`` and ``LimitDataset`` set how many
micro-batches a loader pass yields, so they must be outermost (a clear error says so otherwise).
"""

from __future__ import annotations

from energon.compat.wrappers.base import BaseWrapperDataset
from energon.compat.wrappers.batch_dataset import BatchDataset
from energon.compat.wrappers.blend_dataset import BlendDataset
from energon.compat.wrappers.concat_dataset import ConcatDataset
from energon.compat.wrappers.epochize_dataset import EpochizeDataset
from energon.compat.wrappers.filter_dataset import FilterDataset
from energon.compat.wrappers.gc_dataset import GcDataset
from energon.compat.wrappers.group_batch_dataset import GroupBatchDataset
from energon.compat.wrappers.iter_map_dataset import IterMapDataset
from energon.compat.wrappers.limit_dataset import LimitDataset
from energon.compat.wrappers.log_sample_dataset import LogSampleDataset
from energon.compat.wrappers.map_dataset import MapDataset
from energon.compat.wrappers.mix_batch_dataset import (
    MixBatchDataset,
    concat_pad,
    generic_concat,
    homogeneous_concat_mix,
)
from energon.compat.wrappers.packing_dataset import PackingDataset
from energon.compat.wrappers.repeat_dataset import RepeatDataset
from energon.compat.wrappers.shuffle_buffer_dataset import ShuffleBufferDataset
from energon.compat.wrappers.skip import SkipSample
from energon.compat.wrappers.watchdog_dataset import WatchdogDataset

__all__ = [
    "BaseWrapperDataset",
    "BatchDataset",
    "BlendDataset",
    "ConcatDataset",
    "EpochizeDataset",
    "FilterDataset",
    "GcDataset",
    "GroupBatchDataset",
    "IterMapDataset",
    "LimitDataset",
    "LogSampleDataset",
    "MapDataset",
    "MixBatchDataset",
    "PackingDataset",
    "RepeatDataset",
    "ShuffleBufferDataset",
    "SkipSample",
    "WatchdogDataset",
    "concat_pad",
    "generic_concat",
    "homogeneous_concat_mix",
]
