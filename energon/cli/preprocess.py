"""``energon preprocess``: JSONL text -> Megatron ``.bin/.idx`` token files, in parallel."""

from __future__ import annotations

import click

from energon.cli.arguments import InputPath, OutputPath


@click.command(name="preprocess")
@click.argument("inputs", nargs=-1, required=True, type=InputPath("file"))
@click.option(
    "--output-prefix",
    "-o",
    type=OutputPath("file"),
    required=True,
    help="Writes <prefix>_<key>_document.bin/.idx.",
)
@click.option(
    "--tokenizer",
    "-t",
    required=True,
    help="'bytes' (built-in), a local tokenizer.json, or an importable 'module:function'.",
)
@click.option("--json-keys", default="text", show_default=True, help="Comma-separated keys.")
@click.option(
    "--workers",
    "-j",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Tokenizer processes.",
)
@click.option("--append-eod", is_flag=True, help="Append the tokenizer's EOD id to each document.")
@click.option("--eod-id", type=int, default=None, help="EOD id when the tokenizer has none.")
@click.option(
    "--dtype",
    type=click.Choice(["uint8", "uint16", "int32", "int64"]),
    default=None,
    help="Token dtype (default: uint16 if the vocabulary fits, else int32).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def command(
    inputs, output_prefix, tokenizer, json_keys, workers, append_eod, eod_id, dtype, no_progress
):
    """Tokenize JSONL files (one document per line) into Megatron's indexed token format."""
    from energon.megatron.indexed import IndexedTokens
    from energon.megatron.preprocess import preprocess_jsonl

    try:
        prefixes = preprocess_jsonl(
            list(inputs),
            output_prefix,
            tokenizer=tokenizer,
            json_keys=[k.strip() for k in json_keys.split(",") if k.strip()],
            workers=workers,
            append_eod=append_eod,
            eod=eod_id,
            dtype=dtype,
            progress=not no_progress,
        )
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise click.ClickException(str(e)) from e
    for key, prefix in prefixes.items():
        ds = IndexedTokens(prefix)
        click.echo(f"{key}: {prefix}.bin/.idx  {ds.num_documents} documents, dtype {ds.dtype}")
