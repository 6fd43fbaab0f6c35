"""The process-wide shard reader after a fork: a forked child (a DataLoader worker) starts with
its own descriptors and caches, and reads the same bytes."""

from __future__ import annotations

import json
import os

import numpy as np

from energon.source.shard_reader import RecordOffsets, ShardReader


def _opener(offsets):
    return lambda path: RecordOffsets(np.asarray(offsets, dtype=np.int64))


def test_a_forked_child_reopens_files_and_reads_the_same_bytes(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 4)
    reader = ShardReader()
    open_index = _opener([0, 100, 1024])
    assert reader.read(str(path), 0, 100, open_index) == bytes(range(100))
    parent_fd = reader._fds[str(path)][0]

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees, never return into pytest
        try:
            data = reader.read(str(path), 100, 1024, open_index)
            result = {"ok": data == (bytes(range(256)) * 4)[100:1024]}
            result["fd"] = reader._fds[str(path)][0]
            result["cached"] = len(reader._fds)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            result = {"error": repr(e)}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    child = json.loads(os.read(read_end, 4096))
    os.close(read_end)
    assert status == 0 and child.get("ok"), child
    # the child opened the file itself (its inherited cache was dropped), the parent keeps its own
    assert child["fd"] != parent_fd and child["cached"] == 1
    assert reader._fds[str(path)][0] == parent_fd
    assert reader.read(str(path), 0, 100, open_index) == bytes(range(100))
