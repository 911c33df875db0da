"""Checks of the LLM blocks: RMSNorm as a projection, RoPE's relative kernel, GQA as repeated heads.

- ``rms-norm/kkt``: the derived projection onto the sphere ``{mean_y u² = σ²}`` is a KKT point
  of ``min ½‖u − v‖²`` on it (a multiplier ``λ`` makes ``u − v + λ u = 0``, the constraint holds).
- ``rms-norm/distance``: at that point the squared distance is ``N (σ − √ρ)²``: Theorem 3.1's
  distance ``N[(σ₂ − √β)² + (σ₁ − α)²]`` at a zero-mean input (``α = σ₁ = 0``, ``β = ρ``), and no
  point of the sphere is nearer (Cauchy–Schwarz bound, checked at random sphere points).
- ``rope/relative-kernel``: with the rotation kernel of the ``rotary-attention`` operator, the
  score of one frequency pair depends on the positions only through ``p(x) − p(x̃)``.
- ``gqa/repeated-heads``: the derived grouped-query attention equals the same derived
  attention with ``n_kv_heads = n_heads`` and every key/value head repeated ``n_rep`` times.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import sympy as sp

from . import Check, plain
from .recovery import vanishes

__all__ = ["llm_checks", "rms_norm_kkt_check", "rms_norm_distance_check", "rope_relative_check", "gqa_repeat_check",
           "rotary_kernel"]

_N = 3  # features of the RMSNorm checks


def _rms_projection(formula: sp.Expr | None) -> tuple[sp.Expr, list[sp.Symbol], sp.Symbol]:
    """The entries of the derived projection (ε = 0) of ``v = (v_0, …)`` and the radius σ."""
    from splitformer.symbolic.projections import SYMBOLS
    from splitformer.symbolic.rms_norm import MEAN_SQUARE, RADIUS, RMSNorm

    formula = RMSNorm.projection().formula if formula is None else formula
    v = [sp.Symbol(f"v{k}", real=True) for k in range(_N)]
    rho = sum(value**2 for value in v) / _N
    entries = [formula.subs({SYMBOLS.epsilon: 0}).subs({SYMBOLS.v: value, MEAN_SQUARE: rho}) for value in v]
    return entries, v, RADIUS


def rms_norm_kkt_check(formula: sp.Expr | None = None) -> Check:
    """KKT of the projection onto ``{mean u² = σ²}``; ``formula`` replaces the derived one (controls)."""
    u, v, sigma = _rms_projection(formula)
    lam = sp.Symbol("lambda")
    multiplier = sp.solve(u[0] - v[0] + lam * u[0], lam)
    residuals = [sp.simplify(u[k] - v[k] + multiplier[0] * u[k]) for k in range(_N)] if multiplier else [1]
    feasibility = sp.simplify(sum(value**2 for value in u) / _N - sigma**2)
    holds = all(residual == 0 for residual in residuals) and feasibility == 0
    return Check(
        "rms-norm/kkt", None,
        f"The derived RMSNorm projection (ε = 0, radius σ) is a KKT point of min ½‖u − v‖² subject to "
        f"mean_y u² = σ²: one multiplier λ gives u − v + λu = 0 in every entry, and the constraint holds "
        f"({_N} features).",
        "symbolic", holds,
        (f"λ = {plain(multiplier[0])}; stationarity and constraint residuals simplify to 0" if holds else
         f"stationarity residuals {', '.join(plain(r) for r in residuals)}; constraint residual {plain(feasibility)}"),
    )


def rms_norm_distance_check(formula: sp.Expr | None = None, samples: int = 200) -> Check:
    """The distance to the derived point equals Theorem 3.1's at a zero-mean input, and is the least."""
    from splitformer.symbolic.projections import derive_layer_norm_projection
    from splitformer.symbolic.projections import SYMBOLS as S

    u, v, sigma = _rms_projection(formula)
    rho = sum(value**2 for value in v) / _N
    distance = sum((a - b) ** 2 for a, b in zip(u, v))
    claimed = _N * (sigma - sp.sqrt(rho)) ** 2
    theorem = derive_layer_norm_projection().distance
    count = {symbol: _N for symbol in theorem.free_symbols if symbol.name == "N"}
    theorem = theorem.subs({S.alpha: 0, S.sigma_1: 0, S.beta: rho, S.sigma_2: sigma, **count})
    point = {symbol: sp.Rational(random.Random(k).randint(-9, 9) or 1, 7) for k, symbol in enumerate(v)}
    point[sigma] = sp.Rational(3, 2)
    exact = sp.simplify((distance - claimed).subs(point)) == 0 and sp.simplify((theorem - claimed).subs(point)) == 0
    symbolic = sp.simplify(sp.expand(distance - claimed)) == 0
    generator = random.Random(0)
    at = {symbol: float(value) for symbol, value in point.items()}
    best = float(distance.subs(point))
    nearer = 0
    for _ in range(samples):
        w = [generator.gauss(0, 1) for _ in range(_N)]
        scale = float(at[sigma]) * (_N / sum(x * x for x in w)) ** 0.5
        if sum((scale * x - at[b]) ** 2 for x, b in zip(w, v)) < best - 1e-12:
            nearer += 1
    holds = exact and symbolic and nearer == 0
    return Check(
        "rms-norm/distance", None,
        "At the derived RMSNorm point the squared distance is N(σ − √ρ)², ρ = mean_y v²: Theorem 3.1's distance "
        "N[(σ₂ − √β)² + (σ₁ − α)²] for a zero-mean input (α = σ₁ = 0, β = ρ); no point of the sphere is nearer "
        f"({samples} random sphere points at a rational v).",
        "symbolic", holds,
        (f"‖u − v‖² − N(σ − √ρ)² simplifies to 0; equal to Theorem 3.1's distance at α = 0; 0 of {samples} "
         "sphere points nearer" if holds else
         f"distance residual {'0' if symbolic else 'non-zero'}, theorem match {exact}, {nearer} sphere points nearer"),
    )


