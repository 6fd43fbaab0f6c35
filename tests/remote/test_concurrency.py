"""The adaptive per-process concurrency limit for object-storage requests.

Waits on events and children are hang guards (``HANG_S``): they return as soon as the awaited thing
happens, so their length never depends on how fast the machine is."""

from __future__ import annotations

import threading
import time

from energon.remote import remote_stats
from energon.remote.concurrency import AdaptiveLimit

HANG_S = 120


def test_never_more_requests_in_flight_than_the_limit():
    limit = AdaptiveLimit(3)
    active, peak = [0], [0]
    lock = threading.Lock()

    def request() -> None:
        with limit.slot():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.005)
            with lock:
                active[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 3


def test_throttling_halves_the_limit_and_successes_raise_it_again():
    limit = AdaptiveLimit(16)
    before = remote_stats().throttled
    limit.throttled()
    assert limit.limit == 8
    limit.throttled()
    limit.throttled()
    limit.throttled()
    limit.throttled()
    assert limit.limit == 1  # never below one
    assert remote_stats().throttled - before == 5
    for _ in range(1):
        limit.succeeded()
    assert limit.limit == 2
    for _ in range(2 + 3 + 4):
        limit.succeeded()
    assert limit.limit == 5  # +1 after as many successes in a row as the limit
    for _ in range(1000):
        limit.succeeded()
    assert limit.limit == 16  # capped at the maximum


def test_a_lowered_limit_holds_back_waiting_requests():
    limit = AdaptiveLimit(2)
    limit.throttled()  # limit 1
    inside = threading.Event()
    release = threading.Event()
    second_entered = threading.Event()

    def first() -> None:
        with limit.slot():
            inside.set()
            release.wait(HANG_S)

    def second() -> None:
        with limit.slot():
            second_entered.set()

    a = threading.Thread(target=first)
    a.start()
    assert inside.wait(HANG_S)
    b = threading.Thread(target=second)
    b.start()
    assert not second_entered.wait(0.1)  # one place only: the second request waits
    release.set()
    assert second_entered.wait(HANG_S)
    a.join()
    b.join()


def test_a_child_forked_while_a_thread_holds_the_counters_lock_does_not_hang():
    import os

    from energon.remote.stats import STATS

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with STATS._lock:
            held.set()
            release.wait(HANG_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(HANG_S)
    pid = os.fork()
    if pid == 0:  # the child: the parent's holder thread does not exist here
        try:
            STATS.add(requests=1)
            os._exit(0)
        finally:
            os._exit(1)
    release.set()
    holder.join()
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    raise AssertionError("the child hung on a lock held by the parent's thread at the fork")
