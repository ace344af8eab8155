"""The ``tfgraph`` program's signal policy from its first moment (issue 27).

Importing tfgraph's command line takes a second or two (pydantic, sympy); a Ctrl-C in that
time would print a Python traceback from some import. When the program running is the
``tfgraph`` console script, ``tfgraph/__init__`` calls :func:`install` before importing
anything heavy: until the command line installs its own policy (``tfgraph.cli``), SIGINT and
SIGTERM print one line and end the process with 130 or 143. Nothing has been written yet at
that point, so there is nothing to clean up. Library users (``import tfgraph``) are untouched.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _on_signal(signum: int, frame: FrameType | None) -> None:
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    try:
        os.write(2, f"tfgraph: {word}\n".encode())
    finally:
        os._exit(128 + signum)


def install() -> None:
    """Install the early policy when this process is the ``tfgraph`` program."""
    if not sys.argv or os.path.basename(sys.argv[0]) not in ("tfgraph", "tfgraph.exe"):
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread: leave Python's defaults
            pass
