"""The independent evaluator: what one step of a scheme *means*, computed from the model.

Written from the mathematics (docs/model.md), not from the derivation: each operator kind the project ships has
its continuous definition discretized here by the rectangle rule, by hand, with the
spacings explicit — a token spacing ``Δx ≠ 1`` that must cancel in the softmax kernel,
unit feature spacings absorbed into the stored kernels — and the scheme's tree (steps,
fractions, parallel weights, Heun stages) is composed here by its own interpreter. Nothing
is imported from ``symbolic.derivation``, ``symbolic.quadrature``, ``symbolic.evaluate``
or ``codegen.lowering``; operator kinds registered by users are evaluated from their
continuous SymPy definitions by ``definitions.py`` (an independent quadrature).

The arithmetic is pluggable (``Arithmetic``): 50-digit mpmath numbers, SymPy symbols
(exact comparison at a tiny size) or float64 (the convergence study). Arrays are NumPy
arrays; for mpmath and SymPy they hold Python objects, so ``@`` multiplies exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import sympy

__all__ = ["OpaqueExp", "OpaqueRelu", "Arithmetic", "MPMATH", "SYMPY", "FLOAT", "Sizes", "Semantics", "KNOWN_KINDS",
           "unevaluable"]


@dataclass(frozen=True)
class Arithmetic:
    """Elementwise functions of one number system, applied to NumPy arrays."""

    name: str
    exp: Callable
    sqrt: Callable
    erf: Callable
    tanh: Callable
    relu: Callable  # max(v, 0)
    number: Callable  # Python int or Fraction → a number of this system
    pi: Callable  # () → π in this system (mpmath: at the working precision)


def _map(function):
    """``function`` applied to every entry of an object array (or to one number)."""
    vectorized = np.frompyfunc(function, 1, 1)
    return lambda values: vectorized(values) if isinstance(values, np.ndarray) else function(values)


def _mpmath() -> Arithmetic:
    import mpmath

    return Arithmetic("mpmath", _map(mpmath.exp), _map(mpmath.sqrt), _map(mpmath.erf), _map(mpmath.tanh),
                      _map(lambda v: v if v > 0 else mpmath.mpf(0)),
                      lambda value: mpmath.mpf(Fraction(value).numerator) / Fraction(value).denominator,
                      lambda: +mpmath.pi)


class OpaqueExp(sympy.Function):
    """``exp`` as a plain function: SymPy's automatic rewrites of ``exp`` (it is ``E**x`` inside
    products) are slow on large arguments. The symbolic comparison builds both sides with it
    and ``OpaqueRelu`` (``scheme_checks``), so identical expressions still cancel structurally."""

    def _eval_evalf(self, precision):
        return sympy.exp(self.args[0]).evalf(sympy.core.evalf.prec_to_dps(precision))


class OpaqueRelu(sympy.Function):
    """``max(v, 0)`` as a plain function (``Max`` sorts its arguments by size, slowly)."""

    def _eval_evalf(self, precision):
        return sympy.Max(self.args[0].evalf(sympy.core.evalf.prec_to_dps(precision)), 0)


def _sympy() -> Arithmetic:
    return Arithmetic("sympy", _map(OpaqueExp), _map(sympy.sqrt), _map(sympy.erf), _map(sympy.tanh),
                      _map(OpaqueRelu),
                      lambda value: sympy.Rational(Fraction(value).numerator, Fraction(value).denominator),
                      lambda: sympy.pi)


FLOAT = Arithmetic("float", np.exp, np.sqrt, np.vectorize(math.erf, otypes=[float]), np.tanh,
                   lambda values: np.maximum(values, 0.0), float, lambda: math.pi)
MPMATH = _mpmath()
SYMPY = _sympy()


@dataclass(frozen=True)
class Sizes:
    """Grid sizes and the spacings of the rectangle rule.

    ``token_spacing`` is ``Δx = |Ω_x| / N_x``, a number of the arithmetic (default
    ``1/N_x``); it must cancel (any value, a symbol too, gives the same block). Feature-like domains have unit spacing: the learned kernels absorb it.
    """

    tokens: int
    features: int
    heads: int
    hidden: int
    token_spacing: object = None

    @property
    def head_features(self) -> int:
        return self.features // self.heads


@dataclass
class Semantics:
    """One step of a scheme on one sequence ``u`` of shape ``(tokens, d)``.

    ``params`` maps canonical names (``attn.W_q``) to arrays; ``support[i, j]`` is 1 where
    query ``i`` may attend to key ``j``; ``eps`` is LayerNorm's ε, per operator key when a
    mapping. ``projections=False`` replaces projection substeps by the identity (the flow the
    order analysis describes); ``time_step`` is Δt.
    """

    scheme: object
    params: Mapping[str, np.ndarray]
    sizes: Sizes
    arithmetic: Arithmetic = field(default_factory=lambda: MPMATH)
    support: np.ndarray | None = None
    eps: object = 0
    time_step: object = 1
    projections: bool = True
    unchecked: set[str] = field(default_factory=set)

    # -- the scheme's composition --------------------------------------------------------------
    def step(self, u: np.ndarray) -> np.ndarray:
        """One step of the whole scheme."""
        return self.sequence(self.scheme.body, u)

    def operator(self, key: str):
        """The scheme's operator object ``key`` (its options, such as the activation)."""
        if not hasattr(self, "_operators"):
            self._operators = self.scheme.instantiate()
        return self._operators[key]

    def sequence(self, sequence, u):
        for node in sequence.steps:
            u = self.node(node, u)
        return u

    def node(self, node, u):
        kind = type(node).__name__
        if kind == "Parallel":  # branches from the same state, weighted sum
            total = None
            for weight, branch in zip(node.weights, node.branches):
                term = self.number(weight) * self.sequence(branch, u)
                total = term if total is None else total + term
            return total
        if hasattr(node, "tableau"):  # Runge–Kutta: k_i = G(u + Δt Σ_j a_ij k_j), u + Δt Σ_i b_i k_i
            stages = []
            for row in node.tableau.a:
                state = u
                for a, k in zip(row, stages):
                    if a != 0:
                        state = state + self.time_step * self.number(a) * k
                stages.append(self.summed_field(node.fields, state))
            total = u
            for b, k in zip(node.tableau.b, stages):
                if b != 0:
                    total = total + self.time_step * self.number(b) * k
            return total
        if node.solver == "projection":  # u ← Proj_S(u): the normal cone absorbs Δt
            return self.apply(node.operator, u) if self.projections else u
        # explicit Euler over the substep's share of the step: u + f Δt A(on(u))
        return u + self.number(node.fraction) * self.time_step * self.field(node, u)

    def summed_field(self, fields, u):
        total = None
        for substep in fields:
            term = self.number(substep.fraction) * self.field(substep, u)
            total = term if total is None else total + term
        return total

    def field(self, substep, u):
        """``A(u)`` or, with ``on``, ``A(Proj(u))``."""
        argument = u if substep.on is None else self.apply(substep.on, u)
        return self.apply(substep.operator, argument)

    # -- the operators -------------------------------------------------------------------------
    def apply(self, key: str, u: np.ndarray) -> np.ndarray:
        kind = self.scheme.operators[key]
        if kind in KNOWN_KINDS:
            return KNOWN_KINDS[kind](self, key, u)
        from .definitions import evaluate_definitions

        self.unchecked.add(kind)
        return evaluate_definitions(self, key, u)

    def number(self, value):
        if hasattr(value, "p") and hasattr(value, "q"):  # a SymPy Rational from the scheme file
            value = Fraction(int(value.p), int(value.q))
        return self.arithmetic.number(value)

    def parameter(self, key: str, name: str) -> np.ndarray:
        return self.params[f"{key}.{name}"]

    def epsilon(self, key: str):
        return self.eps[key] if isinstance(self.eps, Mapping) else self.eps

    def spacing(self):
        """``Δx``; default ``|Ω_x| = 1``."""
        if self.sizes.token_spacing is not None:
            return self.sizes.token_spacing
        return self.number(Fraction(1, self.sizes.tokens))


