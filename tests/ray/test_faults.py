"""Lost actors (issue 39, point 3): an actor killed in the middle of an epoch (``ray.kill``, or
``kill -9`` of its process) is replaced, and the loader goes on with no sample lost or repeated,
batch for batch against an uninterrupted run; a node that disappears is reported with the actors,
logical streams and positions it held; a cluster that cannot replace an actor ends the pass with
one clear error; an actor lost again and again at one place ends it through the restart budget.
All kills are counted events (after a given number of batches), not timed ones."""

from __future__ import annotations

import collections
import os
import signal

import pytest

from energon import ClusterError, WorkerRecovery
from energon.errors import WorkerRecoveryError
from tests.helpers.poison import Poison
from tests.ray.helpers import actor_of, keys, local_loader, ray_loader, ray_workers

BATCHES = 60  # 30 per actor: more than an actor has made ahead when it is killed
# small messages, one ahead: an actor holds little ahead, so a kill loses work in flight
SMALL = {"message_items": 2, "prefetch": 1, "keep_actors": False}


def test_killed_actors_are_replaced_nothing_lost_or_repeated(ray_cluster, text_ds):
    ray = ray_cluster.connect_module()
    expected = keys(local_loader(text_ds, 2), BATCHES)
    loader = ray_loader(ray_cluster, text_ds, 2, workers=ray_workers(ray_cluster, 2, **SMALL))
    it = iter(loader)
    got = keys(it, 6)
    name, _ = actor_of(loader, 1)
    ray.kill(ray.get_actor(name))
    got += keys(it, 24)
    _, pid = actor_of(loader, 0)
    os.kill(pid, signal.SIGKILL)
    got += keys(it, BATCHES - 30)
    assert got == expected  # every batch, in order: no sample lost, none read twice
    # counted: each sample as often as in the uninterrupted run (2 epochs of 120 samples)
    counts = collections.Counter(key for _, batch in got for key in batch)
    assert counts == collections.Counter(key for _, batch in expected for key in batch)
    assert len(counts) == 120 and sum(counts.values()) == 4 * BATCHES
    losses = {loss["worker"]: loss for loss in loader.worker_losses()}
    assert sorted(losses) == [0, 1] and all(x["action"] == "replaced" for x in losses.values())
    assert "ray.kill" in losses[1]["cause"] and "lost its process" in losses[0]["cause"]
    assert all(loss["sample"] is None for loss in losses.values())  # none blamed, none skipped
    assert loader.error_report()["skipped"] == 0


def test_cluster_without_room_for_a_replacement(ray_cluster, text_ds):
    """The actors take the head's two "energon_slot"s; one is killed, and another job takes its
    slot before the loader notices: the replacement cannot be placed, and after
    ``start_timeout_seconds`` the loader says so once, with what it asked and what is free.

    The actors are started by a first loader (which may take long on a busy machine) and kept
    (``keep_actors``); the loader under test takes them at once, so its start timeout
    applies to the replacement only."""
    ray = ray_cluster.connect_module()
    ask = {"resources": {"energon_slot": 1}, "message_items": 2, "prefetch": 1}
    warm = ray_loader(ray_cluster, text_ds, 2, workers=ray_workers(ray_cluster, 2, **ask))
    keys(warm, 2)
    warm.close()  # its actors wait for the next loader that asks for the same
    # 15 s, not less: if a kept actor does not answer in time (seen once at load 20), it is
    # killed and a new one waits for the slot the killed one frees
    workers = ray_workers(ray_cluster, 2, keep_actors=False, start_timeout_seconds=15, **ask)
    loader = ray_loader(ray_cluster, text_ds, 2, workers=workers)
    it = iter(loader)
    keys(it, 4)
    name, _ = actor_of(loader, 0)
    ray.kill(ray.get_actor(name))
    blocker = ray.remote(num_cpus=0, resources={"energon_slot": 1})(_Blocker).remote()
    ray.get(blocker.ready.remote())  # the freed slot is taken
    with pytest.raises(ClusterError) as raised:
        keys(it, BATCHES)
    message = str(raised.value)
    assert "could not place and start the actor of worker 0" in message
    assert "energon_slot: 1" in message and "start_timeout_seconds=15" in message
    ray.kill(blocker)


class _Blocker:
    def ready(self):
        return True


def test_actor_lost_again_and_again_at_one_place(ray_cluster, text_ds):
    """A sample that kills its process kills every replacement at the same place: the in-a-row
    budget ends the pass with one error listing the losses (no sample is skipped by guess)."""
    poison = keys(local_loader(text_ds, 1, streams=1, task_encoder=Poison()), 6)[5][1][1]
    loader = ray_loader(
        ray_cluster,
        text_ds,
        1,
        streams=1,
        task_encoder=Poison([poison], how="exit"),
        recovery=WorkerRecovery(max_restarts_in_a_row=1),
        workers=ray_workers(ray_cluster, 1, **SMALL),
    )
    with pytest.raises(WorkerRecoveryError) as raised:
        keys(loader, BATCHES)
    message = str(raised.value)
    assert "max_restarts_in_a_row=1" in message
    # the first actor may have sent items past its last snapshot before it died (its place is
    # then later than the replacements', which die before sending any): 2 or 3 losses
    losses = [line for line in message.splitlines() if "lost its process" in line]
    assert len(losses) in (2, 3), message
    assert losses[-1].endswith("more than max_restarts_in_a_row=1")
    assert all(line.endswith(": replaced") for line in losses[:-1])


@pytest.mark.slow
def test_node_that_disappears(ray_cluster, text_ds):
    """Both actors run on a second node (soft affinity: they may run elsewhere if it is gone);
    the node is killed mid-epoch. Each lost actor is reported with its node, its logical streams
    and the position it was making; the replacements run on the head and the batches are those
    of an uninterrupted run."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray = ray_cluster.connect_module()
    expected = keys(local_loader(text_ds, 2), BATCHES)
    node = ray_cluster.add_node(num_cpus=2, resources={"node_b": 2})
    node_id = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node_b" in n["Resources"])
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=True)
    workers = ray_workers(ray_cluster, 2, actor_options={"scheduling_strategy": strategy}, **SMALL)
    loader = ray_loader(ray_cluster, text_ds, 2, workers=workers)
    it = iter(loader)
    got = keys(it, 8)
    assert all(f"node {node_id[:8]}" in w["actor"] for w in loader.stats()["workers"])
    ray_cluster.remove_node(node)
    got += keys(it, BATCHES - 8)
    assert got == expected
    losses = loader.worker_losses()
    assert sorted(loss["worker"] for loss in losses) == [0, 1]
    for loss in losses:
        assert f"node {node_id[:8]}" in loss["who"] and "logical streams" in loss["who"]
        assert loss["position"] is not None and loss["stream"] == loss["position"] % 2
        assert loss["action"] == "replaced"
    assert all(f"node {node_id[:8]}" not in w["actor"] for w in loader.stats()["workers"])
