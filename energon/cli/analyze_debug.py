"""``energon analyze-debug LOG_PATHS...``: a sample-order heat map from worker debug logs.

Reads the JSON-lines logs written with ``WorkerConfig(worker_debug_path=..., worker_log_level>=1)``
(energon's or Megatron-Energon's; a folder means its ``*.jsonl`` files). The picture has one column
per training step and one row per sample key, rows in the order keys were first seen; a pixel is lit
when that step used that sample, in the colour of the log file (rank) that used it. Revisits show up
as repeated dots in a row, a stuck order as a diagonal, a poor shuffle as visible blocks.

Steps come from the loader's ``*DataLoader.yield`` records (the batches handed to the user) of one
loader, chosen by modality (``--include-modality``; asked for if several match). Without such records,
or with ``--force-loading-order``, the samples' reading order is used instead
(``..._slices_iter.yield`` records: one column per sample read, per worker log).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from energon.cli.arguments import STEP, InputPath, OutputPath

# The 64-colour palette of Megatron-Energon's heat maps (log file i gets colour i % 64), so that
# pictures of the same logs look the same in both tools.
PALETTE = (
    "ffffff 010067 d5ff00 ff0056 9e008e 0e4ca1 ffe502 005f39 00ff00 95003a ff937e a42400 001544 "
    "91d0cb 620e00 6b6882 0000ff 007db5 6a826c 00ae7e c28c9f be9970 008f9c 5fad4e ff0000 ff00f6 "
    "ff029d 683d3b ff74a3 968ae8 98ff52 a75740 01fffe ffeee8 fe8900 bdc6ff 01d0ff bb8800 7544b1 "
    "a5ffd2 ffa6fe 774d00 7a4782 263400 004754 43002c b500ff ffb167 ffdb66 90fb92 7e2dd2 bdd393 "
    "e56ffe deff74 00ff78 009bff 006401 0076ff 85a900 00b917 788231 00ffc6 ff6e41 e85ebe"
).split()

LOADER_YIELD = re.compile(r"^\w*DataLoader\.yield$")
LOADER_INIT = re.compile(r"^\w*(Loader|DataLoader)\.__init__$")
SAMPLE_READ = "WebdatasetSampleLoaderDataset._slices_iter.yield"


@dataclasses.dataclass
class LoaderLog:
    """One loader as seen in one log file."""

    source: int  # index of the log file
    loader_id: Any
    modality: str  # "train" or "val" (or "?" when the config does not say)
    paths: tuple[str, ...]
    steps: dict[int, list[Any]] = dataclasses.field(default_factory=dict)  # global_idx -> keys


@dataclasses.dataclass
class LogFile:
    loaders: dict[Any, LoaderLog]
    reads: list[Any]  # sample keys in reading order


def log_files(paths: Iterable[str]) -> list[Path]:
    """The ``.jsonl`` files named or inside the named folders, in natural order (rank order)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.jsonl"), key=_natural) if p.is_dir() else [p]
    return files


