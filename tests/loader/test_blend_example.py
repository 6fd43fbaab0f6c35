"""tools/examples/blend_schedules.py: the annealing and loss-based reweighting recipes run, and a
reweighting run resumed from its checkpoint repeats the uninterrupted one line by line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "tools" / "examples" / "blend_schedules.py"


def run(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=str(EXAMPLE.parents[2]))
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *args, "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_annealing_recipe_follows_its_schedule(tmp_path):
    out = run(tmp_path, "anneal", "--steps", "120", "--num-workers", "0")
    assert "req -> obs" in out
    shares = {line.split(" [train]")[0].rsplit("/", 1)[1]: line for line in out.splitlines()[-3:]}
    assert set(shares) == {"repetitive", "digits", "letters"}


def test_reweighting_recipe_resumes_identically(tmp_path):
    run(tmp_path, "reweight", "--steps", "80", "--every", "10", "--log-steps", "full.jsonl")
    run(
        tmp_path,
        "reweight",
        "--steps",
        "40",
        "--every",
        "10",
        "--save",
        "ck.pt",
        "--log-steps",
        "part.jsonl",
    )
    run(
        tmp_path,
        "reweight",
        "--steps",
        "80",
        "--every",
        "10",
        "--load",
        "ck.pt",
        "--log-steps",
        "part.jsonl",
        "--num-workers",
        "0",
    )
    full = (tmp_path / "full.jsonl").read_text().splitlines()
    assert len(full) == 80 and sum('"weights"' in line for line in full) == 8
    assert (tmp_path / "part.jsonl").read_text().splitlines() == full
