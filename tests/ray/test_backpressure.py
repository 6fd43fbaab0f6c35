"""Backpressure (issue 39, point 4): an actor makes a bounded number of items ahead of what the
rank has taken, however long the rank waits. Each actor's own counter of items made is asked
from the actor itself (its ``slot`` method answers on a thread the pipeline does not block)."""

from __future__ import annotations

import time

from energon.observe.probe import ITEMS
from tests.ray.helpers import actor_of, keys, ray_loader, ray_workers

PREFETCH, MESSAGE_ITEMS = 1, 2
GROUP_MAX = 8  # a message holds whole groups of a worker, each at most this many items
SETTLE_SECONDS = 120  # wall-clock bound with a wide margin; the loop ends once counts hold still


def _items_made(ray, name: str) -> int:
    return int(ray.get(ray.get_actor(name).slot.remote()).hot[ITEMS])


def test_actors_make_a_bounded_number_ahead(ray_cluster, text_ds):
    ray = ray_cluster.connect_module()
    workers = ray_workers(ray_cluster, 2, prefetch=PREFETCH, message_items=MESSAGE_ITEMS)
    loader = ray_loader(ray_cluster, text_ds, 2, workers=workers)
    it = iter(loader)
    taken = keys(it, 6)
    names = [actor_of(loader, worker)[0] for worker in (0, 1)]
    made, deadline = None, time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:  # until the actors stop: nothing more is asked of them
        now = [_items_made(ray, name) for name in names]
        if now == made:
            break
        made = now
        time.sleep(1.0)
    # what the rank holds (the last message received) and the calls it keeps outstanding
    bound = (PREFETCH + 1) * (MESSAGE_ITEMS - 1 + GROUP_MAX)
    for worker in (0, 1):
        consumed = sum(1 for stream, _ in taken if stream == worker)
        assert consumed == 3
        assert consumed < made[worker] <= consumed + bound, (worker, made)
    # the stream goes on where it stood
    assert [stream for stream, _ in keys(it, 4)] == [0, 1, 0, 1]
