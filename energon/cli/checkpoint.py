"""``energon checkpoint info|redist``: inspect loader states and re-split them for another world size.

Inputs are JSON files or ``torch.save`` files (read with ``weights_only=True``), holding one rank's
state, a Megatron-LM style ``{"dataloader_state_dict": state}``, or a list of all ranks' states.
"""

from __future__ import annotations

import os
import re
from typing import Any

import click


def _unwrap(obj: Any) -> tuple[list[dict], bool]:
    """(states, megatron_wrapped)."""
    wrapped = isinstance(obj, dict) and "dataloader_state_dict" in obj
    if wrapped:
        obj = obj["dataloader_state_dict"]
    if isinstance(obj, list):
        return obj, wrapped
    return [obj], wrapped


def read_states(files: list[str]) -> tuple[list[dict], bool]:
    from energon.state import check_state_shape, load_state_file

    states: list[dict] = []
    wrapped = False
    for path in files:
        found, was_wrapped = _unwrap(load_state_file(path))
        wrapped = wrapped or was_wrapped
        states += [check_state_shape(s) for s in found]
    return sorted(states, key=lambda s: s["rank"]), wrapped


def describe(states: list[dict]) -> list[str]:
    first = states[0]
    lines = [
        f"ranks: {first['world_size']} (states given: {len(states)})",
        f"logical streams: {first['num_streams']}",
        f"micro-batch size: {first.get('micro_batch_size')}",
        f"datasets: {', '.join(d['path'] + ':' + d['split_part'] for d in first['fingerprint']['datasets'])}",
        f"config digest: {first['fingerprint_digest']}",
    ]
    from energon.pipeline import snapshot
    from energon.state import dataset_consumption, merge_stream_snapshots, stream_snapshots

    merged = dict(first, streams=[[s, snap] for s, snap in merge_stream_snapshots(states).items()])
    for entry in dataset_consumption(merged):
        lines.append(
            f"dataset {entry['path']} [{entry['split_part']}]: {entry['read']} samples read, "
            f"epoch {entry['epoch']}"
        )
    for st in states:
        next_position = st["origin"] + st["rank"] + st["consumed"] * st["world_size"]
        lines.append(
            f"rank {st['rank']}: consumed {st['consumed']} micro-batches since position "
            f"{st['origin']}, next global position {next_position}, pass offset {st['pass_offset']}"
        )
        for stream_id, snap in stream_snapshots(st).items():
            epochs = ",".join(map(str, snapshot.reader_epochs(snap)))
            lines.append(
                f"  stream {stream_id}: {snapshot.emitted(snap)} batches emitted, epoch {epochs}"
            )
    return lines


@click.group(name="checkpoint")
def command() -> None:
    """Inspect and redistribute saved loader states."""


@command.command(name="info")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def info(files: tuple[str, ...]) -> None:
    """Print position, epoch and per-stream cursors of saved states."""
    states, _ = read_states(list(files))
    for line in describe(states):
        click.echo(line)


@command.command(name="redist")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.argument("output_dir", type=click.Path(file_okay=False))
@click.option("--new-world-size", type=int, prompt="New data-parallel world size")
def redist(files: tuple[str, ...], output_dir: str, new_world_size: int) -> None:
    """Turn the states of all ranks into states for NEW_WORLD_SIZE ranks (written as JSON)."""
    from energon.state import redistribute_states, save_state_file

    states, wrapped = read_states(list(files))
    new_states = redistribute_states(states, new_world_size)
    os.makedirs(output_dir, exist_ok=True)
    names = _output_names(list(files), new_world_size)
    for state, name in zip(new_states, names):
        payload = {"dataloader_state_dict": state} if wrapped else state
        save_state_file(payload, os.path.join(output_dir, name))
    click.echo(f"Wrote {len(new_states)} states for world size {new_world_size} to {output_dir}")


def _output_names(files: list[str], count: int) -> list[str]:
    """Per-rank names following the input pattern (the varying number), else ``state_rankNNN``."""
    base = os.path.basename(files[0])
    match = list(re.finditer(r"\d+", base))
    if len(files) > 1 and match:
        m = match[-1]
        width = len(m.group())
        stem = os.path.splitext(base[: m.start()] + "{}" + base[m.end() :])[0]
        return [stem.format(str(i).zfill(width)) + ".json" for i in range(count)]
    return [f"state_rank{i:03d}.json" for i in range(count)]
