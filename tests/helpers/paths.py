"""Where things are, for tests that run scripts or read repository files."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATASET_CONFIGS = REPO_ROOT / "dataset_configs"
TOOLS = REPO_ROOT / "tools"
