"""Online reweighting on real torch.distributed ranks (gloo): broadcast from rank 0, the same
global order as one process with the same change, and an elastic restore that repeats it."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import traceback

import torch.distributed as dist

from energon import WorkerConfig, get_savable_loader, get_train_dataset

SCHEDULE = """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: {linear: {start: 0, end: 600, from: 0.2, to: 2.0}}
        path: ./a
      - weight: 1
        path: ./b
"""
CHANGE_STEP = 30  # per rank, with 2 ranks: global micro-batch 60
SAVE_STEP = 50
RESUMED_STEPS = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loader(path, worker_config):
    ds = get_train_dataset(
        path,
        worker_config=worker_config,
        batch_size=2,
        shuffle_buffer_size=5,
        max_samples_per_sequence=4,
        num_streams=4,
    )
    return get_savable_loader(ds)


def _rank_main(rank, world_size, port, path, out_dir, phase):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        loader = _loader(path, WorkerConfig.default_worker_config(1 if phase == "save" else 0))
        keys = []
        if phase == "save":
            it = iter(loader)
            for step in range(SAVE_STEP):
                if step == CHANGE_STEP:
                    # only rank 0's values count: the others pass something else
                    mine = [1.0, 5.0] if rank == 0 else [7.0, 7.0]
                    position = loader.set_blend_weights(mine, broadcast=True)
                    assert position == CHANGE_STEP * world_size
                keys.append(list(next(it).__key__))
            gathered = loader.save_state_global(global_dst_rank=0)
            if rank == 0:
                with open(os.path.join(out_dir, "states.json"), "w") as f:
                    json.dump(gathered, f)
        else:
            with open(os.path.join(out_dir, "states.json")) as f:
                states = json.load(f) if rank == 0 else None
            loader.restore_state_global(states, src_rank=0)
            it = iter(loader)
            keys = [list(next(it).__key__) for _ in range(RESUMED_STEPS)]
        with open(os.path.join(out_dir, f"{phase}_keys_{rank}.json"), "w") as f:
            json.dump(keys, f)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"error_{phase}_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _run(world_size, path, out_dir, phase):
    port = _free_port()
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(target=_rank_main, args=(r, world_size, port, path, out_dir, phase))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    errors = [f for f in os.listdir(out_dir) if f.startswith(f"error_{phase}")]
    for name in errors:
        print(open(os.path.join(out_dir, name)).read())
    assert not errors and all(p.exitcode == 0 for p in procs)
    per_rank = []
    for r in range(world_size):
        with open(os.path.join(out_dir, f"{phase}_keys_{r}.json")) as f:
            per_rank.append([tuple(k) for k in json.load(f)])
    return [per_rank[r][k] for k in range(len(per_rank[0])) for r in range(world_size)]


def test_broadcast_reweighting_on_two_ranks_resumes_on_three(tmp_path, text_ds, text_val_ds):
    (tmp_path / "a").symlink_to(text_ds)
    (tmp_path / "b").symlink_to(text_val_ds)
    path = tmp_path / "mix.yaml"
    path.write_text(SCHEDULE)
    before = _run(2, str(path), str(tmp_path), "save")
    after = _run(3, str(path), str(tmp_path), "restore")

    # one process, the same change planned at global micro-batch 60 (sample 120)
    reference = _loader(path, WorkerConfig(rank=0, world_size=1, num_workers=0))
    reference.set_blend_weights([1.0, 5.0], from_sample=2 * CHANGE_STEP * 2)
    it = iter(reference)
    expected = [tuple(next(it).__key__) for _ in range(len(before) + len(after))]
    assert before == expected[: len(before)]
    assert after == expected[len(before) :]
    unchanged = iter(_loader(path, WorkerConfig(rank=0, world_size=1, num_workers=0)))
    plain = [tuple(next(unchanged).__key__) for _ in range(len(expected))]
    assert plain[:60] == expected[:60] and plain[60:] != expected[60:]