def _natural(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _config_facts(config: Any) -> tuple[str, tuple[str, ...]]:
    """(modality, dataset paths) found anywhere in a loader config (energon's or the reference's)."""
    training = None
    paths: list[str] = []

    def add(path: Any) -> None:
        if isinstance(path, str) and path not in paths:
            paths.append(path)

    def walk(node: Any) -> None:
        nonlocal training
        if isinstance(node, dict):
            if isinstance(node.get("training"), bool):  # a dataset's description
                if training is None:
                    training = node["training"]
                add(node.get("_path"))  # the reference's factory config
                for source in node.get("datasets") or []:  # energon's pipeline config
                    if isinstance(source, dict):
                        add(source.get("path"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    modality = "?" if training is None else ("train" if training else "val")
    return modality, tuple(paths)


def read_log(path: Path, source: int) -> LogFile:
    log = LogFile(loaders={}, reads=[])
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise click.ClickException(f"{path} line {number}: not JSON ({e})") from e
            event = record.get("t", "")
            if LOADER_INIT.match(event):
                modality, paths = _config_facts(record.get("config"))
                log.loaders[record.get("id")] = LoaderLog(source, record.get("id"), modality, paths)
            elif LOADER_YIELD.match(event):
                loader = log.loaders.setdefault(
                    record.get("id"), LoaderLog(source, record.get("id"), "?", ())
                )
                step = record.get("global_idx", record.get("idx"))
                if step is None:
                    raise click.ClickException(f"{path} line {number}: a yield without a step")
                loader.steps[int(step)] = list(record.get("keys") or [])
            elif event == SAMPLE_READ:
                log.reads.append(record.get("key"))
    return log


def group_loaders(logs: list[LogFile]) -> dict[tuple, list[LoaderLog]]:
    """The same loader on every rank: grouped by (loader id, modality, dataset paths)."""
    groups: dict[tuple, list[LoaderLog]] = {}
    for log in logs:
        for loader in log.loaders.values():
            if loader.steps:
                groups.setdefault((loader.loader_id, loader.modality, loader.paths), []).append(
                    loader
                )
    return groups


def loader_steps(group: list[LoaderLog], skip: int) -> Iterator[tuple[int, int, list[Any]]]:
    """(step, source, keys) of a loader group, by step then source (the n-th log file that has
    this loader: its rank)."""
    group = sorted(group, key=lambda loader: loader.source)
    steps = sorted({s for loader in group for s in loader.steps if s >= skip})
    for step in steps:
        for source, loader in enumerate(group):
            keys = loader.steps.get(step)
            if keys is not None:
                yield step - skip, source, keys


def reading_steps(logs: list[LogFile], skip: int) -> Iterator[tuple[int, int, list[Any]]]:
    """(position, source, [key]) of every sample read, by position then worker log (source: the
    n-th log file that read samples)."""
    readers = [log for log in logs if log.reads]
    longest = max((len(log.reads) for log in readers), default=0)
    for position in range(skip, longest):
        for source, log in enumerate(readers):
            if position < len(log.reads):
                yield position - skip, source, [log.reads[position]]


class Heatmap:
    """Steps x keys, each pixel the sum of the colours of the sources that hit it, scaled down
    by powers of two so that it fits ``max_steps`` x ``max_keys`` pixels."""

    def __init__(self, num_steps: int, num_keys: int, max_steps: int, max_keys: int) -> None:
        import numpy as np

        self.step_factor = _power_of_two_factor(num_steps, max_steps)
        self.key_factor = _power_of_two_factor(num_keys, max_keys)
        width = -(-num_steps // self.step_factor)
        height = -(-num_keys // self.key_factor)
        self.pixels = np.zeros((height, width, 3), dtype=np.float64)

    def add(self, step: int, key_id: int, colour: tuple[int, int, int]) -> None:
        self.pixels[key_id // self.key_factor, step // self.step_factor] += colour

    def image(self, gain: float) -> Any:
        """8-bit RGB: a channel whose sum exceeds 255 somewhere is scaled to fit, then ``gain``."""
        import numpy as np

        peak = np.maximum(self.pixels.reshape(-1, 3).max(axis=0, initial=0.0), 255.0)
        scaled = self.pixels * (255.0 / peak) * gain
        return np.clip(scaled, 0, 255).astype(np.uint8)


def _power_of_two_factor(size: int, limit: int) -> int:
    factor = 1
    while -(-size // factor) > max(1, limit):
        factor *= 2
    return factor


def _colour(source: int, colours: bool) -> tuple[int, int, int]:
    code = PALETTE[source % len(PALETTE)] if colours else "ffffff"
    return int(code[0:2], 16), int(code[2:4], 16), int(code[4:6], 16)


def _choose_loader(groups: dict[tuple, list[LoaderLog]], modalities: set[str]) -> list[LoaderLog]:
    candidates = [
        (key, group) for key, group in groups.items() if key[1] in modalities or key[1] == "?"
    ]
    if not candidates:
        raise click.ClickException(
            f"no loader of modality {sorted(modalities)} in the logs "
            f"(found: {sorted({k[1] for k in groups}) or 'none'})"
        )
    click.echo("Available loaders:")
    for i, ((_, modality, paths), group) in enumerate(candidates):
        steps = max(s for loader in group for s in loader.steps) + 1
        click.echo(f"  {i}: {modality} {', '.join(paths) or '?'} {steps} steps")
    index = 0
    if len(candidates) > 1:
        index = click.prompt("Which loader", type=click.IntRange(0, len(candidates) - 1), default=0)
    return candidates[index][1]


@click.command(name="analyze-debug")
@click.argument("log_paths", nargs=-1, required=True, type=InputPath())
@click.option(
    "--heatmap-path",
    type=OutputPath("file"),
    default="heatmap.png",
    show_default=True,
    help="Where to write the PNG.",
)
@click.option(
    "--heatmap-steps",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Width of the heat map: steps are merged by powers of two to fit.",
)
@click.option(
    "--heatmap-samples",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Height of the heat map: sample rows are merged by powers of two to fit.",
)
@click.option(
    "--heatmap-gain",
    type=click.FloatRange(min=0, min_open=True),
    default=10,
    show_default=True,
    help="Brightness factor.",
)
@click.option(
    "--force-loading-order",
    is_flag=True,
    help="Use the samples' reading order instead of the batches handed to the user.",
)
@click.option(
    "--include-modality",
    type=click.Choice(["train", "val", "train,val", "val,train"]),
    default="train",
    show_default=True,
    help="Which loaders to consider: train, val, or both (comma separated).",
)
@click.option("--skip", type=STEP, default=0, help="Leave out this many steps at the start.")
@click.option("--no-colors", is_flag=True, help="All ranks white instead of one colour each.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def command(
    log_paths: tuple[str, ...],
    heatmap_path: str,
    heatmap_steps: int,
    heatmap_samples: int,
    heatmap_gain: float,
    force_loading_order: bool,
    include_modality: str,
    skip: int,
    no_colors: bool,
    no_progress: bool,
) -> None:
    """Render the sample order of worker debug logs (LOG_PATHS: files or folders) as a heat map."""
    from PIL import Image
    from tqdm import tqdm

    files = log_files(log_paths)
    if not files:
        raise click.ClickException(f"no .jsonl logs in {', '.join(log_paths)}")
    click.echo(f"Analyzing {len(files)} logs...")
    with tqdm(files, disable=no_progress) as bar:  # closed (a new line) before any error
        logs = [read_log(f, i) for i, f in enumerate(bar)]
    groups = group_loaders(logs)
    if groups and not force_loading_order:
        modalities = {m.strip() for m in include_modality.split(",") if m.strip()}
        steps = list(loader_steps(_choose_loader(groups, modalities), skip))
        unit = "steps"
    else:
        if not any(log.reads for log in logs):
            raise click.ClickException(
                "the logs hold neither loader yields nor sample reads: were they written with "
                "worker_log_level >= 1?"
            )
        click.echo("Using the samples' reading order (batching and shuffling not shown)")
        steps = list(reading_steps(logs, skip))
        unit = "samples read per worker"
    key_ids: dict[Any, int] = {}
    for _, _, keys in steps:
        for key in keys:
            key_ids.setdefault(json.dumps(key), len(key_ids))
    num_steps = max((s for s, _, _ in steps), default=-1) + 1
    click.echo(f"Found {len(key_ids)} unique sample keys, {num_steps} steps")
    heatmap = Heatmap(num_steps, len(key_ids), heatmap_steps, heatmap_samples)
    with tqdm(steps, disable=no_progress) as bar:
        for step, source, keys in bar:
            for key in keys:
                heatmap.add(step, key_ids[json.dumps(key)], _colour(source, not no_colors))
    Image.fromarray(heatmap.image(heatmap_gain), "RGB").save(heatmap_path)
    click.echo(f"Wrote heatmap to {heatmap_path}")
    click.echo("Heatmap axes:")
    click.echo(f"  x-axis: {num_steps} {unit} ({heatmap.step_factor} per pixel)")
    click.echo(f"  y-axis: {len(key_ids)} samples ({heatmap.key_factor} per pixel)")
