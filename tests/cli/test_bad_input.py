"""Every ``energon`` command, driven with the kinds of bad input issue 33 lists: a missing path, a
folder where a file is expected and the reverse, a JSON ``{}`` or a truncated file as a state, a
state of another dataset, negative, empty and reversed step ranges, unknown dataset, split and
option names, an unwritable output path; and each case again with relative instead of absolute
paths. For each: no traceback, one ``Error:`` line that names the argument and what was expected,
an exit status from the list in docs/cli.md (and the same one for both path spellings).

Nearly every case fails while the command line is parsed, in this process (click's CliRunner):
the whole matrix takes seconds. Kinds a command has no argument for (a state for ``demo``) are
not driven: :func:`test_the_matrix_covers_every_command` checks which each command gets."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click
import pytest

from energon.cli.main import COMMANDS, cli
from tests.cli.conftest import error_line, invoke

MISSING, KIND, BAD_STATE, OTHER_STATE, STEPS, UNKNOWN, UNWRITABLE, VALUE = (
    "missing path",
    "file for a folder or the reverse",
    "{} or truncated state",
    "state of another dataset",
    "negative, empty or reversed steps",
    "unknown dataset, split or option name",
    "unwritable output",
    "value out of range",
)
KINDS = (MISSING, KIND, BAD_STATE, OTHER_STATE, STEPS, UNKNOWN, UNWRITABLE)

S = "{s0} {s1}"  # the states of both ranks
# (command, kind, arguments, what the error line must name, exit status)
CASES = [
    ("prepare", MISSING, "{missing}", ["'PATH'", "does not exist"], 2),
    ("prepare", KIND, "{notes}", ["'PATH'", "is a file"], 2),
    ("prepare", UNWRITABLE, "{dsA} --tmp-path {under_file}", ["'--tmp-path'", "not a folder"], 2),
    ("prepare", UNKNOWN, "{dsA} --bogus", ["'--bogus'"], 2),
    ("prepare", VALUE, "{dsA} --num-workers 0", ["'--num-workers'"], 2),
    ("info", MISSING, "{missing}", ["'PATH'", "does not exist"], 2),
    ("info", KIND, "{blend}", ["'PATH'", "is a file"], 2),
    ("info", UNKNOWN, "{dsA} --split-config nosuch.yaml", ["'--split-config'", "nosuch.yaml"], 2),
    ("info", UNKNOWN, "{dsA} --bogus", ["'--bogus'"], 2),
    ("info", VALUE, "{folder}", ["PATH", "energon prepare"], 1),
    ("lint", MISSING, "{missing}", ["'PATH'", "does not exist"], 2),
    ("lint", KIND, "{blend}", ["'PATH'", "is a file"], 2),
    ("lint", UNKNOWN, "{dsA} --split-parts train,nosuch", ["'--split-parts'", "nosuch"], 2),
    ("lint", UNKNOWN, "{dsA} --bogus", ["'--bogus'"], 2),
    ("lint", VALUE, "{dsA} --parallel 0", ["'--parallel'"], 2),
    ("preview", MISSING, "{missing}", ["'PATH'", "does not exist"], 2),
    ("preview", KIND, "{blend}", ["'PATH'", "is a file"], 2),
    ("preview", UNKNOWN, "{dsA} --split-parts nosuch", ["'--split-parts'", "nosuch"], 2),
    ("preview", UNKNOWN, "{dsA} --bogus", ["'--bogus'"], 2),
    ("preview", VALUE, "{dsA} --num-samples -1", ["'--num-samples'"], 2),
    ("checkpoint info", MISSING, "{missing}", ["'INPUT_FILES...'", "does not exist"], 2),
    ("checkpoint info", KIND, "{folder}", ["'INPUT_FILES...'", "is a folder"], 2),
    ("checkpoint info", BAD_STATE, "{empty}", ["INPUT_FILES", "empty.json", "not an energon"], 1),
    (
        "checkpoint info",
        BAD_STATE,
        "{truncated}",
        ["INPUT_FILES", "truncated.json", "truncated"],
        1,
    ),
    ("checkpoint info", UNKNOWN, "{s0} --bogus", ["'--bogus'"], 2),
    (
        "checkpoint redist",
        BAD_STATE,
        "{empty} {out} --new-world-size 1",
        ["INPUT_FILES", "empty"],
        1,
    ),
    ("checkpoint redist", OTHER_STATE, "{s0} {other} {out} --new-world-size 1", ["INPUT_FILES"], 1),
    ("checkpoint redist", KIND, S + " {notes} --new-world-size 1", ["'OUTPUT_PATH'", "a file"], 2),
    (
        "checkpoint redist",
        UNWRITABLE,
        S + " {under_file} --new-world-size 1",
        ["'OUTPUT_PATH'", "not a folder"],
        2,
    ),  # fmt: skip
    ("checkpoint redist", VALUE, S + " {out} --new-world-size 0", ["'--new-world-size'"], 2),
    ("checkpoint redist", UNKNOWN, S + " {out} --bogus", ["'--bogus'"], 2),
    ("checkpoint skip", STEPS, S + " {out} --steps -1", ["'--steps'", "-1"], 2),
    ("checkpoint skip", BAD_STATE, "{truncated} {s1} {out} --steps 1", ["FILES", "truncated"], 1),
    ("checkpoint skip", OTHER_STATE, S + " {out} --steps 1 --config {dsA}", ["FILES"], 1),
    (
        "checkpoint skip",
        MISSING,
        S + " {out} --steps 1 --config {missing_yaml}",
        ["'--config'", "does not exist"],
        2,
    ),  # fmt: skip
    (
        "checkpoint skip",
        UNKNOWN,
        S + " {out} --steps 1 --config {blend} --split-part nosuch",
        ["'--split-part'", "nosuch", "train"],
        2,
    ),  # fmt: skip
    ("checkpoint skip", UNWRITABLE, S + " {under_file} --steps 1", ["'OUTPUT_DIR'"], 2),
    ("checkpoint skip", UNKNOWN, S + " {out} --steps 1 --bogus", ["'--bogus'"], 2),
    ("checkpoint exclude", UNKNOWN, S + " {out} --dataset nope", ["'--dataset'", "nope", "dsB"], 2),
    (
        "checkpoint exclude",
        UNKNOWN,
        S + " {out} --key 00000_000001 --within nope",
        ["'--within'", "nope", "dsA"],
        2,
    ),  # fmt: skip
    ("checkpoint exclude", UNKNOWN, S + " {out} --key no-such-key", ["'--key'", "no-such-key"], 2),
    ("checkpoint exclude", KIND, S + " {out} --keys-file {folder}", ["'--keys-file'", "folder"], 2),
    ("checkpoint exclude", MISSING, S + " {out} --keys-file {missing}", ["'--keys-file'"], 2),
    ("checkpoint exclude", BAD_STATE, "{empty} {out} --dataset 0", ["FILES", "empty"], 1),
    ("checkpoint exclude", VALUE, S + " {out}", ["--key", "--dataset"], 2),
    ("checkpoint exclude", UNKNOWN, S + " {out} --bogus", ["'--bogus'"], 2),
    (
        "checkpoint migrate",
        MISSING,
        S + " {out} --config {missing_yaml}",
        ["'--config'", "does not exist"],
        2,
    ),  # fmt: skip
    (
        "checkpoint migrate",
        OTHER_STATE,
        S + " {out} --config {blend} --batch-size 4",
        ["FILES", "batch_size"],
        1,
    ),  # fmt: skip
    ("checkpoint migrate", BAD_STATE, "{truncated} {out} --config {blend}", ["FILES"], 1),
    ("checkpoint migrate", UNWRITABLE, S + " {under_file} --config {blend}", ["'OUTPUT_DIR'"], 2),
    ("checkpoint migrate", UNKNOWN, S + " {out} --config {blend} --bogus", ["'--bogus'"], 2),
    ("ledger", MISSING, "{missing_yaml} --state {s0} --step 1", ["'CONFIG'", "does not exist"], 2),
    ("ledger", MISSING, "{blend} --state {missing} --step 1", ["'--state'", "does not exist"], 2),
    ("ledger", STEPS, "{blend} --state {s0} --step -1", ["'--step'", "-1"], 2),
    ("ledger", STEPS, "{blend} --state {s0} --steps 5:2", ["'--steps'", "reversed"], 2),
    ("ledger", STEPS, "{blend} --state {s0} --steps 5:5", ["'--steps'", "empty range"], 2),
    ("ledger", STEPS, "{blend} --state {s0} --steps -3:2", ["'--steps'", ">= 0"], 2),
    (
        "ledger",
        STEPS,
        "{blend} --state {s0} --from-step 10 --until-step 5 --export {out}",
        ["'--from-step'", "'--until-step'"],
        2,
    ),  # fmt: skip
    (
        "ledger",
        STEPS,
        "{blend} --state {s0} --from-step 5 --until-step 5 --export {out}",
        ["'--from-step'", "empty range"],
        2,
    ),  # fmt: skip
    ("ledger", BAD_STATE, "{blend} --state {empty} --step 1", ["--state", "empty.json"], 1),
    ("ledger", BAD_STATE, "{blend} --state {truncated} --step 1", ["--state", "truncated"], 1),
    ("ledger", OTHER_STATE, "{blend} --state {other} --step 1", ["--state", "different"], 1),
    (
        "ledger",
        KIND,
        "{blend} --state {s0} --until-step 3 --export {notes}",
        ["'--export'", "is a file"],
        2,
    ),  # fmt: skip
    ("ledger", KIND, "{blend} --state {s0} --step 1 --journal {notes}", ["'--journal'"], 2),
    (
        "ledger",
        UNWRITABLE,
        "{blend} --state {s0} --until-step 3 --export {under_file}",
        ["'--export'", "not a folder"],
        2,
    ),  # fmt: skip
    (
        "ledger",
        UNKNOWN,
        "{blend} --state {s0} --step 1 --split-part nosuch",
        ["'--split-part'", "nosuch"],
        2,
    ),  # fmt: skip
    ("ledger", UNKNOWN, "{blend} --state {s0} --step 1 --bogus", ["'--bogus'"], 2),
    ("analyze-debug", MISSING, "{missing}", ["'LOG_PATHS...'", "does not exist"], 2),
    ("analyze-debug", KIND, "{notes} --heatmap-path {folder}", ["'--heatmap-path'", "folder"], 2),
    ("analyze-debug", UNWRITABLE, "{notes} --heatmap-path {nowhere}", ["'--heatmap-path'"], 2),
    ("analyze-debug", STEPS, "{notes} --skip -1", ["'--skip'", "-1"], 2),
    ("analyze-debug", UNKNOWN, "{notes} --include-modality nosuch", ["'--include-modality'"], 2),
    ("analyze-debug", VALUE, "{blend}", ["blend.yaml", "line 1"], 1),
    ("analyze-debug", UNKNOWN, "{notes} --bogus", ["'--bogus'"], 2),
    ("demo", KIND, "--workdir {notes}", ["'--workdir'", "is a file"], 2),
    ("demo", UNWRITABLE, "--workdir {under_file}", ["'--workdir'", "not a folder"], 2),
    ("demo", VALUE, "--samples 0", ["'--samples'"], 2),
    ("demo", VALUE, "--samples 40 --shards 50", ["'--shards'"], 2),
    ("demo", UNKNOWN, "--bogus", ["'--bogus'"], 2),
    ("demo-av", KIND, "--workdir {notes}", ["'--workdir'", "is a file"], 2),
    ("demo-av", VALUE, "--clips 0", ["'--clips'"], 2),
    ("demo-av", VALUE, "--seconds -1", ["'--seconds'"], 2),
    ("demo-av", UNKNOWN, "--bogus", ["'--bogus'"], 2),
    ("preprocess", MISSING, "{missing} -o {out} -t bytes", ["'INPUTS...'", "does not exist"], 2),
    ("preprocess", KIND, "{folder} -o {out} -t bytes", ["'INPUTS...'", "is a folder"], 2),
    ("preprocess", UNWRITABLE, "{notes} -o {nowhere} -t bytes", ["'--output-prefix'"], 2),
    ("preprocess", VALUE, "{notes} -o {out} -t bytes --workers 0", ["'--workers'"], 2),
    ("preprocess", UNKNOWN, "{notes} -o {out} -t bytes --bogus", ["'--bogus'"], 2),
    ("merge", MISSING, "{missing} -o {out}", ["'INPUTS...'", "does not exist"], 2),
    ("merge", UNWRITABLE, "{folder} -o {under_file}", ["'--output-prefix'"], 2),
    ("merge", UNKNOWN, "{folder} -o {out} --bogus", ["'--bogus'"], 2),
    ("build-sequences", KIND, "{missing} -o {folder}", ["'--output'", "is a folder"], 2),
    ("build-sequences", UNWRITABLE, "{missing} -o {nowhere}", ["'--output'"], 2),
    ("build-sequences", MISSING, "{missing} -o {out}", ["'DATA_PATH...'", "nope"], 2),
    ("build-sequences", UNKNOWN, "{missing} -o {out} --bogus", ["'--bogus'"], 2),
    (
        "prepare-cache",
        KIND,
        "--data-cache-path {notes} --seq-length 8",
        ["'--data-cache-path'", "is a file"],
        2,
    ),  # fmt: skip
    ("prepare-cache", VALUE, "--data-cache-path {out} --seq-length 0", ["'--seq-length'"], 2),
    (
        "prepare-cache",
        MISSING,
        "--data-cache-path {out} --seq-length 8 --per-dataset-sequences-path {missing}",
        ["'--per-dataset-sequences-path'"],
        2,
    ),  # fmt: skip
    ("prepare-cache", UNKNOWN, "--data-cache-path {out} --seq-length 8 --bogus", ["'--bogus'"], 2),
    ("prepare-media", MISSING, "{missing} --media-metadata-by-extension", ["'PATH'"], 2),
    ("prepare-media", KIND, "{notes} --media-metadata-by-extension", ["'PATH'", "is a file"], 2),
    (
        "prepare-media",
        UNWRITABLE,
        "{folder} --media-metadata-by-extension --tmp-path {under_file}",
        ["'--tmp-path'"],
        2,
    ),  # fmt: skip
    ("prepare-media", VALUE, "{folder}", ["--media-metadata-by-extension"], 2),
    ("prepare-media", UNKNOWN, "{folder} --bogus", ["'--bogus'"], 2),
    ("blend-plan", MISSING, "{missing_yaml}", ["'PATH'", "does not exist"], 2),
    ("blend-plan", KIND, "{dsA}", ["'PATH'", "is a folder"], 2),
    ("blend-plan", UNKNOWN, "{blend} --split-part nosuch", ["'--split-part'", "nosuch"], 2),
    ("blend-plan", UNWRITABLE, "{blend} --html {nowhere}", ["'--html'", "does not exist"], 2),
    ("blend-plan", VALUE, "{blend} --samples 0", ["'--samples'"], 2),
    ("blend-plan", UNKNOWN, "{blend} --bogus", ["'--bogus'"], 2),
    ("simulate", MISSING, "{missing_yaml}", ["'CONFIG'", "does not exist"], 2),
    ("simulate", UNKNOWN, "{blend} --val-split nosuch", ["'--val-split'", "nosuch"], 2),
    ("simulate", KIND, "{blend} --json {folder}", ["'--json'", "is a folder"], 2),
    ("simulate", UNWRITABLE, "{blend} --json {nowhere}", ["'--json'"], 2),
    ("simulate", VALUE, "{blend} --max-length 0", ["'--max-length'"], 2),
    ("simulate", UNKNOWN, "{blend} --bogus", ["'--bogus'"], 2),
    ("mount", MISSING, "{missing} {folder}", ["'PATH'", "does not exist"], 2),
    ("mount", KIND, "{notes} {folder}", ["'PATH'", "is a file"], 2),
    ("mount", VALUE, "{dsA} {folder}", ["does not mount"], 1),
    ("mount", UNKNOWN, "{dsA} {folder} --bogus", ["'--bogus'"], 2),
    ("report", MISSING, "{missing_yaml}", ["'CONFIG'", "does not exist"], 2),
    ("report", UNWRITABLE, "{blend} -o /nonexistent/x.html", ["'--output'", "/nonexistent"], 2),
    ("report", KIND, "{blend} -o {folder}", ["'--output'", "is a folder"], 2),
    ("report", VALUE, "{blend} --samples -1", ["'--samples'"], 2),
    ("report", UNKNOWN, "{blend} --bogus", ["'--bogus'"], 2),
]


def _documented_exit_statuses() -> set[int]:
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    table = text.split("| exit status | meaning |", 1)[1].split("\n\n", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.M)}


EXIT_STATUSES = _documented_exit_statuses()


@pytest.fixture(scope="module")
def places(blend_run, tmp_path_factory) -> dict[str, Path]:
    """Placeholder -> absolute path: the blend run's files and a few bad places."""
    folder = blend_run.folder
    (folder / "notes.txt").write_text("not a state, not a dataset\n")
    (folder / "a-folder").mkdir(exist_ok=True)
    return {
        "blend": blend_run.blend,
        "dsA": blend_run.ds_a,
        "dsB": blend_run.ds_b,
        "s0": blend_run.states[0],
        "s1": blend_run.states[1],
        "empty": blend_run.empty_state,
        "truncated": blend_run.truncated_state,
        "other": blend_run.other_state,
        "missing": folder / "nope",
        "missing_yaml": folder / "nope.yaml",
        "notes": folder / "notes.txt",
        "folder": folder / "a-folder",
        "under_file": folder / "notes.txt" / "x",
        "nowhere": folder / "no-such-folder" / "x.out",
        "out": tmp_path_factory.mktemp("bad-input-out") / "never-written",
    }


