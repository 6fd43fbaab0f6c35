"""``energon lint PATH``: check that every sample of a prepared dataset loads; list those that don't."""

from __future__ import annotations

import os
import tempfile

import click

from energon.cli.info import DatasetPathType


class _FailureLog:
    """Collects per-sample failures from any process (one appended line per failure)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, exc: BaseException, sample=None, sources=None) -> None:
        message = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        with open(self.path, "a") as f:
            f.write(message + "\n")

    def read(self) -> list[str]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [line.rstrip("\n") for line in f if line.strip()]


def check_shard_indices(path: str) -> list[str]:
    """Mismatches between each shard's ``.tar.idx`` and the sample counts in ``.info.json``."""
    from energon import epath
    from energon.format.info import read_info
    from energon.format.tar_index import TarIndex, tar_index_path

    problems = []
    for shard, count in read_info(path).items():
        try:
            if epath.is_remote(path):
                index_file = epath.local_copy(epath.join(path, tar_index_path(shard)))
            else:
                index_file = tar_index_path(os.path.join(path, shard))
            found = len(TarIndex(index_file))
        except Exception as e:  # a missing or damaged index is a lint finding, not a crash
            problems.append(f"{shard}: {e}")
            continue
        if found != count:
            problems.append(f"{shard}: index has {found} samples, .info.json says {count}")
    return problems


def lint_split(
    path: str,
    split_part: str,
    *,
    parallel: int,
    dataset_config: str,
    split_config: str,
    progress: bool = False,
):
    """(samples loaded, failure messages) of one split; None if the split is empty."""
    from energon import WorkerConfig, get_loader, get_val_dataset
    from energon.errors import EmptyDatasetError
    from energon.format.split import UnknownSplitError
    from energon.task_encoder import DefaultTaskEncoder

    with tempfile.TemporaryDirectory() as tmp:
        failures = _FailureLog(os.path.join(tmp, "failures.txt"))
        wc = WorkerConfig(rank=0, world_size=1, num_workers=parallel, global_error_handler=failures)
        encoder = DefaultTaskEncoder()
        encoder.__default_failure_tolerance__ = 0  # lint reports every failure, never gives up
        try:
            dataset = get_val_dataset(
                path,
                split_part=split_part,
                worker_config=wc,
                batch_size=None,
                task_encoder=encoder,
                dataset_config=dataset_config,
                split_config=split_config,
            )
        except (EmptyDatasetError, UnknownSplitError):
            return None
        loader = get_loader(dataset)
        loaded = sum(1 for _ in _progress(loader, progress, f"Checking {split_part}"))
        return loaded, failures.read()


def _progress(loader, enabled: bool, desc: str):
    if not enabled:
        return loader
    from tqdm import tqdm

    return tqdm(loader, total=len(loader), desc=desc, unit="sample")


@click.command(name="lint")
@click.argument("path", type=DatasetPathType(path_type=str))
@click.option("--split-parts", default="train,val,test", show_default=True, help="Splits to check.")
@click.option("--dataset-config", default="dataset.yaml", show_default=True)
@click.option("--split-config", default="split.yaml", show_default=True)
@click.option("--parallel", default=1, show_default=True, help="Worker processes.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def command(
    path: str,
    split_parts: str,
    dataset_config: str,
    split_config: str,
    parallel: int,
    progress: bool,
) -> None:
    """Load every sample of PATH; exit non-zero and list the samples that fail."""
    problems = check_shard_indices(path)
    for problem in problems:
        click.echo(f"Index mismatch: {problem}", err=True)
    failed: list[str] = []
    for split_part in [s.strip() for s in split_parts.split(",") if s.strip()]:
        result = lint_split(
            path,
            split_part,
            parallel=parallel,
            dataset_config=dataset_config,
            split_config=split_config,
            progress=progress,
        )
        if result is None:
            click.echo(f"Skipping empty split part {split_part}")
            continue
        loaded, failures = result
        click.echo(f"{split_part}: {loaded} samples loaded, {len(failures)} failed")
        failed += failures
    for message in failed:
        click.echo(f"FAILED {message}", err=True)
    if problems or failed:
        raise click.ClickException(
            f"Validation failed: {len(problems)} index problem(s), {len(failed)} sample(s) failed"
        )
    click.echo("All samples loaded successfully.")
