"""T5's buckets of relative token distances (Raffel et al. 2020), as a closed form in SymPy.

A distance ``n ≥ 0`` falls into bucket ``n`` below ``e = ⌊B/2⌋`` (exact buckets), into a bucket
growing with ``log n`` up to ``max_distance``, and into the last bucket ``B − 1`` beyond:

    β_B(n) = min(n, e) + min(⌊log(max(n, e)/e) / log(M/e) · (B − e)⌋, B − 1 − e)

(for ``n < e`` the second term is 0; for ``n ≥ e`` the sum is ``min(e + ⌊…⌋, B − 1)``: T5's
``where(n < e, n, min(e + ⌊…⌋, B − 1))`` without a branch, and without ``log 0``). Causal
attention buckets how far back a key lies, ``max(p(x) − p(x̃), 0)`` among ``B`` buckets;
bidirectional attention gives keys ahead of the query the upper half of the buckets,
``⌊B/2⌋ H(p(x̃) − p(x)) + β_{⌊B/2⌋}(|p(x̃) − p(x)|)`` (``H`` the step, ``H(0) = 0``).
"""

from __future__ import annotations

import sympy as sp

__all__ = ["distance_bucket", "relative_bucket"]


def distance_bucket(distance: sp.Expr, buckets: sp.Expr, max_distance: int) -> sp.Expr:
    """``β_B(n)``: T5's bucket of a distance ``n ≥ 0`` among ``buckets``."""
    exact = sp.floor(buckets / 2)
    logarithmic = sp.floor(sp.log(sp.Max(distance, exact) / exact) / sp.log(sp.Integer(max_distance) / exact)
                           * (buckets - exact))
    return sp.Min(distance, exact) + sp.Min(logarithmic, buckets - 1 - exact)


def relative_bucket(offset: sp.Expr, buckets: sp.Expr, max_distance: int, causal: bool) -> sp.Expr:
    """The bucket of a key ``offset = p(x̃) − p(x)`` tokens from its query (causal or bidirectional)."""
    if causal:
        return distance_bucket(sp.Max(-offset, 0), buckets, max_distance)
    half = sp.floor(buckets / 2)
    return half * sp.Heaviside(offset, 0) + distance_bucket(sp.Abs(offset), half, max_distance)
