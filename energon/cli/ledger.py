"""``energon ledger CONFIG``: which samples a training step saw, and how often each sample was seen.

No sample is read: the steps are computed from the configuration, the seed and the cursor (see
docs/ledger.md). Examples::

    energon ledger data.yaml --world-size 8 --num-workers 2 --batch-size 4 \\
        --shuffle-buffer-size 100 --max-samples-per-sequence 100 --step 1200
    energon ledger data.yaml --state ckpt/loader_rank*.pt --steps 1200:1210 --format jsonl
    energon ledger data.yaml --state ckpt/loader_rank*.pt --until-step 5000 --export exposure/
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from energon.cli.arguments import (
    STEP,
    InputPath,
    OutputPath,
    StepRange,
    blame,
    read_states,
    step_span,
)
from energon.cli.dataset_options import build_dataset, dataset_options, pop_options


@click.command(name="ledger")
@click.argument("config", type=InputPath("dataset", remote=True))
@click.option("--step", type=STEP, help="Describe this global step.")
@click.option("--steps", "step_range", type=StepRange(), help="Describe steps A:B (A to B-1).")
@click.option(
    "--until-step", type=STEP, help="Count exposures over steps 0 to N-1 (with --export)."
)
@click.option("--from-step", type=STEP, default=0, show_default=True, help="With --until-step.")
@click.option("--export", "export_dir", type=OutputPath("dir"), help="Exposure output.")
@click.option(
    "--state",
    "state_files",
    multiple=True,
    type=InputPath(),
    help="Saved loader states to start from: files or folders of them (any ranks, any save "
    "points; repeat the option).",
)
@click.option("--journal", type=InputPath("dir"), help="Loader journal.")
@click.option(
    "--micro-batches-per-step",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Gradient accumulation: micro-batches each rank takes per step.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "jsonl"]),
    default="text",
    show_default=True,
)
@click.option(
    "--strict",
    is_flag=True,
    help="Assume nothing about the task encoder's hooks: steps they could change are only "
    "answered from the journal.",
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--no-native", is_flag=True, help="Do not use the compiled inner loop.")
@dataset_options
def command(
    config: str,
    step: int | None,
    step_range: range | None,
    until_step: int | None,
    from_step: int,
    export_dir: str | None,
    state_files: tuple[str, ...],
    journal: str | None,
    micro_batches_per_step: int,
    output_format: str,
    strict: bool,
    no_progress: bool,
    no_native: bool,
    **kwargs: Any,
) -> None:
    """Describe training steps of CONFIG (a dataset or metadataset) without reading data: every
    micro-batch of every rank, every sample's key, dataset, split, shard, byte offset, epoch and
    subflavors; or (--until-step N --export DIR) how often each sample was seen."""
    from energon.errors import NotSimulableError, StateError
    from energon.ledger.ledger import Ledger

    chosen = [x is not None for x in (step, step_range, until_step)]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --step, --steps and --until-step")
    if (until_step is None) != (export_dir is None):
        raise click.UsageError("--until-step and --export go together")
    if until_step is not None:
        step_span(from_step, until_step, ("--from-step", "--until-step"))
    states = [s for f in read_states(state_files, "--state") for s in f.states]
    dataset = build_dataset(config, pop_options(kwargs), states)
    with blame("--state", StateError):
        ledger = Ledger(
            dataset,
            states=states,
            journal=journal,
            micro_batches_per_step=micro_batches_per_step,
            native=not no_native,
            strict=strict,
        )
    try:
        if until_step is not None:
            _export(ledger, export_dir, from_step, until_step, not no_progress)
            return
        steps = range(step, step + 1) if step is not None else step_range
        assert steps is not None
        _describe(ledger, steps, output_format, not no_progress)
    except (NotSimulableError, StateError) as e:
        raise click.ClickException(str(e)) from e


def _export(ledger: Any, directory: str | None, first: int, until: int, progress: bool) -> None:
    from energon.ledger.exposure import export_exposures

    summary = export_exposures(
        ledger, directory, until_step=until, from_step=first, progress=progress
    )
    click.echo(f"Exposures of steps {first}..{until - 1} written to {directory}")
    for d in summary["datasets"]:
        click.echo(
            f"  {d['path']} [{d['split']}]: {d['exposures']} exposures, {d['samples_seen']} of "
            f"{d['samples']} samples seen, most seen {d['max_count']}x ({d['counts']})"
        )


def _describe(ledger: Any, steps: range, output_format: str, progress: bool) -> None:
    from tqdm import tqdm

    records = []
    with tqdm(steps, desc="Steps", unit="step", disable=not progress or len(steps) < 2) as bar:
        for step in bar:
            for record in ledger.describe_step(step):
                if output_format == "jsonl":
                    click.echo(json.dumps(record.to_json()))
                elif output_format == "text":
                    for line in text_lines(record):
                        click.echo(line)
                else:
                    records.append(record.to_json())
    if output_format == "json":
        json.dump(
            {"assumptions": ledger.assumptions, "micro_batches": records}, sys.stdout, indent=1
        )
        click.echo()
    elif output_format == "text":
        for assumption in ledger.assumptions:
            click.echo(f"(simulated entries assume: {assumption})")


def text_lines(record: Any) -> list[str]:
    """A micro-batch record as lines of text."""
    lines = [
        f"step {record.step} rank {record.rank} micro-batch {record.micro_batch}: position "
        f"{record.position} (stream {record.stream} item {record.item}) [{record.status}, "
        f"{record.origin}]"
    ]
    for sample in record.excluded:
        lines.append(f"  excluded (dropped here, not delivered): {sample.key}  {sample.dataset}")
    for sample in record.lost:
        lines.append(
            f"  lost (a loader worker died on it; skipped here): {sample.key}  {sample.dataset}"
        )
    for n, output in enumerate(record.outputs):
        if len(output) > 1:
            lines.append(f"  output {n}: packed from {len(output)} samples")
            indent = "    "
        else:
            indent = "  "
        for sample in output:
            epoch = "?" if sample.epoch is None else sample.epoch
            where = (
                f"{sample.shard} @ {sample.byte_offset}"
                if sample.byte_offset is not None
                else sample.shard
            )
            if sample.row is not None:
                where += f" row group {sample.row_group} row {sample.row}"
            if sample.part is not None:  # packing split the sample across packs
                start, stop = sample.part
                where += f" part {start}..{'end' if stop is None else stop}"
            flavors = f" {json.dumps(sample.subflavors)}" if sample.subflavors else ""
            lines.append(
                f"{indent}{sample.key}  {sample.dataset} [{sample.split}] {where} epoch {epoch}"
                f"{flavors}"
            )
    return lines
