"""Saving and restoring a loader's position: the state of one rank, and of all ranks together.

A saved rank state is plain data (:mod:`energon.state`): the loader's position, the configuration's
fingerprint, the cursor edits and blend weight changes it ran under, and its error counts. A
restore is checked field by field against this dataset and config before anything changes
(:func:`restored_dataset`): a state that does not fit raises a
:class:`~energon.errors.StateError` and leaves the loader as it was. The states of all ranks are
gathered and scattered over the data-parallel group; a list saved by another number of ranks is
re-split (:func:`energon.state.redistribute_states`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from energon.balance.tail import settled
from energon.errors import StateError
from energon.loader.error_report import ErrorReport
from energon.loader.position import LoaderPosition
from energon.loader.savable_dataset import SavableDataset
from energon.pipeline.spec import PipelineSpec
from energon.plan.edits import edits_from_json
from energon.state import (
    check_compatible,
    check_position,
    check_state_shape,
    make_rank_state,
    parsed_weight_changes,
    redistribute_states,
    stream_snapshots,
    upgrade_state,
)
from energon.worker import WorkerConfig

# A state may name at most world_size x MAX_WORKERS logical streams (or one per sample): more is a
# damaged state, and building that many streams would look like a hang.
MAX_WORKERS = 1024


def pass_length(spec: PipelineSpec) -> int | None:
    """Micro-batches per ``for`` loop over a loader of ``spec`` (None: until the data ends, or
    forever)."""
    if spec.limit is not None:
        return spec.limit
    if spec.training:
        return spec.virtual_epoch_length or None
    return None


def rank_state(
    dataset: SavableDataset, position: LoaderPosition, errors: ErrorReport
) -> dict[str, Any]:
    """This rank's position as plain data (JSON-serialisable; safe for ``torch.load``)."""
    fp, digest = dataset.fingerprint()
    spec = dataset.spec
    state = make_rank_state(
        fingerprint=fp,
        fingerprint_digest=digest,
        num_streams=spec.num_streams,
        world_size=dataset.worker_config.world_size,
        rank=dataset.worker_config.rank,
        origin=position.origin,
        consumed=position.consumed,
        pass_offset=position.pass_offset,
        streams=position.snapshots,
        micro_batch_size=spec.batch_size,
        weight_changes=[c.config() for c in spec.weight_changes],
        edits=spec.edits.to_json() if spec.edits is not None else None,
        errors=errors.state(),
        balance_tail=position.balance_tail,
    )
    return json.loads(json.dumps(settled(state)))


def restored_dataset(
    dataset: SavableDataset, state: dict[str, Any]
) -> tuple[SavableDataset, dict[str, Any]]:
    """The dataset that continues ``state`` (its cursor edits, number of logical streams and
    weight changes applied to a copy of ``dataset``), and the state checked and upgraded to the
    current version. Raises :class:`StateError` when the state does not fit this rank, dataset or
    config."""
    state = check_state_shape(state)
    edited = dataset.with_spec(_spec_with_edits(dataset.spec, state))
    fp, digest = edited.fingerprint()
    check_compatible(state, fp, digest)
    state = upgrade_state(state, edited.spec.pointer_kinds())
    wc = dataset.worker_config
    if (state["rank"], state["world_size"]) != (wc.rank, wc.world_size):
        raise StateError(
            f"this state was saved by rank {state['rank']} of {state['world_size']}, but this "
            f"loader is rank {wc.rank} of {wc.world_size}: use restore_state_global(states) or "
            "energon.redistribute_states(states, new_world_size)"
        )
    spec = _spec_with_streams(edited.spec, state["num_streams"], wc.world_size)
    spec = dataclasses.replace(spec, weight_changes=parsed_weight_changes(state))
    _check_state_fits(dataset.with_spec(spec), state)
    return dataset.with_spec(spec), state