def rotary_kernel() -> Callable[[sp.Expr, int, int], sp.Expr]:
    """``R(φ; c, c̃)`` read from the ``rotary-attention`` operator's definition of the rotated queries."""
    from splitformer.symbolic.domains import C, C_IN
    from splitformer.symbolic.rotary_attention import RotaryAttention

    definition = next(d for d in RotaryAttention("attn").definitions() if d.function == "qr")
    integrand = definition.rhs.function
    (angle,) = [f for f in integrand.atoms(sp.core.function.AppliedUndef) if f.func.__name__ == "phi"]
    kernel = sp.Mul(*[factor for factor in sp.Mul.make_args(integrand)
                      if not (isinstance(factor, sp.core.function.AppliedUndef) and factor.func.__name__ == "q")])
    phi = sp.Symbol("phi")
    kernel = kernel.subs(angle, phi)
    return lambda value, c, c_in: kernel.subs({phi: value, C.symbol: c, C_IN.symbol: c_in})


def rope_relative_check(kernel: Callable | None = None) -> Check:
    """One frequency pair: ``s = Σ_c (R(p ω) q)_c (R(p̃ ω) k)_c`` satisfies ``(∂_p + ∂_p̃) s = 0``."""
    kernel = kernel or rotary_kernel()
    p, p_key, omega = sp.symbols("p p_tilde omega", real=True)
    q = sp.symbols("q0 q1", real=True)
    k = sp.symbols("k0 k1", real=True)

    def rotated(vector, position):
        return [sum(kernel(position * omega, c, c_in) * vector[c_in] for c_in in (0, 1)) for c in (0, 1)]

    score = sum(a * b for a, b in zip(rotated(q, p), rotated(k, p_key)))
    # in exponentials, cos² + sin² = 1 is exp(ix)·exp(−ix) = 1, which expansion applies (simplify: 5× slower)
    drift = (sp.diff(score, p) + sp.diff(score, p_key)).rewrite(sp.exp)
    relative = (score - score.subs({p: p - p_key, p_key: 0}, simultaneous=True)).rewrite(sp.exp)
    failing = [(name, residual) for name, residual in (("(∂_p + ∂_p̃) s", drift), ("s(p, p̃) − s(p − p̃, 0)", relative))
               if not vanishes(residual)]
    holds = not failing
    return Check(
        "rope/relative-kernel", None,
        "With the rotation kernel R(φ; c, c̃) = cos(φ − (c − c̃)π/2) of the rotary-attention operator, the score "
        "Σ_c (R(p ω) q)_c (R(p̃ ω) k)_c of one feature pair depends on the token positions only through p − p̃ "
        "(R(a)ᵀR(b) = R(b − a)): (∂_p + ∂_p̃) s = 0 and s(p, p̃) = s(p − p̃, 0).",
        "symbolic", holds,
        "both residuals expand to 0" if holds
        else f"{failing[0][0]} = {plain(sp.simplify(failing[0][1].rewrite(sp.cos)))}",
    )


