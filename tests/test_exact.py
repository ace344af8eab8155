"""tfgraph.passes.exact gives what sympy gives: the integer at sizes, the verdict of
expand(a - b) == 0, and expand's own expression (same terms, same printing)."""

from __future__ import annotations

import sympy

from tfgraph.passes import exact


def _sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


B, S, T, D, H = (_sym(n) for n in ("B", "S", "T", "d", "h"))
CASES = [
    2 * B * S * (D + 3) * (D / H),
    (B * S) ** 2 - 4 * B * S * T / 3 + 7,
    B * S * D * (D / H + 1) ** 2 - B * S * D**3 / H**2,
    sympy.Integer(0),
    sympy.Rational(5, 2) * B * (S + 1),
]


def test_expand_is_sympys_expression() -> None:
    for expr in CASES:
        for minus in (None, 3 * B * S * D, expr):
            want = sympy.expand(expr if minus is None else expr - minus)
            got = exact.expand(expr, minus)
            assert got == want and got.args == want.args and str(got) == str(want)


def test_expand_falls_back_to_sympy_outside_polynomials() -> None:
    windowed = B * sympy.Min(T, 4) * (D + 1)
    assert exact.expand(windowed) == sympy.expand(windowed)
    with_float = 0.5 * B * (S + 1)
    assert exact.expand(with_float) == sympy.expand(with_float)


def test_value_is_the_integer_xreplace_gives() -> None:
    sizes = {B: 3, S: 128, T: 40, D: 64, H: 4}
    for expr in CASES:
        want = expr.xreplace(sizes)
        got = exact.value(expr, sizes)
        assert got == (int(want) if want.is_Integer else None)
    assert exact.value(B * S, {B: 2}) is None  # a symbol left: sympy decides (an error)
    assert exact.value(B * S / 3, {B: 2, S: 2}) is None  # not an integer: sympy decides
    assert exact.value(sympy.Min(T, 4) * B, {B: 2, T: 9}) is None
    assert exact.value(7, {}) == 7


def test_equal_at_is_the_verdict_of_expanding_the_difference() -> None:
    values = {D: 64, H: 4}
    numeric = sympy.expand(CASES[0].xreplace(values))
    assert exact.equal_at(CASES[0], values, numeric) is True
    assert exact.equal_at(CASES[0], values, numeric + B) is False
    assert exact.equal_at(sympy.Min(T, D) * B, values, B * T) is None


def test_text_is_sympys_printing() -> None:
    import random

    rng = random.Random(7)
    symbols = [B, S, T, D, H, sympy.Symbol("x"), sympy.Symbol("L_enc", positive=True)]
    L = sympy.Symbol("L", positive=True, integer=True)

    def poly(k: int) -> sympy.Expr:
        out = sympy.Integer(0)
        for _ in range(k):
            term = sympy.Rational(rng.choice([1, -1]) * rng.randint(1, 40), rng.choice([1, 2, 3]))
            for s in rng.sample(symbols, rng.randint(0, 3)):
                term *= s ** rng.choice([1, 2, 3, -1, -2])
            out += term
        return out

    cases = [*CASES, B, -B, B**2, 2 / B, 3 - 2 * D, 3 - 2 * D * H, -D / 2, 1 - B, 7,
             sympy.Min(T, 4) * B, 0.5 * B,
             L * (24 * B * S * D**2 + 4 * B * S**2 * D) + 2 * B * S * D]
    cases += [poly(rng.randint(1, 6)) for _ in range(400)]
    cases += [rng.choice([1, 2, -3]) * L * poly(3) + poly(rng.randint(0, 3)) for _ in range(200)]
    for expr in cases:
        assert exact.text(expr) == str(expr)
    for expr in cases[:60]:
        assert exact.expanded_text(expr * (B + 2)) == str(sympy.expand(expr * (B + 2)))
