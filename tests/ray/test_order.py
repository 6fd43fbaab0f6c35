"""Ray actors run the dataset's logical streams as local workers do: the rank receives exactly the
batches, in exactly the order, of local workers over the same logical streams (issue 39, point 1),
images included, and image tensors arrive without a copy into new memory (point 4)."""

from __future__ import annotations

import torch

from energon import get_savable_loader, get_val_dataset
from tests.ray.helpers import keys, local_loader, ray_loader, ray_workers


def test_text_batches_equal_local_workers(ray_cluster, text_ds):
    expected = keys(local_loader(text_ds, 2), 30)
    loader = ray_loader(ray_cluster, text_ds, 2)
    it = iter(loader)
    got = keys(it, 30)
    assert got == expected
    stats = loader.stats()
    actors = stats["workers"]
    assert [a["worker"] for a in actors] == [0, 1]
    assert all(a["samples"] > 0 and a["samples_per_second"] > 0 for a in actors)
    for a in actors:
        assert (
            a["actor"].startswith("Ray actor energon-")
            and f"(worker {a['worker']} of" in a["actor"]
        )
    assert stats["batches"] == 30 and stats["wait_seconds"] > 0
    assert loader.config()["workers"]["num_actors"] == 2


def test_more_actors_than_divide_the_streams(ray_cluster, text_ds):
    """4 logical streams over 3 actors (a stream is computed by two actors, each keeping its
    own batches): still the batches of 4 local workers."""
    expected = keys(local_loader(text_ds, 4), 24)
    assert keys(ray_loader(ray_cluster, text_ds, 3, streams=4), 24) == expected


def test_images_equal_and_not_copied(ray_cluster, captioning_ds):
    local = iter(local_loader(captioning_ds, 2))
    remote = iter(ray_loader(ray_cluster, captioning_ds, 2))
    for _ in range(8):
        a, b = next(local), next(remote)
        assert list(a.__key__) == list(b.__key__)
        assert torch.equal(a.image, b.image)
        assert list(a.caption) == list(b.caption)
        # the tensor wraps the received buffer (torch.from_numpy), not memory torch allocated
        assert not b.image.untyped_storage().resizable()


def test_validation_pass_equals_local_workers(ray_cluster, text_val_ds):
    """A finite pass: the actors' streams end, the loader stops, and a second pass repeats it."""
    from energon import WorkerConfig

    def val(workers=None):
        wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
        loader = get_savable_loader(
            get_val_dataset(str(text_val_ds), worker_config=wc, batch_size=3)
        )
        loader.workers = workers
        return loader

    expected = [list(b.__key__) for b in val()]
    loader = val(ray_workers(ray_cluster, 2))
    assert [list(b.__key__) for b in loader] == expected
    assert [list(b.__key__) for b in loader] == expected
