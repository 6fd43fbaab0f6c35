"""The defects issue 33 reported on the command line, each reproduced as the issue did: a small
two-dataset blend, two ranks, states saved at step 10 (``blend_run``). Every failure is one line
that names the argument, with a documented exit code (docs/cli.md): 1 the input was read and is
wrong, 2 the command line is wrong."""

from __future__ import annotations

import tarfile

from energon.state import load_state_file, rank_next_position
from tests.cli.conftest import error_line, invoke


def test_a_negative_step_names_the_option(blend_run):
    result = invoke("ledger", blend_run.blend, "--state", blend_run.states[0], "--step", -1)
    assert result.exit_code == 2
    line = error_line(result)
    assert "--step" in line and "-1" in line


def test_reversed_and_empty_step_ranges_say_so(blend_run):
    reversed_range = invoke(
        "ledger", blend_run.blend, "--state", blend_run.states[0], "--steps", "5:2"
    )
    assert reversed_range.exit_code == 2
    assert "--steps" in error_line(reversed_range) and "5:2" in error_line(reversed_range)
    empty = invoke("ledger", blend_run.blend, "--state", blend_run.states[0], "--steps", "5:5")
    assert empty.exit_code == 2
    assert "--steps" in error_line(empty) and "empty range" in error_line(empty)


def test_export_with_from_step_after_until_step(blend_run, tmp_path):
    result = invoke(
        "ledger", blend_run.blend, "--state", blend_run.states[0], "--from-step", 10,
        "--until-step", 5, "--export", tmp_path / "x",
    )  # fmt: skip
    assert result.exit_code == 2
    line = error_line(result)
    assert "--from-step" in line and "--until-step" in line
    assert not (tmp_path / "x").exists()


def test_migrate_to_a_missing_config_names_it(blend_run, tmp_path):
    result = invoke(
        "checkpoint", "migrate", *blend_run.states, tmp_path / "out", "--config", "nope.yaml"
    )
    assert result.exit_code == 2
    line = error_line(result)
    assert "--config" in line and "nope.yaml" in line


def test_an_empty_json_state_is_one_line_that_does_not_speak_of_pickles(blend_run):
    result = invoke("checkpoint", "info", blend_run.empty_state)
    assert result.exit_code == 1
    line = error_line(result)
    assert str(blend_run.empty_state) in line and "pickled" not in line
    truncated = invoke("checkpoint", "info", blend_run.truncated_state)
    assert truncated.exit_code == 1
    assert str(blend_run.truncated_state) in error_line(truncated)


def test_exclude_dataset_relative_and_absolute_mean_the_same(blend_run, tmp_path, monkeypatch):
    monkeypatch.chdir(blend_run.folder)
    outputs = []
    for n, spelling in enumerate(["dsB", "./dsB/", str(blend_run.ds_b)]):
        out = tmp_path / f"out{n}"
        result = invoke("checkpoint", "exclude", *blend_run.states, out, "--dataset", spelling)
        assert result.exit_code == 0, result.output
        assert f"{blend_run.ds_b} [train]: 60 samples" in result.output
        outputs.append([load_state_file(out / name) for name in ("s0.json", "s1.json")])
    assert outputs[0] == outputs[1] == outputs[2]
    # --within takes the same spellings
    within = invoke(
        "checkpoint", "exclude", *blend_run.states, tmp_path / "w", "--shard",
        "parts/data-00000.tar", "--within", "dsB",
    )  # fmt: skip
    assert within.exit_code == 0, within.output
    assert f"{blend_run.ds_b} [train]: 20 samples" in within.output


def test_exclude_within_an_unknown_dataset_names_it(blend_run, tmp_path):
    result = invoke(
        "checkpoint", "exclude", *blend_run.states, tmp_path / "out", "--key", "00000_000001",
        "--within", "nonexistent",
    )  # fmt: skip
    assert result.exit_code == 2
    line = error_line(result)
    assert "--within" in line and "nonexistent" in line
    assert str(blend_run.ds_a) in line  # what it could have been


def test_simulate_max_length_measures_the_sample_not_the_tar_record(blend_run):
    limit = 40
    longer = 0
    for shard in sorted((blend_run.ds_a / "parts").glob("*.tar")):
        with tarfile.open(shard) as tar:
            longer += sum(m.size > limit for m in tar.getmembers())
    assert 0 < longer < 120
    result = invoke("simulate", blend_run.ds_a, "--batch-size", 4, "--max-length", limit)
    assert result.exit_code == 0, result.output
    assert (
        f"packing limit {limit} in {blend_run.ds_a} [train]: {longer} of those checked"
        in result.output
    )


def test_simulate_an_unknown_val_split_names_it(blend_run):
    result = invoke("simulate", blend_run.blend, "--val-split", "nosuch")
    assert result.exit_code == 2
    line = error_line(result)
    assert "--val-split" in line and "nosuch" in line


def test_report_to_an_unwritable_path_names_the_option(blend_run):
    result = invoke("report", blend_run.blend, "-o", "/nonexistent/x.html", "--no-progress")
    assert result.exit_code == 2
    line = error_line(result)
    assert "--output" in line and "/nonexistent" in line


def test_skipping_zero_steps_says_nothing_was_skipped(blend_run, tmp_path):
    result = invoke(
        "checkpoint", "skip", *blend_run.states, tmp_path / "out", "--steps", 0, "--no-progress"
    )
    assert result.exit_code == 0, result.output
    assert "20..19" not in result.output
    assert "nothing skipped" in result.output and "resumes at position 20" in result.output
    for name, before in zip(("s0.json", "s1.json"), blend_run.states):
        after = load_state_file(tmp_path / "out" / name)
        assert rank_next_position(after) == rank_next_position(load_state_file(before))
