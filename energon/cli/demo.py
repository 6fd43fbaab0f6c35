"""``energon demo``: generate a small captioning dataset, prepare it, load it, show batches and speed."""

from __future__ import annotations

import os
import shutil
import time

import click

from energon.cli.arguments import OutputPath
from energon.format.layout import DATASET_YAML_FILENAME, nv_meta_dir

DEMO_DATASET_YAML = """sample_type:
  __module__: megatron.energon
  __class__: CaptioningSample
field_map:
  image: jpg
  caption: txt
"""


@click.command(name="demo")
@click.option(
    "--workdir",
    type=OutputPath("dir"),
    default="demo_data",
    show_default=True,
    help="Where the demo dataset goes.",
)
@click.option(
    "--samples",
    type=click.IntRange(min=32),
    default=2000,
    show_default=True,
    help="Number of image+caption samples (at least one batch of 32).",
)
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Number of tar shards.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Loader worker processes.",
)
@click.option(
    "--batches",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Batches to load for the speed test.",
)
@click.option("--fresh", is_flag=True, help="Regenerate the dataset even if it exists.")
def command(
    workdir: str, samples: int, shards: int, workers: int, batches: int, fresh: bool
) -> None:
    """Generate, prepare and load a small multimodal dataset, printing batches and samples/s."""
    from tqdm import tqdm

    from energon import WorkerConfig, get_loader, get_train_dataset
    from energon.demo import write_captioning_shards
    from energon.prepare.dataset import prepare_dataset

    if shards > samples:
        raise click.BadParameter(
            f"{shards} shards for {samples} samples: every shard needs a sample",
            param_hint="'--shards'",
        )
    root = os.path.abspath(workdir)
    if fresh and os.path.isdir(root):
        shutil.rmtree(root)
    if not (nv_meta_dir(root) / DATASET_YAML_FILENAME).exists():
        click.echo(f"1. Writing {samples} JPEG+caption samples in {shards} shards to {root}")
        t = time.perf_counter()
        write_captioning_shards(root, num_samples=samples, num_shards=shards, progress=True)
        click.echo(f"   done in {time.perf_counter() - t:.1f} s")
        click.echo("2. Preparing (energon prepare): tar index, split 8/1/1, dataset.yaml")
        t = time.perf_counter()
        prepare_dataset(root, split_parts_ratio=[("train", 0.8), ("val", 0.1), ("test", 0.1)])
        with open(nv_meta_dir(root) / DATASET_YAML_FILENAME, "w") as f:
            f.write(DEMO_DATASET_YAML)
        click.echo(f"   done in {time.perf_counter() - t:.1f} s")
    else:
        click.echo(f"1-2. Reusing the prepared dataset in {root} (--fresh to regenerate)")

    click.echo(f"3. Loading with get_train_dataset + get_loader, {workers} worker processes")
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    t0 = time.perf_counter()
    dataset = get_train_dataset(
        root, worker_config=wc, batch_size=32, shuffle_buffer_size=100, max_samples_per_sequence=100
    )
    loader = get_loader(dataset)
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - t0
    click.echo(f"   time to first batch: {ttfb:.2f} s")
    _show_batch(first)
    count = 0
    t1 = time.perf_counter()
    for batch in tqdm(it, total=batches, desc="Loading batches", unit="batch"):
        count += len(batch.__key__)
        if count >= batches * 32:
            break
    elapsed = time.perf_counter() - t1
    click.echo(f"   {count} samples in {elapsed:.2f} s = {count / elapsed:,.0f} samples/s")
    click.echo("4. Saving the loader position and resuming from it")
    from energon import get_savable_loader

    savable = get_savable_loader(dataset)
    sit = iter(savable)
    for _ in range(3):
        next(sit)
    state = savable.save_state_rank()
    expected = next(sit).__key__
    resumed = get_savable_loader(
        get_train_dataset(
            root,
            worker_config=wc,
            batch_size=32,
            shuffle_buffer_size=100,
            max_samples_per_sequence=100,
        )
    )
    resumed.restore_state_rank(state)
    got = next(iter(resumed)).__key__
    click.echo(f"   next batch after restore matches: {got == expected} (first keys {got[:3]})")


def _show_batch(batch) -> None:
    click.echo(f"   batch type: {type(batch).__name__}")
    click.echo(
        f"   image: {tuple(batch.image.shape)} {batch.image.dtype}, keys: {batch.__key__[:3]} ..."
    )
    for caption in batch.caption[:3]:
        click.echo(f"   caption: {caption!r}")
