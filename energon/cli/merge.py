"""``energon merge``: concatenate Megatron ``.bin/.idx`` prefixes into one."""

from __future__ import annotations

import os

import click

from energon.cli.arguments import InputPath, OutputPath


@click.command(name="merge")
@click.argument("inputs", nargs=-1, required=True, type=InputPath("dataset"))
@click.option(
    "--output-prefix",
    "-o",
    type=OutputPath("file"),
    required=True,
    help="Prefix of the merged .bin/.idx.",
)
@click.option("--multimodal", is_flag=True, help="Keep the per-sequence mode array.")
def command(inputs, output_prefix, multimodal):
    """Merge prefixes in the order given; a directory stands for all its prefixes, sorted.

    The first input's dtype is used; every other input must have the same dtype.
    """
    from energon.megatron.indexed import IndexedFormatError, find_prefixes, merge_prefixes

    prefixes: list[str] = []
    for item in inputs:
        prefixes += find_prefixes(item) if os.path.isdir(item) else [item]
    if not prefixes:
        raise click.ClickException("no .bin/.idx prefixes found in the inputs")
    try:
        n = merge_prefixes(prefixes, output_prefix, multimodal=multimodal)
    except IndexedFormatError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"merged {len(prefixes)} prefixes into {output_prefix}.bin/.idx ({n} sequences)")
