"""Which parts a logical stream has, and the steps a sample goes through between loading and
batching, decided in one place.

Every executor builds a logical stream from the same parts: the pointer stages
(:func:`energon.pipeline.pointers.build_pointer_stages`), loading, the *sample steps* listed by
:func:`sample_steps`, then batching. The normal executor (:func:`energon.pipeline.stream.build_stream`,
also under validation, the ledger's simulated streams, ``simulate``, the cursor editors and the
compat wrappers, which all build on it) makes each sample step a
:class:`~energon.pipeline.stages.MapStage`; the balanced executor
(:mod:`energon.pipeline.balanced_executor`) runs the same steps on each sample of its share
before packing it. So a step added to :func:`sample_steps` (a filter, a probe) runs in every
path, and cannot be missing from one of them. :func:`stream_parts` decides the rest of the
chain (packing, batching, ``encode_batch``); the balanced executor replaces packing and batching by
its packing of balanced shares and keeps the others.
"""

from __future__ import annotations

import dataclasses

from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stages import Hook
from energon.task_encoder.base import DefaultTaskEncoder, TaskEncoder


@dataclasses.dataclass(frozen=True)
class SampleStep:
    """One per-sample step: ``fn(sample)`` returns the sample (or a new one), yields any number
    of them (a generator), or raises :class:`~energon.errors.SkipSample` to drop it. ``name`` is
    the hook name its errors and restore keys carry. ``identity``: it returns its input unchanged
    (then a batch may ask for its inputs several at a time)."""

    name: str
    fn: Hook
    identity: bool = False


def sample_steps(spec: PipelineSpec, *, identity_encode: bool = False) -> list[SampleStep]:
    """The steps between loading and batching, in order: the task encoder's ``encode_sample``
    (or ``preencode_sample``), then ``postencode_sample`` unless packing runs it on each pack.
    ``identity_encode``: the library's own ``encode_sample`` is known to return its input."""
    te = spec.task_encoder
    steps = []
    if te.is_active("preencode_sample"):
        if _user_defined(te, "encode_sample"):
            raise ValueError(
                "define either encode_sample or preencode_sample/postencode_sample, not both"
            )
        steps.append(SampleStep("preencode_sample", te.preencode_sample))
    elif te.is_active("encode_sample"):
        steps.append(SampleStep("encode_sample", te.encode_sample, identity=identity_encode))
    if te.is_active("postencode_sample") and not spec.packing_buffer_size:
        steps.append(SampleStep("postencode_sample", te.postencode_sample))
    return steps


def stream_parts(spec: PipelineSpec) -> list[str]:
    """The parts of a stream's chain, in order: ``pointers``, ``load``, ``samples`` (the
    :func:`sample_steps`), then ``pack`` (with a packing buffer), ``group`` (the task encoder
    groups batches) or ``batch`` (a batch size), and ``encode_batch`` when batches are made and
    the task encoder encodes them."""
    te = spec.task_encoder
    parts = ["pointers", "load", "samples"]
    if spec.packing_buffer_size:
        parts.append("pack")
    if te.is_active("batch_group_criterion"):
        parts.append("group")
    elif spec.batch_size is not None:
        parts.append("batch")
    if parts[-1] in ("group", "batch") and te.is_active("encode_batch"):
        parts.append("encode_batch")
    return parts


def _user_defined(te: TaskEncoder, hook: str) -> bool:
    """Overridden by the user (not just by DefaultTaskEncoder's identity version)."""
    return te.is_active(hook) and getattr(type(te), hook) is not getattr(DefaultTaskEncoder, hook)
