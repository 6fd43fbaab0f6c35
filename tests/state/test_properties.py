"""Property test: for any interrupt points, worker counts and topologies, a run that is saved and
restored yields exactly the global micro-batch sequence of the uninterrupted run."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energon import WorkerConfig, get_savable_loader, get_train_dataset, redistribute_states

NUM_STREAMS = 4


def _loader(path, rank, world_size, num_workers):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=3,
        shuffle_buffer_size=6,
        max_samples_per_sequence=4,
        num_streams=NUM_STREAMS,
    )
    return get_savable_loader(ds)


def _summary(batch):
    return tuple(batch.__key__), float(batch.image.sum())


_REFERENCE: dict[str, list] = {}


def _reference(path, count):
    cached = _REFERENCE.get(str(path), [])
    if len(cached) < count:
        it = iter(_loader(path, 0, 1, 0))
        cached = [_summary(next(it)) for _ in range(count)]
        _REFERENCE[str(path)] = cached
    return cached[:count]


layouts = st.sampled_from([(1, 0), (1, 2), (2, 0), (2, 1), (4, 0), (3, 0), (1, 3)])


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    segments=st.lists(
        st.tuples(layouts, st.integers(min_value=0, max_value=4)), min_size=1, max_size=3
    )
)
def test_interrupted_runs_match_the_uninterrupted_run(captioning_ds, segments):
    torch.set_num_threads(1)
    states = None
    produced = []
    for (world_size, num_workers), steps in segments:
        if states is not None and len(states) != world_size:
            states = redistribute_states(states, world_size)
        per_rank, new_states = [], []
        for rank in range(world_size):
            loader = _loader(captioning_ds, rank, world_size, num_workers)
            if states is not None:
                loader.restore_state_rank(states[rank])
            it = iter(loader)
            per_rank.append([_summary(next(it)) for _ in range(steps)])
            new_states.append(loader.save_state_rank())
        produced += [per_rank[r][k] for k in range(steps) for r in range(world_size)]
        states = new_states
    assert produced == _reference(captioning_ds, len(produced))
