"""User-facing errors (README.md, "Exit status"): invalid specs and bad arguments exit 2 with one line on stderr.

Anything that is not a ``TfgraphError`` is a bug in tfgraph and is reported as an internal error.
"""

from __future__ import annotations

import re

from tfgraph.terminal import printable, short_path

_ASCII_SPACE = re.compile(r"[ \t\r\n\v\f]+")


class TfgraphNote(UserWarning):
    """What the CLI prints as a ``note:`` line, raised as a warning from the Python API
    (``tfgraph.generate``): something about the model or its files the run does not apply,
    e.g. a generation_config.json setting tfgraph has no filter for."""


class TfgraphError(Exception):
    """An error the user can fix (bad spec, bad argument, unwritable output): exit status 2."""

    exit_code = 2

    def __str__(self) -> str:
        # One line, always: stderr gets exactly one readable message per error. Only ASCII
        # line breaks and tabs are folded; other separators (U+2028 in a file name) are kept,
        # so the command line can show them escaped (tfgraph.terminal.printable).
        return _ASCII_SPACE.sub(" ", super().__str__()).strip()


class SpecError(TfgraphError):
    """An invalid spec file, located as ``file:line:col: field.path: message``.

    ``line`` and ``col`` are 1-based. Parts that are unknown are left out of the message.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        col: int | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = " ".join(message.split())
        self.file = file
        self.line = line
        self.col = col
        self.path = path
        # Every problem of the file, located, this one first (tfgraph.spec.errors fills it).
        self.problems: list[SpecError] = [self]

    def __str__(self) -> str:
        # The file name and the field path are user text (a key may hold an escape sequence).
        # A long file name keeps its end (tfgraph.terminal.short_path): the line is at most
        # ~300 characters and the file's own name is what locates the error.
        where = [short_path(self.file)] if self.file is not None else []
        where += [str(part) for part in (self.line, self.col) if part is not None]
        parts = [":".join(where)] if where else []
        if self.path:
            parts.append(printable(self.path))
        parts.append(self.message)
        return ": ".join(parts)
