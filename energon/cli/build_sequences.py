"""``energon build-sequences``: one JSON file with every prefix's sequence and document counts."""

from __future__ import annotations

import os

import click

from energon.cli.arguments import OutputPath


@click.command(name="build-sequences")
@click.argument("data_path", nargs=-1, required=True)
@click.option(
    "--output", "-o", type=OutputPath("file"), required=True, help="The JSON file to write."
)
def command(data_path, output):
    """Read each prefix's .idx header once, offline, so that training reads none.

    DATA_PATH is Megatron's --data-path tokens ("w1 p1 w2 p2 ..." or "p1 p2 ..."). The file is
    megatron-core's --per-dataset-sequences-path format: {"<prefix>": [sequences, documents + 1]}.
    """
    from energon.megatron.cache import build_sequences, prefixes_of
    from energon.megatron.indexed import IndexedFormatError

    try:
        prefixes = prefixes_of(list(data_path))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'DATA_PATH...'") from e
    missing = [p for p in prefixes if not os.path.exists(p + ".idx")]
    if missing:
        raise click.BadParameter(
            f"no {missing[0]}.idx (expected Megatron token prefixes: <prefix>.bin and "
            "<prefix>.idx, optionally preceded by weights)",
            param_hint="'DATA_PATH...'",
        )
    try:
        counts = build_sequences(prefixes, output)
    except (OSError, IndexedFormatError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {output}: {len(counts)} prefixes")
