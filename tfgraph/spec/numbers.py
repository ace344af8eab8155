"""The spec's float fields: finite numbers (YAML ints allowed, never booleans or strings),
most of them within bounds.

A bound is written once, as :class:`Within` in the field's ``Annotated`` type: pydantic then
enforces it and writes it into ``tfgraph schema`` (``exclusiveMinimum``, ``maximum``, ... for
editors), and the value is first checked here so the error reads like the spec's other rules
("must be between 0 and 1 (typical values: 1e-5, 1e-6)") instead of pydantic's wording.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema


def finite_float(value: Any) -> float:
    """Floats may be written as YAML ints (``10000``) but never as booleans or strings."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    if not math.isfinite(value):
        raise ValueError("must be a finite number (not NaN or infinity)")
    return float(value)


def optional_finite_float(value: Any) -> float | None:
    """``finite_float``, or None for an optional field left out."""
    return None if value is None else finite_float(value)


@dataclass(frozen=True)
class Within:
    """A finite float within bounds (``Annotated[float, Within(gt=0.0)]``); ``hint`` ends the
    error message in parentheses (typical values, or why the bound is there)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    hint: str = ""

    def words(self) -> str:
        """The bounds said as the spec's messages say them: "greater than 0", "at least 1",
        "between 0 and 1" (both open), "in (0, 1]"."""
        low = self.gt if self.gt is not None else self.ge
        high = self.lt if self.lt is not None else self.le
        fmt = "{:g}".format
        if low is not None and high is not None:
            if self.gt is not None and self.lt is not None:
                return f"between {fmt(low)} and {fmt(high)}"
            return (f"in {'(' if self.gt is not None else '['}{fmt(low)}, {fmt(high)}"
                    f"{')' if self.lt is not None else ']'}")
        if self.gt is not None:
            return f"greater than {fmt(self.gt)}"
        if self.ge is not None:
            return f"at least {fmt(self.ge)}"
        if self.lt is not None:
            return f"less than {fmt(self.lt)}"
        return f"at most {fmt(self.le)}" if self.le is not None else "a finite number"

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies within the bounds."""
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def check(self, value: Any) -> float:
        """``value`` as a finite float within the bounds, or a ValueError saying which."""
        number = finite_float(value)
        if not self.holds(number):
            raise ValueError(f"must be {self.words()}" + (f" ({self.hint})" if self.hint else ""))
        return number

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        # check first (the readable message), then pydantic's float with the same bounds
        # (what the JSON schema shows)
        return core_schema.no_info_before_validator_function(
            self.check, core_schema.float_schema(gt=self.gt, ge=self.ge, lt=self.lt, le=self.le))


POSITIVE = Within(gt=0.0)
"""A multiplier, scale or cap: greater than 0."""
Positive = Annotated[float, POSITIVE]
EPS = Within(gt=0.0, lt=1.0, hint="typical values: 1e-5, 1e-6")
"""A norm's eps, added inside its square root."""
THETA = Within(gt=1.0, hint="typical values: 10000, 500000")
"""A rotary base."""
