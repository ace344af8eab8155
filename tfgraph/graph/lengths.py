"""One rule for sequence lengths beyond a spec's ``max_len`` (README, "Lengths beyond max_len").

Every command and the Python API apply it through :class:`Lengths`:

- ``positions: learned``: the position table has ``max_len`` rows (plus
  ``embedding.position_offset``) and no row for a later position, so a longer sequence is an
  error (:class:`~tfgraph.errors.TfgraphError`, one line naming the option, the length and
  ``max_len``), and generation stops at ``max_len`` (a hard cap);
- every other kind (``sinusoidal``, ``rope``, ``relative``, ``none``) computes its positions
  from the position itself (or has none), so the model runs at any length: a longer sequence is
  allowed with one warning (:class:`BeyondMaxLenWarning`; the commands print it as one
  ``note: ...`` line on stderr) that the positions extrapolate beyond what the model was built
  for; figures at such lengths are the same formulas evaluated there;
- a spec without ``max_len`` takes any length silently.

The modules and ONNX models themselves apply the first point (a learned table's lookup past
its rows is an error naming ``max_len`` in both back ends) and do not warn: a forward pass is
not where a length is chosen.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfgraph.errors import TfgraphError
from tfgraph.spec.schema import POSITION_KINDS

if TYPE_CHECKING:
    from tfgraph.spec.schema import Spec



class BeyondMaxLenWarning(UserWarning):
    """A length past ``max_len`` of a spec whose positions are not learned: allowed, and the
    model (and every figure) extrapolates; or, in generation, a learned table's max_len
    cutting a row short. ``key`` identifies the length checked (spec name, option without
    dashes, length), so one length reported by a command and again by the API call it makes
    is shown once (:func:`notes`)."""

    def __init__(self, message: str, key: tuple[str, str, int]) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Lengths:
    """What a spec says about sequence lengths: its name, ``max_len`` (None: none given) and
    the kind of its positions (``embedding.positions``)."""

    name: str
    max_len: int | None
    positions: str

    @classmethod
    def of(cls, spec: Spec) -> Lengths:
        return cls(spec.name, spec.max_len, spec.embedding.positions)

    @property
    def learned(self) -> bool:
        return POSITION_KINDS[self.positions].learned

    @property
    def hard_limit(self) -> int | None:
        """The longest sequence the model can run at all: ``max_len`` for a learned table,
        None (unbounded) for every other kind."""
        return self.max_len if self.learned else None

    def beyond(self, length: int) -> bool:
        """Whether ``length`` is past ``max_len`` (never, without one)."""
        return self.max_len is not None and length > self.max_len

    def has_figures(self, length: int) -> bool:
        """Whether the model runs at ``length`` (and so has figures there): within
        ``max_len``, or beyond it with positions that are not a learned table."""
        return not (self.learned and self.beyond(length))

    def refusal(self, subject: str) -> str:
        """The one-line error for a learned table asked for a length past max_len;
        ``subject`` names the option and the length (``--seq 4096``)."""
        return (f"{subject}: longer than {self.name}'s max_len {self.max_len}: its learned "
                "position table has no row past max_len")

    def extrapolation(self, subject: str) -> str:
        """The one-line warning for the other kinds asked for a length past max_len."""
        return (f"{subject}: longer than {self.name}'s max_len {self.max_len}: "
                f"{POSITION_KINDS[self.positions].extrapolates}")

    def check(self, what: str, length: int | None, subject: str | None = None,
              stacklevel: int = 3) -> None:
        """Apply the rule to one length, named ``what`` (``--seq`` in a command, ``seq`` in
        the API); ``subject`` words it in the message (default ``f"{what} {length}"``).
        Postcondition: returns silently within max_len; raises TfgraphError for a learned
        table past it; otherwise warns (:class:`BeyondMaxLenWarning`) and returns.
        ``stacklevel`` is warnings.warn's counted from here: 3 points at the code that called
        the API function calling this."""
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) \
                or not self.beyond(length):
            return  # None, or not a length: the caller's own validation says so
        subject = subject or f"{what} {length}"
        if self.learned:
            raise TfgraphError(self.refusal(subject))
        self.warn(self.extrapolation(subject), what, int(length), stacklevel + 1)

    def warn(self, message: str, what: str, length: int, stacklevel: int = 3) -> None:
        """Warn ``message`` (one line) about ``length`` named ``what``; the note a command
        prints for it is deduplicated on (spec, what without dashes, length). ``stacklevel``
        as in :meth:`check`, counted from here."""
        key = (self.name, what.lstrip("-").replace("-", "_"), length)
        warnings.warn(BeyondMaxLenWarning(message, key), stacklevel=stacklevel)


DEFAULT_SEQ = 128  # report's and run's default length when none is given


def default_seq(spec: Spec | None) -> int:
    """The length ``report``, ``run`` and ``graph.report()`` use when none is given: 128, or
    the spec's max_len when that is smaller (so a default never meets the rule)."""
    if spec is None or spec.max_len is None:
        return DEFAULT_SEQ
    return min(DEFAULT_SEQ, spec.max_len)


def check_lengths(spec: Spec | None, *named: tuple[str, int | None]) -> None:
    """:meth:`Lengths.check` for each (name, length) of ``spec`` (nothing when it is None:
    a model with no spec, whose max_len is unknown)."""
    if spec is None:
        return
    limits = Lengths.of(spec)
    for what, length in named:
        limits.check(what, length, stacklevel=4)


@contextmanager
def notes(emit: Callable[[str], None]) -> Iterator[None]:
    """Within the block, each :class:`BeyondMaxLenWarning` goes to ``emit`` (its one-line
    message) instead of Python's warning output, once per ``key``; other warnings are shown
    as usual. The commands run under this (tfgraph.cli) and print ``note: <message>``."""
    seen: set[tuple[str, str, int]] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", BeyondMaxLenWarning)
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: object = None, line: str | None = None) -> None:
            if isinstance(message, BeyondMaxLenWarning):
                if message.key not in seen:
                    seen.add(message.key)
                    emit(str(message))
                return
            shown(message, category, filename, lineno, file, line)  # type: ignore[arg-type]

        warnings.showwarning = show
        yield
