"""Connecting to a Ray cluster, and running a list of tasks over its nodes with the results in order.

Ray is imported only here and only when a caller asks for a cluster: without the ``ray`` extra
installed, energon never imports it, and asking for it gives one clear error.

``address`` means what it means to ``ray.init``: ``"auto"`` joins the cluster this machine belongs to
(started with ``ray start``; or ``RAY_ADDRESS``), ``"HOST:PORT"`` the cluster whose head listens
there, ``"ray://HOST:10001"`` goes through Ray Client, and ``None`` starts a private one-machine
instance. A process already connected (``ray.init`` called by the training script) stays
connected to its cluster, whatever ``address`` says.
"""

from __future__ import annotations

import collections
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from energon.errors import ClusterError, RayNotInstalledError

INSTALL_HINT = "pip install 'energon-loader[ray]'"
TASK_RETRIES = 3  # a task whose node dies is run again elsewhere (tasks here are idempotent)


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayNotInstalledError` saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise RayNotInstalledError(
            f"this needs Ray, which is not installed: {INSTALL_HINT} (on every node)"
        ) from e
    return ray


def connect(address: str | None) -> Any:
    """This process connected to the Ray cluster at ``address`` (see the module docstring);
    returns the ``ray`` module."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    sigterm = signal.getsignal(signal.SIGTERM) if _in_main_thread() else None
    try:
        # "local": a new instance even where a stale ``ray start`` left its address behind
        ray.init(address="local" if address is None else address, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(
            f"cannot connect to the Ray cluster at address {address!r}: {e}. Start one with "
            "`ray start --head` on the head node (docs/ray.md), or pass its address"
        ) from e
    finally:
        # ray.init makes SIGTERM raise SystemExit here and in every process forked later; the
        # training script's own handling of SIGTERM is not ours to change
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return ray


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def cluster_cpus(ray: Any) -> int:
    """The cluster's CPUs (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def map_in_order(
    function: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    address: str | None,
    num_cpus: float = 1.0,
    max_in_flight: int | None = None,
) -> Iterator[Any]:
    """``function(item)`` for every item, run as Ray tasks spread over the cluster's nodes, yielded
    in the order of ``items``. At most ``max_in_flight`` tasks (default: twice the cluster's CPUs)
    are submitted or finished-but-not-yielded at a time, so the caller's memory stays bounded
    however many items there are. ``function`` must be importable on every node (a module-level
    function of an installed package). A task that raises re-raises its own exception here."""
    ray = connect(address)
    remote = ray.remote(function).options(
        num_cpus=num_cpus, scheduling_strategy="SPREAD", max_retries=TASK_RETRIES
    )
    limit = max_in_flight or 2 * cluster_cpus(ray)
    pending: collections.deque = collections.deque()
    items = iter(items)
    try:
        while True:
            while len(pending) < limit:
                item = next(items, _END)
                if item is _END:
                    break
                pending.append(remote.remote(item))
            if not pending:
                return
            yield task_result(ray, pending.popleft())
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def task_result(ray: Any, ref: Any) -> Any:
    """``ray.get(ref)``, re-raising a failed task's own exception (with Ray's remote traceback
    attached as its cause) rather than Ray's wrapper."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from e
        raise


_END = object()
