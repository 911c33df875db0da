"""Fit the polynomial of single precision's erf and exact GELU (a development tool, not installed):
``python tools/gelu_fit.py``.

The exact GELU is x Φ(x) with Φ(x) = (1 + erf(x/√2))/2 = (1 + tanh g(x))/2, g(x) = artanh erf(x/√2), an odd
function growing from √(2/π) x near 0 to x²/4 far out; erf(v) = tanh g(√2 v). The NumPy runtime (``_ERF_TANH_R`` in
``runtime/numpy_helpers.py``) evaluates g(x) ≈ x R(x²), R a polynomial of degree 6, in float32 and NumPy's
vectorized ``tanh`` on top: 14 array passes and one tanh where Eigen's rational erf took 26 (and two clamps).

R minimizes the largest error of erf, |tanh(x R(x²)) − erf(x/√2)|, over 0 < x ≤ 5.6 (where float32 erf has long
rounded to 1; tanh of x R(x²) rounds to 1 from about x = 5.55 on): Lawson's iteration, weighted least squares whose
weights grow where the error is largest, each row scaled by erf's sensitivity to R, (1 − tanh²) x, with R(0) held at
g'(0) = √(2/π): left free, the fit reaches 5.8e-8 instead of 7.8e-8 but misses that slope by 4.8e-7 relative, which
erf of small x (relative error 10 units in the last place, against 3 held) would show. Prints R's coefficients,
highest degree first, and the float64 error of erf the fit reaches.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fit", "main"]

DEGREE = 6
REACH = 5.6
POINTS = 40_001
ITERATIONS = 300


def fit(degree: int = DEGREE, reach: float = REACH, points: int = POINTS,
        iterations: int = ITERATIONS) -> tuple[np.ndarray, float]:
    """R's coefficients (highest degree first) and the largest error of erf they reach on the grid."""
    x = np.linspace(1e-4, reach, points)
    erf = np.array([math.erf(value / math.sqrt(2)) for value in x])
    slope = math.sqrt(2 / math.pi)  # R(0) = g'(0): held exactly, so erf's relative error vanishes at 0
    target = np.arctanh(np.minimum(erf, 1 - 1e-16)) / x - slope  # R(x²) − R(0), where z Q(z) should be
    powers = np.vander(x * x, degree + 1)[:, :-1]
    sensitivity = np.maximum((1 - erf ** 2) * x, 1e-12)  # d erf / dR = (1 − tanh² g) x
    weights = np.full_like(x, 1 / points)
    best = (math.inf, None)
    for _ in range(iterations):
        rows = sensitivity * np.sqrt(weights)
        coefficients = (*np.linalg.lstsq(powers * rows[:, None], target * rows, rcond=None)[0], slope)
        error = np.abs(np.tanh(x * (powers @ coefficients[:-1] + slope)) - erf)
        best = min(best, (error.max(), tuple(coefficients)), key=lambda pair: pair[0])
        weights = weights * error / np.sum(weights * error)
    return np.array(best[1]), float(best[0])


def main() -> None:
    coefficients, error = fit()
    print(f"# largest error of erf: {error:.3g}")
    print("_ERF_TANH_R = (" + ", ".join(repr(float(c)) for c in coefficients) + ")")


if __name__ == "__main__":
    main()
