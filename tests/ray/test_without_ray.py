"""Ray is optional (issue 39, point 1): where it cannot be imported, energon loads and prepares as
before and never tries to import it; asking for Ray workers or ``prepare --ray`` gives one clear
error saying how to install it. Runs in a process where ``import ray`` fails."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import REPO_ROOT

BLOCK_RAY = """
import sys
class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray' (blocked by the test)")
sys.meta_path.insert(0, _NoRay())
"""

PROGRAM = (
    BLOCK_RAY
    + """
import energon
from energon import RayWorkers, WorkerConfig, get_savable_loader, get_train_dataset
from energon.errors import RayNotInstalledError

wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
OPTS = dict(shuffle_buffer_size=8, max_samples_per_sequence=8)
loader = get_savable_loader(get_train_dataset(sys.argv[1], worker_config=wc, batch_size=4, **OPTS))
assert len([b for _, b in zip(range(5), loader)]) == 5
assert not [m for m in sys.modules if m == "ray" or m.startswith("ray.")]
loader = get_savable_loader(get_train_dataset(sys.argv[1], worker_config=wc, batch_size=4, **OPTS))
loader.workers = RayWorkers(num_actors=2)
try:
    next(iter(loader))
except RayNotInstalledError as e:
    print("ERROR:", e)
"""
)


def test_without_ray_nothing_imports_it(text_ds):
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(text_ds)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "ERROR: this needs Ray, which is not installed: pip install 'energon-loader[ray]'" in (
        done.stdout
    )


def test_prepare_ray_without_ray(tmp_path):
    from energon.demo import write_text_shards

    write_text_shards(tmp_path, num_samples=10, num_shards=2, min_chars=5, max_chars=20, seed=0)
    program = BLOCK_RAY + "from energon.cli.main import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", program, "prepare", str(tmp_path), "--ray", "auto"]
        + ["--split-ratio", "1,0,0", "--non-interactive", "--skip-dataset-yaml"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 1
    assert "pip install 'energon-loader[ray]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".nv-meta" / ".info.json").exists()
