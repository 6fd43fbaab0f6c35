"""``energon lint PATH``: read every sample of a prepared dataset; list every one that fails.

Shards are checked one by one (in ``--parallel`` worker processes): each sample is read, its
checksum compared when the dataset has them, decoded and built, exactly as the loader does. A
damaged sample is listed with its shard, key and byte offset; a shard that cannot be read at all
(missing, a damaged or mismatching ``.tar.idx``) is listed as a bad shard; neither stops the check
of the rest. The command exits non-zero if anything was found, and never with a traceback.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Iterator
from typing import Any

import click
from tqdm import tqdm

from energon import epath
from energon.cli.arguments import InputPath, SplitNames, chosen_splits
from energon.errors import EnergonError, SampleException
from energon.format.layout import DATASET_YAML_FILENAME, SPLIT_YAML_FILENAME
from energon.format.shard_index import ListedShards

_LEAF: Any = None  # the split's leaf, inherited by forked workers
_DECODER: Any = None


@dataclasses.dataclass
class ShardReport:
    shard: str
    samples: int
    loaded: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)  # one line per bad sample
    problem: str | None = None  # the whole shard could not be read


def lint_shard(leaf: Any, decoder: Any, shard: int) -> ShardReport:
    """Read every sample of shard ``shard`` of ``leaf``; collect what fails."""
    name, count = leaf.shard_names[shard], leaf.shard_counts[shard]
    only = ListedShards([name], [count], [leaf.shards.tar_file_id(shard)])
    one = dataclasses.replace(leaf, shards=only, excluded=frozenset())
    report = ShardReport(name, count)
    if not epath.exists(one.shard_path(0)):
        report.problem = f"the shard file {one.shard_path(0)} does not exist"
        return report
    for index in range(count):
        try:
            one.load(index, decoder, ("webdataset", 0, index))
        except SampleException as e:
            report.failures.append(f"{type(e).__name__}: {e}".replace("\n", " "))
            continue
        except (EnergonError, OSError) as e:  # the shard itself: no use trying its other samples
            report.problem = f"{type(e).__name__}: {e}".replace("\n", " ")
            break
        report.loaded += 1
    return report


def _lint_shard_in_worker(shard: int) -> ShardReport:
    return lint_shard(_LEAF, _DECODER, shard)


def lint_split(leaf: Any, *, parallel: int, progress: bool) -> Iterator[ShardReport]:
    """One report per shard of the split, in shard order."""
    global _LEAF, _DECODER
    from energon.task_encoder import DefaultTaskEncoder

    _LEAF, _DECODER = leaf, DefaultTaskEncoder().decoder
    shards = range(len(leaf.shard_names))
    bar = tqdm(
        total=len(leaf), desc=f"Checking {leaf.split_part}", unit="sample", disable=not progress
    )
    try:
        if parallel <= 1:
            reports = (lint_shard(leaf, _DECODER, s) for s in shards)
            for report in reports:
                bar.update(report.samples)
                yield report
            return
        with multiprocessing.get_context("fork").Pool(parallel) as pool:
            for report in pool.imap(_lint_shard_in_worker, shards):
                bar.update(report.samples)
                yield report
    finally:
        bar.close()
        _LEAF = _DECODER = None


def open_split(path: str, split_part: str, dataset_config: str, split_config: str) -> Any:
    """The split's leaf, or None when the split does not exist or is empty."""
    from energon.errors import EmptyDatasetError, UnknownSplitError
    from energon.source.webdataset import WebdatasetLeaf

    try:
        return WebdatasetLeaf.open(
            path, split_part=split_part, split_config=split_config, dataset_config=dataset_config
        )
    except (EmptyDatasetError, UnknownSplitError):
        return None


@click.command(name="lint")
@click.argument("path", type=InputPath("dir", remote=True))
@click.option(
    "--split-parts",
    type=SplitNames(),
    default="train,val,test",
    show_default=True,
    help="Splits to check.",
)
@click.option("--dataset-config", default=DATASET_YAML_FILENAME, show_default=True)
@click.option("--split-config", default=SPLIT_YAML_FILENAME, show_default=True)
@click.option(
    "--parallel", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes."
)
@click.option(
    "--verify",
    is_flag=True,
    help="Require per-sample checksums (prepare --checksums) and check every sample against them.",
)
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def command(
    path: str,
    split_parts: list[str],
    dataset_config: str,
    split_config: str,
    parallel: int,
    verify: bool,
    progress: bool,
) -> None:
    """Read every sample of PATH; exit non-zero and list the samples and shards that fail."""
    failed: list[str] = []
    bad_shards: list[str] = []
    seen: dict[str, ShardReport] = {}
    for split_part in chosen_splits(path, split_parts, "--split-parts", split_config):
        try:
            leaf = open_split(path, split_part, dataset_config, split_config)
        except (EnergonError, OSError) as e:
            raise click.ClickException(f"cannot read the dataset: {e}") from None
        if leaf is None:
            click.echo(f"Skipping empty split part {split_part}")
            continue
        if verify and not leaf.checksums:
            raise click.ClickException(
                f"{path} has no checksums: prepare it with `energon prepare --checksums` to "
                "use --verify"
            )
        loaded = errors = 0
        for report in _reports(leaf, seen, parallel, progress):
            loaded += report.loaded
            errors += report.samples - report.loaded
            failed += report.failures
            if report.problem is not None:
                bad_shards.append(f"{report.shard}: {report.problem}")
        click.echo(f"{split_part}: {loaded} samples loaded, {errors} failed")
    for message in failed:
        click.echo(f"FAILED {message}", err=True)
    for message in bad_shards:
        click.echo(f"BAD SHARD {message}", err=True)
    if failed or bad_shards:
        raise click.ClickException(
            f"Validation failed: {len(bad_shards)} unreadable shard(s), {len(failed)} "
            "damaged or undecodable sample(s)"
        )
    click.echo("All samples loaded successfully.")


def _reports(
    leaf: Any, seen: dict[str, ShardReport], parallel: int, progress: bool
) -> Iterator[ShardReport]:
    """Reports of the split's shards; a shard listed in several splits is read once."""
    todo = [s for s in leaf.shard_names if s not in seen]
    if todo:
        keep = [leaf.shard_names.index(s) for s in todo]
        shards = leaf.shards
        part = dataclasses.replace(
            leaf,
            shards=ListedShards(
                [shards.name(i) for i in keep],
                [leaf.shard_counts[i] for i in keep],
                [shards.tar_file_id(i) for i in keep],
            ),
        )
        for report in lint_split(part, parallel=parallel, progress=progress):
            seen[report.shard] = report
            yield report
    for shard in leaf.shard_names:
        if shard not in todo:
            yield dataclasses.replace(seen[shard], failures=[], problem=None)
