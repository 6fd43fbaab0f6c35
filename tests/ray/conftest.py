"""One real Ray cluster for all Ray tests of a session (starting one costs seconds): the head on
127.0.0.1 with 8 logical CPUs and two "slot" resources (the tests that leave the cluster without room
take them), this process its driver. Every test here runs in the same xdist worker
(``xdist_group``; ``make test`` distributes with ``--dist loadgroup``), so one cluster serves all."""

from __future__ import annotations

import atexit
import gc

import pytest

from tests.helpers.ray_cluster import LocalRayCluster

SLOTS = 2  # custom resource "energon_slot" on the head node
CPUS = 8  # logical CPUs of the head node (Ray's bookkeeping; the machine may have fewer)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/ray/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session")
def ray_cluster():
    pytest.importorskip("ray", reason="Ray is in the test extra: pip install -e '.[test]'")
    cluster = LocalRayCluster(num_cpus=CPUS, resources={"energon_slot": SLOTS})
    atexit.register(cluster.shutdown)  # also if the session ends without finalizers
    cluster.connect()
    yield cluster
    cluster.shutdown()
    atexit.unregister(cluster.shutdown)


@pytest.fixture(autouse=True)
def _release_actors():
    """A test's loaders end their actors when they are collected: collect them before the next
    test asks the cluster for its own."""
    yield
    gc.collect()
