"""``energon mount PATH MOUNTPOINT``: Megatron-Energon's verb for showing a dataset's samples as
files through FUSE. energon does not mount datasets: the verb exists with the reference's options so
that scripts and ``--help`` find it, and it says so (exit code 1) instead of failing obscurely.
``energon preview`` and ``WebdatasetFileStore`` (``store[key]``) read samples without a mount.
"""

from __future__ import annotations

import click

from energon.cli.arguments import InputPath


@click.command(name="mount", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=InputPath("dir"))
@click.argument("mountpoint", type=InputPath("dir", exists=False))
@click.option("-d", "--detach", is_flag=True, help="Run in background (not supported).")
@click.option(
    "-s", "--sample-folders", is_flag=True, help="A virtual folder per sample (not supported)."
)
@click.option("-w", "--allow-slow", is_flag=True, help="Allow slow mode (not supported).")
def command(
    path: str, mountpoint: str, detach: bool, sample_folders: bool, allow_slow: bool
) -> None:
    """Mount a dataset as files (not supported by energon: use preview or a file store)."""
    raise click.ClickException(
        f"energon does not mount datasets (no FUSE support), so {path} was not mounted at "
        f"{mountpoint}. Read samples with `energon preview {path}` or, in Python, "
        "WebdatasetFileStore(path)[key]."
    )