def _argv(template: str, places: dict[str, Path], relative: bool) -> list[str]:
    """``template`` with its placeholders filled in: absolute paths, or paths relative to the
    blend run's folder (the current folder in that case)."""
    cwd = os.getcwd()
    spelled = {k: (os.path.relpath(v, cwd) if relative else str(v)) for k, v in places.items()}
    return [part.format(**spelled) for part in template.split()]


@pytest.mark.parametrize(
    "command, kind, template, names, status",
    CASES,
    ids=[f"{c[0]}: {c[2]}" for c in CASES],
)
def test_bad_input_is_one_clear_line(
    command, kind, template, names, status, places, blend_run, monkeypatch
):
    monkeypatch.chdir(blend_run.folder)
    outcomes = []
    for relative in (False, True):
        result = invoke(*command.split(), *_argv(template, places, relative))
        line = error_line(result)
        assert result.exit_code == status, (result.exit_code, line)
        assert result.exit_code in EXIT_STATUSES
        for name in names:
            assert name in line, (name, line)
        assert result.stderr.strip().splitlines()[-1] == line  # the error is the last word
        outcomes.append((result.exit_code, line.split(":", 2)[:2]))
    assert not places["out"].exists()
    # relative and absolute spellings of the same paths fail the same way, naming the same thing
    assert outcomes[0][0] == outcomes[1][0]


