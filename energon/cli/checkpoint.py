"""``energon checkpoint info|redist|skip|exclude|migrate``: inspect, re-split and edit loader states.

Inputs are JSON files or ``torch.save`` files (read with ``weights_only=True``), each holding one
rank's state, a Megatron-LM style ``{"dataloader_state_dict": state, ...}``, or a list of all ranks'
states. ``redist`` writes what it read: the same file format (``torch.save`` in, ``torch.save`` out;
JSON in, JSON out), the same wrapping (other keys of a Megatron-LM wrapper, e.g. ``iteration``, are
kept) and the same names (per-rank files follow the input's numbering; one list file keeps its name),
so a training script resumes from the output exactly as it would from its own files. ``skip``,
``exclude`` and ``migrate`` edit the cursor (see docs/ledger.md) and write the same way.
"""

from __future__ import annotations

import os
import re

import click

from energon.cli.arguments import (
    DATASET_NAME,
    STEP,
    InputPath,
    OutputPath,
    StateFile,
    blame,
    read_states,
)
from energon.cli.dataset_options import dataset_options, pop_options


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
    lines += describe_edits(first.get("edits"))
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
            lines += lost_sample_lines(snapshot.error_state(snap))
    return lines


def lost_sample_lines(account: dict | None) -> list[str]:
    """The samples a stream's loader lost workers on (energon.loader.recovery): skipped, or to
    be skipped where the stream meets them."""
    lines = []
    for entries, status in (
        ((account or {}).get("lost", []), "skipped"),
        ((account or {}).get("skip", []), "to skip"),
    ):
        for entry in entries:
            lines.append(
                f"    lost sample ({status}): source {entry['source']} index {entry['index']} "
                f"key {entry['key']!r}: {entry['error']}"
            )
    return lines


def _describe_weight(config: dict) -> str:
    from energon.plan.schedules import WeightSchedule

    return WeightSchedule.from_config(config).describe()


def describe_edits(data: dict | None) -> list[str]:
    """The cursor edits of a state, one line each (skips, exclusions, migrations)."""
    from energon.plan.edits import edits_from_json

    edits = edits_from_json(data)
    if edits is None:
        return []
    lines = []
    for entry in edits.history:
        if entry["edit"] == "skip":
            lines.append(f"edit: skipped positions {entry['start']}..{entry['end'] - 1}")
        elif entry["edit"] == "exclude":
            count = sum(b - a for e in entry["exclude"] for a, b in e["ranges"])
            names = ", ".join(f"{e['path']} [{e['split_part']}]" for e in entry["exclude"])
            lines.append(
                f"edit: excluded {count} samples of {names} at position {entry['position']}"
            )
        else:
            changes = entry.get("changes", {})
            lines.append(
                f"edit: migrated at position {entry['position']} from configuration "
                f"{entry.get('from')} ({len(changes.get('added', []))} sources added, "
                f"{len(changes.get('removed', []))} removed, {changes.get('continuing')} continuing)"
            )
    return lines


@click.group(name="checkpoint")
def command() -> None:
    """Inspect and redistribute saved loader states."""


@command.command(name="info")
@click.argument("input_files", nargs=-1, required=True, type=InputPath("file"))
def info(input_files: tuple[str, ...]) -> None:
    """Print position, epoch and per-stream cursors of saved states."""
    states = _by_rank(read_states(input_files, "INPUT_FILES"))
    for line in describe(states):
        click.echo(line)


@command.command(name="redist")
@click.argument("input_files", nargs=-1, required=True, type=InputPath("file"))
@click.argument("output_path", type=OutputPath("dir"))
@click.option("--new-world-size", type=click.IntRange(min=1), prompt="New data-parallel world size")
def redist(input_files: tuple[str, ...], output_path: str, new_world_size: int) -> None:
    """Turn the states of all ranks into states for NEW_WORLD_SIZE ranks, written in the input's
    format, wrapping and naming."""
    from energon.errors import StateError
    from energon.state import redistribute_states

    read = read_states(input_files, "INPUT_FILES")
    with blame("INPUT_FILES", StateError):
        new_states = redistribute_states(_by_rank(read), new_world_size)
    count = write_states(read, new_states, output_path)
    click.echo(
        f"Wrote {count} file(s) with states for world size {new_world_size} to {output_path}"
    )


# Megatron-Energon's names of the two verbs (``megatron.energon.tools.checkpoint``).
command_info = info
command_redist = redist


def write_states(read: list[StateFile], new_states: list[dict], output_dir: str) -> int:
    """Write ``new_states`` as the input files were written (format, wrapping, names); returns the
    number of files."""
    from energon.state import save_state_file

    os.makedirs(output_dir, exist_ok=True)
    template = read[0]
    if len(read) == 1 and template.holds_list:  # one global file in, one global file out
        outputs = [(os.path.basename(template.path), template.payload(new_states))]
    else:
        names = output_names([f.path for f in read], len(new_states))
        outputs = [(name, template.payload(st)) for name, st in zip(names, new_states)]
    for name, payload in outputs:
        save_state_file(payload, os.path.join(output_dir, name), template.file_format)
    return len(outputs)


