"""``energon info PATH``: what a prepared dataset holds (samples, size, splits, sample type)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import yaml

from energon import epath
from energon.cli.arguments import InputPath, bad_input
from energon.errors import EnergonError
from energon.format.dataset_yaml import describe_sample_type, read_dataset_yaml
from energon.format.info import has_info, read_dataset_info
from energon.format.layout import (
    DATASET_YAML_FILENAME,
    MAIN_FOLDER_NAME,
    SPLIT_YAML_FILENAME,
    nv_meta_dir,
)
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


def _total_shard_bytes(root: Path | str, shards: list[str]) -> tuple[int, int]:
    """(total bytes of the shards that exist, number of missing shards)."""
    total = missing = 0
    remote = epath.is_remote(root)
    for shard in shards:
        try:
            if remote:
                total += epath.stat(epath.join(root, shard))[0]
            else:
                total += os.stat(Path(root) / shard).st_size
        except OSError:
            missing += 1
    return total, missing


def _ordered_splits(split: SplitConfig) -> list[str]:
    known = [name for name in _SPLIT_ORDER if name in split.split_parts]
    return known + [name for name in split.split_parts if name not in _SPLIT_ORDER]


def parquet_summary(root: str, split_config: str, dataset_config: str) -> list[str]:
    """The lines ``energon info`` prints for a prepared Parquet/Arrow dataset."""
    from energon.format.parquet import SIZE, read_parquet_index

    index = read_parquet_index(root)
    rows = {f["name"]: int(f["rows"]) for f in index.files}
    total = sum(rows.values())
    groups = index.table()
    formats = sorted({f["format"] for f in index.files})
    largest = int(groups[:, SIZE].max()) if len(groups) else 0
    lines = [
        f"## Dataset {epath.basename(str(root))} ({'/'.join(formats)})",
        "",
        f"* Path: `{root}`",
        f"* Total rows: {total:,} rows",
        f"* Total size: {format_size(sum(int(f['size']) for f in index.files))}",
        f"* Files: {len(index.files):,} files, {len(groups):,} row groups (largest "
        f"{format_size(largest)})",
        f"* Columns: {', '.join(f'{n} ({t})' for n, t in index.columns)}",
        f"* Created with energon version: {index.energon_version or 'unknown'}",
        f"* Sample type: {describe_sample_type(read_dataset_yaml(root, dataset_config))}",
        "",
        "### Splits",
        "",
    ]
    split = read_split(root, split_config)
    for name in _ordered_splits(split):
        files = split.shards(name)
        count = sum(rows.get(f, 0) for f in files)
        share = 100.0 * count / total if total else 0.0
        lines.append(f"* {name}: {share:.2f}% ({count:,} rows, {len(files):,} files)")
    return lines


def dataset_summary(root: Path | str, split_config: str, dataset_config: str) -> list[str]:
    """The lines ``energon info`` prints."""
    from energon.format.parquet import is_prepared_parquet

    if is_prepared_parquet(str(root)):
        return parquet_summary(str(root), split_config, dataset_config)
    info = read_dataset_info(root)
    total = info.total_samples
    size, missing = _total_shard_bytes(root, list(info.shard_counts))
    lines = [
        f"## Dataset {epath.basename(str(root))}",
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
@click.argument("path", type=InputPath("dir", remote=True, path_type=Path))
@click.option("--split-config", default=SPLIT_YAML_FILENAME, show_default=True)
@click.option("--dataset-config", default=DATASET_YAML_FILENAME, show_default=True)
def command(path: Path | str, split_config: str, dataset_config: str) -> None:
    """Print a summary of the prepared dataset at PATH (a folder or an ``s3://`` URL)."""
    root = path if isinstance(path, str) else path.resolve()
    if (
        isinstance(root, Path)
        and has_info(root)
        and not (nv_meta_dir(root) / split_config).exists()
    ):
        raise click.BadParameter(
            f"{nv_meta_dir(root) / split_config} does not exist (expected a split config in the "
            f"dataset's {MAIN_FOLDER_NAME} folder)",
            param_hint="'--split-config'",
        )
    try:
        lines = dataset_summary(root, split_config, dataset_config)
    except (EnergonError, OSError, yaml.YAMLError) as e:
        raise bad_input("PATH", str(e)) from None
    click.echo("\n".join(lines))
