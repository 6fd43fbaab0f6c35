"""``energon simulate CONFIG``: what a configuration will do, before training, from metadata alone
(and, with ``--measure``, from decoding a small random sample). See docs/observability.md."""

from __future__ import annotations

import json

import click

from energon.cli.arguments import InputPath, OutputPath, blame, check_split


@click.command(name="simulate")
@click.argument("config", type=InputPath("dataset"))
@click.option("--world-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--num-workers", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="micro-batch size")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="steps to simulate")
@click.option("--seed", type=int, default=0, show_default=True, help="the loader's seed_offset")
@click.option("--shuffle-buffer-size", type=click.IntRange(min=0), default=100, show_default=True)
@click.option(
    "--max-samples-per-sequence", type=click.IntRange(min=1), default=100, show_default=True
)
@click.option(
    "--val-split",
    default=None,
    help="the validation split to simulate [default: val, where the config has one]",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=None,
    help="global samples per blend window [default: a tenth of those simulated]",
)
@click.option(
    "--max-length",
    type=click.IntRange(min=1),
    default=None,
    help="packing limit: warn about longer samples (tokens where known, else bytes)",
)
@click.option("--measure", is_flag=True, help="decode a small random sample: throughput, memory")
@click.option("--measure-samples", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--target", type=float, default=None, help="samples/s to size the workers for")
@click.option("--json", "json_path", type=OutputPath("file"), help="write the figures")
@click.option("--progress/--no-progress", default=True, help="progress bar (--measure)")
def command(
    config: str,
    world_size: int,
    num_workers: int,
    batch_size: int | None,
    steps: int | None,
    seed: int,
    shuffle_buffer_size: int,
    max_samples_per_sequence: int,
    val_split: str | None,
    window: int | None,
    max_length: int | None,
    measure: bool,
    measure_samples: int,
    target: float | None,
    json_path: str | None,
    progress: bool,
) -> None:
    """Simulate CONFIG (a dataset or a metadataset YAML) on WORLD_SIZE ranks x NUM_WORKERS."""
    from energon.preflight.simulate import SimulationSettings, simulate

    if val_split is not None:
        check_split(config, val_split, "--val-split")
    settings = SimulationSettings(
        world_size=world_size,
        num_workers=num_workers,
        batch_size=batch_size,
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size or None,
        max_samples_per_sequence=max_samples_per_sequence,
        steps=steps,
        window=window,
        max_length=max_length,
    )
    with blame("CONFIG"):
        sim = simulate(config, settings, val_split=val_split)
    click.echo(sim.text())
    figures = sim.to_dict()
    if measure:
        from energon.preflight.measure import measure as run_measure

        with blame("--measure"):
            result = run_measure(
                config, settings, samples=measure_samples, target=target, progress=progress
            )
        click.echo(result.text())
        figures["measure"] = result.to_dict()
    if json_path:
        # one line: json's C encoder (an indented dump runs in Python: minutes at 1M shards)
        with open(json_path, "w") as f:
            f.write(json.dumps(figures, default=str))
        click.echo(f"wrote {json_path}")
