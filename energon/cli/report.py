"""``energon report CONFIG -o report.html``: one self-contained HTML page with random samples,
size histograms, source shares, shard balance and the simulation's warnings (docs/observability.md)."""

from __future__ import annotations

import click

from energon.cli.arguments import InputPath, OutputPath, blame

STEPS = ("simulating", "decoding samples", "plotting")


@click.command(name="report")
@click.argument("config", type=InputPath("dataset"))
@click.option("-o", "--output", type=OutputPath("file"), default="report.html", show_default=True)
@click.option("--world-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--num-workers", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="micro-batch size")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="steps to simulate")
@click.option(
    "--samples",
    type=click.IntRange(min=0),
    default=16,
    show_default=True,
    help="random samples to show",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--progress/--no-progress", default=True, help="progress bar")
def command(
    config: str,
    output: str,
    world_size: int,
    num_workers: int,
    batch_size: int | None,
    steps: int | None,
    samples: int,
    seed: int,
    progress: bool,
) -> None:
    """Write an HTML report of CONFIG (a dataset or a metadataset YAML)."""
    from tqdm import tqdm

    from energon.preflight.report import build_report
    from energon.preflight.simulate import SimulationSettings

    settings = SimulationSettings(
        world_size=world_size,
        num_workers=num_workers,
        batch_size=batch_size,
        seed=seed,
        steps=steps,
    )
    with tqdm(total=len(STEPS), desc="Report", disable=not progress) as bar:

        def step(name: str) -> None:
            if bar.n < len(STEPS) and name != STEPS[0]:
                bar.update(1)
            bar.set_postfix_str(name)

        with blame("CONFIG"):
            page = build_report(config, settings, samples=samples, seed=seed, progress=step)
        bar.update(len(STEPS) - bar.n)
    with open(output, "w") as f:
        f.write(page)
    click.echo(f"wrote {output}")