def test_the_matrix_covers_every_command():
    verbs = set(COMMANDS) - {"checkpoint"}
    checkpoint = cli.get_command(click.Context(cli), "checkpoint")
    verbs |= {f"checkpoint {name}" for name in checkpoint.commands}
    covered: dict[str, set[str]] = {}
    for command, kind, *_ in CASES:
        covered.setdefault(command, set()).add(kind)
    assert set(covered) == verbs
    assert all(UNKNOWN in kinds for kinds in covered.values())  # an unknown option, at least
    assert {kind for kinds in covered.values() for kind in kinds} >= set(KINDS)
    # the commands that read states meet both kinds of bad state, and the step commands bad steps
    for command in ("checkpoint info", "ledger"):
        assert {MISSING, BAD_STATE, UNKNOWN} <= covered[command]
    for command in ("ledger", "checkpoint skip"):
        assert STEPS in covered[command]


def test_debug_shows_the_traceback(blend_run):
    args = ["ledger", blend_run.blend, "--state", blend_run.other_state, "--step", 1]
    plain = invoke(*args)
    assert "Traceback" not in plain.output and plain.exit_code == 1
    for debug in (invoke("--debug", *args), invoke(*args, env={"ENERGON_DEBUG": "1"})):
        assert "Traceback (most recent call last)" in debug.stderr
        assert "StateError" in debug.stderr
        assert debug.stderr.strip().splitlines()[-1] == error_line(plain)
        assert debug.exit_code == 1


def test_relative_and_absolute_paths_give_the_same_answer(blend_run, monkeypatch):
    monkeypatch.chdir(blend_run.folder)
    answers = []
    for config, state in [
        (blend_run.blend, blend_run.states[0]),
        (blend_run.blend.name, blend_run.states[0].name),
        (f"./{blend_run.blend.name}", f"../{blend_run.folder.name}/{blend_run.states[0].name}"),
    ]:
        result = invoke("ledger", config, "--state", state, "--steps", "10:12", "--format", "json")
        assert result.exit_code == 0, result.output
        answers.append(result.stdout)
    assert answers[0] == answers[1] == answers[2]
