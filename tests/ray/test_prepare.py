"""``energon prepare --ray ADDRESS`` (issue 39, point 5): the shard scans run as Ray tasks on the
cluster, and the output is byte for byte a local prepare's (``index.uuid`` aside: every prepare
draws a new random one, which the shard table repeats). The CLI runs as a separate process that joins the cluster by address."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from energon.demo import write_text_shards
from tests.helpers.paths import REPO_ROOT

OPTIONS = ["--split-ratio", "8,1,1", "--non-interactive", "--no-progress", "--checksums"]
OPTIONS += ["--sample-type", "TextSample", "--field-map", '{"text": "txt"}']


def _prepare(path: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "energon.cli.main", "prepare", str(path), *OPTIONS, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_prepare_on_the_cluster_equals_local(ray_cluster, tmp_path):
    local, spread = tmp_path / "local", tmp_path / "ray"
    write_text_shards(local, num_samples=90, num_shards=6, min_chars=5, max_chars=60, seed=3)
    shutil.copytree(local, spread)
    _prepare(local)
    out = _prepare(spread, "--ray", ray_cluster.address)
    assert "Scanning shards as Ray tasks on 1 node(s)" in out
    ours, theirs = _files(local), _files(spread)
    assert sorted(ours) == sorted(theirs)
    assert len([name for name in ours if name.endswith(".tar.idx")]) == 6
    assert any("checksums" in name for name in ours) and ".nv-meta/dataset.yaml" in ours
    our_id, their_id = (files[".nv-meta/index.uuid"].strip() for files in (ours, theirs))
    uuid.UUID(their_id.decode())  # a fresh identity, as in every prepare
    for name in ours:
        if name.endswith("index.uuid"):
            continue
        # the shard table names the identity it was made for
        assert ours[name] == theirs[name].replace(their_id, our_id), name