def _attention(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """docs/model.md §2, §6: heads on ``Ω_h``, scores ``|Ω_e|^{-1/2} ∫ q k de``, ``Softmax_2`` over the support."""
    n, heads, width = sem.sizes.tokens, sem.sizes.heads, sem.sizes.head_features
    dx, de = sem.spacing(), sem.number(1)
    measure_e = width * de
    q, k, v = (u @ sem.parameter(key, f"W_{c}") + sem.parameter(key, f"b_{c}") for c in "qkv")
    support = sem.support if sem.support is not None else np.ones((n, n), dtype=int)
    outputs = []
    for m in range(heads):
        columns = slice(m * width, (m + 1) * width)
        # a(x, x̃) = |Ω_e|^{-1/2} ∫ q(x, e) k(x̃, e) de  →  |Ω_e|^{-1/2} Δe Σ_e
        scores = (q[:, columns] @ k[:, columns].T) * de / sem.arithmetic.sqrt(measure_e)
        weights = sem.arithmetic.exp(scores) * support
        mixed = np.empty((n, width), dtype=u.dtype)
        for i in range(n):
            # γ(x, x̃) = χ e^a / ∫ χ e^a dη; the integral over an empty support is 0 and so is γ
            normalizer = dx * sum(weights[i, j] for j in range(n))
            if _is_zero(normalizer):
                mixed[i] = np.array([sem.number(0)] * width, dtype=mixed.dtype)
                continue
            gamma = weights[i] / normalizer
            # o(x, e) = ∫ γ(x, x̃) v(x̃, e) dx̃  →  Σ_j Δx γ_j v_j
            mixed[i] = (dx * gamma) @ v[:, columns]
        outputs.append(mixed)
    # ∫∫ W^O(h, e, y) o(x, h, e) de dh: the stored W^O holds Δh Δe W^O
    return np.concatenate(outputs, axis=1) @ sem.parameter(key, "W_o") + sem.parameter(key, "b_o")


def _is_zero(value) -> bool:
    return value == 0


def _layer_norm(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Theorem 3.1 with σ₁ = 0, σ₂ = 1 and ε as a ghost coordinate, then gain and bias."""
    d = sem.sizes.features
    rows = []
    for i in range(u.shape[0]):
        mean = sum(u[i]) / d
        variance = sum((value - mean) ** 2 for value in u[i]) / d  # population variance
        rows.append((u[i] - mean) / sem.arithmetic.sqrt(variance + sem.epsilon(key)))
    return np.array(rows) * sem.parameter(key, "gain") + sem.parameter(key, "bias")


def _activation(sem: Semantics, key: str, values: np.ndarray) -> np.ndarray:
    name = sem.operator(key).activation.name
    ar = sem.arithmetic
    if name == "relu":  # projection onto S₂ = {u ≥ 0}
        return ar.relu(values)
    if name == "gelu":
        return values * (1 + ar.erf(values / ar.sqrt(ar.number(2)))) * ar.number(Fraction(1, 2))
    if name == "gelu-tanh":  # GELU's tanh approximation (GPT-2)
        inner = ar.sqrt(ar.number(2) / ar.pi()) * (values + ar.number(Fraction(44715, 10**6)) * values**3)
        return values * (1 + ar.tanh(inner)) * ar.number(Fraction(1, 2))
    if name == "silu":
        return values / (1 + ar.exp(-values))
    if name == "tanh":
        return ar.tanh(values)
    raise KeyError(name)


def _feed_forward(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Lifting to ``Ω_z`` (affine), the activation, restriction to ``Ω_y`` (affine)."""
    hidden = _activation(sem, key, u @ sem.parameter(key, "W_1") + sem.parameter(key, "b_1"))
    return hidden @ sem.parameter(key, "W_2") + sem.parameter(key, "b_2")


def _affine(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """``∫ W(ξ, y) u(x, ξ) dξ + b(y)`` on ``Ω_y`` (the paper's linear FFN layer)."""
    return u @ sem.parameter(key, "W") + sem.parameter(key, "b")


def _nonnegative(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Projection onto ``S₂ = {u ≥ 0}``: pointwise, the nearest non-negative value."""
    return sem.arithmetic.relu(u)


#: Operator kinds with semantics of their own here; any other kind is evaluated from its
#: continuous definitions (``definitions.py``).
KNOWN_KINDS: dict[str, Callable[[Semantics, str, np.ndarray], np.ndarray]] = {
    "attention": _attention,
    "layer-norm": _layer_norm,
    "feed-forward": _feed_forward,
    "affine": _affine,
    "nonnegative": _nonnegative,
}


def unevaluable(scheme) -> dict[str, str]:
    """The operators of ``scheme`` the evaluator cannot evaluate, by key, each with the reason."""
    from .definitions import unsupported

    reasons = {}
    for key, operator in scheme.instantiate().items():
        reason = None if operator.kind in KNOWN_KINDS else unsupported(operator)
        if reason is not None:
            reasons[key] = reason
    return reasons
