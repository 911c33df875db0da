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
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import sympy

from splitformer.symbolic.numeric_expressions import real_valued

__all__ = ["OpaqueExp", "OpaqueRelu", "Arithmetic", "MPMATH", "SYMPY", "FLOAT", "Sizes", "Semantics", "KNOWN_KINDS",
           "KNOWN_COMBINERS", "unevaluable"]


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
    cos: Callable
    sin: Callable
    log: Callable
    floor: Callable


def _map(function):
    """``function`` applied to every entry of an object array (or to one number)."""
    vectorized = np.frompyfunc(function, 1, 1)
    return lambda values: vectorized(values) if isinstance(values, np.ndarray) else function(values)


def _mpmath() -> Arithmetic:
    import mpmath

    return Arithmetic("mpmath", _map(mpmath.exp), _map(real_valued(mpmath.sqrt, "sqrt")), _map(mpmath.erf),
                      _map(mpmath.tanh), _map(lambda v: v if v > 0 else mpmath.mpf(0)),
                      lambda value: mpmath.mpf(Fraction(value).numerator) / Fraction(value).denominator,
                      lambda: +mpmath.pi, _map(mpmath.cos), _map(mpmath.sin), _map(real_valued(mpmath.log, "log")),
                      _map(mpmath.floor))


class OpaqueExp(sympy.Function):
    """``exp`` as a plain function: SymPy's automatic rewrites of ``exp`` (it is ``E**x`` inside
    products) are slow on large arguments. The symbolic comparison builds both sides with it
    and ``OpaqueRelu`` (``scheme_checks``), so identical expressions still cancel structurally."""

    def _eval_evalf(self, precision):
        return sympy.exp(self.args[0]).evalf(sympy.core.evalf.prec_to_dps(precision))


class OpaqueRelu(sympy.Function):
    """``max(v, 0)`` as a plain function (``Max`` sorts its arguments by size, slowly); of a number, that number's
    ``max(v, 0)`` (a bucket of integer distances is then a number too)."""

    @classmethod
    def eval(cls, value):
        if value.is_number:
            return sympy.Max(value, 0)

    def _eval_evalf(self, precision):
        return sympy.Max(self.args[0].evalf(sympy.core.evalf.prec_to_dps(precision)), 0)


def _sympy() -> Arithmetic:
    return Arithmetic("sympy", _map(OpaqueExp), _map(sympy.sqrt), _map(sympy.erf), _map(sympy.tanh),
                      _map(OpaqueRelu),
                      lambda value: sympy.Rational(Fraction(value).numerator, Fraction(value).denominator),
                      lambda: sympy.pi, _map(sympy.cos), _map(sympy.sin), _map(sympy.log), _map(sympy.floor))


FLOAT = Arithmetic("float", np.exp, np.sqrt, np.vectorize(math.erf, otypes=[float]), np.tanh,
                   lambda values: np.maximum(values, 0.0), float, lambda: math.pi, np.cos, np.sin, np.log, np.floor)
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
    #: Key/value heads of grouped-query attention (``None``: one per query head).
    kv_heads: int | None = None
    #: Buckets of relative distances of a learned score-bias table (T5).
    buckets: int = 4
    #: The head width a scheme's attention sets (its option ``d_head``); ``None``: ``features / heads``.
    head_width: int | None = None

    @property
    def head_features(self) -> int:
        return self.features // self.heads if self.head_width is None else self.head_width

    def of(self, scheme: object) -> "Sizes":
        """These sizes with the head width ``scheme``'s attention operators set (``Scheme.head_width``)."""
        width = scheme.head_width() if hasattr(scheme, "head_width") else None
        return self if width is None else replace(self, head_width=width)

    @property
    def key_value_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads


