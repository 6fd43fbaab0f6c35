"""The small two-dataset blend of issue 33's reports: two ranks, states saved at step 10, and the
bad states the CLI must answer in one line (an empty JSON object, a truncated file, a state of
another dataset)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from energon.cli.main import cli
from energon.state import save_state_file
from tests.helpers.datasets import make_text_dataset
from tests.ledger.runs import run_ranks, write_blend

LOADER = dict(num_streams=4, batch_size=3, shuffle_buffer_size=7, max_samples_per_sequence=5)


@dataclasses.dataclass(frozen=True)
class BlendRun:
    folder: Path  # holds dsA, dsB, blend.yaml and the state files
    ds_a: Path
    ds_b: Path
    blend: Path
    states: tuple[Path, Path]  # rank 0 and rank 1 at step 10 (JSON)
    empty_state: Path  # "{}"
    truncated_state: Path  # the first half of a real state file
    other_state: Path  # a real state of a loader over dsA alone


@pytest.fixture(scope="session")
def blend_run(tmp_path_factory) -> BlendRun:
    folder = tmp_path_factory.mktemp("blend-run")
    ds_a = make_text_dataset(folder / "dsA", num_samples=120, num_shards=5, seed=1)
    ds_b = make_text_dataset(folder / "dsB", num_samples=60, num_shards=3, seed=2)
    blend = write_blend(folder, [ds_a, ds_b], [0.6, 0.4])
    _, states = run_ranks(str(blend), 2, 10, **LOADER)
    paths = (folder / "s0.json", folder / "s1.json")
    for state, path in zip(states, paths):
        save_state_file(state, path)
    empty = folder / "empty.json"
    empty.write_text("{}")
    truncated = folder / "truncated.json"
    text = paths[0].read_text()
    truncated.write_text(text[: len(text) // 2])
    _, other = run_ranks(str(ds_a), 1, 2, **LOADER)
    other_path = folder / "other.json"
    save_state_file(other[0], other_path)
    return BlendRun(folder, ds_a, ds_b, blend, paths, empty, truncated, other_path)


def invoke(*args: object, env: dict[str, str] | None = None) -> Result:
    """``energon ARGS`` in this process (exceptions become exit codes, as on the command line)."""
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def error_line(result: Result) -> str:
    """The one ``Error:`` line of a failed command (asserting there is exactly one, and no
    traceback anywhere in its output)."""
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    return lines[0]
