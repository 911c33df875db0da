"""Tables of words (checks/series.py) against SymPy's expansion of the same non-commutative polynomials."""

import random

import sympy as sp

from splitformer.symbolic.checks.series import Series

A, B, C = sp.symbols("A B C", commutative=False)
h = sp.Symbol("h", positive=True)
DEGREE = 4


def _truncated(expr: sp.Expr) -> sp.Expr:
    expr = sp.expand(expr)
    return sp.expand(sum(expr.coeff(h, power) * h**power for power in range(DEGREE + 1)))


def _random_series(rng: random.Random) -> tuple[Series, sp.Expr]:
    terms = {}
    for _ in range(4):
        word = tuple(rng.choice((A, B, C)) for _ in range(rng.randint(0, 3)))
        terms[word] = terms.get(word, 0) + sp.Rational(rng.randint(-5, 5), rng.randint(1, 4))
    series = Series(terms, DEGREE)
    return series, sp.Add(*(c * h ** len(word) * sp.Mul(*word) for word, c in terms.items()))


def test_products_sums_and_powers_match_sympy_expand():
    rng = random.Random(7)
    for _ in range(20):
        (left, left_expr), (right, right_expr) = _random_series(rng), _random_series(rng)
        assert sp.expand((left @ right).expression(h)) == _truncated(left_expr * right_expr)
        assert sp.expand((left - right).expression(h)) == _truncated(left_expr - right_expr)
        assert sp.expand(left.power(3).expression(h)) == _truncated(left_expr**3)
        # control: the order of the factors matters (the generators do not commute)
        if sp.expand((left @ right - right @ left).expression(h)) != 0:
            assert sp.expand((left @ right).expression(h)) != _truncated(right_expr * left_expr)


def test_exponential_is_the_truncated_taylor_series():
    field = Series.field([(sp.Rational(1, 2), A), (1, B)], DEGREE)
    generator = h * (A / 2 + B)
    expected = _truncated(sum(generator**k / sp.factorial(k) for k in range(DEGREE + 1)))
    assert sp.expand(field.exponential().expression(h)) == expected
    assert field.exponential().part(5).is_zero()  # truncated at the degree
    euler = Series.constant(1, DEGREE) + field  # control: the first-order truncation differs
    assert sp.expand(euler.expression(h)) != expected
