"""Real torch.distributed processes (gloo): global save/restore, including onto other world sizes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import traceback

import pytest
import torch.distributed as dist

from energon import WorkerConfig, get_savable_loader, get_train_dataset

STEPS_BEFORE = 3
STEPS_AFTER = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loader(path, num_workers):
    wc = WorkerConfig.default_worker_config(num_workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=5,
        max_samples_per_sequence=4,
        num_streams=4,
    )
    return get_savable_loader(ds)


def _rank_main(rank, world_size, port, path, out_dir, phase, num_workers):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        loader = _loader(path, num_workers)
        if phase == "restore":
            with open(os.path.join(out_dir, "states.json")) as f:
                states = json.load(f) if rank == 0 else None
            loader.restore_state_global(states, src_rank=0)
        it = iter(loader)
        steps = STEPS_BEFORE if phase == "save" else STEPS_AFTER
        keys = [list(next(it).__key__) for _ in range(steps)]
        gathered = loader.save_state_global(global_dst_rank=0)
        with open(os.path.join(out_dir, f"{phase}_keys_{rank}.json"), "w") as f:
            json.dump(keys, f)
        if rank == 0 and phase == "save":
            assert len(gathered) == world_size
            with open(os.path.join(out_dir, "states.json"), "w") as f:
                json.dump(gathered, f)
        if rank != 0:
            assert gathered is None
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"error_{phase}_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _run(world_size, path, out_dir, phase, num_workers=0):
    port = _free_port()
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(
            target=_rank_main, args=(r, world_size, port, path, out_dir, phase, num_workers)
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)  # a hang guard, not a speed bound
    errors = [f for f in os.listdir(out_dir) if f.startswith(f"error_{phase}")]
    for name in errors:
        print(open(os.path.join(out_dir, name)).read())
    assert not errors and all(p.exitcode == 0 for p in procs)
    per_rank = []
    for r in range(world_size):
        with open(os.path.join(out_dir, f"{phase}_keys_{r}.json")) as f:
            per_rank.append([tuple(k) for k in json.load(f)])
    steps = len(per_rank[0])
    return [per_rank[r][k] for k in range(steps) for r in range(world_size)]


def _reference(path, count):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=5,
        max_samples_per_sequence=4,
        num_streams=4,
    )
    it = iter(get_savable_loader(ds))
    return [tuple(next(it).__key__) for _ in range(count)]


@pytest.mark.parametrize("world_size,new_world_size", [(2, 2), (4, 2), (4, 3), (2, 4)])
def test_global_save_and_restore_across_world_sizes(text_ds, tmp_path, world_size, new_world_size):
    before = _run(
        world_size, str(text_ds), str(tmp_path), "save", num_workers=1 if world_size == 2 else 0
    )
    after = _run(new_world_size, str(text_ds), str(tmp_path), "restore")
    reference = _reference(str(text_ds), len(before) + len(after))
    assert before == reference[: len(before)]
    assert after == reference[len(before) :]
