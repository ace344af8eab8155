"""Exact arithmetic on cost expressions without sympy's intermediate expressions.

The figures are polynomials: sums of products of sizes, integer powers and rational
coefficients. Evaluating one at sizes with ``expr.xreplace(sizes)``, checking two equal with
``expand(a - b) == 0`` or expanding a difference makes sympy build (and derive assumptions
for) every intermediate expression, most of the time of a first report. Here an expression
becomes a dict from monomials to exact coefficients (ints, or ``Fraction``); the results are
the ones sympy gives: the same integer, the same verdict, and, for ``expand`` and ``text``,
sympy's canonical sum of the same terms and its printing. Anything else (``Min`` of a
sliding window, a float, a fractional power) raises ``NotPolynomial`` inside, and the caller's
sympy operation runs instead.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import sympy

Monomial = frozenset[tuple[Any, int]]
"""A product of powers of symbols: its (symbol, exponent) pairs (empty: the constant 1)."""
Coefficient = int | Fraction
"""An int where the coefficient is one (Fraction arithmetic is many times slower)."""
Polynomial = dict[Monomial, Coefficient]
"""{monomial: coefficient}, no zero coefficients."""

ONE: Monomial = frozenset()


class NotPolynomial(Exception):
    """The expression is not a polynomial of this module (see the module docstring)."""


def polynomial(e: Any) -> Polynomial:
    """``e`` as a polynomial over all its symbols; NotPolynomial for anything but sums,
    products, integer powers and rational numbers (a negative power only of a symbol)."""
    if not isinstance(e, sympy.Basic):
        if type(e) is int:
            return {ONE: e} if e else {}
        raise NotPolynomial(e)
    return _polynomial(e)


def _polynomial(e: sympy.Basic) -> Polynomial:
    if e.is_Rational:  # Integer included
        return {ONE: _number(e)} if e.p else {}
    if e.is_Symbol:
        return {frozenset([(e, 1)]): 1}
    if e.is_Add:
        out: Polynomial = {}
        for arg in e.args:
            _add_into(out, polynomial(arg))
        return out
    if e.is_Mul:
        prod: Polynomial = {ONE: 1}
        for arg in e.args:
            prod = _mul(prod, polynomial(arg))
        return prod
    if e.is_Pow and e.exp.is_Integer:
        n = int(e.exp)
        if e.base.is_Symbol:
            return {frozenset([(e.base, n)]): 1}
        if n < 0:
            raise NotPolynomial(e)
        base = polynomial(e.base)
        power: Polynomial = {ONE: 1}
        for _ in range(n):
            power = _mul(power, base)
        return power
    raise NotPolynomial(e)


def _number(e: sympy.Rational) -> Coefficient:
    p, q = int(e.p), int(e.q)
    return p if q == 1 else Fraction(p, q)


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
                v = values[sym]
                coef = coef * v**n if n > 0 else coef / Fraction(v) ** -n
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
    if p.keys() - {ONE}:  # a symbol without a value
        return None
    v = p.get(ONE, 0)
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


def text(expr: Any) -> str:
    """``str(expr)``: sympy's printing of a sum of monomials in symbols (integer powers,
    rational coefficients; a term may have one sum of such monomials as a factor, the
    ``L*(...)`` of the formulas), written directly without the printer's term ordering
    machinery and the assumptions it asks of every term; anything else is printed by
    sympy."""
    out = _sum_text(expr)
    return str(expr) if out is None else out


Factor = tuple[tuple[int, str], int, Any]
"""One factor of a monomial: its sort key ((0, name) for a symbol, (1, "") for a sum, which
sympy orders after every symbol), its exponent and the symbol or the sum."""
Term = tuple[Coefficient, list[Factor]]
"""A monomial as printed: its coefficient and factors in sympy's order."""


def expanded_text(expr: Any) -> str:
    """``str(sympy.expand(expr))``, printed straight from the polynomial (no sympy sum is
    built); sympy for anything else."""
    try:
        p = polynomial(expr)
    except NotPolynomial:
        return text(sympy.expand(expr))
    terms: list[Term] = []
    for mono, coef in p.items():
        factors = sorted((((0, sym.name), n, sym) for sym, n in mono), key=lambda f: f[0])
        if len({f[0] for f in factors}) != len(factors):  # two symbols of one name
            return text(sympy.expand(expr))
        terms.append((coef, factors))
    out = _terms_text(terms) if terms else "0"
    return str(sympy.expand(expr)) if out is None else out


