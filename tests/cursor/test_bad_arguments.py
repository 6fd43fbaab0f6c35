"""The ledger and cursor functions check their arguments first: a bad one is an ArgumentError
(or StateError for a state) naming it, and dataset names are read one way for ``datasets`` and
``within`` (issue 33, points 3 and 4)."""

from __future__ import annotations

import pytest

from energon import ArgumentError, ArgumentTypeError, StateError
from energon.cursor.exclude import exclude_samples
from energon.cursor.migrate import migrate_states
from energon.cursor.skip import skip_steps
from energon.ledger.exposure import export_exposures
from energon.ledger.ledger import Ledger
from tests.helpers.datasets import make_text_dataset
from tests.ledger.runs import CONFIGS, run_ranks, train_dataset, write_blend

CONFIG = dict(CONFIGS["shuffled"], num_streams=4)


@pytest.fixture(scope="module")
def run(tmp_path_factory, text_ds):
    folder = tmp_path_factory.mktemp("bad-arguments")
    other = make_text_dataset(folder / "b", num_samples=60, num_shards=3, seed=7)
    blend = str(write_blend(folder, [text_ds, other], [0.6, 0.4]))
    _, states = run_ranks(blend, 2, 4, **CONFIG)
    return blend, states, folder


def test_ledger_arguments(run, tmp_path):
    blend, states, _ = run
    dataset = train_dataset(blend, world_size=2, **CONFIG)
    with pytest.raises(ArgumentTypeError, match="^dataset: "):
        Ledger("x")
    with pytest.raises(ArgumentError, match="^micro_batches_per_step: "):
        Ledger(dataset, micro_batches_per_step=0)
    with pytest.raises(ArgumentError, match="^journal: "):
        Ledger(dataset, journal=str(tmp_path / "nope"))
    ledger = Ledger(dataset, states=states)
    with pytest.raises(ArgumentError, match=r"^step: expected an integer >= 0, got -1"):
        ledger.describe_step(-1)
    with pytest.raises(ArgumentError, match="^from_step/until_step: .*after"):
        export_exposures(ledger, str(tmp_path / "x"), until_step=5, from_step=10)
    with pytest.raises(ArgumentError, match="^from_step/until_step: .*empty range"):
        export_exposures(ledger, str(tmp_path / "x"), until_step=5, from_step=5)
    with pytest.raises(ArgumentError, match="^until_step: "):
        export_exposures(ledger, str(tmp_path / "x"), until_step=-1)
    assert not (tmp_path / "x").exists()
    with pytest.raises(StateError, match="datasets"):
        Ledger(
            train_dataset(states[0]["fingerprint"]["datasets"][0]["path"], world_size=2, **CONFIG),
            states=states,
        )


def test_cursor_arguments(run):
    blend, states, _ = run
    with pytest.raises(ArgumentError, match="^steps: "):
        skip_steps(states, -1)
    with pytest.raises(ArgumentError, match="^micro_batches_per_step: "):
        skip_steps(states, 1, micro_batches_per_step=0)
    for call in (lambda: skip_steps([], 1), lambda: migrate_states([], None)):
        with pytest.raises(ArgumentError, match="^states: "):
            call()
    with pytest.raises(ArgumentTypeError, match="^dataset: "):
        migrate_states(states, "x")
    with pytest.raises(ArgumentError, match="^datasets: 'nope'.*is no dataset.*\\[1\\]"):
        exclude_samples(states, datasets=["nope"])
    with pytest.raises(ArgumentError, match="^within: 'nope'"):
        exclude_samples(states, keys=["00000_000001"], within=["nope"])
    with pytest.raises(ArgumentError, match="^keys: nothing to exclude.*no-such-key"):
        exclude_samples(states, keys=["no-such-key"])


def test_dataset_names_relative_absolute_or_numbered_mean_the_same(run, monkeypatch):
    _, states, folder = run
    monkeypatch.chdir(folder)
    b = str(folder / "b")
    names = (b, "b", "./b/", f"../{folder.name}/b", "1")  # "1": the blend's second source
    results = [exclude_samples(states, datasets=[name])[0] for name in names]
    assert all(r == results[0] for r in results[1:])
    _, within = exclude_samples(states, shards=["parts/data-00000.tar"], within=["b"])
    _, within_abs = exclude_samples(states, shards=["parts/data-00000.tar"], within=[b])
    assert within.datasets == within_abs.datasets == [{"path": b, "split": "train", "samples": 20}]
