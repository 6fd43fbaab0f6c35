"""``energon prepare PATH``: index a WebDataset and (optionally) write its ``dataset.yaml``.

Everything the interactive assistant asks can also be given as options, so the command is fully
scriptable with ``--non-interactive`` (sample types are chosen by NAME there, not by number).
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from energon import epath
from energon.cli.arguments import InputPath, OutputPath
from energon.cli.dataset_yaml_assistant import (
    CRUDE_ALIASES,
    CRUDE_CHOICE_LABEL,
    MAX_PART_TYPES_FOR_FIELD_MAP,
    DatasetYamlOptions,
    FieldSpec,
    SampleTypeSpec,
    available_sample_types,
    parse_field_map,
    sample_type_menu,
)
from energon.errors import EnergonError
from energon.format.dataset_yaml import read_dataset_yaml
from energon.format.info import has_info, read_info
from energon.format.layout import (
    DATASET_YAML_FILENAME,
    INDEX_SQLITE_FILENAME,
    INFO_JSON_FILENAME,
    MAIN_FOLDER_NAME,
    SHARD_TABLE_FILENAME,
    SPLIT_YAML_FILENAME,
    nv_meta_dir,
)
from energon.format.split_shards import write_shard_table_for
from energon.format.tar import split_member_name, split_sample_bytes
from energon.format.tar_index import TarIndex, tar_index_path
from energon.prepare.dataset import PrepareResult, discover_shards, prepare_dataset

# The sample types and the dataset.yaml assistant live in energon.cli.dataset_yaml_assistant;
# their names stay importable from here.
__all__ = [
    "CRUDE_ALIASES",
    "CRUDE_CHOICE_LABEL",
    "MAX_PART_TYPES_FOR_FIELD_MAP",
    "SPLIT_NAMES",
    "FieldSpec",
    "SampleTypeSpec",
    "SplitChoice",
    "available_sample_types",
    "command",
    "parse_field_map",
    "parse_media_filter",
    "parse_split_parts",
    "parse_split_ratio",
    "sample_type_menu",
]

SPLIT_NAMES = ("train", "val", "test")

# ---------------------------------------------------------------------------------------------
# Option parsing


def parse_split_ratio(text: str) -> list[tuple[str, float]]:
    """``"8,1,1"`` -> ``[("train", 8.0), ("val", 1.0), ("test", 1.0)]``; raises ValueError."""
    values = [float(v) for v in text.split(",")]
    if len(values) != 3:
        raise ValueError("expected exactly three comma-separated numbers (train, val, test)")
    if any(v < 0 for v in values) or sum(values) <= 0:
        raise ValueError("ratios must be non-negative and not all zero")
    return list(zip(SPLIT_NAMES, values))


def parse_split_parts(entries: tuple[str, ...]) -> list[tuple[str, str]]:
    """``("train:parts/train_.*",)`` -> ``[("train", "parts/train_.*")]``; raises ValueError."""
    result = []
    for entry in entries:
        name, sep, pattern = entry.partition(":")
        if not sep or not name.strip() or not pattern:
            raise ValueError(f"{entry!r}: expected NAME:PATTERN")
        result.append((name.strip(), pattern.strip()))
    return result


# ---------------------------------------------------------------------------------------------
# The command


@click.command(name="prepare", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=InputPath("any", remote=True, path_type=Path))
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
@click.option(
    "--split-parts",
    multiple=True,
    metavar="NAME:PATTERN",
    help="Assign shards matching a regex (braces allowed) to a split; repeatable. Overrides --split-ratio.",
)
@click.option("--exclude", default=None, help="Regex of shard paths to leave out (re.search).")
@click.option("--num-workers", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--tar-index-only", is_flag=True, help="Only rebuild .tar.idx files and index.sqlite."
)
@click.option(
    "--shard-table-only",
    is_flag=True,
    help=f"Only write {MAIN_FOLDER_NAME}/{SHARD_TABLE_FILENAME} again (after editing the split "
    "config): what lets each rank read only its own shards at start-up.",
)
@click.option(
    "--no-sample-tables",
    "sample_tables",
    flag_value=False,
    default=True,
    help=f"Training-only index: no {INDEX_SQLITE_FILENAME} (sample keys and part byte ranges), "
    "only what loading reads. Tools that look samples up by key say so; --tar-index-only "
    "builds the tables later.",
)
@click.option("--shuffle-tars", is_flag=True, help="Shuffle shards (seed 42) before a ratio split.")
@click.option(
    "--media-metadata-by-glob",
    default=None,
    metavar="PATTERNS",
    help="Store media metadata for parts matching these comma-separated globs (e.g. '*.mp4,*.jpg').",
)
@click.option(
    "--media-metadata-by-header",
    is_flag=True,
    help="Store media metadata for every part whose content looks like an image, audio or video.",
)
@click.option(
    "--media-metadata-by-extension",
    is_flag=True,
    help="Store media metadata for parts with image/audio/video extensions.",
)
@click.option(
    "--checksums",
    is_flag=True,
    help="Also store a CRC-32 of every sample (reads all shard bytes); loading and "
    "`energon lint` then detect changed bytes. Without it, old checksums are removed.",
)
@click.option("--fix-duplicates", is_flag=True, help="(not supported yet)")
@click.option("--non-interactive", is_flag=True, help="Never prompt; fail if an answer is missing.")
@click.option("--split-ratio", default=None, help='train,val,test ratio of shards, e.g. "8,1,1".')
@click.option("--force-overwrite", is_flag=True, help="Re-prepare an already prepared dataset.")
@click.option("--skip-dataset-yaml", is_flag=True, help="Do not create a dataset.yaml.")
@click.option("--dataset-yaml-name", default=DATASET_YAML_FILENAME, show_default=True)
@click.option("--sample-type", default=None, help="Sample class name (or CrudeWebdataset).")
@click.option(
    "--field-map", default=None, help='JSON, e.g. \'{"image": "jpg", "caption": "txt"}\'.'
)
@click.option(
    "--key-column",
    default=None,
    help="Parquet/Arrow datasets: the column that holds each row's sample key (default: "
    "<file>/<row>).",
)
@click.option(
    "--tmp-path",
    type=OutputPath("dir", path_type=Path),
    default=None,
    help=f"Folder to build {INDEX_SQLITE_FILENAME} in before it is copied into {MAIN_FOLDER_NAME}.",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Scan the tar shards in Ray tasks over the nodes of this Ray cluster ('auto': the "
    "cluster of this machine); every node must be able to read the shards. The output is the "
    "same as a local prepare's (docs/ray.md). Needs energon-loader[ray].",
)
def command(
    path: Path | str,
    progress: bool,
    split_parts: tuple[str, ...],
    exclude: str,
    num_workers: int,
    tar_index_only: bool,
    shard_table_only: bool,
    sample_tables: bool,
    shuffle_tars: bool,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
    media_metadata_by_extension: bool,
    checksums: bool,
    fix_duplicates: bool,
    non_interactive: bool,
    split_ratio: str | None,
    force_overwrite: bool,
    skip_dataset_yaml: bool,
    dataset_yaml_name: str,
    sample_type: str | None,
    field_map: str | None,
    key_column: str | None,
    tmp_path: Path | None,
    ray_address: str | None,
) -> None:
    """Prepare the WebDataset at PATH: index its tar shards and write PATH/.nv-meta/.

    PATH may be an ``s3://`` URL: the shards are streamed once each, the index is built locally
    (in --tmp-path) and the metadata is uploaded, ``.info.json`` last. A folder of Parquet or
    Arrow files (and no tar shards) is indexed from the files' footers (docs/parquet.md).
    """
    media_filter = _check_options(
        fix_duplicates,
        media_metadata_by_glob,
        media_metadata_by_header,
        media_metadata_by_extension,
    )
    split = SplitChoice(split_ratio, split_parts, shuffle_tars)
    yaml_options = DatasetYamlOptions(skip_dataset_yaml, dataset_yaml_name, sample_type, field_map)
    _check_ray_target(ray_address, str(path).endswith((".jsonl", ".yaml")))
    if _is_jsonl_or_metadataset(path):
        _prepare_file(path, progress)
        return
    tables = None if tar_index_only else _table_files(path, exclude)
    _check_ray_target(ray_address, tables is not None)
    if tables is not None:
        yaml_options = replace(yaml_options, key_column=key_column)
        _prepare_tables(
            path, tables, split, yaml_options, non_interactive, force_overwrite, progress
        )
        return
    if not isinstance(path, str):
        _check_path_kind(path)
    if shard_table_only:
        _write_shard_table(path)
        return
    if not tar_index_only and not _confirm_overwrite(path, force_overwrite, non_interactive):
        return
    shards = _find_shards(path, exclude, tar_index_only)
    if ray_address is not None:
        _connect_ray(ray_address)
    scan = dict(
        progress=progress,
        num_workers=num_workers,
        tmp_path=tmp_path,
        media_filter=media_filter,
        checksums=checksums,
        ray_address=ray_address,
    )
    if tar_index_only:
        _rebuild_tar_indices(path, shards, scan)
    else:
        _prepare_shards(path, shards, scan, split, yaml_options, sample_tables, non_interactive)


@dataclass(frozen=True)
class SplitChoice:
    """``--split-ratio``, ``--split-parts`` and ``--shuffle-tars``: how shards go to splits."""

    ratio: str | None
    parts: tuple[str, ...]
    shuffle: bool

    @property
    def shuffle_seed(self) -> int | None:
        return 42 if self.shuffle else None


def _check_options(
    fix_duplicates: bool, media_glob: str | None, media_header: bool, media_extension: bool
) -> Any:
    """Options that fail before anything is read; returns the media filter they give."""
    media_filter = parse_media_filter(media_glob, media_header, media_extension)
    if fix_duplicates:
        raise click.UsageError(
            "--fix-duplicates is not supported yet; make sample keys unique (e.g. prefix member "
            "names with the shard name) and prepare again."
        )
    return media_filter


def _is_jsonl_or_metadataset(path: Path | str) -> bool:
    """A JSONL file (local or remote) or a local metadataset ``.yaml``: prepared on its own."""
    if isinstance(path, str):
        return path.endswith(".jsonl")
    return path.is_file() and path.suffix in (".jsonl", ".yaml")


def _rebuild_tar_indices(path: Path | str, shards: list[str], scan: dict[str, Any]) -> None:
    """``--tar-index-only``: the shards' ``.tar.idx`` files and ``index.sqlite`` again."""
    _run_prepare(path, shards, scan, tar_index_only=True)
    click.echo(f"Rebuilt the tar indices and index.sqlite of {len(shards)} shards. Done.")


