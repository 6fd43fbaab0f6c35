"""Streams over metadata instead of data: what the ledger runs.

:func:`simulated_spec` turns a :class:`~energon.pipeline.spec.PipelineSpec` into one that
``build_stream`` turns into *the same chain of stages* as for training (same classes, counters,
restore keys and snapshots), except that

- every leaf is a :class:`MetaLeaf`: "loading" sample ``i`` gives its
  :class:`~energon.source.meta.SampleMeta`, no byte of data is read;
- the task encoder is a copy with the same active hooks in which every hook that only passes
  samples through (``encode_sample`` and friends, ``pack_selected_samples``, ``batch``,
  ``encode_batch``) passes the metadata through, and the hooks that decide what goes together
  (``select_samples_to_pack``, ``batch_group_criterion``) are the user's own, which is only
  possible when they are marked ``@uses_sample_meta``.

So a simulated stream emits exactly the restore keys the real one emits, and its snapshots
restore real streams. What it assumes (:func:`assumptions` lists it, and the ledger reports it
with every answer): every sample loads, and each of the user's hooks that is not a generator
returns one output per input (it does not raise ``SkipSample``). With ``strict=True`` it assumes
nothing about the user's hooks and refuses them instead. A hook whose outcome depends on decoded
data (an unmarked packing or grouping hook, a generator hook, a task encoder that composes its own
pipeline) raises :class:`NotSimulableError` naming it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from energon.errors import NotSimulableError, reraise_exception
from energon.pipeline.keys import Key, pointer_target
from energon.pipeline.spec import PipelineSpec
from energon.source.meta import MetaReader, SampleMeta, meta_reader
from energon.task_encoder.base import (
    DefaultTaskEncoder,
    TaskEncoder,
    decides_from_sample_meta,
    uses_sample_meta,
)

#: hooks that pass samples through, one output per input: identity on metadata
PASS_THROUGH = ("encode_sample", "preencode_sample", "postencode_sample", "encode_batch")
#: hooks that decide which samples go together: must decide from metadata
DECIDING = ("select_samples_to_pack", "batch_group_criterion")
LOADS = "every sample loads (the error policy skips corrupt ones: that would shift later items)"


@dataclasses.dataclass(frozen=True)
class _MetaBuilder:
    kind: str = "meta"  # not "crude": no cooker runs
    sample_type: Any = None


class MetaLeaf:
    """A leaf whose samples are their metadata (see the module docstring)."""

    builder = _MetaBuilder()
    remote = False  # no prefetch hints: nothing is read

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf
        self.kind = leaf.kind
        self.root = leaf.root
        self.split_part = leaf.split_part
        self.subflavors = leaf.subflavors
        self.excluded = leaf.excluded
        self.shard_starts = leaf.shard_starts

    def sample_meta_reader(self) -> MetaReader:
        return meta_reader(self.leaf)

    def __len__(self) -> int:
        return len(self.leaf)

    def load(self, index: int, decoder: Any, restore_key: Key) -> SampleMeta:
        source, _ = pointer_target(restore_key)
        return SampleMeta(meta_reader(self.leaf), source, index)

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        pass

    def fingerprint(self) -> dict[str, Any]:
        return self.leaf.fingerprint()

    def config(self) -> dict[str, Any]:
        return self.leaf.config()


def _passes_through(self: Any, value: Any) -> Any:
    return value


def _batch(self: Any, values: list[Any]) -> list[Any]:
    return list(values)


def _hook_name(te: TaskEncoder, hook: str) -> str:
    return f"{type(te).__qualname__}.{hook}"


def _user_defined(te: TaskEncoder, hook: str) -> bool:
    """A hook the user wrote (not energon's own default behaviour)."""
    return getattr(type(te), hook) is not getattr(DefaultTaskEncoder, hook, None)


def assumptions(te: TaskEncoder) -> list[str]:
    """What a simulation of ``te``'s pipeline takes for granted (see the module docstring)."""
    found = [LOADS]
    for hook in (*PASS_THROUGH, "pack_selected_samples", "batch"):
        if te.is_active(hook) and _user_defined(te, hook):
            found.append(
                f"{_hook_name(te, hook)} returns one output per input (no SkipSample, no failure)"
            )
    return found


def _simulated_hook(te: TaskEncoder, hook: str, strict: bool) -> Callable[..., Any]:
    fn = getattr(te, hook)
    if hook in DECIDING:
        if not decides_from_sample_meta(fn):
            raise NotSimulableError(
                f"{_hook_name(te, hook)} decides from decoded samples, so what it does cannot be "
                "known without reading data. Mark it @uses_sample_meta (and decide from "
                "SampleMeta: sizes, keys, media metadata) to make it known, or describe steps "
                "that were trained from the loader's journal (see docs/ledger.md)."
            )

        def decide(self: Any, value: Any) -> Any:
            return fn(value)

        return uses_sample_meta(decide)
    if inspect.isgeneratorfunction(fn):
        raise NotSimulableError(
            f"{_hook_name(te, hook)} is a generator: how many outputs it yields per input depends "
            "on the data. Describe steps that were trained from the loader's journal (see "
            "docs/ledger.md)."
        )
    if hook == "encode_sample" and getattr(type(te), hook) is DefaultTaskEncoder.encode_sample:
        return DefaultTaskEncoder.encode_sample  # keeps build_stream's view of "user-defined"
    if strict and _user_defined(te, hook) and hook != "batch":
        raise NotSimulableError(
            f"{_hook_name(te, hook)} is the user's: whether it returns exactly one output per "
            "input (no SkipSample) cannot be known without reading data (strict mode). Describe "
            "steps that were trained from the loader's journal (see docs/ledger.md)."
        )
    if hook == "batch":
        return _batch
    if hook == "pack_selected_samples":
        return _batch
    return _passes_through


def simulated_task_encoder(te: TaskEncoder, strict: bool = False) -> TaskEncoder:
    """A task encoder with ``te``'s active hooks, acting on metadata (see the module docstring)."""
    if getattr(te, "compose_dataset", None) is not None:
        raise NotSimulableError(
            f"{type(te).__qualname__} builds its own pipeline (compose_dataset): the ledger only "
            "knows energon's own stream chain"
        )
    hooks = [*PASS_THROUGH, *DECIDING, "pack_selected_samples", "batch"]
    attrs = {hook: _simulated_hook(te, hook, strict) for hook in hooks if te.is_active(hook)}
    simulated = type(f"Simulated{type(te).__name__}", (TaskEncoder,), attrs)()
    simulated.decoder = None
    simulated.encoded_sample_type = None  # DefaultTaskEncoder.encode_sample: identity
    return simulated


def simulated_spec(spec: PipelineSpec, strict: bool = False) -> PipelineSpec:
    """``spec`` with metadata leaves and the simulated task encoder (see the module docstring)."""
    sources = [
        dataclasses.replace(source, leaf=MetaLeaf(source.leaf), aux={}) for source in spec.sources
    ]
    return dataclasses.replace(
        spec,
        sources=sources,
        task_encoder=simulated_task_encoder(spec.task_encoder, strict),
        decoder=None,
        error_handler=reraise_exception,
    )