def gqa_repeat_check(repeat: Callable | None = None) -> Check:
    """The derived rotary attention with 2 key/value heads for 4 query heads equals it with 4 repeated heads.

    ``repeat(matrix, n_kv, n_rep, width)`` builds the MHA kernels (default: each head ``n_rep`` times in a
    row, transformers' ``repeat_kv``); a different order is a negative control.
    """
    from splitformer.symbolic.derivation import derive
    from splitformer.symbolic.domains import VARIABLES
    from splitformer.symbolic.evaluate import evaluate
    from splitformer.symbolic.rotary_attention import POSITIONS, ROPE_THETA
    from splitformer.symbolic.scheme import Scheme, Sequence, Substep
    from .recovery import domain_sizes, evaluation_sizes, view_entry

    repeat = repeat or (lambda matrix, n_kv, n_rep, width: sp.Matrix.hstack(
        *[matrix[:, g * width:(g + 1) * width] for g in range(n_kv) for _ in range(n_rep)]))
    scheme = Scheme("gqa", "rotary attention alone", {"attn": "rotary-attention"},
                    Sequence((Substep("attn", "explicit"),)), causal=True)
    program = derive(scheme)
    index_domains = {variable.index: variable.domain for variable in VARIABLES.values()}
    n, d, heads, kv_heads, width = 2, 8, 4, 2, 2

    def symbols(name, rows, columns):
        return sp.Matrix(rows, columns, lambda i, j: sp.Symbol(f"{name}[{i},{j}]", real=True))

    grouped = {"W_q": symbols("W_q", d, d), "W_k": symbols("W_k", d, kv_heads * width),
               "W_v": symbols("W_v", d, kv_heads * width), "W_o": symbols("W_o", d, d)}
    repeated = dict(grouped, **{name: repeat(grouped[name], kv_heads, heads // kv_heads, width) for name in ("W_k", "W_v")})
    u = symbols("u", n, d)

    def run(params, n_kv):
        sizes = evaluation_sizes(n, d, heads, 1, kv_heads=n_kv)
        by_domain = domain_sizes(sizes)
        inputs = {"u0": lambda i, k: u[i, k], "chi": lambda i, j: int(j <= i), POSITIONS: lambda i: i}
        for tensor in program.parameters():
            domains = [index_domains[index] for index in tensor.indices]
            matrix = params[tensor.parameter.split(".")[1]]
            inputs[tensor.name] = (lambda *index, matrix=matrix, domains=domains, shape=tensor.shape:
                                   matrix[view_entry(domains, shape, index, by_domain)])
        return evaluate(program, {**sizes, ROPE_THETA: 10000}, inputs)[program.output]

    first, second = run(grouped, kv_heads), run(repeated, heads)
    differing = [key for key in first if not vanishes(first[key] - second[key])]
    return Check(
        "gqa/repeated-heads", None,
        "Grouped-query attention (keys and values on a coarser head grid) equals multi-head attention whose "
        "key/value kernels repeat each head n_rep times in a row: the derived rotary attention with 4 query "
        "heads and 2 key/value heads against the same program with 4 key/value heads, exactly, 2 tokens, d = 8.",
        "symbolic", not differing,
        "every output entry agrees exactly" if not differing else f"entries {differing} differ",
    )


def llm_checks() -> list[Check]:
    """Every check of this module, with the derived formulas."""
    return [rms_norm_kkt_check(), rms_norm_distance_check(), rope_relative_check(), gqa_repeat_check()]
