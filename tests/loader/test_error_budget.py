"""Error budgets that see real failure rates, and public skip reports (issue 14, point 3).

Datasets are damaged for real: payload bytes of chosen samples are spoiled in the prepared shards
(invalid UTF-8), so those samples fail to decode while their neighbours load.
"""

from __future__ import annotations

import functools
import json
import logging

import pytest

from energon import (
    ErrorBudget,
    ErrorBudgetExceeded,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from energon.errors import ERROR_BUDGET_ENV, StateError
from tests.helpers.damage import spoil_text_payloads
from tests.helpers.datasets import make_text_dataset, shard_paths


def quiet(*_args):
    """An error handler that only lets the policy count (the default prints every traceback)."""


def worker_config(num_workers=0, rank=0, world_size=1):
    return WorkerConfig(
        rank=rank, world_size=world_size, num_workers=num_workers, global_error_handler=quiet
    )


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """A weighted blend of a good text dataset and one whose every sample fails."""
    root = tmp_path_factory.mktemp("blend")
    make_text_dataset(root / "good", num_samples=60, num_shards=3)
    make_text_dataset(root / "broken", num_samples=40, num_shards=2, seed=1)
    for shard in shard_paths(root / "broken"):
        spoil_text_payloads(root / "broken" / shard, lambda i, key: True)
    (root / "blend.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - weight: 1\n        path: ./good\n      - weight: 1\n        path: ./broken\n"
    )
    return root


@pytest.fixture(scope="module")
def mostly_bad_shard(tmp_path_factory):
    """800 samples in 2 shards; 396 of the 400 samples of the first shard are spoiled."""
    root = make_text_dataset(tmp_path_factory.mktemp("shard396"), num_samples=800, num_shards=2)
    first = root / shard_paths(root)[0]
    spoiled = spoil_text_payloads(first, lambda i, key: i % 100 != 0)
    assert len(spoiled) == 396
    return root, spoiled


def train(path, num_workers=0, **kwargs):
    options = dict(batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None)
    options.update(kwargs)
    return get_savable_loader(
        get_train_dataset(path, worker_config=worker_config(num_workers), **options)
    )


def run_until_error(loader, max_steps):
    """Steps taken before the loader raised (the error), or (max_steps, None)."""
    it = iter(loader)
    for step in range(max_steps):
        try:
            next(it)
        except ErrorBudgetExceeded as e:
            return step, e
    return max_steps, None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_blend_member_whose_every_sample_fails_stops_the_run_naming_it(blend, num_workers):
    """Good samples in between reset the hooks' consecutive-failure counters, so only the
    per-source rate sees it: with the default budget after 501 failures in its first window."""
    steps, error = run_until_error(train(blend / "blend.yaml", num_workers), 5000)
    assert error is not None, f"ran {steps} steps on half-broken data"
    message = str(error)
    assert str(blend / "broken") in message and "mostly broken" in message
    assert "SampleReadError" in message and "offset" in message
    # each stream stops at its 501st failure; about as many good samples came in between
    assert steps < 600 * max(1, num_workers)


def test_a_smaller_window_stops_sooner(blend):
    steps, error = run_until_error(
        train(blend / "blend.yaml", error_budget=ErrorBudget(window=50)), 1000
    )
    assert error is not None and steps < 100


def test_a_validation_source_that_fails_completely_is_fatal(blend):
    """Fewer failures than any window or consecutive limit: the end of the stream sees them all."""
    wc = worker_config(world_size=1)
    ds = get_val_dataset(blend / "broken", worker_config=wc, batch_size=4, split_part="train")
    with pytest.raises(ErrorBudgetExceeded, match="fails completely") as info:
        list(get_loader(ds))
    assert str(blend / "broken") in str(info.value)


def test_a_mostly_broken_shard_is_reported_and_a_budget_can_stop_it(mostly_bad_shard, caplog):
    """396 of 400 samples of one shard fail, interleaved with the other shard's: under the default
    budget the run goes on, but not silently: a log line and ``error_report()`` say what and where."""
    root, spoiled = mostly_bad_shard
    loader = train(root)
    it = iter(loader)
    with caplog.at_level(logging.WARNING, logger="energon"):
        delivered = [next(it).__key__ for _ in range(404)]  # the good samples of one epoch
    assert not set(delivered) & set(spoiled)
    report = loader.error_report()
    (source,) = report["sources"]
    # every sample read was delivered or skipped (the few spoiled samples read after the last
    # good one are counted with the next item)
    assert report["read"] - report["skipped"] == 404 and 390 <= report["skipped"] <= 396
    assert source["reasons"] == {"SampleReadError": report["skipped"]}
    assert source["rate"] == pytest.approx(report["skipped"] / report["read"])
    first_shard = shard_paths(root)[0]
    for example in source["examples"]:
        assert example["shard"] == first_shard
        assert example["offset"] == spoiled[example["key"] or _key_at(spoiled, example)]
        assert "SampleReadError" in example["error"]
    lines = [r.getMessage() for r in caplog.records if r.name == "energon"]
    # the first skip is logged at once; the next line would wait for log_interval_s (300 s, far
    # longer than these steps take on a busy machine)
    assert len(lines) == 1 and "samples skipped after errors" in lines[0]

    steps, error = run_until_error(
        train(root, error_budget=ErrorBudget(max_rate=0.2, window=100)), 1000
    )
    assert error is not None and "max_rate=0.2" in str(error)
    steps, error = run_until_error(train(root, error_budget=ErrorBudget(max_skipped=10)), 1000)
    assert error is not None and "max_skipped=10" in str(error) and steps < 30


def _key_at(spoiled, example):
    """The key of a spoiled sample found by its offset (load failures happen before the key is
    known to the pipeline)."""
    return next(key for key, offset in spoiled.items() if offset == example["offset"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_report_survives_save_and_restore(mostly_bad_shard, num_workers):
    """One logical stream (read by both workers): its reads mix both shards."""
    root, _ = mostly_bad_shard
    one_stream = functools.partial(train, num_streams=1)
    full = one_stream(root, num_workers)
    it = iter(full)
    for _ in range(300):
        next(it)
    expected = full.error_report()

    first = one_stream(root, num_workers)
    it = iter(first)
    for _ in range(120):
        next(it)
    state = json.loads(json.dumps(first.save_state_rank()))
    second = one_stream(root, num_workers)
    second.restore_state_rank(state)
    assert second.error_report() == first.error_report()
    it = iter(second)
    for _ in range(180):
        next(it)
    assert second.error_report() == expected
    assert expected["skipped"] > 100


def test_the_total_count_budget_and_the_environment(mostly_bad_shard, monkeypatch):
    root, _ = mostly_bad_shard
    monkeypatch.setenv(ERROR_BUDGET_ENV, "max_total_skipped=7, log_interval_s=none")
    steps, error = run_until_error(train(root), 1000)
    assert error is not None and "max_total_skipped=7" in str(error)
    monkeypatch.setenv(ERROR_BUDGET_ENV, "max_rate=2")
    with pytest.raises(ValueError, match="max_rate"):
        train(root)
    monkeypatch.setenv(ERROR_BUDGET_ENV, "nonsense=1")
    with pytest.raises(ValueError, match=ERROR_BUDGET_ENV):
        train(root)


def test_a_finished_validation_pass_keeps_its_counts(tmp_path):
    root = make_text_dataset(tmp_path / "val", num_samples=40, num_shards=2)
    spoil_text_payloads(root / shard_paths(root)[1], lambda i, key: i < 5)
    wc = worker_config()
    loader = get_savable_loader(
        get_val_dataset(root, worker_config=wc, batch_size=4, split_part="train")
    )
    assert sum(len(b.__key__) for b in loader) == 35
    assert loader.error_report()["skipped"] == 5
    state = loader.save_state_rank()
    again = get_savable_loader(
        get_val_dataset(root, worker_config=wc, batch_size=4, split_part="train")
    )
    again.restore_state_rank(state)
    assert again.error_report()["skipped"] == 5
    list(again)
    assert again.error_report()["skipped"] == 10, "both passes"


def test_log_lines_can_be_switched_off_or_made_immediate(mostly_bad_shard, caplog):
    root, _ = mostly_bad_shard
    with caplog.at_level(logging.WARNING, logger="energon"):
        it = iter(train(root, error_budget=ErrorBudget(log_interval_s=None)))
        for _ in range(50):
            next(it)
        assert not [r for r in caplog.records if r.name == "energon"]
        loader = train(root, error_budget=ErrorBudget(log_interval_s=0))
        it = iter(loader)
        for _ in range(50):
            next(it)
    lines = [r for r in caplog.records if r.name == "energon"]
    assert len(lines) >= 2, "every new skip is logged"


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world_size", [1, 2])
def test_failures_after_a_streams_last_item_are_reported(tmp_path, num_workers, world_size):
    """The last samples of every stream are spoiled: no item follows them, the streams' final
    snapshots still bring their counts to the report."""
    root = make_text_dataset(tmp_path / "tail", num_samples=40, num_shards=4)
    spoiled = {}
    for shard in shard_paths(root):
        spoiled.update(spoil_text_payloads(root / shard, lambda i, key: i >= 8))
    total = 0
    for rank in range(world_size):
        wc = worker_config(num_workers, rank, world_size)
        ds = get_val_dataset(root, worker_config=wc, batch_size=3, split_part="train")
        loader = get_loader(ds)
        real = [k for b in loader for k, pad in zip(b.__key__, b.__padding__) if not pad]
        assert not set(real) & set(spoiled)
        total += loader.error_report()["skipped"]
    assert total == len(spoiled) == 8


def test_damaged_error_counters_in_a_state_are_state_errors(mostly_bad_shard):
    root, _ = mostly_bad_shard
    loader = train(root)
    it = iter(loader)
    for _ in range(20):
        next(it)
    state = json.loads(json.dumps(loader.save_state_rank()))
    (_stream, snapshot), *_ = state["streams"]
    assert snapshot["errors"]["failed"] > 0

    bad = json.loads(json.dumps(state))
    bad["streams"][0][1]["errors"]["sources"][0][0] = 99  # a source the dataset does not have
    restored = train(root)
    restored.restore_state_rank(bad)
    with pytest.raises(StateError, match="'errors'"):
        next(iter(restored))

    bad = json.loads(json.dumps(state))
    bad["errors"] = [{"read": "many"}]
    with pytest.raises(StateError, match="'errors'"):
        train(root).restore_state_rank(bad)
