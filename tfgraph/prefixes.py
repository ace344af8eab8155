"""Decimal prefixes for counts, one table per kind of count, shared by every table and plot.

Parameter counts say billions as ``B`` ("a 7B model", as model cards and papers write them);
FLOPs and other counts keep the SI prefixes (``G`` for 1e9, ``P`` for 1e15).
"""

from __future__ import annotations

PARAMS: tuple[tuple[str, float], ...] = (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3))
"""Parameter counts: thousands, millions, billions, trillions."""
SI: tuple[tuple[str, float], ...] = (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9),
                                     ("M", 1e6), ("k", 1e3))
"""FLOPs and other counts: the SI prefixes."""


def prefixed(n: float, table: tuple[tuple[str, float], ...], spec: str = ".1f",
             sep: str = "", unit: str = "") -> str:
    """``n`` with the largest prefix of ``table`` it reaches, formatted by ``spec``:
    prefixed(1.1e9, PARAMS) -> ``1.1B``; below every prefix, ``n`` as it is (``g``)."""
    for prefix, size in table:
        if abs(n) >= size:
            return f"{n / size:{spec}}{sep}{prefix}{unit}"
    return f"{n:g}{sep}{unit}".rstrip()
