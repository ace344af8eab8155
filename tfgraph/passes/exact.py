"""Exact evaluation of cost expressions without building sympy objects.

The figures are polynomials (sums of products of sizes, integer powers and rational
coefficients). Evaluating one at sizes with ``expr.xreplace(sizes)``, or checking two equal
with ``expand(a - b) == 0``, makes sympy build (and derive assumptions for) every
intermediate expression, most of the time of a first report. Here an expression becomes a
dict from exponent tuples to ``Fraction`` coefficients, with sizes substituted on the way.
Anything else (``Min`` of a sliding window, a float, a fractional power) raises
``NotPolynomial`` and the caller falls back to sympy, so every result is the one sympy gives.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import sympy

Monomial = tuple[int, ...]
Polynomial = dict[Monomial, Fraction]


class NotPolynomial(Exception):
    """The expression is not a polynomial this module evaluates (see the module docstring)."""


def polynomial(expr: Any, values: dict[sympy.Symbol, int],
               gens: tuple[sympy.Symbol, ...] = ()) -> Polynomial:
    """``expr`` with ``values`` substituted, as {exponents of ``gens``: coefficient} (no zero
    coefficients); NotPolynomial when a symbol is in neither or the form is unsupported."""
    index = {g: k for k, g in enumerate(gens)}
    return _poly(expr, values, index, (0,) * len(gens))


def _poly(e: Any, values: dict[sympy.Symbol, int], index: dict[sympy.Symbol, int],
          one: Monomial) -> Polynomial:
    if not isinstance(e, sympy.Basic):
        if type(e) is int:
            return {one: Fraction(e)} if e else {}
        raise NotPolynomial(e)
    if e.is_Rational:  # Integer included
        return {one: Fraction(int(e.p), int(e.q))} if e.p else {}
    if e.is_Symbol:
        if e in values:
            v = values[e]
            return {one: Fraction(v)} if v else {}
        k = index.get(e)
        if k is None:
            raise NotPolynomial(e)
        return {one[:k] + (1,) + one[k + 1:]: Fraction(1)}
    if e.is_Add:
        out: Polynomial = {}
        for arg in e.args:
            _add_into(out, _poly(arg, values, index, one))
        return out
    if e.is_Mul:
        prod: Polynomial = {one: Fraction(1)}
        for arg in e.args:
            prod = _mul(prod, _poly(arg, values, index, one))
        return prod
    if e.is_Pow and e.exp.is_Integer:
        base = _poly(e.base, values, index, one)
        n = int(e.exp)
        if n < 0:
            if len(base) != 1:  # only a monomial has a polynomial inverse
                raise NotPolynomial(e)
            (mono, coef), = base.items()
            base, n = {tuple(-x for x in mono): 1 / coef}, -n
        out = {one: Fraction(1)}
        for _ in range(n):
            out = _mul(out, base)
        return out
    raise NotPolynomial(e)


def _add_into(out: Polynomial, p: Polynomial) -> None:
    for mono, coef in p.items():
        total = out.get(mono, 0) + coef
        if total:
            out[mono] = total
        else:
            out.pop(mono, None)


def _mul(a: Polynomial, b: Polynomial) -> Polynomial:
    out: Polynomial = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            mono = tuple([x + y for x, y in zip(ma, mb)]) if ma else ma
            total = out.get(mono, 0) + ca * cb
            if total:
                out[mono] = total
            else:
                out.pop(mono, None)
    return out


def value(expr: Any, values: dict[sympy.Symbol, int]) -> int | None:
    """The integer ``expr`` takes at ``values``; None when it is not a polynomial in them or
    not an integer there (the caller asks sympy)."""
    try:
        p = polynomial(expr, values)
    except NotPolynomial:
        return None
    v = p.get((), Fraction(0))
    return int(v) if v.denominator == 1 else None


def equal_at(expr: Any, values: dict[sympy.Symbol, int], other: Any,
             gens: tuple[sympy.Symbol, ...]) -> bool | None:
    """Whether ``expand(expr.xreplace(values) - other) == 0``, both polynomials in ``gens``
    once ``values`` are substituted; None when either is not (the caller asks sympy)."""
    try:
        return polynomial(expr, values, gens) == polynomial(other, {}, gens)
    except NotPolynomial:
        return None