def _prepare_shards(
    path: Path | str,
    shards: list[str],
    scan: dict[str, Any],
    split: SplitChoice,
    yaml_options: DatasetYamlOptions,
    sample_tables: bool,
    non_interactive: bool,
) -> None:
    """Index the tar shards, assign them to splits, report what was found and write the
    dataset.yaml: that happens before ``.info.json`` is written, so a killed run never looks
    prepared without its dataset.yaml."""
    ratio, patterns = _ask_split(split.ratio, split.parts, non_interactive)
    yaml_options.check()

    def before_info(result: PrepareResult, staged_root: Path) -> None:
        _print_summary(path, result, staged_root)
        mode_like = None if isinstance(path, str) else path / shards[0]
        yaml_options.ask_and_write(path, result.part_names, non_interactive, mode_like)

    _run_prepare(
        path,
        shards,
        scan,
        split_parts_ratio=ratio,
        split_parts_patterns=patterns,
        shuffle_seed=split.shuffle_seed,
        sample_tables=sample_tables,
        before_info=before_info,
    )
    click.echo("Done")


def _check_ray_target(ray_address: str | None, not_tar_shards: bool) -> None:
    """``--ray`` spreads the scans of tar shards; other inputs are prepared here, in one go."""
    if ray_address is not None and not_tar_shards:
        raise click.UsageError(
            "--ray spreads the indexing of tar shards over a cluster; PATH is a JSONL file, a "
            "metadataset or a folder of Parquet/Arrow files: prepare it without --ray"
        )


