"""The one check of a seed given to the Python API (README.md, "Python API"): the bounds of
the commands' ``--seed`` / ``--weights-seed`` (tfgraph.limits.SEED), with the argument named,
instead of numpy's "expected non-negative integer" from deep inside a generator."""

from __future__ import annotations

import operator
from typing import SupportsIndex

from tfgraph.errors import TfgraphError

MAX_SEED = 2**64 - 1
"""numpy's generators take non-negative integers; 64 bits is what they mix in."""


def check_seed(name: str, seed: object) -> int:
    """``seed`` as an int from 0 to MAX_SEED (any integer type: numpy's too), else a
    TfgraphError naming ``name``, the value and the range. A bool is refused."""
    value = None
    if not isinstance(seed, bool) and type(seed).__name__ not in ("bool", "bool_") \
            and isinstance(seed, SupportsIndex):
        try:
            value = operator.index(seed)
        except TypeError:  # an array of several
            pass
    if value is None or not 0 <= value <= MAX_SEED:
        raise TfgraphError(f"{name} {seed!r}: a seed is a whole number from 0 to "
                           f"2**64 - 1 ({MAX_SEED})")
    return value
