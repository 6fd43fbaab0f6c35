"""``prepare --ray``: the chunks of a preparation run as Ray tasks spread over a cluster's nodes.

A node runs :func:`~energon.prepare.scan.run_chunk` into a folder of its own temporary
directory and sends the folder's files back as bytes; they are written here under the chunk's
temporary name and renamed into place, as a local worker process leaves a finished chunk. So the
nodes must read the shards (local shards by the same absolute path on every node: a shared file
system; or object storage, with its credentials in every node's environment) but write nothing
shared, and the output is byte for byte a local prepare's: the index is built here from the
chunks, in shard order. A chunk whose node dies is run again elsewhere (Ray's task retries), and
the chunks finished before a run was killed are kept for the next run, as with local workers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from energon import epath
from energon.prepare.scan import ChunkSummary, ChunkTask, run_chunk


def run_chunks_on_cluster(tasks: list[ChunkTask], address: str) -> Iterator[ChunkSummary]:
    """Run ``tasks`` on the Ray cluster at ``address``; each chunk's folder is in place here when
    its summary is yielded (in task order; at most twice the cluster's CPUs in flight)."""
    from energon.cluster.ray_cluster import map_in_order

    shipped = [_as_a_node_runs_it(task) for task in tasks]
    results = map_in_order(_run_chunk_elsewhere, shipped, address=address)
    for task, (summary, files) in zip(tasks, results):
        _write_chunk_folder(Path(task.folder), files)
        yield summary


def _as_a_node_runs_it(task: ChunkTask) -> ChunkTask:
    """Local shards by their absolute path (a node runs its tasks in a folder of its own); remote
    shards downloaded into the node's temporary folder, not this machine's staging folder."""
    paths = tuple(p if epath.is_remote(p) else os.path.abspath(p) for p in task.tar_paths)
    return dataclasses.replace(task, tar_paths=paths, download_dir=None)


def _run_chunk_elsewhere(task: ChunkTask) -> tuple[ChunkSummary, dict[str, bytes]]:
    """On a node: the chunk's summary and the files of its folder, by relative path."""
    with tempfile.TemporaryDirectory(prefix="energon-chunk-") as temp:
        folder = Path(temp) / "chunk"
        summary = run_chunk(dataclasses.replace(task, folder=str(folder)))
        files = {
            str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }
    return summary, files


def _write_chunk_folder(final: Path, files: dict[str, bytes]) -> None:
    """The folder under a temporary name, renamed when complete (a finished chunk)."""
    temp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    try:
        for name, data in files.items():
            path = temp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.replace(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
