"""``energon blend-plan``: the blend a config will feed training, from the plan alone."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.cli.main import cli
from energon.loader.blend_report import simulate_blend

CONFIG = """
__class__: MetadatasetV2
global_batch_size: 10
splits:
  train:
    blend:
      - weight: {cosine: {start: 100, end: 700, from: 0.2, to: 1.8}, unit: steps}
        path: ./a
      - weight: 1
        path: ./b
"""


@pytest.fixture
def config(tmp_path, text_ds, text_val_ds):
    (tmp_path / "a").symlink_to(text_ds)
    (tmp_path / "b").symlink_to(text_val_ds)
    path = tmp_path / "mix.yaml"
    path.write_text(CONFIG)
    return path


def test_blend_plan_prints_plots_and_matches_a_real_loader(config, tmp_path):
    html, png, report = tmp_path / "p.html", tmp_path / "p.png", tmp_path / "r.json"
    result = CliRunner().invoke(
        cli,
        [
            "blend-plan",
            str(config),
            "--num-streams",
            "4",
            "--window",
            "500",
            "--no-progress",
            "--html",
            str(html),
            "--png",
            str(png),
            "--json",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "req -> obs" in result.output and f"wrote {html}" in result.output
    data = json.loads(report.read_text())
    windows = data["windows"]
    assert windows[-1]["end"] == 9000  # the last point (7000) + 25%, in whole windows
    first, last = windows[0], windows[-1]
    assert first["requested"][0] == pytest.approx(0.2 / 1.2, abs=1e-9)
    assert last["requested"][0] == pytest.approx(1.8 / 2.8, abs=1e-9)
    assert all(abs(o - r) < 0.02 for w in windows for o, r in zip(w["observed"], w["requested"]))
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<polyline") == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the plan is what a loader with the same streams picks (its live report, window by window)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        config,
        worker_config=wc,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        num_streams=4,
    )
    loader = get_savable_loader(ds)
    it = iter(loader)
    for _ in range(3000):
        next(it)
    live = loader.blend_report().windows
    planned = simulate_blend(ds.spec, 3000, 1000).windows
    assert [(w.start, w.picks) for w in live] == [(w.start, w.picks) for w in planned]
    for a, b in zip(live, planned):
        assert a.observed == b.observed
        assert a.requested == pytest.approx(b.requested, abs=1e-12)


def test_blend_plan_explains_what_it_cannot_simulate(tmp_path, text_ds, text_val_ds):
    result = CliRunner().invoke(cli, ["blend-plan", str(tmp_path / "none.yaml")])
    assert result.exit_code != 0 and "does not exist" in result.output
    single = tmp_path / "single.yaml"
    single.write_text(f"__class__: MetadatasetV2\nsplits:\n  train:\n    path: {text_ds}\n")
    result = CliRunner().invoke(cli, ["blend-plan", str(single), "--no-progress"])
    assert result.exit_code == 1 and "not a weight blend" in result.output
    steps = tmp_path / "steps.yaml"
    text = CONFIG.replace("global_batch_size: 10\n", "")
    steps.write_text(text.replace("./a", str(text_ds)).replace("./b", str(text_val_ds)))
    result = CliRunner().invoke(cli, ["blend-plan", str(steps), "--no-progress"])
    assert result.exit_code == 1 and "in steps" in result.output
    result = CliRunner().invoke(
        cli, ["blend-plan", str(steps), "--no-progress", "--global-batch-size", "2"]
    )
    assert result.exit_code == 0, result.output


def test_checkpoint_info_lists_online_weight_changes(config, tmp_path):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        config,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        num_streams=4,
    )
    loader = get_savable_loader(ds)
    it = iter(loader)
    for _ in range(10):
        next(it)
    loader.set_blend_weights([1.0, 3.0])
    loader.set_blend_weights(None, from_step=7)  # sample 70: micro-batch 35
    path = tmp_path / "state.json"
    path.write_text(json.dumps(loader.save_state_rank()))
    result = CliRunner().invoke(cli, ["checkpoint", "info", str(path)])
    assert result.exit_code == 0, result.output
    assert "blend weights: scheduled" in result.output
    assert "changed online from global micro-batch 10: 1, 3" in result.output
    assert "changed online from global micro-batch 35: the configured weights" in result.output
