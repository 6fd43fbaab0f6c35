"""Shared fixtures: small real datasets (real tar shards, real JPEGs), prepared with our prepare."""

from __future__ import annotations

import functools
import re
import resource
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers.datasets import make_captioning_dataset, make_text_dataset

# Folders whose tests share one expensive session fixture (a scheduling unit of their own).
_SHARED_FOLDERS = ("tests/ray/",)  # one Ray cluster per worker (tests/ray/conftest.py)
_MODULE_FIXTURE = re.compile(r"@pytest\.fixture\(\s*scope=\"module\"")


@functools.cache
def _files_with_module_fixtures() -> frozenset[str]:
    tests = Path(__file__).parent
    return frozenset(
        path.relative_to(tests.parent).as_posix()
        for path in tests.rglob("test_*.py")
        if _MODULE_FIXTURE.search(path.read_text())
    )


def _work_unit(nodeid: str) -> str:
    """A test file with a module-scoped fixture, or a shared folder, is one unit; else the test."""
    path = nodeid.split("::")[0]
    for folder in _SHARED_FOLDERS:
        if path.startswith(folder):
            return folder
    return path if path in _files_with_module_fixtures() else nodeid


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (the test extra)
def pytest_report_header(config) -> str:
    """Free disk where the side venvs and the test folders go: the suite needs several GB (the
    side venvs, about 5 GB after sharing files), and a full disk shows up as scattered errors;
    likewise the open-files limit ("Too many open files")."""
    places = {
        "repository": Path(__file__).resolve().parents[1],
        "temp": Path(tempfile.gettempdir()),
    }
    free = ", ".join(
        f"{name} {shutil.disk_usage(p).free / 2**30:.1f} GiB" for name, p in places.items()
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return f"free disk: {free}; open files per process: {soft} (hard {hard})"


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with a file that has a module-scoped fixture kept on one worker.

    Spread test by test, a module's tests alternate between the two workers, so each built the
    module's fixtures (a reference run of every compat program: 73 CPU-s; megatron-core runs;
    datasets): twice the work. (``xdist_group`` marks would say the same, but xdist 3.8 writes
    the group into ``item._nodeid``, which pytest 9 no longer reads: they have no effect here.)
    Units are handed out largest first, so the single tests still balance the end of the run.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedFixtureScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return _work_unit(nodeid) if scope == nodeid else scope

    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def text_ds(tmp_path_factory) -> Path:
    """120 text samples in 5 shards, all in train."""
    return make_text_dataset(tmp_path_factory.mktemp("text"), num_samples=120, num_shards=5)


@pytest.fixture(scope="session")
def text_val_ds(tmp_path_factory) -> Path:
    """A train split of 3 shards (60 samples) and a val split of 2 shards (40 samples)."""
    return make_text_dataset(
        tmp_path_factory.mktemp("textval"),
        num_samples=100,
        num_shards=5,
        split=(("train", 0.6), ("val", 0.4), ("test", 0.0)),
    )


@pytest.fixture(scope="session")
def captioning_ds(tmp_path_factory) -> Path:
    """60 JPEG+caption samples in 3 shards, all in train."""
    return make_captioning_dataset(tmp_path_factory.mktemp("cap"), num_samples=60, num_shards=3)


@pytest.fixture(scope="module")
def moto_endpoint():
    """A real S3 API server (moto in server mode) on loopback, for one test module."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def fake_aws_env(monkeypatch, tmp_path, moto_endpoint):
    """Fake credentials pointing boto3 at the loopback server; fresh client, cache, counters and
    concurrency limit."""
    from energon.remote import remote_stats, s3
    from energon.remote.concurrency import reset_process_limit

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("ENERGON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ENERGON_REMOTE_BACKOFF_BASE", "0.01")
    s3.reset_client()
    remote_stats().reset()
    reset_process_limit()  # an earlier test's throttling must not limit this one's concurrency
    yield
    s3.reset_client()


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield
