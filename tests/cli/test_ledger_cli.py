"""``energon ledger`` and ``energon checkpoint skip|exclude|migrate`` on the command line: the
options mirror get_train_dataset's, states supply them, outputs are written like redist's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from energon.cli.main import cli
from energon.state import load_state_file, save_state_file
from tests.helpers.datasets import make_text_dataset
from tests.ledger.runs import CONFIGS, run_ranks, write_blend

OPTIONS = [
    "--world-size", "2", "--num-streams", "4", "--batch-size", "3",
    "--shuffle-buffer-size", "7", "--max-samples-per-sequence", "5",
]  # fmt: skip


def _invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def trained(text_ds, tmp_path_factory):
    """States of 2 ranks after 4 steps (JSON files and one torch file), and what came after."""
    folder = tmp_path_factory.mktemp("cli-ledger")
    delivered, states = run_ranks(str(text_ds), 2, 10, num_streams=4, **CONFIGS["shuffled"])
    _, at4 = run_ranks(str(text_ds), 2, 4, num_streams=4, **CONFIGS["shuffled"])
    (folder / "ckpt").mkdir()
    for rank, state in enumerate(at4):
        save_state_file(state, folder / "ckpt" / f"loader_rank{rank:03d}.json")
    torch.save({"dataloader_state_dict": at4[0], "iteration": 4}, folder / "wrapped_rank0.pt")
    torch.save({"dataloader_state_dict": at4[1], "iteration": 4}, folder / "wrapped_rank1.pt")
    return folder, delivered


def test_ledger_describes_a_step_from_options_and_from_states(text_ds, trained):
    folder, delivered = trained
    as_json = _invoke("ledger", text_ds, *OPTIONS, "--step", 6, "--format", "json")
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    keys = [tuple(json.loads(json.dumps(r["restore_key"]))) for r in data["micro_batches"]]
    assert [json.dumps(k) for k in keys] == [json.dumps(k) for k in delivered[6]]
    from_state = _invoke(
        "ledger", text_ds, "--state", folder / "ckpt", "--step", 6, "--format", "jsonl"
    )
    lines = [json.loads(line) for line in from_state.output.splitlines()]
    assert [r["restore_key"] for r in lines] == [r["restore_key"] for r in data["micro_batches"]]
    text = _invoke("ledger", text_ds, "--state", folder / "wrapped_rank0.pt", "--steps", "5:7")
    assert text.exit_code == 0, text.output
    assert text.output.count("[seen, simulated]") == 4
    sample = data["micro_batches"][0]["outputs"][0][0]
    assert (
        f"{sample['key']}  {sample['dataset']} [train] {sample['shard']} @ {sample['byte_offset']}"
        in text.output
    )


def test_ledger_usage_errors(text_ds):
    missing = _invoke("ledger", text_ds, "--step", 3, "--num-workers", 1)
    assert missing.exit_code != 0 and "--batch-size is required without --state" in missing.output
    both = _invoke("ledger", text_ds, *OPTIONS, "--step", 3, "--steps", "1:2")
    assert both.exit_code != 0 and "exactly one of" in both.output
    bad = _invoke("ledger", text_ds, *OPTIONS, "--steps", "5")
    assert bad.exit_code != 0 and "A:B" in bad.output


def test_ledger_export(text_ds, trained, tmp_path):
    out = _invoke(
        "ledger", text_ds, *OPTIONS, "--until-step", 10, "--export", tmp_path / "x", "--no-progress"
    )
    assert out.exit_code == 0, out.output
    assert "60 exposures" in out.output  # 10 steps x 2 ranks x 3 samples
    counts = np.load(tmp_path / "x" / "counts" / "0.npy")
    assert counts.sum() == 60 and counts.max() == 1


def test_checkpoint_edits_write_like_redist(text_ds, trained, tmp_path):
    folder, delivered = trained
    skipped = _invoke(
        "checkpoint",
        "skip",
        folder / "wrapped_rank0.pt",
        folder / "wrapped_rank1.pt",
        tmp_path / "s",
        "--steps",
        3,
    )
    assert skipped.exit_code == 0, skipped.output
    assert "training resumes at position 14" in skipped.output
    wrapped = torch.load(tmp_path / "s" / "wrapped_rank1.pt", weights_only=True)
    assert wrapped["iteration"] == 4 and wrapped["dataloader_state_dict"]["rank"] == 1
    after, _ = run_ranks(
        str(text_ds), 2, 3, num_streams=4, **CONFIGS["shuffled"],
        states=[torch.load(tmp_path / "s" / f"wrapped_rank{r}.pt", weights_only=True)["dataloader_state_dict"] for r in range(2)],
    )  # fmt: skip
    assert after == delivered[7:10]
    info = _invoke(
        "checkpoint",
        "info",
        tmp_path / "s" / "wrapped_rank0.pt",
        tmp_path / "s" / "wrapped_rank1.pt",
    )
    assert "edit: skipped positions 8..13" in info.output
    excluded = _invoke(
        "checkpoint", "exclude", *sorted((folder / "ckpt").iterdir()), tmp_path / "e",
        "--shard", "parts/data-00002.tar",
    )  # fmt: skip
    assert excluded.exit_code == 0, excluded.output
    assert "24 samples" in excluded.output
    names = sorted(p.name for p in (tmp_path / "e").iterdir())
    assert names == ["loader_rank000.json", "loader_rank001.json"]
    state = load_state_file(tmp_path / "e" / "loader_rank000.json")
    assert state["edits"]["exclude"][0]["ranges"] == [[48, 72]]
    nothing = _invoke(
        "checkpoint", "exclude", folder / "ckpt" / "loader_rank000.json", tmp_path / "n"
    )
    assert nothing.exit_code != 0


def test_checkpoint_migrate(text_ds, tmp_path):
    other = make_text_dataset(tmp_path / "other", num_samples=40, num_shards=2, seed=9)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = write_blend(tmp_path / "old", [text_ds], [1.0])
    new = write_blend(tmp_path / "new", [text_ds, other], [3.0, 1.0])
    _, states = run_ranks(str(old), 2, 3, num_streams=4, **CONFIGS["plain"])
    files = []
    for rank, state in enumerate(states):
        files.append(tmp_path / f"state_{rank}.json")
        save_state_file(state, files[-1])
    out = _invoke("checkpoint", "migrate", *files, tmp_path / "m", "--config", new)
    assert out.exit_code == 0, out.output
    assert (
        "continues (keeps its place)" in out.output
        and "added (starts at its beginning)" in out.output
    )
    migrated = [load_state_file(tmp_path / "m" / f"state_{r}.json") for r in range(2)]
    after, _ = run_ranks(str(new), 2, 4, num_streams=4, states=migrated, **CONFIGS["plain"])
    assert len(after) == 4
    described = _invoke("ledger", new, "--state", tmp_path / "m", "--step", 4, "--format", "jsonl")
    assert [json.loads(line)["restore_key"] for line in described.output.splitlines()] == [
        json.loads(json.dumps(k)) for k in after[1]
    ]
