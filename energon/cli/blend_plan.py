"""``energon blend-plan CONFIG``: what a blend will feed training, before training, from the plan.

Runs every logical stream's blend schedule for the first ``--samples`` global samples (no sample is
read: datasets are opened for their sample counts only) and prints, per window, the share each
source was asked for against the share it gets; ``--html`` / ``--png`` plot it.
"""

from __future__ import annotations

import json

import click

from energon.cli.arguments import InputPath, OutputPath, blame, check_split


@click.command(name="blend-plan")
@click.argument("path", type=InputPath("file"))
@click.option("--split-part", default="train", show_default=True, help="split to simulate")
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=None,
    help="global samples to simulate [default: past the last schedule point, at least 10 windows]",
)
@click.option(
    "--window", type=click.IntRange(min=1), default=1000, show_default=True, help="samples/window"
)
@click.option(
    "--num-streams",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="logical streams (world size x workers of the first run); the order depends on it",
)
@click.option(
    "--global-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="samples per training step, for schedules given in steps",
)
@click.option("--seed", type=int, default=0, show_default=True, help="the loader's seed_offset")
@click.option("--html", "html_path", type=OutputPath("file"), help="write an HTML page")
@click.option("--png", "png_path", type=OutputPath("file"), help="write a PNG (matplotlib)")
@click.option("--json", "json_path", type=OutputPath("file"), help="write the report")
@click.option("--progress/--no-progress", default=True, help="progress bar")
def command(
    path: str,
    split_part: str,
    samples: int | None,
    window: int,
    num_streams: int,
    global_batch_size: int | None,
    seed: int,
    html_path: str | None,
    png_path: str | None,
    json_path: str | None,
    progress: bool,
) -> None:
    """Simulate the blend of metadataset CONFIG: requested vs. observed shares per window."""
    from energon.loader.blend_report import simulate_blend
    from energon.loader.build import get_train_dataset
    from energon.worker import WorkerConfig

    check_split(path, split_part, "--split-part")
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, seed_offset=seed)
    with blame("PATH"):
        dataset = get_train_dataset(
            path,
            split_part=split_part,
            worker_config=wc,
            batch_size=None,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            num_streams=num_streams,
            global_batch_size=global_batch_size,
        )
    spec = dataset.spec
    if spec.mode != "weight":
        raise click.ClickException(
            f"{path} [{split_part}] is not a weight blend of several datasets (mode {spec.mode!r})"
        )
    if samples is None:
        last = max(
            (
                t
                for level in (spec.mixture.levels if spec.mixture else ())
                for s in level
                for t in s.breakpoints()
            ),
            default=0,
        )
        samples = max(10 * window, last + last // 4)
        samples = -(-samples // window) * window
    report = simulate_blend(spec, samples, window, progress=progress)
    click.echo(report.table())
    title = f"{path} [{split_part}]: {num_streams} logical streams, seed {seed}"
    if html_path:
        with open(html_path, "w") as f:
            f.write(report.html(title))
        click.echo(f"wrote {html_path}")
    if png_path:
        with blame("--png"):
            report.save_png(png_path, title)
        click.echo(f"wrote {png_path}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report.to_dict(), f)
        click.echo(f"wrote {json_path}")
