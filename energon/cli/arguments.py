"""How every ``energon`` command reads its arguments, so that the same spelling means the same
thing everywhere and a bad one is answered in one line that names it (docs/cli.md, "Bad input").

- Paths: :class:`InputPath` (must exist, and be a file or a folder as the command needs) and
  :class:`OutputPath` (where the command may write). A relative path means the same as the
  absolute one: commands get the absolute path. ``s3://`` / ``msc://`` URLs pass where a command
  reads remote data.
- Steps: :data:`STEP` (an integer >= 0), :class:`StepRange` (``A:B``, steps A to B-1) and
  :func:`step_span` (``--from-step``/``--until-step``): negative, empty and reversed ranges are
  errors that say so.
- Dataset names (:data:`DATASET_NAME`): a path, relative or absolute, or a source number, matched
  by the library's :func:`energon.cursor.exclude.sources_named` (``--dataset`` and ``--within``
  alike, and the Python API too).
- Split names: :class:`SplitNames` (a comma-separated list) and :func:`check_split` (the split must
  exist in the configuration).
- Saved states: :func:`read_states`, and :func:`blame`, which puts the argument's name on an error
  the library raises about it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import click

from energon import epath
from energon.errors import ArgumentError, EnergonError


def bad_input(argument: str, message: str) -> click.ClickException:
    """An argument was read and its content is wrong (a damaged state, a dataset that is not
    prepared): exit status 1, one line that starts with the argument."""
    return click.ClickException(f"{argument}: {message}")


# -- paths ------------------------------------------------------------------------------------
class InputPath(click.ParamType):
    """A path to read: ``kind`` ``"file"``, ``"dir"``, ``"any"`` or ``"dataset"`` (a folder, a
    file, or a Megatron token prefix: ``PATH.idx`` exists); it must exist (unless
    ``exists=False``). The value is the absolute path (a ``path_type``), or a normalised URL when
    ``remote`` allows one (whether it exists is found out on use)."""

    name = "path"

    def __init__(
        self, kind: str = "any", *, exists: bool = True, remote: bool = False, path_type: type = str
    ) -> None:
        self.kind = kind
        self.exists = exists
        self.remote = remote
        self.path_type = path_type

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        text = os.fspath(value)
        if epath.is_remote(text):
            if not self.remote:
                self.fail(f"{text!r} is a URL; this command reads local {self._what()}", param, ctx)
            return epath.normalize(text)
        path = os.path.abspath(text)
        if self.kind == "dataset" and not os.path.exists(path) and os.path.exists(path + ".idx"):
            return self.path_type(path)  # a Megatron token prefix
        if os.path.exists(path):
            if self.kind == "file" and os.path.isdir(path):
                self.fail(f"{text!r} is a folder; expected a file", param, ctx)
            if self.kind == "dir" and not os.path.isdir(path):
                self.fail(f"{text!r} is a file; expected a folder", param, ctx)
        elif self.exists:
            self.fail(f"{text!r} does not exist (expected {self._what()})", param, ctx)
        return self.path_type(path)

    def _what(self) -> str:
        return {
            "file": "a file",
            "dir": "a folder",
            "dataset": "a dataset folder, a metadataset .yaml, a .jsonl file or a token prefix",
        }.get(self.kind, "a file or a folder")


class OutputPath(click.ParamType):
    """A path to write: ``kind`` ``"file"`` (its folder must exist and be writable; an existing
    folder is refused) or ``"dir"`` (an existing file is refused; a missing folder is created, so
    its nearest existing parent must be a writable folder). The value is the absolute path."""

    name = "path"

    def __init__(self, kind: str = "file", *, path_type: type = str) -> None:
        self.kind = kind
        self.path_type = path_type

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        text = os.fspath(value)
        path = os.path.abspath(text)
        if self.kind == "file" and os.path.isdir(path):
            self.fail(f"{text!r} is a folder; expected a file to write", param, ctx)
        if self.kind == "dir" and os.path.exists(path) and not os.path.isdir(path):
            self.fail(f"{text!r} is a file; expected a folder to write into", param, ctx)
        parent = os.path.dirname(path) if self.kind == "file" else path
        if self.kind == "dir":
            while not os.path.exists(parent):
                parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            where = "does not exist" if not os.path.exists(parent) else "is not a folder"
            self.fail(f"cannot write {text!r}: {parent} {where}", param, ctx)
        if not os.access(parent, os.W_OK | os.X_OK):
            self.fail(f"cannot write {text!r}: {parent} is not writable", param, ctx)
        return self.path_type(path)


# -- steps ------------------------------------------------------------------------------------
class _Step(click.ParamType):
    name = "STEP"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        try:
            number = int(str(value))
        except ValueError:
            number = -1
        if number < 0:
            self.fail(f"{value!r} is not a step (expected an integer >= 0)", param, ctx)
        return number


STEP = _Step()


class StepRange(click.ParamType):
    """``A:B``: steps A to B-1 (``range(A, B)``), with 0 <= A < B."""

    name = "A:B"

    def convert(self, value: Any, param: Any, ctx: Any) -> range:
        if isinstance(value, range):
            return value
        start, sep, stop = str(value).partition(":")
        try:
            if not sep:
                raise ValueError
            first, end = int(start), int(stop)
        except ValueError:
            self.fail(f"expected A:B (steps A to B-1), got {value!r}", param, ctx)
        if first < 0 or end < 0:
            self.fail(f"{value!r}: steps are integers >= 0", param, ctx)
        if first == end:
            self.fail(f"{value!r} is an empty range (A:B means steps A to B-1)", param, ctx)
        if first > end:
            self.fail(f"{value!r} is reversed (A:B means steps A to B-1: give A < B)", param, ctx)
        return range(first, end)


def step_span(first: int, until: int, hints: tuple[str, str]) -> range:
    """Steps ``first`` to ``until - 1`` of two options (e.g. ``--from-step``/``--until-step``):
    an empty or reversed span is a usage error that says so."""
    where = f"'{hints[0]}' / '{hints[1]}'"
    if first == until:
        raise click.BadParameter(
            f"{hints[0]} {first} and {hints[1]} {until} make an empty range (steps "
            f"{hints[0]} to {hints[1]} - 1)",
            param_hint=where,
        )
    if first > until:
        raise click.BadParameter(
            f"{hints[0]} {first} is after {hints[1]} {until} (steps {hints[0]} to "
            f"{hints[1]} - 1: give {hints[0]} < {hints[1]})",
            param_hint=where,
        )
    return range(first, until)


# -- dataset and split names ------------------------------------------------------------------
class _DatasetName(click.ParamType):
    """A dataset of the configuration: its path (relative or absolute: the same) or its source
    number. The library matches it (:func:`energon.cursor.exclude.sources_named`, the one place
    that reads dataset names), so the Python API takes the same spellings; an unknown name is a
    usage error of the option."""

    name = "DATASET"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip()
        if not text:
            self.fail("expected a dataset path or a source number, got ''", param, ctx)
        return text


DATASET_NAME = _DatasetName()


class SplitNames(click.ParamType):
    """Comma-separated split names (``train,val``): a list without blanks or repeats."""

    name = "SPLITS"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[str]:
        if isinstance(value, list):
            return value
        names = list(dict.fromkeys(s.strip() for s in str(value).split(",") if s.strip()))
        if not names:
            self.fail(f"expected split names such as train,val, got {value!r}", param, ctx)
        return names


def splits_of(config: str | os.PathLike, split_config: str | None = None) -> list[str] | None:
    """The splits a local dataset or metadataset defines (None: it cannot tell, e.g. JSONL, a
    token prefix or a remote path, whose every split is the whole data)."""
    path = os.fspath(config)
    if epath.is_remote(path):
        return None
    if os.path.isfile(path) and path.endswith((".yaml", ".yml")):
        from energon.metadataset.config import load_metadataset

        return sorted(load_metadataset(path).splits)
    if os.path.isdir(path):
        from energon.format.split import read_split

        try:
            args = (path,) if split_config is None else (path, split_config)
            return sorted(read_split(*args).split_parts)
        except (EnergonError, OSError):
            return None  # not prepared: the command says so when it opens it
    return None


def check_split(
    config: str | os.PathLike, split: str, hint: str, split_config: str | None = None
) -> None:
    """``split`` must be a split of ``config`` (where that can be known)."""
    try:
        known = splits_of(config, split_config)
    except (EnergonError, OSError):
        return  # a broken config: opening it says what is wrong
    if known is not None and split not in known:
        raise click.BadParameter(
            f"{config} has no split {split!r} (its splits: {', '.join(known) or 'none'})",
            param_hint=f"'{hint}'",
        )


def chosen_splits(
    config: str | os.PathLike, names: list[str], hint: str, split_config: str | None = None
) -> list[str]:
    """The splits a command should visit: the option's default list as it is (the command skips
    the splits a dataset does not have), but a list the user gave must name splits the dataset
    has (a usage error of ``hint`` otherwise)."""
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if hint in getattr(p, "opts", ()))
    if ctx.get_parameter_source(param.name) is click.core.ParameterSource.DEFAULT:
        return names
    for name in names:
        check_split(config, name, hint, split_config)
    return names


# -- saved states and library errors ----------------------------------------------------------
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
    """One state file (JSON or ``torch.save``), its states checked."""
    from energon.state import check_state_shape, load_state_file, state_file_format

    obj = load_state_file(path)
    wrapper = None
    if isinstance(obj, dict) and "dataloader_state_dict" in obj:
        wrapper, obj = obj, obj["dataloader_state_dict"]
    holds_list = isinstance(obj, list)
    states = [check_state_shape(s) for s in (obj if holds_list else [obj])]
    return StateFile(path, state_file_format(path), wrapper, states, holds_list)


def read_states(paths: tuple[str, ...] | list[str], hint: str) -> list[StateFile]:
    """The :class:`StateFile` of every file (a folder: every file in it); a file that is no
    loader state is one line naming ``hint`` and the file."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, name) for name in os.listdir(path))
        else:
            files.append(path)
    read = []
    for path in files:
        with blame(f"{hint} {path}"):
            read.append(read_state_file(path))
    return read


@contextlib.contextmanager
def blame(argument: str, *kinds: type[BaseException]) -> Iterator[None]:
    """Errors of ``kinds`` (default: every ``EnergonError`` and ``OSError``) raised inside are
    about ``argument``: one line naming it, exit status 1. An :class:`ArgumentError` names its own
    argument and passes (the ``energon`` group spells it as the option), unless ``kinds`` lists it:
    then it is a usage error of ``argument`` (exit status 2)."""
    try:
        yield
    except ArgumentError as e:
        if kinds and isinstance(e, kinds):
            raise click.BadParameter(e.reason, param_hint=f"'{argument}'") from e
        raise
    except (EnergonError, OSError) as e:
        if kinds and not isinstance(e, kinds):
            raise
        raise bad_input(argument, _text(e)) from e


def _text(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return str(error)
