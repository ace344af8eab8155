"""Command-line arguments of scripts built on tfgraph (the examples in examples/).

A bad value is refused as tfgraph's own commands refuse one (README, "Exit status"): one line
on stderr and exit 2, before any work, never a traceback and never a value quietly changed.
``ArgumentParser`` puts argparse's usage errors on one line; the ``type=`` functions below
refuse out-of-range numbers while parsing; ``run_main`` turns a :class:`TfgraphError`
(a bad spec file, say) raised by the script into that line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from tfgraph.errors import TfgraphError
from tfgraph.terminal import one_line, printable


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line: ``train.py: argument --steps: expected
    an integer of 1 or more, got '0' (see train.py --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, one_line(printable(f"{self.prog}: {message} (see {self.prog} --help)"))
                  + "\n")


def _integer(text: str, least: int) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = least - 1  # not a number: the same message as one out of range
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer of {least} or more, "
                                         f"got {text!r}")
    return value


def positive_int(text: str) -> int:
    """``type=`` for a count that must be 1 or more (steps, batch rows, threads, beams)."""
    return _integer(text, 1)


def non_negative_int(text: str) -> int:
    """``type=`` for a count where 0 means something (warm-up steps; 0 windows: all)."""
    return _integer(text, 0)


MAX_SEED = 2**32 - 1
"""The largest ``--seed`` of an example: every generator the examples seed takes it (numpy's
legacy ``RandomState``, Python's ``random``, torch's ``manual_seed``, and the distributed
example's data seed ``seed * 1,000,003 + step``, which stays within torch's 64 bits)."""


def seed(text: str) -> int:
    """``type=`` for a seed: an integer from 0 to :data:`MAX_SEED`."""
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {MAX_SEED}, "
                                         f"got {text!r}")
    return value


def check_step_memory(what: str, rows: int, length: int, vocab: int) -> None:
    """Refuse (a :class:`TfgraphError`, before anything is allocated) a training step of
    ``rows`` sequences of ``length`` tokens past tfgraph's bounds (``MAX_BATCH`` rows,
    ``MAX_LENGTH`` tokens: tfgraph.limits) or whose ids, labels and float32 logits alone
    cannot fit in the memory available (an estimate from below: the activations and
    their gradients come on top)."""
    from tfgraph.limits import MAX_BATCH, MAX_LENGTH, check_at_most, check_memory

    check_at_most("--batch", rows, MAX_BATCH, "sequences per step")
    check_at_most("--seq", length, MAX_LENGTH, "tokens per sequence")
    check_memory(what, float(rows) * length * (16 + 4 * vocab))


def _real(text: str, zero_ok: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    # NaN compares false and inf is no setting: both refused with the negatives
    if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        what = "a finite number >= 0" if zero_ok else "a finite number > 0"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """``type=`` for a rate or threshold that must be above 0 (learning rate, perplexity)."""
    return _real(text, zero_ok=False)


def non_negative_float(text: str) -> float:
    """``type=`` for a finite number of 0 or more."""
    return _real(text, zero_ok=True)


def positive_ints(text: str) -> list[int]:
    """``type=`` for a comma-separated list of positive integers (sequence lengths)."""
    try:
        return [positive_int(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers of 1 or more, "
                                         f"got {text!r}") from None


def output_file(text: str) -> Path:
    """``type=`` for a file the script writes when it is done (``--json-out``): refused now,
    not after the training, when it is a folder, not a regular file, or in a folder that
    is missing or cannot be written (tfgraph.io.check_output)."""
    from tfgraph.io import check_output

    try:
        return check_output(text, create=False)
    except TfgraphError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run_main(main: Callable[[], int]) -> int:
    """``main()``'s exit status, or 2 after one ``error:`` line on stderr when it raises a
    :class:`TfgraphError` (a spec that does not load, an argument the model cannot take);
    ``sys.exit(run_main(main))`` ends an example script."""
    try:
        return main()
    except TfgraphError as e:
        print(one_line(printable(f"error: {e}")), file=sys.stderr)
        return 2
