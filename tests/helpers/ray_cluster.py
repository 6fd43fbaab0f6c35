"""A real Ray cluster on this machine for tests: a head node started with ``ray start --head``
(its own temporary folder, no dashboard, no usage reports, token authentication off; asked to
use 127.0.0.1, though Ray 2.60 registers the machine's own address all the same), worker nodes
added and removed as separate ``ray start`` processes, and this process connected to it as the
driver.

A removed node is killed with SIGKILL (its raylet and the actors on it, as when a machine
disappears); the head is told quickly (health checks every 0.5 s, dead after 4 misses) so that
tests do not wait Ray's default 15 s for it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START_SECONDS = 300  # a wall-clock bound with a wide margin (busy 2-core CI machine)
ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "4",
    "RAY_DEDUP_LOGS": "0",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRayCluster:
    """The head node (``num_cpus``, custom ``resources``), then :meth:`add_node` /
    :meth:`remove_node`; :meth:`connect` makes this process its driver."""

    def __init__(self, num_cpus: int = 2, resources: dict[str, float] | None = None) -> None:
        import json

        self.temp = tempfile.mkdtemp(prefix="energon-ray-")
        self.address = f"127.0.0.1:{_free_port()}"
        self.env = {**os.environ, **ENV, "PYTHONPATH": _pythonpath()}
        self.ray = str(Path(sys.executable).with_name("ray"))
        self.nodes: list[subprocess.Popen] = []
        self.head = self._start(
            "--head",
            f"--port={self.address.rsplit(':', 1)[1]}",
            f"--temp-dir={self.temp}",
            "--include-dashboard=false",
            f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources or {})}",
        )

    def _start(self, *args: str) -> subprocess.Popen:
        number = len(self.nodes) + (1 if hasattr(self, "head") else 0)
        log = open(os.path.join(self.temp, f"ray-start-{number}.log"), "wb")  # noqa: SIM115
        with log:
            return subprocess.Popen(
                [self.ray, "start", "--block", "--node-ip-address=127.0.0.1", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: removed with one signal
            )

    def connect(self):
        """This process as the cluster's driver, once the head says it runs."""
        os.environ.update(ENV)
        import ray

        self._wait_started(self.head, 0)
        sigterm = signal.getsignal(signal.SIGTERM)
        ray.init(address=self.address, log_to_driver=False)
        # ray.init makes SIGTERM raise SystemExit in this test process and in every process it
        # forks later: a multiprocessing pool's terminate() would then run pytest in its children
        signal.signal(signal.SIGTERM, sigterm)
        return ray

    def _wait_started(self, process: subprocess.Popen, number: int) -> None:
        """Until ``ray start`` number ``number`` says its node runs (its log)."""
        log = os.path.join(self.temp, f"ray-start-{number}.log")
        deadline = time.monotonic() + START_SECONDS
        while True:
            with open(log, "rb") as f:
                if b"Ray runtime started" in f.read():
                    return
            if process.poll() is not None or time.monotonic() > deadline:
                with open(log, errors="replace") as f:
                    raise RuntimeError(f"`ray start` did not start a node:\n{f.read()[-3000:]}")
            time.sleep(0.2)

    def connect_module(self):
        """The ``ray`` module, connected to this cluster."""
        import ray

        if not ray.is_initialized():
            return self.connect()
        return ray

    def alive_nodes(self) -> list[dict]:
        import ray

        return [n for n in ray.nodes() if n["Alive"]]

    def add_node(self, num_cpus: int, resources: dict[str, float]) -> subprocess.Popen:
        """A worker node with ``num_cpus`` and custom ``resources`` (waits until it is alive)."""
        import json

        before = len(self.alive_nodes())
        number = len(self.nodes) + 1
        node = self._start(
            f"--address={self.address}",
            f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}",
        )
        self.nodes.append(node)
        self._wait_started(node, number)
        deadline = time.monotonic() + START_SECONDS
        while len(self.alive_nodes()) <= before and time.monotonic() < deadline:
            time.sleep(0.2)
        return node

    def remove_node(self, node: subprocess.Popen) -> None:
        """The node disappears (SIGKILL to its processes); returns once the head knows."""
        before = len(self.alive_nodes())
        _kill(node)
        deadline = time.monotonic() + START_SECONDS
        while len(self.alive_nodes()) >= before and time.monotonic() < deadline:
            time.sleep(0.2)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        for node in [*self.nodes, self.head]:
            _kill(node)  # the whole process group: raylet, GCS, workers (nothing to save)
        shutil.rmtree(self.temp, ignore_errors=True)


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    process.wait()


def _pythonpath() -> str:
    """The actors import this checkout (and ``tests``, for the tests' task encoders)."""
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in paths if p)
