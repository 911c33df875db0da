"""RMSNorm's scale invariance (Lean: ``RMSNorm.lean``), on the derived operator.

``rms-norm/scale-invariance``: the derived RMSNorm (the projection onto the sphere
``{mean_y u² = 1}`` with the ghost coordinate ``√(N ε)``, then its gain), evaluated entry by
entry with symbolic input and gain, satisfies ``RMS(c x) = RMS(x)`` for every ``c > 0`` when
``ε = 0``, exactly; with ``ε > 0`` it does not (the negative control, at a rational point).
"""

from __future__ import annotations

import sympy as sp

from . import Check, plain

__all__ = ["rms_norm_scale_check"]


def rms_norm_scale_check(features: int = 3) -> Check:
    from splitformer.symbolic.derivation import derive
    from splitformer.symbolic.domains import FEATURES, TOKENS
    from splitformer.symbolic.evaluate import evaluate
    from splitformer.symbolic.operators import EPSILON
    from splitformer.symbolic.scheme import Scheme, Sequence, Substep

    scheme = Scheme("rms-norm", "one RMSNorm", {"norm": "rms-norm"}, Sequence((Substep("norm", "projection"),)))
    program = derive(scheme)
    x = [sp.Symbol(f"x{k}", real=True) for k in range(features)]
    g = [sp.Symbol(f"g{k}", real=True) for k in range(features)]
    c = sp.Symbol("c", positive=True)

    def normalized(scale):
        inputs = {"u0": lambda i, k: scale * x[k], "norm_gain": lambda k: g[k]}
        values = evaluate(program, {TOKENS.size: 1, FEATURES.size: features}, inputs)[program.output]
        return [values[(0, k)] for k in range(features)]

    differences = [a - b for a, b in zip(normalized(c), normalized(1))]
    without_eps = [sp.simplify(difference.subs(EPSILON, 0)) for difference in differences]
    point = {EPSILON: sp.Rational(1, 10), c: 2, **{symbol: k + 1 for k, symbol in enumerate(x)}, g[0]: 1}
    control = differences[0].subs(point)
    holds = all(difference == 0 for difference in without_eps) and control != 0
    return Check(
        "rms-norm/scale-invariance", None,
        f"The derived RMSNorm is scale invariant, RMS(c x) = RMS(x) for every c > 0, when ε = 0 (symbolic x, g, "
        f"{features} features); with ε > 0 it is not (negative control at x = (1, 2, 3), ε = 1/10, c = 2).",
        "symbolic", bool(holds),
        f"ε = 0: differences {', '.join(plain(d) for d in without_eps)}; ε = 1/10: first entry differs by "
        f"{float(control):.4g}",
    )
