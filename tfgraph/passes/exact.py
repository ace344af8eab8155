"""Exact arithmetic on cost expressions without sympy's intermediate expressions.

The figures are polynomials: sums of products of sizes, integer powers and rational
coefficients. Evaluating one at sizes with ``expr.xreplace(sizes)``, checking two equal with
``expand(a - b) == 0`` or expanding a difference makes sympy build (and derive assumptions
for) every intermediate expression, most of the time of a first report. Here an expression
becomes a dict from monomials to ``Fraction`` coefficients; the results are the ones sympy
gives: the same integer, the same verdict, and, for ``expand``, sympy's canonical sum of the
same terms. Anything else (``Min`` of a sliding window, a float, a fractional power) raises
``NotPolynomial`` inside, and the caller's sympy operation runs instead.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import sympy

Monomial = frozenset[tuple[Any, int]]
"""A product of powers of symbols: its (symbol, exponent) pairs (empty: the constant 1)."""
Polynomial = dict[Monomial, Fraction]
"""{monomial: coefficient}, no zero coefficients."""

ONE: Monomial = frozenset()


class NotPolynomial(Exception):
    """The expression is not a polynomial of this module (see the module docstring)."""


def polynomial(e: Any) -> Polynomial:
    """``e`` as a polynomial over all its symbols; NotPolynomial for anything but sums,
    products, integer powers and rational numbers (a negative power only of a symbol)."""
    if not isinstance(e, sympy.Basic):
        if type(e) is int:
            return {ONE: Fraction(e)} if e else {}
        raise NotPolynomial(e)
    return _polynomial(e)


def _polynomial(e: sympy.Basic) -> Polynomial:
    if e.is_Rational:  # Integer included
        return {ONE: Fraction(int(e.p), int(e.q))} if e.p else {}
    if e.is_Symbol:
        return {frozenset([(e, 1)]): Fraction(1)}
    if e.is_Add:
        out: Polynomial = {}
        for arg in e.args:
            _add_into(out, polynomial(arg))
        return out
    if e.is_Mul:
        prod: Polynomial = {ONE: Fraction(1)}
        for arg in e.args:
            prod = _mul(prod, polynomial(arg))
        return prod
    if e.is_Pow and e.exp.is_Integer:
        n = int(e.exp)
        if e.base.is_Symbol:
            return {frozenset([(e.base, n)]): Fraction(1)}
        if n < 0:
            raise NotPolynomial(e)
        base = polynomial(e.base)
        power: Polynomial = {ONE: Fraction(1)}
        for _ in range(n):
            power = _mul(power, base)
        return power
    raise NotPolynomial(e)


def _add_into(out: Polynomial, p: Polynomial, sign: int = 1) -> None:
    for mono, coef in p.items():
        total = out.get(mono, 0) + sign * coef
        if total:
            out[mono] = total
        else:
            out.pop(mono, None)


def _mul(a: Polynomial, b: Polynomial) -> Polynomial:
    if len(a) == 1 and ONE in a:  # a number times b: the common case of a product's start
        c = a[ONE]
        return {mono: c * coef for mono, coef in b.items()}
    out: Polynomial = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            mono = _mono_mul(ma, mb)
            total = out.get(mono, 0) + ca * cb
            if total:
                out[mono] = total
            else:
                out.pop(mono, None)
    return out


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    if not a or not b:
        return a or b
    powers = dict(a)
    for sym, n in b:
        powers[sym] = powers.get(sym, 0) + n
    return frozenset((s, n) for s, n in powers.items() if n)


def substitute(p: Polynomial, values: dict[sympy.Symbol, int]) -> Polynomial:
    """``p`` with the symbols in ``values`` replaced by their values."""
    out: Polynomial = {}
    for mono, coef in p.items():
        rest = []
        for sym, n in mono:
            if sym in values:
                coef = coef * Fraction(values[sym]) ** n
            else:
                rest.append((sym, n))
        _add_into(out, {frozenset(rest): coef})
    return out


def value(expr: Any, values: dict[sympy.Symbol, int]) -> int | None:
    """``int(expr.xreplace(values))`` when that is an integer; None when ``expr`` is not a
    polynomial, keeps a symbol outside ``values`` or is not an integer there (the caller asks
    sympy, which gives the same error or truncation as before)."""
    try:
        p = substitute(polynomial(expr), values)
    except (NotPolynomial, ZeroDivisionError):
        return None
    if any(p.keys() - {ONE}):
        return None
    v = p.get(ONE, Fraction(0))
    return int(v) if v.denominator == 1 else None


def equal_at(expr: Any, values: dict[sympy.Symbol, int], other: Any) -> bool | None:
    """Whether ``expand(expr.xreplace(values) - other) == 0``; None when either is not a
    polynomial (the caller asks sympy)."""
    try:
        return substitute(polynomial(expr), values) == polynomial(other)
    except (NotPolynomial, ZeroDivisionError):
        return None


def expand(expr: Any, minus: Any = None) -> Any:
    """``sympy.expand(expr - minus)`` (``minus`` None: of ``expr``): for polynomials, the
    terms summed again from their exact coefficients; anything else goes to sympy.expand."""
    try:
        terms = polynomial(expr)
        if minus is not None:
            _add_into(terms, polynomial(minus), -1)
    except NotPolynomial:
        return sympy.expand(expr if minus is None else expr - minus)
    return sympy.Add(*(sympy.Mul(sympy.Rational(c.numerator, c.denominator),
                                 *(s**n for s, n in mono))
                       for mono, c in terms.items()))
