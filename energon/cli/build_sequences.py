"""``energon build-sequences``: one JSON file with every prefix's sequence and document counts."""

from __future__ import annotations

import click


@click.command(name="build-sequences")
@click.argument("data_path", nargs=-1, required=True)
@click.option("--output", "-o", required=True, help="The JSON file to write.")
def command(data_path, output):
    """Read each prefix's .idx header once, offline, so that training reads none.

    DATA_PATH is Megatron's --data-path tokens ("w1 p1 w2 p2 ..." or "p1 p2 ..."). The file is
    megatron-core's --per-dataset-sequences-path format: {"<prefix>": [sequences, documents + 1]}.
    """
    from energon.megatron.cache import build_sequences, prefixes_of
    from energon.megatron.indexed import IndexedFormatError

    try:
        counts = build_sequences(prefixes_of(list(data_path)), output)
    except (OSError, IndexedFormatError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {output}: {len(counts)} prefixes")
