"""The stall watchdog: a task encoder that sleeps on one sample; the report names the stage, the
sample and the stacks; with fail_on_timeout the wait ends in WatchdogTimeout.

Timing: the watchdog timeout is short and the sleep is at least 10x longer, so the watchdog fires
on any machine; nothing asserts how long anything took."""

from __future__ import annotations

import re
import time

import pytest

from energon import DefaultTaskEncoder, WorkerConfig, get_savable_loader, get_train_dataset
from energon.errors import WatchdogTimeout
from energon.loader.workers import messages

TIMEOUT = 1.0  # between batches; the first batch of a pass gets INITIAL (starting up)
INITIAL = 60.0
SLEEP = 10 * TIMEOUT  # without workers the error waits for the sleep to return


class SleepyEncoder(DefaultTaskEncoder):
    """Sleeps on the sample whose key ends in _000003, ``seconds`` long."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def encode_sample(self, sample):
        if sample.__key__.endswith("_000003"):
            time.sleep(self.seconds)
        return sample


def _loader(path, num_workers, seconds, **watchdog):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=SleepyEncoder(seconds),
    )
    return get_savable_loader(ds, **watchdog)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_watchdog_fails_with_stacks_and_the_sample(text_ds, num_workers, monkeypatch):
    # one item per message: with groups, whether the items before the sleepy one reach the main
    # process before it sleeps depends on how fast they were made (forked workers inherit this)
    monkeypatch.setattr(messages, "GROUP_SECONDS", 0.0)
    # with a worker, the watchdog kills it: the sleep can be long, the error comes at once
    seconds = SLEEP if num_workers == 0 else 600
    loader = _loader(
        text_ds,
        num_workers,
        seconds,
        watchdog_timeout_seconds=TIMEOUT,
        watchdog_initial_timeout_seconds=INITIAL,
        fail_on_timeout=True,
    )
    with pytest.raises(WatchdogTimeout) as info:
        for _ in loader:
            pass
    report = str(info.value)
    assert "has waited" in report
    assert "stage encode" in report
    assert "_000003" in report  # the sample's key
    assert "data-0000" in report  # its shard
    assert "encode_sample" in report  # the stack of the process that runs the encoder
    if num_workers:
        assert "worker 0 (pid" in report and "time.sleep" not in report.split("stacks:")[0]
        assert "File " in report.split("worker 0 (pid")[1]  # faulthandler's dump of the worker
    assert loader.watchdog_reports() == [report]


def test_watchdog_reports_and_continues_without_fail(text_ds, caplog):
    loader = _loader(
        text_ds,
        0,
        SLEEP,
        watchdog_timeout_seconds=TIMEOUT,
        watchdog_initial_timeout_seconds=INITIAL,
        fail_on_timeout=False,
    )
    with caplog.at_level("ERROR", logger="energon.watchdog"):
        batches = [b for _, b in zip(range(4), loader)]
    assert len(batches) == 4
    reports = loader.watchdog_reports()
    assert any("stage encode" in r and "_000003" in r for r in reports)
    assert any("energon watchdog" in r.getMessage() for r in caplog.records)
    assert loader.stats()["watchdog_reports"] == len(reports)
    # every report counts the whole wait: the n-th comes after n timeouts, and the item the main
    # process is stuck on began after the wait did (issue 33: the second said 3.0 s, then 6.1 s)
    assert len(reports) >= 2
    for n, text in enumerate(reports[:2], 1):
        waited = float(re.search(r"has waited ([0-9.]+) s", text).group(1))
        on_item = float(re.search(r"on its current item for ([0-9.]+) s", text).group(1))
        assert waited >= n * TIMEOUT - 0.05 and waited >= on_item - 0.05, text


def test_no_report_when_batches_come(text_ds):
    loader = _loader(text_ds, 0, 0.0, watchdog_timeout_seconds=60, fail_on_timeout=True)
    assert len([b for _, b in zip(range(5), loader)]) == 5
    assert loader.watchdog_reports() == []