def _spec_with_edits(spec: PipelineSpec, state: dict[str, Any]) -> PipelineSpec:
    """The spec under the cursor edits of the state (skip, exclude, migrate: they change the plan,
    and the state's fingerprint describes the edited configuration)."""
    edits = edits_from_json(state.get("edits"))
    if edits is not None and edits.sources is not None and len(edits.sources) != len(spec.sources):
        raise StateError(
            f"the state's cursor edits describe {len(edits.sources)} sources, but this "
            f"configuration has {len(spec.sources)}: it belongs to another configuration"
        )
    return spec if edits == spec.edits else dataclasses.replace(spec, edits=edits)


def _spec_with_streams(spec: PipelineSpec, num_streams: int, world_size: int) -> PipelineSpec:
    """The spec with the state's number of logical streams."""
    if num_streams == spec.num_streams:
        return spec
    if spec.num_streams_fixed:
        raise StateError(
            f"the state uses {num_streams} logical streams but num_streams={spec.num_streams} was given"
        )
    samples = sum(len(source) for source in spec.sources)
    limit = max(samples, spec.num_streams, world_size * MAX_WORKERS)
    if num_streams > limit:
        raise StateError(
            f"loader state field 'num_streams' is {num_streams}, more than this dataset "
            f"({samples} samples) can have (at most {limit}; the state is damaged)"
        )
    spec = dataclasses.replace(spec, num_streams=num_streams)
    if spec.training and spec.repeat and min(spec.stream_sample_counts()) == 0:
        raise StateError(
            f"loader state field 'num_streams' is {num_streams}: more logical streams than "
            f"the {samples} samples of this dataset (the state is damaged or from another "
            "dataset)"
        )
    return spec


def _check_state_fits(probe: SavableDataset, state: dict[str, Any]) -> None:
    """Every field against the dataset ``probe`` (the state's spec): the position against the
    pass and the snapshots, each snapshot's pointer stages by restoring them (no data is read)."""
    spec = probe.spec
    check_position(state, probe.pass_end(), finite=not (spec.training and spec.repeat))
    length = pass_length(spec)
    if length is not None and state["pass_offset"] > length:
        raise StateError(
            f"loader state field 'pass_offset' is {state['pass_offset']}, beyond the pass of "
            f"{length} batches"
        )
    for stream_id, snap in stream_snapshots(state).items():
        probe.check_snapshot(stream_id, snap)


def gathered_states(
    state: dict[str, Any], worker_config: WorkerConfig, dst_rank: int
) -> list | None:
    """Every data-parallel rank's ``state`` on ``dst_rank`` (None elsewhere); all ranks call."""
    if worker_config.world_size == 1:
        return [state]
    import torch.distributed as dist

    group = worker_config.data_parallel_group
    gathered = [None] * worker_config.world_size if dist.get_rank() == dst_rank else None
    dist.gather_object(state, gathered, dst=dst_rank, group=group)
    return gathered


def state_of_this_rank(
    states: list | None, worker_config: WorkerConfig, src_rank: int | None
) -> dict[str, Any] | None:
    """This rank's state out of every rank's (re-split for this number of ranks if needed);
    with ``src_rank``, only that rank has the list and scatters it (all ranks call)."""
    if src_rank is not None and worker_config.world_size > 1:
        import torch.distributed as dist

        received = [None]
        scatter = None
        if dist.get_rank() == src_rank:
            scatter = states_for_world(states, worker_config.world_size)
        dist.scatter_object_list(
            received, scatter, src=src_rank, group=worker_config.data_parallel_group
        )
        return received[0]
    if states is None:
        return None
    return states_for_world(states, worker_config.world_size)[worker_config.rank]


def states_for_world(states: list, world: int) -> list:
    """One state per rank of a world of ``world`` ranks, in rank order."""
    states = [check_state_shape(s) for s in states]
    if len(states) == world and all(s["world_size"] == world for s in states):
        return sorted(states, key=lambda s: s["rank"])
    return redistribute_states(states, world)
