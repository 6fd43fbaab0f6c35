"""``energon preview PATH``: show decoded samples of a prepared dataset in the terminal."""

from __future__ import annotations

import shutil
from typing import Any

import click

from energon.cli.arguments import InputPath, SplitNames, chosen_splits
from energon.format.layout import DATASET_YAML_FILENAME

_SHADES = " .:-=+*#%@"
_HIDDEN = {"__restore_key__", "__subflavors__", "__sources__", "__padding__"}


def ascii_image(image: Any, width: int) -> list[str]:
    """A rough grey-scale rendering of a CHW (or HW) image tensor in ``width`` characters."""
    import torch

    img = image.float()
    if img.ndim == 3:
        img = img.mean(dim=0)
    if img.max() > 1.0:
        img = img / 255.0
    h, w = img.shape
    cols = max(1, min(width, w))
    rows = max(1, int(h * cols / w / 2))  # terminal cells are about twice as tall as wide
    small = torch.nn.functional.interpolate(img[None, None], size=(rows, cols), mode="area")[0, 0]
    levels = (small.clamp(0, 1) * (len(_SHADES) - 1)).round().long()
    return ["".join(_SHADES[v] for v in row.tolist()) for row in levels]


def describe_value(value: Any, width: int) -> list[str]:
    import torch

    if isinstance(value, torch.Tensor):
        head = f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
        if value.ndim == 3 and value.shape[0] in (1, 3, 4) or value.ndim == 2:
            return [head, *ascii_image(value, width)]
        return [head, str(value.flatten()[:16].tolist())]
    if isinstance(value, bytes):
        return [f"bytes[{len(value)}]: {value[:64]!r}"]
    if isinstance(value, str):
        text = value if len(value) <= 400 else value[:400] + "..."
        return [repr(text)]
    return [repr(value)[:400]]


def iter_fields(sample: Any):
    if isinstance(sample, dict):
        yield from sample.items()
        return
    import dataclasses

    for f in dataclasses.fields(sample):
        yield f.name, getattr(sample, f.name)


@click.command(name="preview")
@click.argument("path", type=InputPath("dir", remote=True))
@click.option("--split-parts", type=SplitNames(), default="train,val,test", show_default=True)
@click.option("--dataset-config", default=DATASET_YAML_FILENAME, show_default=True)
@click.option(
    "--num-samples",
    type=click.IntRange(min=0),
    default=0,
    help="Show this many samples without asking (0: ask).",
)
def command(path: str, split_parts: list[str], dataset_config: str, num_samples: int) -> None:
    """Print decoded samples of PATH with their field types; images as ASCII art."""
    from energon import WorkerConfig, get_loader, get_val_dataset
    from energon.errors import EmptyDatasetError
    from energon.format.split import UnknownSplitError

    width = max(20, min(100, shutil.get_terminal_size().columns - 4))
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    shown = 0
    for split_part in chosen_splits(path, split_parts, "--split-parts"):
        try:
            dataset = get_val_dataset(
                path,
                split_part=split_part,
                worker_config=wc,
                batch_size=None,
                dataset_config=dataset_config,
            )
        except (EmptyDatasetError, UnknownSplitError):
            click.echo(f"Skipping empty split part {split_part}")
            continue
        click.echo(f"Split {split_part}: {len(dataset)} samples")
        for index, sample in enumerate(get_loader(dataset)):
            click.echo(f"Sample {index}")
            for name, value in iter_fields(sample):
                if name in _HIDDEN:
                    continue
                lines = describe_value(value, width)
                click.echo(f" - {name} ({type(value).__name__}): {lines[0]}")
                for line in lines[1:]:
                    click.echo(f"   {line}")
            shown += 1
            if num_samples:
                if shown >= num_samples:
                    return
            elif not click.confirm("Continue?", default=True):
                click.echo("Exiting preview")
                return
