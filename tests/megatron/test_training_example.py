"""tools/examples/train_megatron_gpt.py: a tiny megatron-core GPT trained from energon's loader, on CPU.

Each scenario trains 6 iterations uninterrupted, and separately resumes from the checkpoint taken
after iteration 3 (model + optimizer through dist_checkpointing, the loader state per data-parallel
rank) in a fresh process, then compares the per-iteration logs: the resumed iterations 4-6 must
consume exactly the same micro-batches on every rank and, since nothing else is random, produce the
same losses and weights bit for bit; the weights right after loading must equal those saved.

megatron-core runs in the side venv of tests/helpers/megatron_venv.py; skipped only if it cannot be built.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.megatron_venv import REPO_ROOT, mcore, mcore_any  # noqa: F401  (fixture)

SCRIPT = REPO_ROOT / "tools" / "examples" / "train_megatron_gpt.py"
ITERS, SAVE_AT, MICROBATCHES = 6, 3, 2


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mcore-example-data")  # the script generates its data here


def train(python: str, tmp: Path, data_dir: Path, args: str, nproc: int = 1) -> list[dict]:
    """Runs the example with ``args`` (torchrun for nproc > 1); returns its log lines."""
    log = tmp / f"log{len(list(tmp.glob('log*')))}.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # energon from this source tree; one thread per process so that runs are comparable and the
    # two CI cores are not oversubscribed
    env.update(PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    launcher = [python]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = [*launcher, str(SCRIPT), "--data-dir", str(data_dir), "--log-batches", str(log)]
    cmd += args.split()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    print(f"{args} (nproc {nproc}): {time.perf_counter() - t0:.1f} s")
    return [json.loads(line) for line in log.read_text().splitlines()]


def by_event(lines: list[dict], event: str) -> dict[int, list[dict]]:
    return {line["iteration"]: line["ranks"] for line in lines if line["event"] == event}


def check_resume(
    full: list[dict], resumed: list[dict], world: int, saved: list[dict] | None = None
):
    """``full``: iterations 1..6 (and the save after 3 unless ``saved`` has it); ``resumed``: 4..6."""
    trained = by_event(full, "train")
    assert sorted(trained) == list(range(1, ITERS + 1))
    for ranks in trained.values():
        assert len(ranks) == world
        for r in ranks:
            assert len(r["batches"]) == MICROBATCHES and math.isfinite(r["loss"])
        # data-parallel replicas hold the same weights after every step
        assert len({r["weights"] for r in ranks}) == 1
    # every rank read its own micro-batches, never one twice
    consumed = [b["tokens"] for ranks in trained.values() for r in ranks for b in r["batches"]]
    assert len(set(consumed)) == len(consumed)

    saved_weights = by_event(saved or full, "saved")[SAVE_AT]
    assert saved_weights == [{"weights": r["weights"]} for r in trained[SAVE_AT]]
    # the checkpoint restored the weights exactly
    assert by_event(resumed, "loaded") == {SAVE_AT: saved_weights}
    again = by_event(resumed, "train")
    assert sorted(again) == list(range(SAVE_AT + 1, ITERS + 1))
    for it in again:  # same batches per rank (keys and token hashes), same losses, same weights
        assert again[it] == trained[it], f"iteration {it} differs after resume"


def check_loader_state_files(ckpt: Path, world: int) -> None:
    """One plain-data file per DP rank, loadable with weights_only=True (as Megatron-LM does)."""
    for rank in range(world):
        path = ckpt / f"iter_{SAVE_AT:07d}" / f"train_dataloader_dprank{rank:03d}.pt"
        saved = torch.load(path, weights_only=True)
        assert saved["iteration"] == SAVE_AT
        json.dumps(saved["dataloader_state_dict"])  # plain data only
    assert not (ckpt / f"iter_{SAVE_AT:07d}" / f"train_dataloader_dprank{world:03d}.pt").exists()


def test_tokens_world1_stop_save_resume(mcore_any, tmp_path, data_dir):  # noqa: F811
    """Three processes: 6 iterations; 3 then exit with a checkpoint; resume to 6 (0 workers).
    Runs with megatron-core 0.16.1 and 0.19.x."""
    python = mcore_any
    full = train(python, tmp_path, data_dir, "--iters 6 --workers 1")
    first = train(python, tmp_path, data_dir, "--iters 3 --save ckpt --workers 1")
    assert sorted(by_event(first, "train")) == [1, 2, 3]
    assert first[:3] == full[:3]  # the same first three iterations
    check_loader_state_files(tmp_path / "ckpt", world=1)
    # resuming on another number of loader workers (0 = in the main process) sees the same data
    resumed = train(python, tmp_path, data_dir, "--iters 6 --load ckpt --workers 0")
    check_resume(full, resumed, world=1, saved=first)


def test_tokens_world2_torchrun_resume(mcore, tmp_path, data_dir):  # noqa: F811
    """Data parallel over 2 gloo ranks: each rank's batches after resume match the full run."""
    args = "--iters 6 --save ckpt --save-interval 3 --workers 1"
    full = train(mcore, tmp_path, data_dir, args, nproc=2)
    check_loader_state_files(tmp_path / "ckpt", world=2)
    args = "--iters 6 --load ckpt --ckpt-step 3 --workers 2"
    resumed = train(mcore, tmp_path, data_dir, args, nproc=2)
    check_resume(full, resumed, world=2)
    ranks = by_event(full, "train")[1]
    assert {b["tokens"] for b in ranks[0]["batches"]}.isdisjoint(
        b["tokens"] for b in ranks[1]["batches"]
    )
    check_redistributed_resume(mcore, tmp_path, data_dir, full)


