"""The training-dataset options of ``energon ledger`` and ``energon checkpoint skip|exclude|migrate``.

They mirror ``get_train_dataset``'s arguments (and ``WorkerConfig``'s). Given saved states, every
option left out is taken from the states (their fingerprint records the seed, batch size, shuffle
buffer, slicing, packing, the task encoder's class, the number of logical streams and the world
size), so ``energon ledger data.yaml --state ckpt/*.pt --step N`` needs nothing else. Without states
the options that shape the order must be given: what the ledger says is only true for the settings
the training used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from energon.cli.arguments import blame, check_split

_NONE = "none"  # given as 'none' (an option left out is None)


class _IntOrNone(click.ParamType):
    """An integer >= ``low``, or ``none``."""

    def __init__(self, low: int) -> None:
        self.low = low
        self.name = f"INT>={low}|none"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | str | None:
        if value is None or value == _NONE:
            return value
        if str(value).lower() == _NONE:
            return _NONE
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < self.low:
            self.fail(f"{value!r} is not an integer >= {self.low} or 'none'", param, ctx)
        return number


_OPTIONS = [
    ("--world-size", click.IntRange(min=1), "Data-parallel ranks of the training job."),
    (
        "--num-workers",
        click.IntRange(min=0),
        "Loader workers per rank (the logical streams default to ranks x workers).",
    ),
    (
        "--num-streams",
        click.IntRange(min=1),
        "Logical streams (when training fixed them with num_streams=...).",
    ),
    ("--batch-size", _IntOrNone(1), "Micro-batch size ('none': no batching)."),
    ("--shuffle-buffer-size", _IntOrNone(0), "Shuffle buffer size ('none': no buffer)."),
    ("--max-samples-per-sequence", _IntOrNone(1), "Slice length ('none': whole shards)."),
    ("--parallel-shard-iters", click.IntRange(min=1), "Slices open at once per stream."),
    ("--packing-buffer-size", _IntOrNone(0), "Packing buffer size."),
    ("--group-max-wait", _IntOrNone(1), "Grouping: flush a bucket after this many samples."),
    ("--seed-offset", int, "WorkerConfig.seed_offset."),
    ("--split-part", str, "The split to read (default: train)."),
    ("--shuffle-over-epochs-multiplier", _IntOrNone(-1), "As get_train_dataset's."),
    ("--task-encoder", str, "Task encoder class, module:Class (made without arguments)."),
    (
        "--balance",
        str,
        "Compute-balanced steps as trained with balance=Balance(...): MAX_LENGTH[:WINDOW] "
        "(the built-in cost; taken from the states when given).",
    ),
]


def dataset_options(fn: Callable) -> Callable:
    """Add the dataset options to a click command (read them back with :func:`pop_options`)."""
    for flag, kind, text in reversed(_OPTIONS):
        fn = click.option(flag, type=kind, default=None, help=text)(fn)
    return fn


def option_names() -> list[str]:
    return [flag[2:].replace("-", "_") for flag, _, _ in _OPTIONS]


def pop_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The dataset options given on the command line (others are left out)."""
    given = {}
    for name in option_names():
        value = kwargs.pop(name, None)
        if value is not None:
            given[name] = None if value == _NONE else value
    return given


