"""Running a function on several real ``torch.distributed`` ranks (gloo, forked processes).

``run_ranks(world_size, fn, *args)`` forks one process per rank, initialises a gloo process group in
each and calls ``fn(rank, world_size, *args)``; whatever ``fn`` returns (JSON data) comes back as a
list indexed by rank. A rank's exception is re-raised here with its traceback. The join timeout only
guards against a hang (a deadlock fails the test instead of blocking the suite); it is not a speed
bound and is far above what the ranks need on a busy machine.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

HANG_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, out_dir: str, fn: Callable, args: tuple):
    import torch.distributed as dist

    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        with open(os.path.join(out_dir, f"result_{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"error_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)


def run_ranks(world_size: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``fn(rank, world_size, *args)`` on each of ``world_size`` gloo ranks; their results."""
    port = free_port()
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [
            ctx.Process(target=_rank_main, args=(r, world_size, port, out_dir, fn, args))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=HANG_TIMEOUT_S)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        errors = []
        for r in range(world_size):
            path = os.path.join(out_dir, f"error_{r}.txt")
            if os.path.exists(path):
                errors.append(f"rank {r}:\n{open(path).read()}")
        assert not errors, "\n".join(errors)
        assert not hung, f"ranks {hung} hung (deadlock?)"
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        results = []
        for r in range(world_size):
            with open(os.path.join(out_dir, f"result_{r}.json")) as f:
                results.append(json.load(f))
        return results