def _dataset_for(config: str | None, options: dict, states: list[dict]):
    """The training dataset of the states: built from ``config`` and options, or (without a
    config) rebuilt from the states' fingerprint."""
    if config is not None:
        from energon.cli.dataset_options import build_dataset

        return build_dataset(config, options, states, "--config")
    if options:
        raise click.UsageError("dataset options need --config")
    from energon.cursor.rebuild import dataset_from_state

    with blame("FILES"):
        return dataset_from_state(states[0])


def _edit(files: tuple[str, ...], output_dir: str, edit) -> None:
    """Read ``files``, apply ``edit(states) -> (new_states, report)``, write like redist. A state
    that does not fit the configuration is an error of FILES."""
    from energon.errors import NotSimulableError, StateError

    read = read_states(files, "FILES")
    try:
        with blame("FILES", StateError):
            new_states, report = edit(_by_rank(read))
    except NotSimulableError as e:
        raise click.ClickException(str(e)) from e
    for line in report.lines():
        click.echo(line)
    count = write_states(read, new_states, output_dir)
    click.echo(f"Wrote {count} file(s) to {output_dir}")


_STATE_FILES = click.argument("files", nargs=-1, required=True, type=InputPath("file"))
_OUTPUT = click.argument("output_dir", type=OutputPath("dir"))
_CONFIG = click.option(
    "--config",
    type=InputPath("dataset", remote=True),
    help="The training configuration (dataset or metadataset); default: rebuilt from the state.",
)


@command.command(name="skip")
@_STATE_FILES
@_OUTPUT
@click.option("--steps", type=STEP, required=True, help="Steps to skip (0: none).")
@click.option("--micro-batches-per-step", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--read-data",
    is_flag=True,
    help="If hooks decide from decoded data, run the real pipeline over the skipped steps.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@_CONFIG
@dataset_options
def skip(
    files: tuple[str, ...],
    output_dir: str,
    steps: int,
    micro_batches_per_step: int,
    read_data: bool,
    no_progress: bool,
    config: str | None,
    **kwargs,
) -> None:
    """States that resume STEPS steps later, as if those batches had been consumed (nothing is
    read unless --read-data); the ledger shows the skipped steps as skipped."""
    from energon.cursor.skip import skip_steps

    options = pop_options(kwargs)

    def edit(states: list[dict]):
        return skip_steps(
            states,
            steps,
            dataset=_dataset_for(config, options, states),
            micro_batches_per_step=micro_batches_per_step,
            read_data=read_data,
            progress=not no_progress,
        )

    _edit(files, output_dir, edit)


@command.command(name="exclude")
@_STATE_FILES
@_OUTPUT
@click.option("--key", "keys", multiple=True, help="A sample key to exclude (repeatable).")
@click.option("--keys-file", type=InputPath("file"), help="A file with one sample key per line.")
@click.option("--shard", "shards", multiple=True, help="A shard (name in the split, or path).")
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    type=DATASET_NAME,
    help="A dataset path, relative or absolute (or a source number), whose every sample is "
    "excluded.",
)
@click.option(
    "--within",
    multiple=True,
    type=DATASET_NAME,
    help="Look keys and shards up in this dataset only (spelled as --dataset; repeatable; "
    "default: every dataset).",
)
@_CONFIG
@dataset_options
def exclude(
    files: tuple[str, ...],
    output_dir: str,
    keys: tuple[str, ...],
    keys_file: str | None,
    shards: tuple[str, ...],
    datasets: tuple[str, ...],
    within: tuple[str, ...],
    config: str | None,
    **kwargs,
) -> None:
    """States that never deliver the given samples again; every other sample keeps its order."""
    from energon.cursor.exclude import exclude_samples

    options = pop_options(kwargs)
    all_keys = list(keys)
    if keys_file is not None:
        with open(keys_file) as f:
            all_keys += [line.strip() for line in f if line.strip()]
    if not (all_keys or shards or datasets):
        raise click.UsageError("give --key, --keys-file, --shard or --dataset")

    def edit(states: list[dict]):
        return exclude_samples(
            states,
            keys=all_keys,
            shards=shards,
            datasets=datasets,
            within=within,
            dataset=_dataset_for(config, options, states),
        )

    _edit(files, output_dir, edit)


@command.command(name="migrate")
@_STATE_FILES
@_OUTPUT
@click.option(
    "--config",
    type=InputPath("dataset", remote=True),
    required=True,
    help="The edited configuration.",
)
@dataset_options
def migrate(files: tuple[str, ...], output_dir: str, config: str, **kwargs) -> None:
    """States for an edited configuration (weights changed, sources added or removed): continuing
    sources keep their place, new ones start at their beginning, removed ones are dropped."""
    from energon.cursor.migrate import migrate_states

    options = pop_options(kwargs)

    def edit(states: list[dict]):
        from energon.cli.dataset_options import build_dataset

        return migrate_states(states, build_dataset(config, options, states, "--config"))

    _edit(files, output_dir, edit)


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
