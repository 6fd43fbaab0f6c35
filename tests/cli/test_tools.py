"""The energon CLI verbs that use the loader: lint, preview, checkpoint, demo."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import torch
from click.testing import CliRunner

from energon import (
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    load_state_file,
    redistribute_states,
    save_state_file,
)
from energon.cli.checkpoint import output_names
from energon.cli.main import cli
from energon.prepare.dataset import prepare_dataset
from energon.state import state_file_format
from tests.helpers.datasets import CAPTIONING_YAML


def test_lint_passes_on_a_good_dataset(captioning_ds):
    result = CliRunner().invoke(cli, ["lint", str(captioning_ds)])
    assert result.exit_code == 0, result.output
    assert "train: 60 samples loaded, 0 failed" in result.output
    assert "Skipping empty split part val" in result.output


def test_lint_fails_and_lists_bad_samples(tmp_path):
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for i in range(6):
            for ext, data in (("jpg", b"garbage" if i in (2, 4) else _jpeg()), ("txt", b"cap")):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    prepare_dataset(tmp_path, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (tmp_path / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_YAML)
    for parallel in ("1", "2"):
        result = CliRunner().invoke(cli, ["lint", str(tmp_path), "--parallel", parallel])
        assert result.exit_code != 0
        assert "train: 4 samples loaded, 2 failed" in result.output
        assert "'k2'" in result.output and "'k4'" in result.output and "a.tar" in result.output


def _jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="JPEG")
    return buf.getvalue()


def test_preview_shows_samples(captioning_ds):
    result = CliRunner().invoke(cli, ["preview", str(captioning_ds), "--num-samples", "2"])
    assert result.exit_code == 0, result.output
    assert "Sample 0" in result.output and "Sample 1" in result.output
    assert "__key__ (str): '00000_000000'" in result.output
    assert "image (Tensor): Tensor(shape=(3," in result.output
    assert "caption (str):" in result.output


def _states(path, world_size, steps):
    states = []
    for rank in range(world_size):
        wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=0)
        loader = get_savable_loader(
            get_train_dataset(
                path,
                worker_config=wc,
                batch_size=2,
                shuffle_buffer_size=4,
                max_samples_per_sequence=5,
                num_streams=4,
            )
        )
        it = iter(loader)
        for _ in range(steps):
            next(it)
        states.append(loader.save_state_rank())
    return states


def test_checkpoint_info_and_redist(text_ds, tmp_path):
    states = _states(text_ds, 2, 3)
    files = []
    for rank, state in enumerate(states):
        path = tmp_path / f"dl_rank{rank:03d}.pt"
        torch.save({"dataloader_state_dict": state, "iteration": 3}, path)
        files.append(str(path))
    result = CliRunner().invoke(cli, ["checkpoint", "info", *files])
    assert result.exit_code == 0, result.output
    assert "ranks: 2" in result.output and "logical streams: 4" in result.output
    assert "rank 1: consumed 3 micro-batches" in result.output
    from energon.pipeline.snapshot import stage_states
    from energon.state import merge_stream_snapshots

    buffered = sum(  # the shuffle buffer is the stage after the pointer source
        len(stage_states(snap)[1]["buffer"]) for snap in merge_stream_snapshots(states).values()
    )
    consumed = 2 * 3 * 2  # ranks x steps x batch size
    assert f"{consumed + buffered} samples read" in result.output

    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["checkpoint", "redist", *files, str(out), "--new-world-size", "1"]
    )
    assert result.exit_code == 0, result.output
    # torch.save files in, torch.save files out, named like the input, Megatron wrapping kept
    written = sorted(p.name for p in out.iterdir())
    assert written == ["dl_rank000.pt"]
    assert state_file_format(out / "dl_rank000.pt") == "torch"
    saved = torch.load(out / "dl_rank000.pt", weights_only=True)
    assert saved["iteration"] == 3
    new_state = saved["dataloader_state_dict"]
    assert new_state["world_size"] == 1 and new_state["origin"] == 6
    json.dumps(new_state)


@pytest.mark.parametrize("file_format", ["json", "torch"])
def test_checkpoint_redist_keeps_format_names_and_wrapping(text_ds, tmp_path, file_format):
    states = _states(text_ds, 2, 3)
    ext = ".json" if file_format == "json" else ".pt"
    files = []
    for rank, state in enumerate(states):
        files.append(str(tmp_path / f"state_rank{rank}{ext}"))
        save_state_file(state, files[-1], file_format)  # bare states, one per rank
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["checkpoint", "redist", *files, str(out)], input="3\n")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"state_rank{i}{ext}" for i in range(3)]
    new = [load_state_file(out / n) for n in names]
    assert all(state_file_format(out / n) == file_format for n in names)
    assert [s["rank"] for s in new] == [0, 1, 2] and {s["world_size"] for s in new} == {3}
    assert new == redistribute_states(states, 3)


def test_checkpoint_redist_of_one_global_list_file(text_ds, tmp_path):
    states = _states(text_ds, 2, 3)
    path = tmp_path / "global.pt"
    torch.save({"dataloader_state_dict": states, "iteration": 7}, path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["checkpoint", "redist", str(path), str(out), "--new-world-size", "4"]
    )
    assert result.exit_code == 0, result.output
    assert [p.name for p in out.iterdir()] == ["global.pt"]
    saved = torch.load(out / "global.pt", weights_only=True)
    assert saved["iteration"] == 7
    assert saved["dataloader_state_dict"] == redistribute_states(states, 4)


@pytest.mark.parametrize(
    "inputs,count,expected",
    [
        (
            ["a/train_dataloader_dprank000.pt", "a/train_dataloader_dprank001.pt"],
            3,
            [
                "train_dataloader_dprank000.pt",
                "train_dataloader_dprank001.pt",
                "train_dataloader_dprank002.pt",
            ],
        ),
        (["iter_5/r0_of_2.json", "iter_5/r1_of_2.json"], 2, ["r0_of_2.json", "r1_of_2.json"]),
        (["state.pt"], 2, ["state_rank0.pt", "state_rank1.pt"]),
        (["ckpt_7.pt"], 2, ["ckpt_0.pt", "ckpt_1.pt"]),
    ],
)
def test_checkpoint_output_names_follow_the_input(inputs, count, expected):
    assert output_names(inputs, count) == expected


def test_demo_runs_end_to_end(tmp_path):
    result = CliRunner().invoke(
        cli,
        [
            "demo",
            "--workdir",
            str(tmp_path / "demo"),
            "--samples",
            "96",
            "--shards",
            "2",
            "--batches",
            "3",
            "--workers",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "time to first batch" in result.output
    assert "samples/s" in result.output
    assert "next batch after restore matches: True" in result.output
