"""Operator kinds the evaluator has no semantics for: their continuous definitions, by quadrature.

A user-registered kind is specified by its continuous SymPy definitions (``Operator.definitions``);
that is its meaning, so the evaluator trusts them. What it does *not* share with the
derivation is the path from there to numbers: each definition is evaluated point by point
on the grid, ``∫_Ω f dξ`` as ``Δ Σ_k f(ξ_k)`` with the spacings explicit, ``|Ω|`` as
``N Δ``, stored kernels divided by the spacings they absorb, and every other node by the
arithmetic's own functions. The checks report such kinds as "evaluated from their
continuous definitions".
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import sympy as sp
from sympy.core.function import AppliedUndef

from splitformer.symbolic.domains import BUCKETS, FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS, VARIABLES
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.operators import EPSILON, STATE, SUPPORT

__all__ = ["evaluate_definitions", "unsupported"]

#: The grid domains the evaluator discretizes; other domains (grouped heads, rotated pairs,
#: a memory) and inputs other than the state need semantics it does not have.
_DOMAINS = (TOKENS, FEATURES, HEADS, HEAD_FEATURES, HIDDEN, BUCKETS)
_FUNCTIONS = (sp.exp, sp.erf, sp.tanh, sp.sin, sp.cos, sp.Max, sp.Min, sp.Abs, sp.log, sp.floor, sp.Heaviside,
              sp.KroneckerDelta)


class _Point:
    """Evaluates continuous expressions at one assignment of grid indices to variables."""

    def __init__(self, sem, operator, parameters, u, tables):
        self.sem, self.operator, self.u, self.tables = sem, operator, u, tables
        self.parameters = {parameter.function: parameter for parameter in parameters}
        self.positions = {field.name for field in operator.input_fields if field.role == "positions"}
        sizes = sem.sizes
        self.counts = {TOKENS: sizes.tokens, FEATURES: sizes.features, HEADS: sizes.heads,
                       HEAD_FEATURES: sizes.head_features, HIDDEN: sizes.hidden, BUCKETS: sizes.buckets}
        self.spacings = {domain: sem.number(1) for domain in self.counts}
        self.spacings[TOKENS] = sem.spacing()

    def value(self, expr, env):
        if isinstance(expr, sp.Integral):
            return self.integral(expr.function, list(expr.limits), env)
        if isinstance(expr, AppliedUndef):
            return self.sample(expr, env)
        if isinstance(expr, sp.Symbol) and expr in env:  # a coordinate as a value: its grid point k·Δ
            return self.number_at(env[expr]) * self.spacings[VARIABLES[expr].domain]
        if isinstance(expr, sp.Symbol):
            return self.symbol(expr)
        if expr.is_Rational:
            return self.sem.number(Fraction(int(expr.p), int(expr.q)))
        if expr is sp.pi:
            return self.sem.arithmetic.pi()
        if isinstance(expr, sp.Mul):
            return self.product(expr.args, env)
        arguments = [self.value(argument, env) for argument in expr.args]
        return self.function(expr, arguments)

    def integral(self, body, limits, env):
        """``∫ … dξ`` over the outermost of ``limits`` (the last) → ``Δ Σ_k``, inner ones recursively."""
        symbol, lower, upper = limits[-1]
        variable = VARIABLES[symbol]
        if (lower, upper) != (0, variable.domain.measure):
            raise SplitformerError(f"{self.operator.key}: integral over {limits[-1]} is not over a whole domain")
        spacing, terms = self.spacings[variable.domain], []
        for index in range(self.counts[variable.domain]):
            inner = {**env, symbol: index}
            terms.append(self.integral(body, limits[:-1], inner) if len(limits) > 1 else self.value(body, inner))
        if isinstance(spacing, sp.Symbol) and any(_mentions(term, spacing) for term in terms):
            # a symbolic spacing that a kernel absorbed (1/Δx̃ in γ) cancels term by term
            return sum((spacing * term for term in terms[1:]), spacing * terms[0])
        return spacing * sum(terms[1:], terms[0])

    def product(self, factors, env):
        """A product, its reciprocals last: a factor that is exactly 0 makes it 0 before any is taken.

        That is the rule for an empty support: outside it ``χ = 0``, and where a query's support is
        empty its normalizing token integral is 0 as well; the kernel ``χ e^a / ∫ χ e^a`` is then 0.
        """
        ordered = sorted(factors, key=lambda factor: factor.is_Pow and factor.exp.is_negative is True)
        product = self.sem.number(1)
        for factor in ordered:
            if product == 0:  # structural for SymPy expressions, exact for numbers
                return product
            product = product * self.value(factor, env)
        return product

    def symbol(self, symbol):
        if symbol == EPSILON:
            return self.sem.epsilon(self.operator.key)
        for constant in self.operator.constants:  # the check's value (a symbol where the comparison is symbolic,
            if symbol == constant.symbol:  # as the derived program keeps it), else its default
                return self.sem.constant(constant.name, constant.default)
        for domain, count in self.counts.items():
            if symbol == domain.measure:
                return count * self.spacings[domain]
        raise SplitformerError(f"{self.operator.key}: cannot evaluate the free symbol {symbol} of its definitions")

    def function(self, expr, arguments):
        ar = self.sem.arithmetic
        if isinstance(expr, sp.Add):
            return sum(arguments[1:], arguments[0])
        if isinstance(expr, sp.Pow):
            base, exponent = arguments
            if expr.exp == sp.Rational(1, 2):
                return ar.sqrt(base)
            if expr.exp == -sp.Rational(1, 2):
                return 1 / ar.sqrt(base)
            return base ** int(expr.exp) if expr.exp.is_Integer else base ** exponent
        simple = {sp.exp: ar.exp, sp.erf: ar.erf, sp.tanh: ar.tanh, sp.log: ar.log, sp.floor: ar.floor, sp.sin: ar.sin,
                  sp.cos: ar.cos}
        if expr.func in simple:
            return simple[expr.func](arguments[0])
        if isinstance(expr, sp.Abs):
            return abs(arguments[0])
        if isinstance(expr, sp.Max) and len(expr.args) == 2 and 0 in expr.args:  # max(v, 0)
            return ar.relu(arguments[1 - expr.args.index(0)])
        if isinstance(expr, (sp.Min, sp.Max, sp.Heaviside, sp.KroneckerDelta)):
            return self.piecewise(expr, arguments)
        raise SplitformerError(f"{self.operator.key}: the evaluator has no rule for {expr.func.__name__} "
                               "in its continuous definitions")

    def number_at(self, index: int):
        """A grid index as a number of the arithmetic (a coordinate's ``k`` in ``k·Δ``, a default position)."""
        return self.sem.number(index)

    def piecewise(self, expr, arguments):
        return _piecewise(expr, arguments, self.sem.number)

    def sample(self, expr, env):
        name = expr.func.__name__
        index = tuple(env[argument] for argument in expr.args)
        if name == STATE:
            return self.u[index]
        if name == SUPPORT:
            return self.sem.support[index] if self.sem.support is not None else 1
        if name in self.tables:
            return self.tables[name][index]
        if name in self.positions:  # the token positions, 0 … N−1 unless the evaluator is given others
            given = self.sem.positions  # an array or a list: the grid reads it at an array of indices
            return np.asarray(given)[index[0]] if given is not None else self.number_at(index[0])
        parameter = self.parameters[name]
        stored = _canonical(self.sem.parameter(self.operator.key, parameter.name), parameter, index,
                            self.sem.sizes.head_features)
        absorbed = self.sem.number(1)
        for variable in parameter.absorbs:
            absorbed = absorbed * self.spacings[variable.domain]
        return stored / absorbed


#: The grid evaluator's axes, one per continuous variable: its arrays have all of them, of length 1 where a value
#: does not vary along that variable.
_AXES = {symbol: axis for axis, symbol in enumerate(VARIABLES)}


class _Grid(_Point):
    """Evaluates continuous expressions at every grid point at once, in float64: a variable's value is its grid
    indices along its own axis (``_AXES``), an integral a sum over that axis. The rules are the point evaluator's
    (the order of the products, an exact 0 that stops a product); only the numbers are arrays. The convergence
    study of a plug-in scheme evaluates its definitions some 10⁵ times: point by point that took about a minute."""

    def indices(self, symbol: sp.Symbol) -> np.ndarray:
        """The grid indices of ``symbol`` along its axis."""
        count = self.counts[VARIABLES[symbol].domain]
        shape = [1] * len(_AXES)
        shape[_AXES[symbol]] = count
        return np.arange(count).reshape(shape)

    def number_at(self, index: np.ndarray) -> np.ndarray:
        return index.astype(float)

    def integral(self, body, limits, env):
        """``∫ … dξ`` over the outermost of ``limits`` (the last) → ``Δ Σ_k`` along ξ's axis, inner ones first."""
        symbol, lower, upper = limits[-1]
        variable = VARIABLES[symbol]
        if (lower, upper) != (0, variable.domain.measure):
            raise SplitformerError(f"{self.operator.key}: integral over {limits[-1]} is not over a whole domain")
        inner = {**env, symbol: self.indices(symbol)}
        terms = self.integral(body, limits[:-1], inner) if len(limits) > 1 else self.value(body, inner)
        terms = np.broadcast_to(terms, np.broadcast_shapes(np.shape(terms), inner[symbol].shape))
        return self.spacings[variable.domain] * terms.sum(axis=_AXES[symbol], keepdims=True)

    def product(self, factors, env):
        """The point evaluator's product at every point: where it is exactly 0 it stays 0, whatever follows."""
        ordered = sorted(factors, key=lambda factor: factor.is_Pow and factor.exp.is_negative is True)
        product = 1.0
        for factor in ordered:
            product = np.where(product == 0, product, product * self.value(factor, env))
        return product

    def piecewise(self, expr, arguments):
        if isinstance(expr, sp.Min):
            return np.minimum.reduce(np.broadcast_arrays(*arguments))
        if isinstance(expr, sp.Max):
            return np.maximum.reduce(np.broadcast_arrays(*arguments))
        if isinstance(expr, sp.Heaviside):
            value, at_zero = np.asarray(arguments[0]), arguments[1]
            return np.where(value == 0, float(at_zero), (value > 0).astype(float))
        return (np.asarray(arguments[0]) == np.asarray(arguments[1])).astype(float)

    def table(self, definition) -> np.ndarray:
        """The definition's values at every point of its variables, its axes in their order."""
        symbols = [variable.symbol for variable in definition.arguments]
        values = self.value(definition.rhs, {symbol: self.indices(symbol) for symbol in symbols})
        shape = [1] * len(_AXES)
        for symbol in symbols:
            shape[_AXES[symbol]] = self.counts[VARIABLES[symbol].domain]
        axes = sorted(_AXES[symbol] for symbol in symbols)  # the variables' axes in the grid's order
        values = np.broadcast_to(values, shape).reshape([shape[axis] for axis in axes])
        return np.array(values.transpose([axes.index(_AXES[symbol]) for symbol in symbols]), dtype=float)


def _mentions(expr, symbol: sp.Symbol) -> bool:
    """Whether ``symbol`` occurs in ``expr``, each shared subexpression visited once. ``free_symbols`` walks the
    tree, in which a subexpression that a step's later operators read many times stands as often: on a Strang step
    of a plug-in attention (two applications) it took minutes where this takes milliseconds."""
    if not isinstance(expr, sp.Basic):
        return False
    seen, stack = set(), [expr]
    while stack:
        node = stack.pop()
        if node == symbol:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(node.args)
    return False


def _piecewise(expr, arguments, number):
    """``min``, ``max``, the step ``H(v, c)`` (``c`` at 0) and ``δ(i, j)`` of numbers; of symbols, SymPy's own."""
    if any(isinstance(argument, sp.Basic) and not argument.is_number for argument in arguments):
        return expr.func(*arguments)
    if isinstance(expr, sp.Min):
        return min(arguments)
    if isinstance(expr, sp.Max):
        return max(arguments)
    if isinstance(expr, sp.Heaviside):
        value, at_zero = arguments
        return at_zero if value == 0 else number(int(bool(value > 0)))
    return number(int(bool(arguments[0] == arguments[1])))


def _canonical(array: np.ndarray, parameter, index: tuple[int, ...], head_width: int):
    """The entry of a canonical array for a point of the parameter's variables (``(h, e)`` → ``h·d_h + e``)."""
    canonical, position = [], 0
    variables = parameter.arguments
    while position < len(variables):
        if variables[position].domain is HEADS and variables[position + 1:position + 2] \
                and variables[position + 1].domain is HEAD_FEATURES:  # (h, e) → h·d_h + e; a control per head stays
            canonical.append(index[position] * head_width + index[position + 1])
            position += 2
        else:
            canonical.append(index[position])
            position += 1
    return array[tuple(canonical)] if canonical else array  # a control with no axis: its number (exact: no array)


def evaluate_definitions(sem, key: str, u: np.ndarray) -> np.ndarray:
    """The operator ``key`` applied to ``u``, from its continuous definitions: at every grid point at once in float64,
    point by point in the exact arithmetics."""
    operator = sem.operator(key)
    parameters, stages = _stages(sem, key)
    tables: dict[str, np.ndarray] = {}
    if sem.arithmetic.name == "float":
        grid = _Grid(sem, operator, parameters, u, tables)
        with np.errstate(all="ignore"):  # as the point evaluator's float64 numbers: inf and NaN where they arise
            for definition in stages:
                tables[definition.function] = grid.table(definition)
    else:
        by_points(_Point(sem, operator, parameters, u, tables), stages, u.dtype)
    return tables[stages[-1].function]


def by_points(point: _Point, stages: tuple, dtype) -> None:
    """Each definition's value at one point of its variables at a time, into ``point``'s tables."""
    for definition in stages:
        shape = tuple(point.counts[variable.domain] for variable in definition.arguments)
        table = np.empty(shape, dtype=dtype)
        symbols = [variable.symbol for variable in definition.arguments]
        for index in itertools.product(*(range(count) for count in shape)):
            table[index] = point.value(definition.rhs, dict(zip(symbols, index)))
        point.tables[definition.function] = table


def _stages(sem, key: str) -> tuple[tuple, tuple]:
    """The operator's parameters and definitions, built once per evaluator: SymPy builds them anew at each call,
    and a convergence study evaluates an operator some 10⁴ times."""
    built = sem.__dict__.setdefault("_stages", {})
    if key not in built:
        operator = sem.operator(key)
        built[key] = (operator.parameters(), operator.definitions())
    return built[key]


def unsupported(operator) -> str | None:
    """Why the evaluator cannot evaluate ``operator`` from its definitions, or ``None`` when it can.

    It evaluates integrals over the token, feature, head and hidden grids of the state, the
    support, the token positions, the operator's parameters, its declared constants (at the
    check's values, ``Semantics.constants``, else their defaults) and its earlier stages, with the
    arithmetic's functions; anything else (an input such as a memory, an undeclared free symbol,
    another domain) is named.
    """
    known = {STATE, SUPPORT} | {parameter.function for parameter in operator.parameters()}
    known |= {field.name for field in operator.input_fields if field.role == "positions"}
    inputs, symbols, domains, functions = set(), set(), set(), set()
    constants = {constant.symbol for constant in operator.constants}  # evaluated (``symbol``)
    for definition in operator.definitions():
        variables = set(definition.arguments)
        for integral in definition.rhs.atoms(sp.Integral):
            variables |= {VARIABLES[limit[0]] for limit in integral.limits if limit[0] in VARIABLES}
        domains |= {f"Ω_{variable.domain.name}" for variable in variables if variable.domain not in _DOMAINS}
        for applied in definition.rhs.atoms(AppliedUndef):
            if applied.func.__name__ not in known:
                inputs.add(applied.func.__name__)
        measures = {variable.domain.measure for variable in VARIABLES.values()}
        symbols |= {str(symbol) for symbol in definition.rhs.free_symbols
                    if symbol not in VARIABLES and symbol != EPSILON and symbol not in measures | constants}
        functions |= {type(node).__name__ for node in sp.preorder_traversal(definition.rhs)
                      if isinstance(node, sp.Function) and not isinstance(node, AppliedUndef)
                      and not isinstance(node, _FUNCTIONS)}
        known.add(definition.function)
    parts = [f"{label} {', '.join(sorted(names))}" for label, names in
             (("inputs", inputs), ("free symbols", symbols), ("domains", domains), ("functions", functions)) if names]
    return f"{operator.kind} reads " + "; ".join(parts) if parts else None
