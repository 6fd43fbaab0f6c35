"""``energon prepare-cache``: build every GPT/blend index offline for a future run."""

from __future__ import annotations

import json

import click

from energon.cli.arguments import InputPath, OutputPath


@click.command(name="prepare-cache")
@click.option("--data-path", default=None, help='Blend: "w1 p1 w2 p2 ..." or "p1 p2 ...".')
@click.option(
    "--train-data-path", default=None, help="Per-split blend for train (instead of --data-path)."
)
@click.option("--valid-data-path", default=None)
@click.option("--test-data-path", default=None)
@click.option("--split", default="969, 30, 1", show_default=True)
@click.option("--data-cache-path", required=True, type=OutputPath("dir"))
@click.option("--seq-length", required=True, type=click.IntRange(min=1))
@click.option("--seed", default=1234, show_default=True)
@click.option("--global-batch-size", type=click.IntRange(min=1), default=None)
@click.option("--micro-batch-size", type=click.IntRange(min=1), default=None)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    default=None,
    help="Data-parallel size of the future run.",
)
@click.option("--num-microbatches", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--train-iters", type=click.IntRange(min=0), default=None)
@click.option("--train-samples", type=click.IntRange(min=0), default=None)
@click.option("--eval-iters", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--eval-interval", type=click.IntRange(min=1), default=None)
@click.option(
    "--tokenizer-identifiers",
    default="null",
    help="JSON the run's tokenizer hashes as (megatron: tokenizer.unique_identifiers).",
)
@click.option("--no-extra-token", is_flag=True, help="add_extra_token_to_sequence=False.")
@click.option("--mid-level-dataset-surplus", type=float, default=0.005, show_default=True)
@click.option(
    "--per-dataset-sequences-path",
    type=InputPath("file"),
    default=None,
    help="From `energon build-sequences`.",
)
def command(
    data_path,
    train_data_path,
    valid_data_path,
    test_data_path,
    split,
    data_cache_path,
    seq_length,
    seed,
    global_batch_size,
    micro_batch_size,
    world_size,
    num_microbatches,
    train_iters,
    train_samples,
    eval_iters,
    eval_interval,
    tokenizer_identifiers,
    no_extra_token,
    mid_level_dataset_surplus,
    per_dataset_sequences_path,
):
    """Build the document/sample/shuffle and blend indices of a run into --data-cache-path.

    The global batch size is --global-batch-size, or --micro-batch-size x --world-size x
    --num-microbatches. A run with the same settings then only memory-maps the cache.
    """
    from energon.megatron.cache import prepare_cache, split_sample_counts
    from energon.megatron.gpt_dataset import GPTConfig

    if global_batch_size is None:
        if micro_batch_size is None or world_size is None:
            raise click.UsageError(
                "give --global-batch-size or --micro-batch-size and --world-size"
            )
        global_batch_size = micro_batch_size * world_size * num_microbatches
    per_split = [train_data_path, valid_data_path, test_data_path]
    use_per_split = any(p is not None for p in per_split)
    if use_per_split == (data_path is not None):
        raise click.UsageError("give either --data-path or --train/valid/test-data-path")
    try:
        sizes = split_sample_counts(
            global_batch_size=global_batch_size,
            train_iters=train_iters,
            train_samples=train_samples,
            eval_iters=eval_iters,
            eval_interval=eval_interval,
        )
        config = GPTConfig(
            sequence_length=seq_length,
            random_seed=seed,
            split=None if use_per_split else split,
            tokenizer=json.loads(tokenizer_identifiers),
            add_extra_token_to_sequence=not no_extra_token,
            path_to_cache=data_cache_path,
            mid_level_dataset_surplus=mid_level_dataset_surplus,
            sequences_path=per_dataset_sequences_path,
        )
        report = prepare_cache(
            data_path.split() if data_path else None,
            sizes,
            config,
            blend_per_split=[p.split() if p else None for p in per_split]
            if use_per_split
            else None,
        )
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from e
    built = sum(not r["cached_before"] for r in report)
    click.echo(f"samples requested [train, valid, test]: {sizes}")
    click.echo(
        f"{len(report)} indices in {data_cache_path}: {built} built, {len(report) - built} already cached"
    )
