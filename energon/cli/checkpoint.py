"""``energon checkpoint info|redist``: inspect loader states and re-split them for another world size.

Inputs are JSON files or ``torch.save`` files (read with ``weights_only=True``), each holding one
rank's state, a Megatron-LM style ``{"dataloader_state_dict": state, ...}``, or a list of all ranks'
states. ``redist`` writes what it read: the same file format (``torch.save`` in, ``torch.save`` out;
JSON in, JSON out), the same wrapping (other keys of a Megatron-LM wrapper, e.g. ``iteration``, are
kept) and the same names (per-rank files follow the input's numbering; one list file keeps its name),
so a training script resumes from the output exactly as it would from its own files.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import click


@dataclasses.dataclass
class StateFile:
    """One input file: its states and how they were stored."""

    path: str
    file_format: str  # "json" or "torch"
    wrapper: dict[str, Any] | None  # Megatron-LM's dict around the state (None: bare)
    states: list[dict[str, Any]]
    holds_list: bool  # a list of all ranks' states (a "global" checkpoint)

    def payload(self, states: list[dict[str, Any]] | dict[str, Any]) -> Any:
        """``states`` stored the way this file stored its own."""
        if self.wrapper is None:
            return states
        return {**self.wrapper, "dataloader_state_dict": states}


def read_state_file(path: str) -> StateFile:
    from energon.state import check_state_shape, load_state_file, state_file_format

    obj = load_state_file(path)
    wrapper = None
    if isinstance(obj, dict) and "dataloader_state_dict" in obj:
        wrapper, obj = obj, obj["dataloader_state_dict"]
    holds_list = isinstance(obj, list)
    states = [check_state_shape(s) for s in (obj if holds_list else [obj])]
    return StateFile(path, state_file_format(path), wrapper, states, holds_list)


def read_states(files: list[str]) -> list[dict]:
    """All ranks' states of ``files``, by rank."""
    return _by_rank([read_state_file(path) for path in files])


def _by_rank(read: list[StateFile]) -> list[dict]:
    return sorted((s for f in read for s in f.states), key=lambda s: s["rank"])


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
    from energon.state import (
        dataset_consumption,
        merge_stream_snapshots,
        stream_snapshots,
        weight_changes,
    )

    if "mixture" in first["fingerprint"]:
        lines.append("blend weights: scheduled (see the fingerprint's 'mixture')")
    for change in weight_changes(first):
        weights = change["weights"]
        described = (
            "the configured weights"
            if weights is None
            else ", ".join(_describe_weight(w) for w in weights)
        )
        lines.append(
            f"blend weights changed online from global micro-batch {change['position']}: "
            f"{described}"
        )
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


def _describe_weight(config: dict) -> str:
    from energon.plan.schedules import WeightSchedule

    return WeightSchedule.from_config(config).describe()


@click.group(name="checkpoint")
def command() -> None:
    """Inspect and redistribute saved loader states."""


@command.command(name="info")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def info(files: tuple[str, ...]) -> None:
    """Print position, epoch and per-stream cursors of saved states."""
    states = read_states(list(files))
    for line in describe(states):
        click.echo(line)


@command.command(name="redist")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.argument("output_dir", type=click.Path(file_okay=False))
@click.option("--new-world-size", type=int, prompt="New data-parallel world size")
def redist(files: tuple[str, ...], output_dir: str, new_world_size: int) -> None:
    """Turn the states of all ranks into states for NEW_WORLD_SIZE ranks, written in the input's
    format, wrapping and naming."""
    from energon.state import redistribute_states, save_state_file

    read = [read_state_file(path) for path in files]
    new_states = redistribute_states(_by_rank(read), new_world_size)
    os.makedirs(output_dir, exist_ok=True)
    template = read[0]
    if len(read) == 1 and template.holds_list:  # one global file in, one global file out
        outputs = [(os.path.basename(template.path), template.payload(new_states))]
    else:
        names = output_names([f.path for f in read], new_world_size)
        outputs = [(name, template.payload(st)) for name, st in zip(names, new_states)]
    for name, payload in outputs:
        save_state_file(payload, os.path.join(output_dir, name), template.file_format)
    click.echo(
        f"Wrote {len(outputs)} file(s) with states for world size {new_world_size} to {output_dir}"
    )


def output_names(files: list[str], count: int) -> list[str]:
    """Per-rank names following the input's numbering (the number that varies between the input
    names, or the last one; zero padding kept), else ``state_rank{i}`` plus the input's extension."""
    names = [os.path.basename(f) for f in files]
    varying = _varying_number(names)
    if varying is None:
        suffix = os.path.splitext(names[0])[1]
        return [f"state_rank{i}{suffix}" for i in range(count)]
    start, end = varying
    width = end - start if names[0][start] == "0" and end - start > 1 else 1
    return [names[0][:start] + str(i).zfill(width) + names[0][end:] for i in range(count)]


def _varying_number(names: list[str]) -> tuple[int, int] | None:
    """Span of the number in ``names[0]`` that is the rank: the one that differs between names
    (the last number when there is a single name)."""
    numbers = [list(re.finditer(r"\d+", n)) for n in names]
    if not numbers[0]:
        return None
    if len(names) == 1:
        m = numbers[0][-1]
        return m.start(), m.end()
    for i, m in enumerate(numbers[0]):
        values = {int(ms[i].group()) for ms in numbers if len(ms) > i}
        if len(values) > 1:
            return m.start(), m.end()
    m = numbers[0][-1]
    return m.start(), m.end()
