"""Decode deadlines: the context manager, the sample decoder option, and the loader's error policy.

Deadlines are about time, but no assertion here depends on how fast the machine is: slow work takes
many times its deadline (a busy machine only makes it slower), fast work is given deadlines ten
times longer or more than it needs, and "was it cut short" is read from what happened (an error was
raised, a sample is missing), not from a stopwatch."""

from __future__ import annotations

import signal
import threading
import time
import zlib

import pytest

from energon import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_val_dataset,
    reraise_exception,
)
from energon.deadline import DecodeTimeoutError, check_deadline, deadline, remaining_time
from energon.decode import SampleDecoder
from energon.decode import sample_decoder as sample_decoder_module
from energon.errors import SampleException
from tests.helpers.datasets import make_text_dataset

DEADLINE_S = 0.5  # fast texts decode in microseconds; slow ones take 3 s


def busy(seconds: float) -> None:
    """Python-level work (interruptible by the alarm, unlike one long C call)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_no_deadline_is_free_and_unbounded():
    with deadline(None, "x"):
        busy(0.01)
        check_deadline()
        assert remaining_time() is None
    with deadline(0, "x"):
        busy(0.01)


def test_slow_block_is_interrupted_on_the_main_thread():
    previous = signal.getsignal(signal.SIGALRM)
    # busy(5) would return normally after 5 s: the error proves the block was cut short
    with pytest.raises(DecodeTimeoutError, match="decoding thing took longer than .* 0.1 s"):
        with deadline(0.1, "decoding thing"):
            busy(5)
    assert signal.getsignal(signal.SIGALRM) == previous
    assert isinstance(DecodeTimeoutError("x"), SampleException)


def test_nested_deadlines_never_extend_the_outer_one():
    with pytest.raises(DecodeTimeoutError, match="outer"):
        with deadline(0.1, "outer"):
            with deadline(10, "inner"):
                assert remaining_time() <= 0.1
                busy(5)
    with deadline(60, "outer"):
        with pytest.raises(DecodeTimeoutError, match="inner"):
            with deadline(0.05, "inner"):
                busy(5)
        busy(0.1)  # the outer deadline is still armed, with its own remaining time (not 0.05)
        assert 1 < remaining_time() <= 60 and signal.getitimer(signal.ITIMER_REAL)[0] > 1


def test_fast_block_is_untouched():
    # (pytest-timeout's own timer, if this run has one, is armed already: ours must not be left)
    before = signal.getitimer(signal.ITIMER_REAL)[0]
    with deadline(2.0, "fast"):  # 200 times what the block needs
        busy(0.01)
    assert remaining_time() is None, "no deadline is armed after the block"
    after = signal.getitimer(signal.ITIMER_REAL)[0]
    assert after <= before and (after > 0) == (before > 0), "our timer was disarmed"


def test_a_timer_set_before_the_deadline_is_given_back():
    """The job's own SIGALRM timer (a watchdog, pytest-timeout) survives a deadline: re-armed
    with what was left of it, and one that came due meanwhile fires right after the block."""
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    previous_timer = signal.setitimer(signal.ITIMER_REAL, 600)
    try:
        with deadline(2.0, "fast"):
            busy(0.01)
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0 < left <= 600 and fired == []
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # comes due inside the next block
        with deadline(5.0, "longer than the job's timer"):
            busy(0.2)
        assert fired == []  # not during the block: the deadline's timer stood in for it
        for _ in range(1000):  # re-armed at 1 ms: it fires at once (bounded by count)
            if fired:
                break
            time.sleep(0.01)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, *previous_timer)
        signal.signal(signal.SIGALRM, previous)


def test_other_threads_use_cooperative_checks():
    errors = []

    def work():
        try:
            with deadline(0.05, "threaded"):
                for _ in range(1000):
                    time.sleep(0.001)
                    check_deadline()
        except DecodeTimeoutError as e:
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "threaded" in str(errors[0])


# ---------------------------------------------------------------------------------------------
# SampleDecoder + loader


def is_slow(text: str) -> bool:
    """Deterministic choice of the samples whose decoding hangs (same in every process)."""
    return zlib.crc32(text.encode()) % 5 == 0


@pytest.fixture()
def slow_text(monkeypatch):
    """Makes decoding of some texts take far longer than the deadline."""
    fast = sample_decoder_module._decode_text

    def sometimes_slow(data):
        text = fast(data)
        if is_slow(text):
            busy(3)
        return text

    monkeypatch.setattr(sample_decoder_module, "_decode_text", sometimes_slow)


def test_sample_decoder_deadline_names_the_part(slow_text):
    decoder = SampleDecoder(decode_timeout=DEADLINE_S)
    texts = [f"text number {i}" for i in range(40)]
    slow = next(t for t in texts if is_slow(t))
    quick = next(t for t in texts if not is_slow(t))
    with pytest.raises(DecodeTimeoutError, match=r"decoding k7\.txt took longer"):
        decoder.decode_part("txt", slow.encode(), key="k7")
    assert decoder.decode_part("txt", quick.encode()) == quick
    assert decoder.config()["decode_timeout"] == DEADLINE_S
    with pytest.raises(ValueError, match="decode_timeout"):
        SampleDecoder(decode_timeout=0)


@pytest.fixture(scope="module")
def text_ds(tmp_path_factory):
    return make_text_dataset(tmp_path_factory.mktemp("deadline"), num_samples=24, num_shards=2)


def all_texts(root) -> dict[str, str]:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
    return {s.__key__: s.text for s in get_loader(dataset)}


def timed_loader(root, num_workers, **config):
    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(decode_timeout=DEADLINE_S)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers, **config)
    dataset = get_val_dataset(
        root, split_part="train", worker_config=wc, batch_size=None, task_encoder=encoder
    )
    return get_loader(dataset)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_skips_and_reports_samples_past_their_deadline(text_ds, num_workers, capfd):
    texts = all_texts(text_ds)
    expected_slow = {k for k, t in texts.items() if is_slow(t)}
    assert 0 < len(expected_slow) < len(texts)
    # patch only now: the reference run above must not be slow
    fast = sample_decoder_module._decode_text
    sample_decoder_module._decode_text = lambda d: (
        (busy(3) if is_slow(fast(d)) else None) or fast(d)
    )
    try:
        loaded = [s.__key__ for s in timed_loader(text_ds, num_workers)]
    finally:
        sample_decoder_module._decode_text = fast
    # a slow sample that was waited for would have loaded: each one was cut off
    assert sorted(loaded) == sorted(set(texts) - expected_slow)
    err = capfd.readouterr().err
    assert err.count("DecodeTimeoutError") >= len(expected_slow)
    assert f"took longer than its deadline of {DEADLINE_S} s" in err
    assert ".tar sample '" in err and "byte offset" in err


def test_loader_raises_past_deadline_with_reraise_policy(text_ds, slow_text):
    with pytest.raises(Exception, match=r"byte offset.*took longer than its deadline") as info:
        list(timed_loader(text_ds, 0, global_error_handler=reraise_exception))
    assert isinstance(info.value.__cause__, DecodeTimeoutError)
