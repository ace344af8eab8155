"""Small helpers shared by the command modules in ``tfgraph.commands``."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import click

from tfgraph.limits import check_layers
from tfgraph.spec.loader import load_spec
from tfgraph.terminal import short_path
from tfgraph.spec.schema import Spec


def load_spec_arg(path: str | os.PathLike[str], lowered: bool = True) -> Spec:
    """Load the SPEC argument of a command.

    Raises :class:`~tfgraph.errors.SpecError` (exit 2, one line) for anything wrong with the
    file; commands just call this and let ``tfgraph.cli`` report the error. ``lowered``: the
    command lowers the spec to a graph, so a spec deeper than
    :data:`tfgraph.limits.MAX_LOWERED_LAYERS` is refused now (``validate`` passes False).
    """
    spec = load_spec(path)
    if lowered:
        check_layers(spec, short_path(os.fspath(path)))
    return spec


def describe(spec: Spec) -> str:
    """One-line summary: ``gpt2, decoder-only, 12 layers, d_model 768, 12 heads``."""
    counts = {stack: spec.layer_count(stack) for stack in spec.stacks}
    if len(set(counts.values())) == 1:
        layers = f"{next(iter(counts.values()))} layers"
    else:
        layers = " + ".join(f"{n} {stack}" for stack, n in counts.items()) + " layers"
    att = spec.attention
    heads = f"{att.heads} heads"
    if att.kv_heads != att.heads:
        heads += f" ({att.kv_heads} kv)"
    return f"{spec.name}, {spec.arch}, {layers}, d_model {spec.d_model}, {heads}"


_finished = False
"""Whether the command's outputs are all in place and it has said so (:func:`say_done`)."""


def _ignore(signum: int, frame: Any) -> None:
    """A signal after the command succeeded: nothing to do. (A Python handler rather than
    SIG_IGN, which programs started later from this process would inherit.)"""


def say_done(line: str, err: bool = False) -> None:
    """Print the command's last line, ``wrote PATH (...)``, once every output is published:
    from here the command has succeeded, so SIGINT and SIGTERM are ignored until the
    process exits 0. A signal after "wrote" can no longer turn it into 130 or 143 (which
    would say the command failed after it claimed success); a signal before it still
    unwinds the command, removing what it staged (tfgraph.cli)."""
    global _finished
    if threading.current_thread() is threading.main_thread():
        # The program itself ignores them outright: the interpreter, as it exits, puts a
        # Python handler back to the default before it tears the modules down (torch's
        # teardown takes a while), and a signal then would still end it with 143. It starts
        # no other program after its last line, so nothing inherits SIG_IGN. A caller of
        # the CLI in process keeps a Python handler (its own come back afterwards).
        handler = signal.SIG_IGN if is_the_program() else _ignore
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, handler)
        _finished = True
    from tfgraph.io import take_notes

    for note in take_notes():  # the folders made for the outputs, which now stay
        click.echo(note, err=True)
    click.echo(line, err=err)


def finished() -> bool:
    """Whether :func:`say_done` ended the command."""
    return _finished


def start_command() -> None:
    """A new command runs in this process (the CLI called in-process again, by tests)."""
    global _finished
    _finished = False
    from tfgraph.io import take_notes

    take_notes()  # a failed command's notes are not the next one's


def is_the_program() -> bool:
    """Whether this process is the ``tfgraph`` program (console script or ``python -m
    tfgraph``), which exits when the command ends, rather than a caller of the CLI in
    process (click's CliRunner), whose own signal handlers come back afterwards."""
    if not sys.argv:
        return False
    first = sys.argv[0]
    if os.path.basename(first) in ("tfgraph", "tfgraph.exe"):
        return True
    return os.path.abspath(first) == os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "__main__.py")
