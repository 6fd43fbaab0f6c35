"""Side venvs for tests that need packages the project venv cannot hold (the reference, a
torchvision that fits its own torch): created on first use under ``.cache/``, reused after. Not a
test module itself."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def ensure_venv(directory: Path, pip_steps: Sequence[Sequence[str]], marker: Path) -> str | None:
    """Create the venv at ``directory`` with ``pip_steps`` unless ``marker`` says it is complete;
    returns a reason string when it cannot be created. Locked, so parallel workers build it once."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    python = directory / "bin" / "python"
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return None
        steps = [[sys.executable, "-m", "venv", "--clear", str(directory)]]
        steps += [[str(python), "-m", "pip", "install", "-q", *args] for args in pip_steps]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                return f"{' '.join(step[:6])} failed: {proc.stderr.strip()[-500:]}"
        marker.write_text("ok\n")
    return None