def _sum_text(expr: Any) -> str | None:
    terms = list(expr.args) if isinstance(expr, sympy.Basic) and expr.is_Add else [expr]
    parsed = [_term(t) for t in terms]
    if any(p is None for p in parsed):
        return None
    return _terms_text(parsed)  # type: ignore[arg-type]


def _terms_text(parsed: list[Term]) -> str | None:
    """sympy's ``_print_Add`` of the terms (one term: the term's own printing)."""
    if len(parsed) == 1:
        return _term_text(parsed[0])
    ordered = _ordered(parsed)
    if ordered is None:
        return None
    out = []
    for term in ordered:
        t = _term_text(term)
        if t is None:
            return None
        sign = "+"
        if t.startswith("-"):
            sign, t = "-", t[1:]
        out.extend([sign, t])
    first = out.pop(0)
    return ("" if first == "+" else first) + " ".join(out)


def _term(t: Any) -> Term | None:
    """``t`` as a coefficient and factors, or None where ``text`` leaves it to sympy."""
    if not isinstance(t, sympy.Basic):
        return None
    if t.is_Rational:
        return _number(t), []
    args = t.args if t.is_Mul else (t,)
    coef: Coefficient = 1
    factors: list[Factor] = []
    for k, a in enumerate(args):
        if a.is_Rational and k == 0 and t.is_Mul:
            coef = _number(a)
        elif a.is_Symbol:
            factors.append(((0, a.name), 1, a))
        elif a.is_Pow and a.base.is_Symbol and a.exp.is_Integer and (t.is_Mul or a.exp > 0):
            factors.append(((0, a.base.name), int(a.exp), a.base))
        elif a.is_Add and t.is_Mul:
            factors.append(((1, ""), 1, a))
        else:
            return None
    keys = [f[0] for f in factors]
    if len(set(keys)) != len(keys):  # two sums, or two symbols of one name
        return None
    factors.sort(key=lambda f: f[0])
    return coef, factors


def _term_text(term: Term) -> str | None:
    """sympy's ``_print_Mul`` (``_print_Symbol``, ``_print_Pow``, ``_print_Rational``) of one
    monomial: the sign, the numerator's factors, then ``/d`` or ``/(d1*d2)``."""
    coef, factors = term
    if not factors:
        return str(coef.numerator) if coef.denominator == 1 else \
            f"{coef.numerator}/{coef.denominator}"
    sign = "-" if coef < 0 else ""
    top, bottom = abs(coef.numerator), coef.denominator
    num = [str(top)] if top != 1 else []
    den = [str(bottom)] if bottom != 1 else []
    for (kind, name), n, what in factors:
        if kind:  # a sum, in parentheses
            inner = _sum_text(what)
            if inner is None:
                return None
            num.append(f"({inner})")
        else:
            (num if n > 0 else den).append(name if abs(n) == 1 else f"{name}**{abs(n)}")
    head = sign + "*".join(num or ["1"])
    if not den:
        return head
    return head + ("/" + den[0] if len(den) == 1 else f"/({'*'.join(den)})")


def _ordered(parsed: list[Term]) -> list[Term] | None:
    """The terms in sympy's ``as_ordered_terms`` order: lexicographic by exponents over the
    symbols sorted by name (then the one sum some terms multiply), higher first (a
    constant after every positive power); a positive number before a negative number times
    one factor ("3 - 2*x": sympy's special case of a number and a Mul of two). None for
    terms with different sums as factors."""
    if len(parsed) == 2:
        number = [p for p in parsed if not p[1]]
        other = [p for p in parsed if p[1]]
        if len(number) == 1 and number[0][0] > 0 and other and other[0][0] < 0 \
                and len(other[0][1]) == 1:
            return [number[0], other[0]]
    sums = {what for _, factors in parsed for (kind, _), _, what in factors if kind}
    if len(sums) > 1:  # sympy orders sums by their own sort keys: left to it
        return None
    gens = sorted({key for _, factors in parsed for key, _, _ in factors})
    index = {g: k for k, g in enumerate(gens)}

    def key(term: Term) -> tuple[int, ...]:
        monom = [0] * len(gens)
        for g, n, _ in term[1]:
            monom[index[g]] = n
        return tuple(-m for m in monom)

    return sorted(parsed, key=key)
