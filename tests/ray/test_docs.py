"""docs/ray.md's walk-through runs as written, against the session's cluster (``RAY_ADDRESS``):
prepare over the cluster, train with 2 actors, continue from the saved state without workers."""

from __future__ import annotations

from tests.helpers.doc_walkthrough import run_walkthrough
from tests.helpers.ray_cluster import ENV


def test_walkthrough_runs_as_written(ray_cluster, tmp_path):
    text = run_walkthrough("ray.md", tmp_path, env={**ENV, "RAY_ADDRESS": ray_cluster.address})
    assert "Scanning shards as Ray tasks on 1 node(s)" in text
    assert "actors: ['Ray actor energon-" in text
    assert "same after restore: True" in text
