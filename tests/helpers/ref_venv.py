"""The reference (megatron-energon 7.x in ``.cache/ref-venv``), run as a black box beside energon
(through ``import energon.megatron_alias``) for side-by-side tests.

The one place that creates the side venv: on first use, under a file lock (pytest-xdist workers
share it), with the machine's CPU torch first so that megatron-energon pulls no CUDA wheels.
Tests are skipped, with the reason printed, only when it cannot be created (e.g. without network
access); ENERGON_SKIP_COMPAT=1 skips them on purpose. Not a test module itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT
from tests.helpers.side_venv import ensure_venv

REF_VENV = REPO_ROOT / ".cache" / "ref-venv"
REF_READY = REF_VENV / ".energon-ref-ready"
REF_PYTHON = REF_VENV / "bin" / "python"
OUR_PYTHON = sys.executable
# a script starts with this line; for energon it becomes the alias import
ALIAS_LINE = "# energon: alias"

REF_PIP_STEPS: tuple[tuple[str, ...], ...] = (
    # CPU torch first, so that megatron-energon does not pull CUDA wheels
    ("torch==2.13.0",),
    ("megatron-energon>=7,<8",),
    # PyAV: the reference's av.* modules (AVProbeIndex, AVDecoder) import it
    ("av>=12",),
)


@pytest.fixture(scope="session")
def ref_python() -> str:
    """The reference venv's python (created on first use)."""
    if os.environ.get("ENERGON_SKIP_COMPAT"):
        pytest.skip("ENERGON_SKIP_COMPAT is set")
    reason = ensure_venv(REF_VENV, REF_PIP_STEPS, REF_READY, needs_gib=1.0)
    if reason is not None:
        print(f"skipping reference compatibility tests: {reason}")
        pytest.skip(f"cannot create the reference venv: {reason}")
    return str(REF_PYTHON)


def run_script(python: str, script: str, *args: str, cwd: str = "/", check: bool = True) -> str:
    """Run ``script`` with ``python``: the reference as is; energon with the alias line enabled and
    this source tree on the path. Returns stdout (asserting success when ``check``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if python == OUR_PYTHON:
        script = script.replace(ALIAS_LINE, "import energon.megatron_alias  # noqa: F401")
        env["PYTHONPATH"] = str(REPO_ROOT)
    env.setdefault("PYTHONWARNINGS", "ignore")
    proc = subprocess.run(
        [python, "-c", script, *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd
    )
    if check:
        assert proc.returncode == 0, (
            f"{'energon' if python == OUR_PYTHON else 'reference'} failed:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def ref_cli(python: str, *args: str) -> str:
    """``energon ARGS`` of the reference (its click entry point)."""
    return run_script(python, "from megatron.energon.cli.main import main; main()", *args)