def _connect_ray(ray_address: str) -> None:
    """Join the cluster before any work, and say what it has."""
    from energon.cluster.ray_cluster import connect

    try:
        ray = connect(ray_address)
    except EnergonError as e:
        raise click.ClickException(str(e)) from None
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    cpus = int(ray.cluster_resources().get("CPU", 0))
    click.echo(f"Scanning shards as Ray tasks on {nodes} node(s) with {cpus} CPUs ({ray_address})")


def _prepare_file(path: Path | str, progress: bool) -> None:
    """A JSONL file (local or remote) gets its ``.jsonl.idx``; a metadataset gets the join indices
    of its joins."""
    if str(path).endswith(".jsonl"):
        from energon.format.jsonl import prepare_jsonl

        count = prepare_jsonl(path)
        click.echo(f"Done. Found {count} samples.")
        return
    from energon.prepare.join_indices import prepare_metadataset

    for line in prepare_metadataset(path, progress=progress):
        click.echo(line)
    click.echo("Done")


def _table_files(path: Path | str, exclude: str) -> list[str] | None:
    """The Parquet/Arrow files of a folder (or prefix) without tar shards, else None."""
    from energon.format.parquet import discover_table_files, table_format

    if table_format(str(path)) is not None:
        raise click.UsageError(
            f"{path} is a single Parquet/Arrow file: it is used as it is, without preparing. "
            "Prepare the folder that holds it to get splits and a dataset.yaml."
        )
    if not _remote_or_dir(path):
        return None
    try:
        if discover_shards(path, exclude or None):
            return None
        found = discover_table_files(str(path), exclude or None)
    except re.error as e:
        raise click.BadParameter(f"invalid regex: {e}", param_hint="--exclude") from None
    return found or None


