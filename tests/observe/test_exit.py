"""A training script may exit with a loader half-way through a pass: Python then closes the pass
while it tears the interpreter down, and that must not print a traceback at the user."""

from pathlib import Path

import pytest

from tests.helpers.datasets import make_text_dataset
from tests.helpers.modules import run_fresh

ONE_BATCH_THEN_EXIT = """
import sys
import energon
workers = int(sys.argv[2])
config = energon.WorkerConfig(rank=0, world_size=1, num_workers=workers)
dataset = energon.get_train_dataset(
    sys.argv[1], batch_size=2, worker_config=config,
    shuffle_buffer_size=None, max_samples_per_sequence=None,
)
loader = energon.get_savable_loader(dataset)
batches = iter(loader)
print(len(next(batches).__key__))
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_exiting_in_the_middle_of_a_pass_is_quiet(tmp_path: Path, workers: int) -> None:
    root = make_text_dataset(tmp_path / "text", num_samples=40, num_shards=2)
    done = run_fresh(ONE_BATCH_THEN_EXIT, str(root), str(workers), timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