@dataclass
class Semantics:
    """One step of a scheme on one sequence ``u`` of shape ``(tokens, d)``.

    ``params`` maps canonical names (``attn.W_q``) to arrays; ``support[i, j]`` is 1 where
    query ``i`` may attend to key ``j``; ``eps`` is LayerNorm's ε, per operator key when a
    mapping. ``projections=False`` replaces projection substeps by the identity (the flow the
    order analysis describes); ``time_step`` is Δt.

    Inputs of particular operators: ``positions`` (the tokens' positions, default
    ``0 … N−1``) for rotary attention; ``constants``, the values of declared constants by name
    (rotary attention's ``rope_theta``; any not given takes its default); ``memory``
    (shape ``(memory tokens, d)``, held fixed over the step), ``memory_support[i, t]``
    (default 1) and ``memory_spacing`` (``Δx̂``, default ``1/N_m``; it must cancel) for
    cross-attention.
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
    positions: np.ndarray | None = None
    constants: Mapping[str, object] = field(default_factory=dict)
    memory: np.ndarray | None = None
    memory_support: np.ndarray | None = None
    memory_spacing: object = None

    def __post_init__(self) -> None:
        self.sizes = self.sizes.of(self.scheme)

    # -- the scheme's composition --------------------------------------------------------------
    def step(self, u: np.ndarray) -> np.ndarray:
        """One step of the whole scheme."""
        return self.sequence(self.scheme.body, u)

    def streams(self, u: np.ndarray) -> tuple[np.ndarray, object]:
        """One step and the increment of the second state: the sum of the stream substeps' increments
        ``fraction·Δt·A`` (``Substep.stream``), each at the state its substep starts from, never projected."""
        increment = 0
        for node in self.scheme.body.steps:
            if getattr(node, "stream", False):
                increment = increment + self.number(node.fraction) * self.time_step * self.field(node, u)
            u = self.node(node, u)
        return u, increment

    def operator(self, key: str):
        """The scheme's operator object ``key`` (its options, such as the activation)."""
        if not hasattr(self, "_operators"):
            self._operators = self.scheme.instantiate()
        return self._operators[key]

    def parameter_names(self, key: str) -> frozenset[str]:
        """The names of operator ``key``'s learned parameters (``bias=False`` drops the biases), read once."""
        if not hasattr(self, "_parameter_names"):
            self._parameter_names = {}
        if key not in self._parameter_names:
            self._parameter_names[key] = frozenset(parameter.name for parameter in self.operator(key).parameters())
        return self._parameter_names[key]

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
        """``A(u)`` or, with ``on``, ``A(Proj(u))`` (with ``shift``, ``A(S(Proj(u)))``); with ``then``, the projection of that output; with a
        learned step, times ``λ(y)`` (``<operator>.step``) feature by feature, or times one number ``λ``;
        with ``combine``, the combiner's field of ``u`` and that value."""
        argument = u if substep.on is None else self.apply(substep.on, u)
        if substep.shift is not None:
            argument = self.apply(substep.shift, argument)
        value = self.apply(substep.operator, argument)
        if substep.then is not None:
            value = self.apply(substep.then, value)
        if substep.step == "per-channel":
            value = value * self.parameter(substep.operator, "step")[None, :]
        elif substep.step == "scalar":
            value = value * self.parameter(substep.operator, "step")
        if substep.combine is not None:
            value = KNOWN_COMBINERS[self.scheme.operators[substep.combine]](self, substep.combine, u, value)
        return value

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

    def constant(self, name: str, default: float):
        """The value of the declared constant ``name``: as given, else ``default``."""
        return self.constants[name] if name in self.constants else self.number(Fraction(default))

    def epsilon(self, key: str):
        return self.eps[key] if isinstance(self.eps, Mapping) else self.eps

    def spacing(self):
        """``Δx``; default ``|Ω_x| = 1``."""
        if self.sizes.token_spacing is not None:
            return self.sizes.token_spacing
        return self.number(Fraction(1, self.sizes.tokens))


def _linear(sem: Semantics, key: str, values: np.ndarray, weight: str, bias: str) -> np.ndarray:
    """``∫ W(ξ, ·) v(ξ) dξ + b`` (unit feature spacing, absorbed by W); the bias only where the operator has one."""
    result = values @ sem.parameter(key, weight)
    return result + sem.parameter(key, bias) if bias in sem.parameter_names(key) else result