def from_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The dataset options recorded in saved states."""
    if not states:
        return {}
    state = states[0]
    fp = state["fingerprint"]
    multipliers = {d.get("shuffle_over_epochs") for d in fp["datasets"]}
    found = {
        "world_size": state["world_size"],
        "num_streams": state["num_streams"],
        "batch_size": fp["batch_size"],
        "shuffle_buffer_size": fp["shuffle_buffer_size"],
        "max_samples_per_sequence": fp["max_samples_per_sequence"],
        "parallel_shard_iters": fp["parallel_shard_iters"],
        "packing_buffer_size": fp["packing_buffer_size"],
        "group_max_wait": fp["group_max_wait"],
        "seed_offset": fp["seed"],
        "task_encoder": fp["task_encoder"],
    }
    if len(multipliers) == 1:
        found["shuffle_over_epochs_multiplier"] = multipliers.pop()
    if fp.get("balance") is not None:
        found["balance"] = fp["balance"]
    if fp["datasets"]:
        found["split_part"] = fp["datasets"][0]["split_part"] or "train"
    return found


def build_dataset(
    config: str, given: dict[str, Any], states: list[dict[str, Any]], config_hint: str = "CONFIG"
) -> Any:
    """``get_train_dataset(config, ...)`` with the given options, the rest from the states; an
    error about the configuration is one line naming ``config_hint``."""
    if "split_part" in given:
        check_split(config, given["split_part"], "--split-part")
    options = {**from_states(states), **given}
    _check_required(options)
    with blame(config_hint):
        return _train_dataset(config, options)


def _check_required(options: dict[str, Any]) -> None:
    for required in ("batch_size", "shuffle_buffer_size", "max_samples_per_sequence"):
        if required not in options:
            raise click.UsageError(
                f"--{required.replace('_', '-')} is required without --state (use the training's "
                "value; 'none' is allowed)"
            )
    if "num_streams" not in options and "num_workers" not in options:
        raise click.UsageError("--num-workers (or --num-streams) is required without --state")


def _train_dataset(config: str, options: dict[str, Any]) -> Any:
    from energon import WorkerConfig, get_train_dataset

    worker_config = WorkerConfig(
        rank=0,
        world_size=options.get("world_size", 1),
        num_workers=options.get("num_workers", 0),
        seed_offset=options.get("seed_offset", 0),
    )
    kwargs: dict[str, Any] = {}
    for name in ("num_streams", "parallel_shard_iters", "group_max_wait"):
        if options.get(name) is not None:
            kwargs[name] = options[name]
    if "shuffle_over_epochs_multiplier" in options:
        kwargs["shuffle_over_epochs_multiplier"] = options["shuffle_over_epochs_multiplier"]
    if options.get("balance") is not None:
        kwargs["balance"] = make_balance(options["balance"])
    task_encoder = options.get("task_encoder")
    return get_train_dataset(
        config,
        split_part=options.get("split_part") or "train",
        worker_config=worker_config,
        batch_size=options["batch_size"],
        shuffle_buffer_size=options["shuffle_buffer_size"],
        max_samples_per_sequence=options["max_samples_per_sequence"],
        packing_buffer_size=options.get("packing_buffer_size"),
        task_encoder=make_task_encoder(task_encoder) if task_encoder else None,
        **kwargs,
    )


def make_balance(value: str | dict[str, Any]) -> Any:
    """A :class:`~energon.balance.Balance` from ``--balance MAX_LENGTH[:WINDOW]`` or from a
    state's fingerprint (only the built-in cost and no group can be rebuilt from a state)."""
    from energon.balance import Balance, MultimodalCost

    if isinstance(value, str):
        length, _, window = value.partition(":")
        try:
            return Balance(int(length), window=int(window) if window else 8)
        except ValueError as e:
            raise click.BadParameter(f"--balance expects MAX_LENGTH[:WINDOW], got {value!r}") from e
    cost = value.get("cost", {})
    builtin = f"{MultimodalCost.__module__}.{MultimodalCost.__qualname__}"
    if cost.get("type") != builtin or value.get("group") is not None:
        raise click.UsageError(
            f"the states were saved with balanced steps using cost {cost.get('type')!r} and group "
            f"{value.get('group')!r}, which the command line cannot rebuild; use the Python API "
            "(energon.ledger.ledger.Ledger) with the training's dataset"
        )
    return Balance(
        value["max_length"],
        cost=MultimodalCost(**cost.get("params", {})),
        over_length=value.get("over_length", "truncate"),
        window=value.get("window", 1),
    )


def make_task_encoder(name: str) -> Any:
    """An instance of ``module:Class`` (or ``module.Class``), made without arguments."""
    from energon.cursor.rebuild import make_task_encoder as make

    try:
        return make(name)
    except ValueError as e:
        raise click.UsageError(
            f"{e}; pass --task-encoder module:Class of a class that needs no arguments"
        ) from e