def check_redistributed_resume(python: str, tmp: Path, data_dir: Path, full: list[dict]) -> None:
    """`energon checkpoint redist` turns the 2 ranks' loader files into 1 rank's, in the same
    format and names; the training script resumes from them on one rank and reads the next global
    micro-batches in order: iteration 4 of both ranks, interleaved as the global sequence has them."""
    import shutil

    from click.testing import CliRunner

    from energon.cli.main import cli

    step = tmp / "ckpt" / f"iter_{SAVE_AT:07d}"
    files = [str(step / f"train_dataloader_dprank{r:03d}.pt") for r in range(2)]
    out = tmp / "redist"
    result = CliRunner().invoke(
        cli, ["checkpoint", "redist", *files, str(out), "--new-world-size", "1"]
    )
    assert result.exit_code == 0, result.output
    assert [p.name for p in out.iterdir()] == ["train_dataloader_dprank000.pt"]
    one_rank = tmp / "ckpt1"
    shutil.copytree(tmp / "ckpt", one_rank)
    for name in ("train_dataloader_dprank000.pt", "train_dataloader_dprank001.pt"):
        (one_rank / f"iter_{SAVE_AT:07d}" / name).unlink()
    shutil.copy(out / "train_dataloader_dprank000.pt", one_rank / f"iter_{SAVE_AT:07d}")
    args = f"--iters {SAVE_AT + 2} --load ckpt1 --ckpt-step {SAVE_AT} --workers 1"
    resumed = by_event(train(python, tmp, data_dir, args), "train")
    before = by_event(full, "train")[SAVE_AT + 1]  # [rank 0, rank 1], 2 micro-batches each
    expected = [before[r]["batches"][mb] for mb in range(MICROBATCHES) for r in range(2)]
    got = [b for it in (SAVE_AT + 1, SAVE_AT + 2) for b in resumed[it][0]["batches"]]
    assert got == expected


def test_captioning_task_encoder_resume(mcore, tmp_path, data_dir):  # noqa: F811
    """JPEG+caption samples through the example's TaskEncoder, with a shuffle buffer in the state."""
    args = "--data captioning --iters 6 --save ckpt --save-interval 3 --workers 1"
    full = train(mcore, tmp_path, data_dir, args)
    check_loader_state_files(tmp_path / "ckpt", world=1)
    args = "--data captioning --iters 6 --load ckpt --ckpt-step 3 --workers 0"
    resumed = train(mcore, tmp_path, data_dir, args)
    check_resume(full, resumed, world=1)
    batches = [b for ranks in by_event(full, "train").values() for b in ranks[0]["batches"]]
    keys = [k for b in batches for k in b["keys"]]
    assert len(keys) == ITERS * MICROBATCHES * 2 and len(set(keys)) == len(keys)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
