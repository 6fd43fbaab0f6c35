"""Which stages a logical stream has, and in what order: decided in one place, :func:`stream_parts`.

A stream is a chain of *parts*: its pointers, loading, the per-sample hooks, packing, batching (or
grouping, or the balanced executor's packing of balanced shares), then the per-batch hooks. Every
path that makes a stream builds exactly the parts :func:`stream_parts` lists, in its order:

- the normal executor, :func:`energon.pipeline.stream.build_stream` (one stage per part), which
  training, validation, the ledger's simulated streams, ``simulate`` and the cursor editors use;
- the balanced executor (:mod:`energon.pipeline.balanced_executor`), which plans from the pointer
  part, runs the sample parts on each sample of its rank's share, packs the share where the list
  says ``balanced`` and runs the batch parts on the result (it refuses a part it cannot run);
- the compat wrappers (:mod:`energon.compat.wrappers`): their leaves are built by ``build_stream``,
  and a wrapper that is itself one part over its child (``MapDataset``, ``PackingDataset``,
  ``BatchDataset``, ``GroupBatchDataset``) asks :func:`stream_parts` what follows it.

So a part added here (a filter, a probe, a batch-level step) runs in every path, and cannot be
missing from one of them.
"""

from __future__ import annotations

import dataclasses

from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stages import Hook
from energon.task_encoder.base import DefaultTaskEncoder, TaskEncoder

# the kinds of part
POINTERS = "pointers"  # cursors, blend, shuffle of keys (energon.pipeline.pointers)
LOAD = "load"  # read, decode, cook
UPSTREAM = "upstream"  # a compat wrapper's child (a stream or another wrapper)
SAMPLE = "sample"  # a hook on each sample (value -> value, a generator, or SkipSample)
PACK = "pack"  # a packing buffer: packs are samples again
GROUP = "group"  # batches grouped by the task encoder's batch_group_criterion
BATCH = "batch"  # batches by size
BALANCED = "balanced"  # a rank's balanced share, packed (balanced executor); a stream's pool
BATCH_STEP = "batch_step"  # a hook on each batch

#: the parts after which items are batches
BATCHING = frozenset({GROUP, BATCH, BALANCED})


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of a stream. ``name`` is the hook name its errors and restore keys carry; ``fn``
    the hook of a ``sample`` or ``batch_step`` part; ``identity``: the hook returns its input
    unchanged (then a batch may ask for its inputs several at a time)."""

    kind: str
    name: str = ""
    fn: Hook | None = None
    identity: bool = False


def stream_parts(of: PipelineSpec | Part, *, identity_encode: bool = False) -> list[Part]:
    """The parts of a stream, in order.

    ``of`` a spec: a logical stream's ``pointers``, ``load``, the task encoder's sample hooks
    (``encode_sample`` or ``preencode_sample``, then ``postencode_sample`` unless packing runs
    it on each pack), ``pack`` (a packing buffer), ``group`` (the task encoder groups) or
    ``batch`` (a batch size) or ``balanced`` (``balance=``: replaces both), then ``encode_batch``
    when there are batches and the task encoder encodes them. ``identity_encode``: the library's
    own ``encode_sample`` is known to return its input.

    ``of`` a part: a compat wrapper that is that one part over its ``upstream`` child, and what
    follows it."""
    if isinstance(of, Part):
        parts = [Part(UPSTREAM), of]
        te = None
    else:
        parts = [Part(POINTERS), Part(LOAD), *_sample_hooks(of, identity_encode), *_batching(of)]
        te = of.task_encoder
    if parts[-1].kind in BATCHING:
        parts += _batch_hooks(te)
    return parts


def _sample_hooks(spec: PipelineSpec, identity_encode: bool) -> list[Part]:
    te = spec.task_encoder
    hooks = []
    if te.is_active("preencode_sample"):
        if _user_defined(te, "encode_sample"):
            raise ValueError(
                "define either encode_sample or preencode_sample/postencode_sample, not both"
            )
        hooks.append(Part(SAMPLE, "preencode_sample", te.preencode_sample))
    elif te.is_active("encode_sample"):
        hooks.append(Part(SAMPLE, "encode_sample", te.encode_sample, identity=identity_encode))
    if te.is_active("postencode_sample") and not spec.packing_buffer_size:
        hooks.append(Part(SAMPLE, "postencode_sample", te.postencode_sample))
    return hooks


def _batching(spec: PipelineSpec) -> list[Part]:
    """Packing, then grouping or batching; with ``balance=`` the balanced packing alone."""
    grouped = spec.task_encoder.is_active("batch_group_criterion")
    if spec.balance is not None:
        if spec.packing_buffer_size or grouped:
            raise ValueError("balance packs and groups by itself: no packing buffer or grouping")
        return [Part(BALANCED)]
    parts = [Part(PACK)] if spec.packing_buffer_size else []
    if grouped:
        parts.append(Part(GROUP))
    elif spec.batch_size is not None:
        parts.append(Part(BATCH))
    return parts


def _batch_hooks(te: TaskEncoder | None) -> list[Part]:
    """What runs on each batch: the task encoder's ``encode_batch`` (a compat wrapper's batches
    have no task encoder)."""
    if te is not None and te.is_active("encode_batch"):
        return [Part(BATCH_STEP, "encode_batch", te.encode_batch)]
    return []


def _user_defined(te: TaskEncoder, hook: str) -> bool:
    """Overridden by the user (not just by DefaultTaskEncoder's identity version)."""
    return te.is_active(hook) and getattr(type(te), hook) is not getattr(DefaultTaskEncoder, hook)