def _remote_or_dir(path: Path | str) -> bool:
    return isinstance(path, str) or path.is_dir()


def _prepare_tables(
    path: Path | str,
    files: list[str],
    split: SplitChoice,
    yaml_options: DatasetYamlOptions,
    non_interactive: bool,
    force_overwrite: bool,
    progress: bool,
) -> None:
    """``energon prepare`` for a Parquet/Arrow dataset: index the files' row groups, assign files
    to splits and (optionally) write a dataset.yaml whose field map names columns."""
    from energon.format.parquet import is_prepared_parquet, prepare_parquet

    root = str(path)
    click.echo(f"Found {len(files)} Parquet/Arrow files: {files[0]} ... {files[-1]}")
    if is_prepared_parquet(root) and not force_overwrite:
        if non_interactive:
            raise click.ClickException(
                "Dataset has already been prepared. Use --force-overwrite to overwrite."
            )
        if not click.confirm("The dataset was prepared before. Continue?", default=False):
            return
    ratio, patterns = _ask_split(split.ratio, split.parts, non_interactive)

    def before_info(result: Any) -> None:
        click.echo(
            f"Found {result.total_rows:,} rows in {len(files)} files, {result.row_groups:,} row "
            f"groups (the largest {result.largest_row_group_bytes:,} bytes)."
        )
        for name, names in result.split_parts.items():
            rows = sum(result.shard_counts[n] for n in names)
            click.echo(f"  {name}: {len(names)} files, {rows:,} rows")
        click.echo("Columns: " + ", ".join(f"{n} ({t})" for n, t in result.columns))
        columns = [name for name, _ in result.columns]
        yaml_options.ask_and_write(path, columns, non_interactive)

    try:
        prepare_parquet(
            root,
            files,
            split_parts_ratio=ratio,
            split_parts_patterns=patterns,
            shuffle_seed=split.shuffle_seed,
            progress=progress,
            before_info=before_info,
        )
    except (EnergonError, OSError, ImportError) as e:
        raise click.ClickException(f"Preparation failed.\n{e}") from None
    click.echo("Done")


def parse_media_filter(glob: str | None, header: bool, extension: bool) -> Any:
    """The ``MediaFilterConfig`` of the ``--media-metadata-by-*`` options (None if none given)."""
    if glob is None and not header and not extension:
        return None
    from energon.media.extract import MediaFilterConfig

    try:
        return MediaFilterConfig.parse(glob=glob, header=header, extension=extension)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _check_path_kind(path: Path) -> None:
    if path.is_file():
        raise click.BadParameter(
            f"{path} is a file; expected a WebDataset folder (or a .jsonl or metadataset .yaml "
            "file)",
            param_hint="'PATH'",
        )
    if _is_filesystem_dataset(path):
        raise click.BadParameter(
            f"{path} is a filesystem dataset; it must be prepared using 'energon prepare-media'.",
            param_hint="'PATH'",
        )


def _is_filesystem_dataset(path: Path) -> bool:
    """A media folder prepared by ``prepare-media``: an index.sqlite without sample tables."""
    db_path = nv_meta_dir(path) / INDEX_SQLITE_FILENAME
    if has_info(path) or not db_path.is_file():
        return False
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError:
        return False
    return "samples" not in tables


def _confirm_overwrite(path: Path, force_overwrite: bool, non_interactive: bool) -> bool:
    if not has_info(path) or force_overwrite:
        return True
    if non_interactive:
        raise click.ClickException(
            "Dataset has already been prepared. Use --force-overwrite to overwrite."
        )
    return click.confirm(
        "It seems the dataset had already been prepared. Do you want to continue?", default=False
    )


def _write_shard_table(path: Path | str) -> None:
    if not has_info(path):
        raise click.UsageError(f"{path} is not prepared yet: run `energon prepare {path}` first")
    content = read_dataset_yaml(path) or {}
    split_config = content.get("split_config") or SPLIT_YAML_FILENAME
    write_shard_table_for(path, split_config)
    click.echo(f"Wrote the shard table of {path} for {split_config}.")