def _gru_gate(sem: Semantics, key: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The GRU cell (Cho et al. 2014) read as a field: ``GRU(v, u) − u = (1 − z)(n − u)`` with
    ``r = σ(W_ir v + b_ir + W_hr u + b_hr)``, ``z`` likewise, ``n = tanh(W_in v + b_in + r (W_hn u + b_hn))``."""
    def sigmoid(values):
        return 1 / (1 + sem.arithmetic.exp(-values))

    def gate(name):
        return _linear(sem, key, v, f"W_i{name}", f"b_i{name}"), _linear(sem, key, u, f"W_h{name}", f"b_h{name}")

    (ir, hr), (iz, hz), (in_, hn) = gate("r"), gate("z"), gate("n")
    reset, update = sigmoid(ir + hr), sigmoid(iz + hz)
    return (1 - update) * (sem.arithmetic.tanh(in_ + reset * hn) - u)


def _softmax_mix(sem: Semantics, q: np.ndarray, k: np.ndarray, v: np.ndarray, support: np.ndarray,
                 spacing) -> np.ndarray:
    """One head: ``o(x, e) = ∫ γ(x, x̃) v(x̃, e) dx̃`` with ``γ = χ e^a / ∫ χ e^a dη`` and
    ``a(x, x̃) = |Ω_e|^{-1/2} ∫ q(x, e) k(x̃, e) de`` (docs/model.md §2), each integral by the
    rectangle rule; ``spacing`` is the key grid's ``Δx̃``."""
    width, de = q.shape[1], sem.number(1)
    scores = (q @ k.T) * de / sem.arithmetic.sqrt(width * de)
    weights = sem.arithmetic.exp(scores) * support
    normalizers = spacing * weights.sum(axis=1)  # ∫ χ e^a dη, row by row
    # the integral over an empty support is 0 and so is γ
    empty = np.array([_is_zero(normalizer) for normalizer in normalizers], dtype=bool)
    normalizers[empty] = sem.number(1)
    mixed = (spacing * (weights / normalizers[:, None])) @ v  # Σ_j Δx̃ γ_j v_j
    mixed[empty] = sem.number(0)
    return mixed


def _head(values: np.ndarray, m: int, width: int) -> np.ndarray:
    """Head ``m``'s features: the columns ``m·d_h … (m+1)·d_h − 1`` (the head grid is the outer axis)."""
    return values[:, m * width:(m + 1) * width]


def _combine(sem: Semantics, key: str, heads: list[np.ndarray]) -> np.ndarray:
    """``∫∫ W^O(h, e, y) o(x, h, e) de dh + b^O``: the stored W^O holds Δh Δe W^O."""
    return _linear(sem, key, np.concatenate(heads, axis=1), "W_o", "b_o")


def _token_support(sem: Semantics) -> np.ndarray:
    n = sem.sizes.tokens
    return sem.support if sem.support is not None else np.ones((n, n), dtype=int)


def _attention(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """docs/model.md §2, §6: heads on ``Ω_h``, each mixing the tokens over the support."""
    width = sem.sizes.head_features
    q, k, v = (_linear(sem, key, u, f"W_{c}", f"b_{c}") for c in "qkv")
    return _combine(sem, key, [
        _softmax_mix(sem, _head(q, m, width), _head(k, m, width), _head(v, m, width), _token_support(sem),
                     sem.spacing())
        for m in range(sem.sizes.heads)])


def _rotated(sem: Semantics, values: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Each pair ``(v_r, v_{r+d_h/2})`` of one head as the point ``v_r + i v_{r+d_h/2}`` of the
    plane turned by its angle: ``(v_r cos φ − v_{r'} sin φ, v_r sin φ + v_{r'} cos φ)``."""
    half = values.shape[1] // 2
    first, second = values[:, :half], values[:, half:]
    cos, sin = sem.arithmetic.cos(angles), sem.arithmetic.sin(angles)
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=1)


def _rotary_attention(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Rotary positions (Su et al. 2021) and grouped key/value heads (Ainslie et al. 2023).

    Pair ``r`` of a head turns by ``φ = p(x) ω_r`` with the frequency ``ω_r = θ^{-2r/d_h}``; a partial
    rotation of ``R`` features (``rotary_dim``) turns the first ``R/2`` pairs with ``ω_r = θ^{-2r/R}`` and
    leaves the others; query head ``h`` reads key/value head ``⌊h / (N_h / N_g)⌋``.
    """
    width, heads, groups = sem.sizes.head_features, sem.sizes.heads, sem.sizes.key_value_heads
    if width % 2 or heads % groups:
        raise ValueError(f"rotary attention needs an even head width and N_g | N_h, got d_h = {width}, "
                         f"{heads} heads, {groups} key/value heads")
    n, members = sem.sizes.tokens, heads // groups
    theta = sem.constant("rope_theta", 10000)
    positions = sem.positions if sem.positions is not None else [sem.number(i) for i in range(n)]
    rotated = sem.operator(key).rotary_dim or width
    frequencies = [theta ** sem.number(Fraction(-2 * r, rotated)) if 2 * r < rotated else sem.number(0)
                   for r in range(width // 2)]
    angles = np.array([[positions[i] * omega for omega in frequencies] for i in range(n)], dtype=u.dtype)
    q, k, v = (_linear(sem, key, u, f"W_{c}", f"b_{c}") for c in "qkv")
    return _combine(sem, key, [
        _softmax_mix(sem, _rotated(sem, _head(q, h, width), angles), _rotated(sem, _head(k, h // members, width), angles),
                     _head(v, h // members, width), _token_support(sem), sem.spacing())
        for h in range(heads)])


def _cross_attention(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Queries from the state, keys and values from the memory ``M(x̂, ξ)`` held fixed over the
    step; the token integral runs over the memory grid ``Ω_m`` within its support ``χ_m``."""
    if sem.memory is None:
        raise ValueError(f"{key}: cross-attention needs a memory")
    width, count = sem.sizes.head_features, sem.memory.shape[0]
    support = sem.memory_support if sem.memory_support is not None else np.ones((u.shape[0], count), dtype=int)
    spacing = sem.memory_spacing if sem.memory_spacing is not None else sem.number(Fraction(1, count))
    q = _linear(sem, key, u, "W_q", "b_q")
    k, v = (_linear(sem, key, sem.memory, f"W_{c}", f"b_{c}") for c in "kv")
    return _combine(sem, key, [
        _softmax_mix(sem, _head(q, m, width), _head(k, m, width), _head(v, m, width), support, spacing)
        for m in range(sem.sizes.heads)])


def _is_zero(value) -> bool:
    return value == 0


def _layer_norm(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Theorem 3.1 with σ₁ = 0, σ₂ = 1 and ε as a ghost coordinate, then gain and bias (if it has one)."""
    d = sem.sizes.features
    centered = u - (u.sum(axis=1) / d)[:, None]
    variance = (centered**2).sum(axis=1) / d  # population variance
    scaled = centered / sem.arithmetic.sqrt(variance + sem.epsilon(key))[:, None] * sem.parameter(key, "gain")
    return scaled + sem.parameter(key, "bias") if sem.operator(key).bias else scaled


def _activation(sem: Semantics, key: str, values: np.ndarray) -> np.ndarray:
    name = sem.operator(key).activation.name
    ar = sem.arithmetic
    if name == "relu":  # projection onto S₂ = {u ≥ 0}
        return ar.relu(values)
    if name == "relu-squared":  # that projection, squared (Primer)
        return ar.relu(values) ** 2
    if name == "gelu":
        return values * (1 + ar.erf(values / ar.sqrt(ar.number(2)))) * ar.number(Fraction(1, 2))
    if name == "gelu-tanh":  # GELU's tanh approximation (GPT-2)
        inner = ar.sqrt(ar.number(2) / ar.pi()) * (values + ar.number(Fraction(44715, 10**6)) * values**3)
        return values * (1 + ar.tanh(inner)) * ar.number(Fraction(1, 2))
    if name == "silu":
        return values / (1 + ar.exp(-values))
    if name == "tanh":
        return ar.tanh(values)
    return _pointwise(sem, sem.operator(key).activation.formula, values)  # a registered activation


def _pointwise(sem: Semantics, expr, values: np.ndarray) -> np.ndarray:
    """A registered activation's formula in ``v`` at ``values``, in the arithmetic (its functions are
    ``register_activation``'s: exp, erf, tanh, max(·, 0), |·|)."""
    ar = sem.arithmetic
    if isinstance(expr, sympy.Symbol):
        return values
    if expr.is_Rational:
        return sem.number(Fraction(int(expr.p), int(expr.q)))
    if expr is sympy.pi:
        return ar.pi()
    parts = [_pointwise(sem, argument, values) for argument in expr.args]
    if isinstance(expr, sympy.Add):
        return sum(parts[1:], parts[0])
    if isinstance(expr, sympy.Mul):
        product = parts[0]
        for part in parts[1:]:
            product = product * part
        return product
    if isinstance(expr, sympy.Pow):
        if expr.exp == sympy.Rational(1, 2):
            return ar.sqrt(parts[0])
        return parts[0] ** int(expr.exp) if expr.exp.is_Integer else parts[0] ** parts[1]
    if isinstance(expr, sympy.Max) and 0 in expr.args:
        return ar.relu(parts[1 - expr.args.index(0)])
    if isinstance(expr, sympy.Abs):
        return abs(parts[0])
    return {sympy.exp: ar.exp, sympy.erf: ar.erf, sympy.tanh: ar.tanh}[expr.func](parts[0])


def _feed_forward(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Lifting to ``Ω_z`` (affine), the activation, restriction to ``Ω_y`` (affine); biases only where the operator has them."""
    return _linear(sem, key, _activation(sem, key, _linear(sem, key, u, "W_1", "b_1")), "W_2", "b_2")


def _gated_feed_forward(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """SwiGLU/GeGLU: ``W_2 (act(W_1 u + b_1) ⊙ (W_3 u + b_3)) + b_2``; biases only where the operator has them."""
    hidden = _activation(sem, key, _linear(sem, key, u, "W_1", "b_1")) * _linear(sem, key, u, "W_3", "b_3")
    return _linear(sem, key, hidden, "W_2", "b_2")


def _rms_norm(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """The projection onto the sphere ``mean_y u² = 1`` (ε as a ghost coordinate), then the gain."""
    d = sem.sizes.features
    scales = sem.arithmetic.sqrt((u * u).sum(axis=1) / d + sem.epsilon(key))
    return u / scales[:, None] * sem.parameter(key, "gain")


def _affine(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """``∫ W(ξ, y) u(x, ξ) dξ + b(y)`` on ``Ω_y`` (the paper's linear FFN layer)."""
    return u @ sem.parameter(key, "W") + sem.parameter(key, "b")


def _within_half_token(distance) -> object:
    """``1[|distance| < 1/2]``: a number for numbers, ``θ(1/2 + distance, 0) θ(1/2 − distance, 0)`` for a symbol."""
    if isinstance(distance, sympy.Expr) and not distance.is_number:
        half = sympy.Rational(1, 2)
        return sympy.Heaviside(half + distance, 0) * sympy.Heaviside(half - distance, 0)
    return 1 if bool(abs(distance) < sympy.Rational(1, 2)) else 0


def _token_shift(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Token shift (x-transformers' ``ShiftTokens``): the features cut into one segment per offset
    (``⌊d / n⌋`` wide, the rest kept); segment ``j`` at token ``t`` reads each token ``o`` whose position is within
    half a token of ``p(t) − s_j`` (one token on the grid of positions), zero where there is none or (``masked``,
    offsets other than 0) where ``t`` may not attend to it."""
    operator = sem.operator(key)
    offsets = operator.offsets()
    n, d = u.shape
    width = d // len(offsets)
    positions = sem.positions if sem.positions is not None else [sem.number(i) for i in range(n)]
    support = _token_support(sem)
    result = u.copy()
    segments = [(slice(segment * width, (segment + 1) * width), offset, operator.masked and offset != 0)
                for segment, offset in enumerate(offsets)] + [(slice(len(offsets) * width, d), 0, False)]
    for columns, offset, masked in segments:  # the rest of the features: offset 0
        for token in range(n):
            result[token, columns] = sum(
                _within_half_token(positions[token] - positions[other] - offset) * (support[token, other] if masked else 1)
                * u[other, columns] for other in range(n))
    return result


def _nonnegative(sem: Semantics, key: str, u: np.ndarray) -> np.ndarray:
    """Projection onto ``S₂ = {u ≥ 0}``: pointwise, the nearest non-negative value."""
    return sem.arithmetic.relu(u)


#: Operator kinds with semantics of their own here; any other kind is evaluated from its
#: continuous definitions (``definitions.py``).
KNOWN_KINDS: dict[str, Callable[[Semantics, str, np.ndarray], np.ndarray]] = {
    "attention": _attention,
    "rotary-attention": _rotary_attention,
    "cross-attention": _cross_attention,
    "layer-norm": _layer_norm,
    "feed-forward": _feed_forward,
    "gated-feed-forward": _gated_feed_forward,
    "rms-norm": _rms_norm,
    "affine": _affine,
    "nonnegative": _nonnegative,
    "token-shift": _token_shift,
}

#: The residual combiners the evaluator knows by kind: ``(semantics, key, state u, branch output v) → c(u, v)``.
KNOWN_COMBINERS: dict[str, Callable[[Semantics, str, np.ndarray, np.ndarray], np.ndarray]] = {
    "gru-gate": _gru_gate,
}


def unevaluable(scheme) -> dict[str, str]:
    """The operators of ``scheme`` the evaluator cannot evaluate, by key, each with the reason."""
    from .definitions import unsupported

    reasons = {}
    for key, operator in scheme.instantiate().items():
        reason = None if operator.kind in KNOWN_KINDS or operator.kind in KNOWN_COMBINERS else unsupported(operator)
        if reason is not None:
            reasons[key] = reason
    return reasons
