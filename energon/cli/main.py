"""The ``energon`` command group.

Verbs live in their own modules (each defines a click ``command``) and are imported only when
used, so ``energon prepare`` does not pay for importing what ``energon preview`` needs, and a verb
whose module is missing or broken does not take the others down.

Every error of every verb ends here: one line and an exit status from a short list
(:mod:`energon.cli.failures`; ``--debug`` or ``ENERGON_DEBUG=1`` adds the traceback). Verbs read
their arguments through :mod:`energon.cli.arguments`.
"""

from __future__ import annotations

import importlib
from importlib import metadata

import click

from energon.cli import failures

# Verb name -> module defining ``command``. Add new verbs here.
COMMANDS: dict[str, str] = {
    "prepare": "energon.cli.prepare",
    "info": "energon.cli.info",
    "lint": "energon.cli.lint",
    "preview": "energon.cli.preview",
    "checkpoint": "energon.cli.checkpoint",
    "ledger": "energon.cli.ledger",
    "analyze-debug": "energon.cli.analyze_debug",
    "demo": "energon.cli.demo",
    "preprocess": "energon.cli.preprocess",
    "merge": "energon.cli.merge",
    "build-sequences": "energon.cli.build_sequences",
    "prepare-cache": "energon.cli.prepare_cache",
    "prepare-media": "energon.cli.prepare_media",
    "demo-av": "energon.cli.demo_av",
    "blend-plan": "energon.cli.blend_plan",
    "simulate": "energon.cli.simulate",
    "report": "energon.cli.report",
    "mount": "energon.cli.mount",
}

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def package_version() -> str:
    try:
        return metadata.version("energon-loader")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _unavailable(name: str, error: BaseException) -> click.Command:
    """Stands in for a verb whose module failed to import, and says why when invoked."""

    @click.command(name=name, help=f"(unavailable: {error})", context_settings=CONTEXT_SETTINGS)
    def command() -> None:
        raise click.ClickException(
            f"'energon {name}' is unavailable: {type(error).__name__}: {error}"
        )

    return command


class LazyGroup(click.Group):
    """A group that imports a verb's module only when that verb is listed or run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self.get_command(ctx, name) is not None]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as e:
            if failures.passes_through(e):
                raise
            raise failures.as_failure(e, ctx, [], failures.debug_requested()) from e

    def invoke(self, ctx: click.Context) -> object:
        """Run the verb; any error becomes one line (see :mod:`energon.cli.failures`)."""
        args = [*ctx._protected_args, *ctx.args]
        try:
            return super().invoke(ctx)
        except Exception as e:
            if failures.passes_through(e):
                raise
            debug = failures.debug_requested(bool(ctx.params.get("debug")))
            raise failures.as_failure(e, ctx, args, debug) from e

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMANDS.get(cmd_name)
        if module_name is None:
            return None
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                return None  # verb not written yet
            return _unavailable(cmd_name, e)
        except Exception as e:  # a broken verb must not break the others
            return _unavailable(cmd_name, e)
        return getattr(module, "command", None)


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS, invoke_without_command=True)
@click.version_option(
    package_version(), "-V", "--version", prog_name="energon-loader", message="%(prog)s %(version)s"
)
@click.option(
    "--debug",
    is_flag=True,
    help=f"Show the traceback of an error (also: {failures.DEBUG_ENV}=1), for bug reports.",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """energon: prepare, inspect and check multimodal datasets (Megatron-Energon compatible)."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """A click option callback (Megatron-Energon's name): print the version and exit."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"energon-loader {package_version()}")
    ctx.exit()


def __getattr__(name: str) -> click.Command:
    """``prepare_command``, ``prepare_media_command``, ...: each verb's click command under
    Megatron-Energon's name, imported on first use like the verbs themselves."""
    verb = name[: -len("_command")].replace("_", "-") if name.endswith("_command") else None
    if verb in COMMANDS:
        return importlib.import_module(COMMANDS[verb]).command
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The ``energon`` command; Megatron-Energon's ``cli.main.main`` is the click group itself, which
# scripts invoke as a command (``main()``) or pass to ``click.testing.CliRunner().invoke(main, ...)``.
main = cli


if __name__ == "__main__":
    main()
