"""``energon prepare-media PATH``: store media metadata (image sizes, audio/video durations, ...).

For a prepared WebDataset the metadata is added to its existing ``index.sqlite``. For a plain
folder of media files (used as an auxiliary source, e.g. a folder of videos referenced by a JSONL
dataset) a ``.nv-meta/index.sqlite`` holding only the media tables is created; keys are the POSIX
paths relative to the folder.
"""

from __future__ import annotations

from pathlib import Path

import click

from energon.cli.arguments import InputPath, OutputPath
from energon.cli.prepare import parse_media_filter
from energon.format.info import has_info


def _kind(path: Path) -> str:
    if path.is_file():
        raise click.BadParameter(
            f"{path} is a file; prepare-media takes a prepared WebDataset or a folder of media "
            "files",
            param_hint="'PATH'",
        )
    if has_info(path):
        return "webdataset"
    if any(path.glob("*.tar")) or any(path.glob("*.tgz")):
        raise click.UsageError(
            f"{path} contains tar shards but is not prepared: run `energon prepare "
            "--media-metadata-by-extension` (or -glob/-header) on it instead"
        )
    return "folder"


@click.command(name="prepare-media", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=InputPath("any", path_type=Path))
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
@click.option("--num-workers", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--media-metadata-by-glob",
    default=None,
    metavar="PATTERNS",
    help="Files matching these comma-separated globs (e.g. '*.mp4,*.wav').",
)
@click.option(
    "--media-metadata-by-header", is_flag=True, help="Files whose content is image/audio/video."
)
@click.option(
    "--media-metadata-by-extension", is_flag=True, help="Files with image/audio/video extensions."
)
@click.option(
    "--tmp-path",
    type=OutputPath("dir", path_type=Path),
    default=None,
    help="Accepted for compatibility; the index is always staged next to its final place.",
)
def command(
    path: Path,
    progress: bool,
    num_workers: int,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
    media_metadata_by_extension: bool,
    tmp_path: Path | None,
) -> None:
    """Compute media metadata for the dataset or media folder at PATH."""
    from energon.prepare.media import prepare_folder_media, prepare_webdataset_media

    media_filter = parse_media_filter(
        media_metadata_by_glob, media_metadata_by_header, media_metadata_by_extension
    )
    if media_filter is None:
        raise click.UsageError(
            "give one of --media-metadata-by-extension, --media-metadata-by-glob PATTERNS, "
            "--media-metadata-by-header"
        )
    if _kind(path) == "webdataset":
        click.echo("Preparing webdataset and computing media metadata...")
        count = prepare_webdataset_media(
            path, media_filter, num_workers=num_workers, progress=progress
        )
    else:
        click.echo("Preparing a media folder (filesystem dataset) and computing media metadata...")
        count = prepare_folder_media(path, media_filter, num_workers=num_workers, progress=progress)
    click.echo(f"Done. Stored metadata for {count} files.")
