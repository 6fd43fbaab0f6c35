"""What the Ray tests share: datasets built as the loader tests build them, loaders with local
workers or with Ray actors over the same logical streams, and the actors behind a loader.

The actors of a test's loaders are kept for the next test (``keep_actors``): a Ray actor costs
seconds of CPU to start (it imports torch), and the tests of faults kill their own actors anyway.
"""

from __future__ import annotations

from energon import RayWorkers, WorkerConfig, get_savable_loader, get_train_dataset


def quiet(*_args):
    """The error handler of these runs: the policy counts, nothing is printed."""


def dataset(path, num_workers=2, **options):
    """A training dataset whose logical streams are those of ``num_workers`` local workers."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers, global_error_handler=quiet)
    kwargs = dict(batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=8)
    kwargs.update(options)
    return get_train_dataset(str(path), worker_config=wc, **kwargs)


def ray_workers(cluster, num_actors, **options):
    options.setdefault("keep_actors", True)
    return RayWorkers(num_actors=num_actors, address=cluster.address, **options)


def ray_loader(cluster, path, num_actors, *, streams=2, recovery=None, workers=None, **options):
    """A loader whose ``streams`` logical streams run in ``num_actors`` Ray actors."""
    loader = get_savable_loader(dataset(path, streams, **options))
    loader.workers = workers or ray_workers(cluster, num_actors)
    if recovery is not None:
        loader.recovery = recovery
    return loader


def local_loader(path, num_workers, *, streams=None, **options):
    """A loader with ``num_workers`` local worker processes (over ``streams`` logical streams,
    by default as many as workers)."""
    ds = dataset(path, num_workers if streams is None else streams, **options)
    return get_savable_loader(ds.with_num_workers(num_workers))


def keys(loader_or_iterator, count):
    """(logical stream, sample keys) of the next ``count`` batches."""
    it = iter(loader_or_iterator)
    return [(batch.__restore_key__[1], list(batch.__key__)) for _, batch in zip(range(count), it)]


def actor_of(loader, worker):
    """(name, pid) of the actor running ``worker`` now, as ``loader.stats()`` shows it."""
    for entry in loader.stats()["workers"]:
        if entry["worker"] == worker:
            return entry["actor"].split()[2], entry["pid"]
    raise AssertionError(f"no actor for worker {worker}")
