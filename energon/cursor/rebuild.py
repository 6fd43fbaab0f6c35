"""The configuration a state was saved with, rebuilt from the state alone.

A state's fingerprint names every dataset (path, split, shards and counts, sample range, weight,
repetitions) and every loader option that shapes the order (seed, batch size, shuffle buffer,
slicing, packing, the task encoder's class). That is enough to rebuild the plan of WebDataset and
JSONL sources, so ``energon checkpoint skip`` and ``exclude`` need no configuration file. Token
and join sources, task encoders that need constructor arguments, or a dataset that changed on disk
need the configuration (``--config``, or the Python API with a dataset); the error says so.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from energon.errors import ArgumentError, StateError
from energon.loader.savable_dataset import SavableDataset
from energon.pipeline.spec import PipelineSpec, fingerprint_digest
from energon.plan.edits import edits_from_json
from energon.plan.sources import Source
from energon.source.kinds import open_leaf
from energon.state import fingerprint_differences
from energon.task_encoder.base import TaskEncoder
from energon.worker import WorkerConfig

_HINT = "pass the configuration (--config with the loader options, or a dataset in Python)"


def dataset_from_state(
    state: dict[str, Any], *, task_encoder: TaskEncoder | None = None
) -> SavableDataset:
    """A training dataset whose fingerprint is the state's (see the module docstring)."""
    fp = state["fingerprint"]
    if not fp.get("training"):
        raise StateError("only training states can be edited (validation restarts every pass)")
    sources = [_source(d) for d in fp["datasets"]]
    spec = PipelineSpec(
        sources=sources,
        mode=fp["mode"],
        training=True,
        seed=fp["seed"],
        num_streams=state["num_streams"],
        num_streams_fixed=True,
        batch_size=fp["batch_size"],
        batch_drop_last=fp["batch_drop_last"],
        shuffle_buffer_size=fp["shuffle_buffer_size"],
        max_samples_per_sequence=fp["max_samples_per_sequence"],
        parallel_shard_iters=fp["parallel_shard_iters"],
        shuffle_over_epochs=fp["shuffle_over_epochs"],
        repeat=fp["repeat"],
        task_encoder=task_encoder or _task_encoder(fp["task_encoder"]),
        decoder=None,
        packing_buffer_size=fp["packing_buffer_size"],
        group_max_wait=fp["group_max_wait"],
    )
    edited = dataclasses.replace(spec, edits=edits_from_json(state.get("edits")))
    if fingerprint_digest(edited.fingerprint()) != state["fingerprint_digest"]:
        diffs = fingerprint_differences(fp, edited.fingerprint())
        raise StateError(
            "the configuration rebuilt from the state differs from the one it was saved with "
            f"({'; '.join(diffs) or 'digest differs'}): {_HINT}"
        )
    worker_config = WorkerConfig(rank=0, world_size=state["world_size"], num_workers=0)
    return SavableDataset.from_spec(spec, worker_config)


def _source(described: dict[str, Any]) -> Source:
    if "megatron" in described or "join" in described:
        raise StateError(
            f"{described['path']}: token and join datasets cannot be rebuilt from a state: {_HINT}"
        )
    leaf = open_leaf(described["path"], split_part=described["split_part"])
    start, end = described["range"]
    return Source(
        leaf,
        start,
        end,
        weight=described["weight"],
        repetitions=described["repetitions"],
        shuffle_over_epochs=described["shuffle_over_epochs"],
    )


def _task_encoder(name: str) -> TaskEncoder:
    try:
        return make_task_encoder(name)
    except ValueError as e:
        raise StateError(f"{e}: {_HINT}") from e


def make_task_encoder(name: str) -> TaskEncoder:
    """An instance of the task encoder class ``module:Class`` or ``module.QualName`` (made without
    arguments); ValueError saying why not."""
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        candidates = [(module_name, attribute.split("."))]
    else:
        parts = name.split(".")
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    for module_name, attributes in candidates:
        try:
            value: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for attribute in attributes:
                value = getattr(value, attribute)
            return value()
        except (AttributeError, TypeError) as e:
            raise ArgumentError("task_encoder", f"cannot make the task encoder {name} ({e})") from e
    raise ArgumentError("task_encoder", f"cannot import the task encoder {name}")
