"""The paper's own scheme (``paper-lie``) against the post-LN block after ``W̃ = I + W``.

Parameter map (``d_ff = d``): ``ffn.W_1 = I + ffn1.W``, ``ffn.b_1 = ffn1.b``,
``ffn.W_2 = I + ffn2.W``, ``ffn.b_2 = ffn2.b``, every other parameter unchanged. The
relaxation ``½(w + u)`` halves the state that the second projection receives, and
``LN(½z; ε) = LN(z; 4ε)``: with the second LayerNorm's ε replaced by ``4ε`` the two blocks
are equal for every ε; with one ε for both they are equal at ε = 0 only, and the check
measures the difference at ε = 1e-5 on the emitted code. With ``d_ff ≠ d`` there is no
map: ``I + W_1`` needs a square kernel.
"""

from __future__ import annotations

import mpmath
import numpy as np

from splitformer.codegen.verification.statements import Check
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.scheme_file import load_scheme

from .emitted import emitted_modules
from .parameters import random_parameters
from .scheme_checks import DIGITS
from .semantics import MPMATH, Semantics, Sizes

__all__ = ["paper_checks", "to_post_ln"]

_SIZES = Sizes(tokens=5, features=8, heads=2, hidden=8)


def to_post_ln(params: dict, identity) -> dict:
    """The post-LN parameters of a ``paper-lie`` parameter set (``identity``: the d × d identity)."""
    mapped = {name: value for name, value in params.items() if not name.startswith(("ffn1.", "ffn2."))}
    mapped.update({"ffn.W_1": identity + params["ffn1.W"], "ffn.b_1": params["ffn1.b"],
                   "ffn.W_2": identity + params["ffn2.W"], "ffn.b_2": params["ffn2.b"]})
    return mapped


def _difference(paper, post_ln, params, mapped, u, support, eps_paper, eps_post) -> mpmath.mpf:
    left = Semantics(paper, params, _SIZES, MPMATH, support=support, eps=eps_paper).step(u)
    right = Semantics(post_ln, mapped, _SIZES, MPMATH, support=support, eps=eps_post).step(u)
    return max(abs(value) for value in (left - right).flat)


def paper_checks(scheme: Scheme) -> list[Check]:
    """``paper-lie`` = post-LN after the map, exactly with norm2's ε → 4ε; the same-ε gap, measured."""
    post_ln = load_scheme("post-ln")
    params = random_parameters(scheme, _SIZES, 11)
    u = np.random.default_rng(12).standard_normal((_SIZES.tokens, _SIZES.features))
    support = np.tril(np.ones((_SIZES.tokens, _SIZES.tokens), dtype=int))
    d = _SIZES.features
    with mpmath.workdps(DIGITS):
        exact = {name: np.frompyfunc(mpmath.mpf, 1, 1)(value) for name, value in params.items()}
        identity = np.frompyfunc(mpmath.mpf, 1, 1)(np.eye(d))
        mapped = to_post_ln(exact, identity)
        u_exact = np.frompyfunc(mpmath.mpf, 1, 1)(u)
        eps = mpmath.mpf("1e-5")
        with_map = _difference(scheme, post_ln, exact, mapped, u_exact, support, eps, {"norm1": eps, "norm2": 4 * eps})
        at_zero = _difference(scheme, post_ln, exact, mapped, u_exact, support, 0, 0)
        control = _difference(scheme, post_ln, exact, to_post_ln(exact, 0 * identity), u_exact, support, 0, 0)
    tolerance = mpmath.mpf(10) ** -40
    paper_module = emitted_modules(scheme, derive(scheme), ("numpy",))["numpy"]
    post_module = emitted_modules(post_ln, derive(post_ln), ("numpy",))["numpy"]
    batch = u[None]
    same_eps = float(np.abs(paper_module.forward(batch, params, n_heads=_SIZES.heads, eps=1e-5, causal=True)
                            - post_module.forward(batch, to_post_ln(params, np.eye(d)), n_heads=_SIZES.heads,
                                                  eps=1e-5, causal=True)).max())
    statement = ("The paper's Lie scheme (paper-lie: J = 2 affine substeps with the S₂ projection between them, "
                 "½ relaxation) equals the post-LN block after ffn.W_1 = I + ffn1.W, ffn.b_1 = ffn1.b, "
                 "ffn.W_2 = I + ffn2.W, ffn.b_2 = ffn2.b (d_ff = d; with d_ff ≠ d there is no such map, I + W_1 "
                 "needs a square kernel), other parameters unchanged")
    return [
        Check("paper-lie/post-ln-exact", scheme.name,
              statement + ", when post-LN's second LayerNorm uses 4ε (LN(½z; ε) = LN(z; 4ε)); and with one ε for "
              "both at ε = 0. 50-digit evaluator, 5 tokens, d = 8, 2 heads, causal mask, random parameters.",
              "numeric", bool(with_map < tolerance and at_zero < tolerance and control > tolerance),
              f"max difference {mpmath.nstr(with_map, 3)} (ε = 1e-5, norm2 at 4ε), {mpmath.nstr(at_zero, 3)} (ε = 0); "
              f"control: without the identity (W̃ = W) {mpmath.nstr(control, 3)}"),
        Check("paper-lie/post-ln-same-eps", scheme.name,
              statement + ", with one ε = 1e-5 for both LayerNorms: not exact; the emitted NumPy modules of both "
              "differ by O(ε) (the relaxation is exact only for a scale-invariant projection).",
              "numeric", 0 < same_eps < 1e-3,
              f"max |paper-lie − post-ln| = {same_eps:.2e} at ε = 1e-5 (float64, emitted code)"),
    ]
