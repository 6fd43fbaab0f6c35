"""``energon info PATH``: what a prepared dataset holds (samples, size, splits, sample type)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import yaml

from energon.errors import EnergonError
from energon.format.dataset_yaml import describe_sample_type, read_dataset_yaml
from energon.format.info import read_dataset_info
from energon.format.layout import DATASET_YAML_FILENAME, SPLIT_YAML_FILENAME
from energon.format.split import SplitConfig, read_split

_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SPLIT_ORDER = ("train", "val", "test")


def format_size(num_bytes: int) -> str:
    """Bytes in binary units with two decimals (``1.50 MiB``)."""
    size = float(num_bytes)
    for unit in _SIZE_UNITS:
        if size < 1024 or unit == _SIZE_UNITS[-1]:
            return f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _total_shard_bytes(root: Path, shards: list[str]) -> tuple[int, int]:
    """(total bytes of the shards that exist, number of missing shards)."""
    total = missing = 0
    for shard in shards:
        try:
            total += os.stat(root / shard).st_size
        except OSError:
            missing += 1
    return total, missing


def _ordered_splits(split: SplitConfig) -> list[str]:
    known = [name for name in _SPLIT_ORDER if name in split.split_parts]
    return known + [name for name in split.split_parts if name not in _SPLIT_ORDER]


def dataset_summary(root: Path, split_config: str, dataset_config: str) -> list[str]:
    """The lines ``energon info`` prints."""
    info = read_dataset_info(root)
    total = info.total_samples
    size, missing = _total_shard_bytes(root, list(info.shard_counts))
    lines = [
        f"## Dataset {root.name}",
        "",
        f"* Path: `{root}`",
        f"* Total samples: {total:,} samples",
        f"* Total size: {format_size(size)}"
        + (f" ({missing} shard files missing)" if missing else ""),
        f"* Shards: {len(info.shard_counts):,} shards",
        f"* Created with energon version: {info.energon_version or 'unknown'}",
        f"* Sample type: {describe_sample_type(read_dataset_yaml(root, dataset_config))}",
        "",
        "### Splits",
        "",
    ]
    split = read_split(root, split_config)
    for name in _ordered_splits(split):
        shards = split.shards(name)
        count = sum(info.shard_counts.get(s, 0) for s in shards)
        share = 100.0 * count / total if total else 0.0
        lines.append(f"* {name}: {share:.2f}% ({count:,} samples, {len(shards):,} shards)")
    return lines


@click.command(name="info", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--split-config", default=SPLIT_YAML_FILENAME, show_default=True)
@click.option("--dataset-config", default=DATASET_YAML_FILENAME, show_default=True)
def command(path: Path, split_config: str, dataset_config: str) -> None:
    """Print a summary of the prepared dataset at PATH."""
    try:
        lines = dataset_summary(path.resolve(), split_config, dataset_config)
    except (EnergonError, OSError, yaml.YAMLError) as e:
        raise click.ClickException(str(e)) from None
    click.echo("\n".join(lines))