def _find_shards(path: Path, exclude: str, tar_index_only: bool) -> list[str]:
    if tar_index_only and has_info(path):
        shards = list(read_info(path))
        click.echo(
            f"Re-indexing the {len(shards)} shards listed in {epath.join(path, MAIN_FOLDER_NAME, INFO_JSON_FILENAME)}."
        )
        return shards
    try:
        shards = discover_shards(path, exclude or None)
    except re.error as e:
        raise click.BadParameter(f"invalid regex: {e}", param_hint="--exclude") from None
    if not shards:
        raise click.ClickException("Did not find any tar files. Exiting.")
    click.echo(f"Found {len(shards)} tar files in total. The first and last ones are:")
    click.echo(f"- {shards[0]}")
    click.echo(f"- {shards[-1]}")
    click.echo(
        "If you want to exclude some of them, cancel with ctrl+c and specify an exclude "
        "filter in the command line (--exclude REGEX)."
    )
    return shards


def _ask_split(
    split_ratio: str | None, split_parts: tuple[str, ...], non_interactive: bool
) -> tuple[list[tuple[str, float]] | None, list[tuple[str, str]] | None]:
    if split_parts:
        try:
            return None, parse_split_parts(split_parts)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--split-parts") from None
    if split_ratio is not None:
        try:
            return parse_split_ratio(split_ratio), None
        except ValueError as e:
            raise click.BadParameter(f"{split_ratio!r}: {e}", param_hint="--split-ratio") from None
    if non_interactive:
        raise click.UsageError("Give --split-ratio or --split-parts in non-interactive mode.")
    while True:
        answer = click.prompt(
            'Please enter a desired train/val/test split like "0.5, 0.2, 0.3" or "8,1,1"'
        )
        try:
            return parse_split_ratio(answer), None
        except ValueError as e:
            click.echo(f"Invalid split: {e}. Try again.")


def _run_prepare(
    path: Path | str, shards: list[str], scan: dict[str, Any], **kwargs: Any
) -> PrepareResult:
    """:func:`prepare_dataset` with the scan options; its errors become one CLI error line."""
    try:
        return prepare_dataset(path, shards, **scan, **kwargs)
    except (EnergonError, OSError, re.error) as e:
        raise click.ClickException(
            f"Preparation failed, previous metadata left unchanged.\n{e}"
        ) from None


# ---------------------------------------------------------------------------------------------
# What was found


def _print_summary(path: Path | str, result: PrepareResult, staged_root: Path) -> None:
    click.echo(f"Found {result.total_samples:,} samples in {len(result.shard_counts)} shards.")
    for name, shards in (result.split_parts or {}).items():
        count = sum(result.shard_counts.get(s, 0) for s in shards)
        click.echo(f"  {name}: {len(shards)} shards, {count:,} samples")
    first_shard = next(iter(result.shard_counts))
    click.echo("Sample 0 and 1 of the first shard:")
    for key, parts, json_preview in _first_samples_preview(path, first_shard, result, staged_root):
        click.echo(f" - {key}: parts {', '.join(parts)}")
        if json_preview is not None:
            for line in json_preview.splitlines():
                click.echo(f"     {line}")
    shown = result.part_names[:MAX_PART_TYPES_FOR_FIELD_MAP]
    more = len(result.part_names) > MAX_PART_TYPES_FOR_FIELD_MAP
    click.echo(
        f"Found the following part types in the dataset: {', '.join(shown)}{', ...' if more else ''}"
    )


def _first_samples_preview(path: Path | str, shard: str, result: PrepareResult, staged_root: Path):
    """Key, parts and a shortened JSON view of the first samples (reads only those bytes; the
    new tar index is in ``staged_root``, which for a remote dataset is not uploaded yet)."""
    index = TarIndex(Path(staged_root) / tar_index_path(shard))
    shard_path = epath.join(path, shard) if isinstance(path, str) else str(path / shard)
    for i, (key, parts) in enumerate(result.first_samples):
        preview = None
        if "json" in parts:
            start, end = index.byte_range(i)
            data = epath.read_range(shard_path, start, end)
            for name, payload in split_sample_bytes(data, base_offset=start):
                if split_member_name(name) == (key, "json"):
                    preview = _json_preview(bytes(payload))
        yield key, parts, preview


def _shorten(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shorten(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v) for v in value[:3]] + (["..."] if len(value) > 3 else [])
    if isinstance(value, str) and len(value) > 25:
        return value[:25] + "..."
    return value


def _json_preview(data: bytes) -> str:
    try:
        return json.dumps(_shorten(json.loads(data)), indent=2)
    except (ValueError, UnicodeDecodeError):
        return "(json part is not valid JSON)"
