"""How an ``energon`` command fails: one line that names the argument and what was expected, and
an exit status from a short list; never a traceback, unless asked for (``energon --debug CMD`` or
``ENERGON_DEBUG=1``), for bug reports.

Exit statuses (the list in docs/cli.md):

=====  =======================================================================================
0      success
1      the command ran and failed: a dataset, state, configuration or file is not what it must
       be, or could not be read or written (the line names it)
2      usage: an argument or option is wrong (missing, unknown, out of range, a path that does
       not exist or is of the wrong kind, a split or dataset the configuration does not have)
70     internal error: a bug in energon (the line says so; ``--debug`` shows the traceback)
=====  =======================================================================================

The ``energon`` group (:mod:`energon.cli.main`) sends every error of every command through
:func:`as_failure`; commands themselves only raise (``click`` errors, the library's errors, or
:func:`energon.cli.arguments.bad_input`).
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from typing import Any

import click

from energon.errors import ArgumentError, EnergonError

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70
EXIT_STATUSES = (0, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL)
DEBUG_ENV = "ENERGON_DEBUG"


def debug_requested(flag: bool = False) -> bool:
    """``--debug`` given, or ``ENERGON_DEBUG`` set to anything but empty, 0, false or no."""
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def failure(message: str, exit_code: int) -> click.ClickException:
    """A failed command, worded: click shows it as one ``Error:`` line and exits with
    ``exit_code`` (in standalone mode; a caller of ``main(standalone_mode=False)`` catches it)."""
    error = click.ClickException(one_line(message))
    error.exit_code = exit_code
    return error


def one_line(text: str) -> str:
    """A message on one line: its lines joined with '; ' (with ' ' after a line that ends in a
    colon; indentation dropped)."""
    out = ""
    for line in (part.strip() for part in str(text).splitlines()):
        if line:
            out += ("" if not out else " " if out.endswith(":") else "; ") + line
    return out


def passes_through(error: BaseException) -> bool:
    """Errors ``click`` itself must handle: exits, aborts, help shown for a bare group, a closed
    pipe."""
    if isinstance(error, click.exceptions.Exit | click.Abort | click.exceptions.NoArgsIsHelpError):
        return True
    return isinstance(error, OSError) and error.errno == errno.EPIPE


def as_failure(
    error: BaseException, ctx: click.Context, args: list[str], debug: bool
) -> click.ClickException:
    """``error`` of the command that ``args`` name (below the group ``ctx``), as one line."""
    if debug:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    if isinstance(error, click.UsageError):
        return failure(f"{error.format_message()} {_help_hint(error.ctx)}", EXIT_USAGE)
    if isinstance(error, click.ClickException):
        return failure(error.format_message(), error.exit_code)
    params = _command_params(ctx, args)
    if isinstance(error, ArgumentError):
        where = " / ".join(_spelled(params, name) for name in error.argument.split("/"))
        return failure(f"Invalid value for {where}: {error.reason}", EXIT_USAGE)
    if isinstance(error, OSError) and not isinstance(error, EnergonError):
        return failure(_os_error_text(error, params), EXIT_FAILED)
    if isinstance(error, EnergonError):
        return failure(str(error) or type(error).__name__, EXIT_FAILED)
    return failure(
        f"internal error: {type(error).__name__}: {error} (a bug in energon: run it again with "
        f"--debug or {DEBUG_ENV}=1 and report the traceback)",
        EXIT_INTERNAL,
    )


def _help_hint(ctx: click.Context | None) -> str:
    return f"(Try '{ctx.command_path} -h' for help.)" if ctx is not None else ""


def _command_params(ctx: click.Context, args: list[str]) -> dict[str, tuple[click.Parameter, Any]]:
    """name -> (parameter, value) of the command ``args`` run, parsed again without running
    anything (the failed command's own context is gone by now)."""
    try:
        while isinstance(ctx.command, click.Group) and args:
            name, command, args = ctx.command.resolve_command(ctx, args)
            if command is None or name is None:
                break
            ctx = command.make_context(name, list(args), parent=ctx, resilient_parsing=True)
            args = [*ctx._protected_args, *ctx.args]
    except click.ClickException:
        pass
    return {p.name: (p, ctx.params.get(p.name)) for p in ctx.command.params if p.name}


def _spelled(params: dict[str, tuple[click.Parameter, Any]], name: str) -> str:
    """How the command line spells the function argument ``name`` (``from_step``:
    ``'--from-step'``); the name itself where the command has no such option."""
    found = params.get(name)
    if found is None:
        return f"'{name}'"
    param = found[0]
    if isinstance(param, click.Option):
        return f"'{max(param.opts, key=len)}'"
    return f"'{param.human_readable_name}'"


def _os_error_text(error: OSError, params: dict[str, tuple[click.Parameter, Any]]) -> str:
    """``--output /x/y: No such file or directory`` where a parameter holds the file, else the
    file and the reason."""
    text = error.strerror or str(error)
    if not error.filename:
        return text
    target = os.path.abspath(os.fspath(error.filename))
    for name, (_, value) in params.items():
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, str | os.PathLike) and os.path.abspath(v) == target for v in values):
            return f"{_spelled(params, name)} {error.filename}: {text}"
    return f"{error.filename}: {text}"
