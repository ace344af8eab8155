"""The ``tfgraph`` command line (README.md, "CLI reference").

Each command lives in its own module under ``tfgraph.commands`` and is registered below with
one line in ``COMMANDS``; a command's module is imported only when that command runs (or help
lists it), so ``tfgraph build`` does not pay for the imports of ``run``, ``draw`` or ``compare``. The error policy lives here, once, for every command:

- :class:`~tfgraph.errors.TfgraphError` (bad spec, bad argument): its one-line message on
  stderr, exit 2;
- click usage errors: click's message on one line, exit 2;
- a length past a spec's ``max_len`` that its positions allow (tfgraph.graph.lengths): one
  ``note: ...`` line on stderr, and the command goes on;
- anything else is a bug: ``tfgraph: internal error: ...`` on stderr, exit 1.

A Python traceback is printed only with ``tfgraph --debug``.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
import traceback
from typing import Any, NoReturn

import click

from tfgraph import __version__
from tfgraph.errors import TfgraphError
from tfgraph.graph.lengths import notes
from tfgraph.io import track_inputs
from tfgraph.terminal import MAX_LINE, one_line, printable

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


# command name -> module under tfgraph.commands defining a click command of the same name
COMMANDS = ("validate", "schema", "report", "draw", "compare", "build", "run", "generate",
            "import", "plan")
# commands whose module and function cannot carry the command's name (``import`` is a keyword)
_MODULE_NAMES = {"import": "hf_import"}


class _Group(click.Group):
    """A click group that applies tfgraph's error policy to every subcommand and imports each
    subcommand's module on first use (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)  # commands added with add_command
        attribute = _MODULE_NAMES.get(cmd_name, cmd_name)
        module = importlib.import_module(f"tfgraph.commands.{attribute}")
        command: click.Command = getattr(module, attribute)
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        debug = "--debug" in args  # before click's parser consumes args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:  # the group's own options (tfgraph --bogus)
            _usage_error(exc)
        except OSError as exc:  # the group's eager options (tfgraph --help > /dev/full)
            _output_error(exc, debug)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run with tfgraph's signal policy: SIGINT and SIGTERM unwind the command (every
        staged output is removed on the way), then one line and exit 130 or 143."""
        from tfgraph.cli_support import start_command

        start_command()
        previous = _install_signal_policy()
        try:
            return super().main(*args, **kwargs)
        except Interrupted as exc:
            _restore(previous)
            _say_interrupted(exc.signum)
            sys.exit(128 + exc.signum)
        finally:
            _restore(previous)

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.get("debug"))
        track_inputs()  # no output of this command may be one of its inputs (tfgraph.io)
        try:
            # A length past a spec's max_len that its positions allow is one `note:` line on
            # stderr (tfgraph.graph.lengths), however many checks meet it.
            with notes(lambda text: click.echo(f"note: {printable(text)}", err=True)):
                return super().invoke(ctx)
        except TfgraphError as exc:
            if debug:
                traceback.print_exc()
            click.echo(one_line(printable(str(exc))), err=True)
            ctx.exit(exc.exit_code)
        except click.UsageError as exc:
            _usage_error(exc)
        except click.ClickException as exc:
            # Usage errors already exit 2; other click errors (e.g. an unopenable file
            # argument) are the user's to fix too, so they exit 2 rather than 1.
            # click annotates exit_code as a ClassVar; an instance value is what click reads.
            exc.exit_code = 2  # type: ignore[misc]
            raise
        except (click.exceptions.Exit, click.Abort, Interrupted):
            raise
        except KeyboardInterrupt:  # raised by code that bypasses the handler below
            raise Interrupted(signal.SIGINT) from None
        except OSError as exc:
            _output_error(exc, debug)
        except Exception as exc:  # noqa: BLE001 - the one place that turns bugs into exit 1
            if debug:
                traceback.print_exc()
            detail = " ".join(str(exc).split()) or type(exc).__name__
            hint = "" if debug else " (run with --debug for the traceback)"
            click.echo(one_line(f"tfgraph: internal error: {type(exc).__name__}: "
                                f"{printable(detail)}", MAX_LINE - len(hint)) + hint, err=True)
            ctx.exit(1)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind (a BaseException, so ``except Exception`` does not
    swallow it and click does not turn it into "Aborted!")."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)


def _on_signal(signum: int, frame: Any) -> None:
    # Ignore repeats while unwinding: the clean-up runs once, to the end.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def _install_signal_policy() -> dict[int, Any]:
    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for sig in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN:  # ignored by the parent (nohup, a shell's &): stays so
            continue
        previous[sig] = current
        signal.signal(sig, _on_signal)
    return previous


def _restore(previous: dict[int, Any]) -> None:
    from tfgraph.cli_support import finished, is_the_program

    if finished() and is_the_program():  # it succeeded and said so: exit 0, whatever
        previous.clear()  # arrives while the interpreter shuts down (say_done)
        return
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    previous.clear()


def _say_interrupted(signum: int) -> None:
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"tfgraph: {word}\n")
        sys.stderr.flush()


# click >= 8.2 raises this (a UsageError) to print the help of a group run without arguments.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _output_error(exc: OSError, debug: bool) -> NoReturn:
    """Output that cannot be written (a full disk, stdout on /dev/full, a closed pipe) is the
    user's to fix, not a bug: one line, exit 2 (as an output path that is not writable, which
    is refused before any work), no traceback."""
    if debug:
        traceback.print_exc()
    click.echo(one_line(printable(f"tfgraph: {exc.strerror or exc}"
                                  + (f": {exc.filename}" if exc.filename else ""))), err=True)
    sys.exit(2)


def _usage_error(exc: click.UsageError) -> NoReturn:
    """Bad usage is one line and exit 2 like every other bad input (README.md, "Exit status"), e.g.
    ``tfgraph run: --seq: 0 is not in the range x>=1 (see tfgraph run --help)``."""
    if isinstance(exc, _NO_ARGS_IS_HELP):  # plain ``tfgraph``: click prints the help
        raise exc
    where = exc.ctx.command_path if exc.ctx is not None else "tfgraph"
    message = " ".join(exc.format_message().split())
    click.echo(one_line(printable(f"{where}: {message} (see {where} --help)")), err=True)
    sys.exit(2)


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", "-V", prog_name="tfgraph")
@click.option("--debug", is_flag=True, help="Show Python tracebacks for errors.")
def main(debug: bool) -> None:
    """tfgraph: compile declarative Transformer specs (YAML) to graphs, models and reports."""

