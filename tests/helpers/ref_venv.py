"""Running the same script on the reference (megatron-energon 7.x in ``.cache/ref-venv``) and on
energon (through ``import energon.megatron_alias``), as black boxes, for side-by-side tests.

The venv is the one ``tests/compat/test_reference.py`` creates (same path, same lock, same steps);
tests are skipped with the reason only when it cannot be created. Not a test module itself.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

REF_VENV = REPO_ROOT / ".cache" / "ref-venv"
REF_READY = REF_VENV / ".energon-ref-ready"
REF_PYTHON = REF_VENV / "bin" / "python"
OUR_PYTHON = sys.executable
# a script starts with this line; for energon it becomes the alias import
ALIAS_LINE = "# energon: alias"


def _create() -> str | None:
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(REF_VENV)],
        # CPU torch first, so that megatron-energon does not pull CUDA wheels
        [str(REF_PYTHON), "-m", "pip", "install", "-q", "torch==2.13.0"],
        [str(REF_PYTHON), "-m", "pip", "install", "-q", "megatron-energon>=7,<8"],
    ]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            return f"{' '.join(step[:4])} failed: {proc.stderr.strip()[-500:]}"
    REF_READY.write_text("ok\n")
    return None


@pytest.fixture(scope="session")
def reference() -> str:
    """The reference venv's python (created on first use)."""
    if os.environ.get("ENERGON_SKIP_COMPAT"):
        pytest.skip("ENERGON_SKIP_COMPAT is set")
    REF_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(REF_VENV.parent / "ref-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not REF_READY.is_file():
            reason = _create()
            if reason is not None:
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
