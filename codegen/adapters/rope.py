"""RoPE frequencies as a source holds them, and the base θ they are the frequencies of.

transformers (``LlamaRotaryEmbedding``) and x-transformers (``RotaryEmbedding``) compute a rotary
embedding's ``inv_freq`` buffer as ``1 / θ ** (arange(0, R, 2).float() / R)``: in float32 (θ rounded to
float32 too), whatever the model's dtype (``.double()`` widens the float32 values exactly). The generated
code rotates by θ^(−2r/R) computed in its own dtype. A buffer is the frequencies of θ when it is exactly
that float32 computation (``library_frequencies``, on the CPU or the buffer's device, then cast to the
buffer's dtype) or θ^(−2r/R) itself to float64 round-off (a buffer a user computed in float64); anything
else, a frequency scaled by 1 + 1e-7 included, is not. ``read_theta`` recognizes θ from a buffer alone
(x-transformers stores no base): the simplest float32 base (an integer where one fits) whose frequencies
the buffer is, so the default buffer is read as 10000 exactly, not as the 9999.998 its rounding suggests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["library_frequencies", "exact_frequencies", "is_frequencies_of", "read_theta"]

#: Float32 bases on either side of a fit that ``read_theta`` tries (the fit is within a few of them).
_NEIGHBOURS = 16


def library_frequencies(theta: float, rotated: int, device: Any = "cpu") -> Any:
    """``1 / θ ** (arange(0, rotated, 2).float() / rotated)`` in float32 on ``device``, as both libraries compute it."""
    import torch

    return 1.0 / (theta ** (torch.arange(0, rotated, 2, device=device).float() / rotated))


def exact_frequencies(theta: float, rotated: int) -> np.ndarray:
    """θ^(−2r/R) for r < R/2, in float64: what the generated code rotates by."""
    return theta ** (-np.arange(0, rotated, 2, dtype=np.float64) / rotated)


def is_frequencies_of(buffer: Any, theta: float, rotated: int) -> bool:
    """``buffer`` (a float32 or float64 tensor of ``rotated / 2`` entries) is exactly the frequencies of ``theta`` as
    the libraries compute them in float32 (on the CPU or its own device), or θ^(−2r/R) to float64 round-off. A half
    precision buffer (a model converted with ``.to(torch.bfloat16)``) holds them rounded, and the library rotates by
    those: 0.4 % off in bfloat16, angles off by whole turns at long positions."""
    import torch

    if buffer.dtype not in (torch.float32, torch.float64) or tuple(buffer.shape) != (rotated // 2,):
        return False
    found = buffer.detach()
    for device in dict.fromkeys(("cpu", found.device)):
        if torch.equal(library_frequencies(theta, rotated, device).to(found.dtype), found.to(device)):
            return True
    values = found.cpu().to(torch.float64).numpy()
    exact = exact_frequencies(theta, rotated)
    return found.dtype == torch.float64 and bool(np.allclose(values, exact, rtol=1e-14, atol=0.0))


def read_theta(buffer: Any, rotated: int) -> float | None:
    """The base θ whose frequencies ``buffer`` is (``is_frequencies_of``), ``None`` when there is none: an integer
    where one fits, else the float32 base nearest a fit to the last frequency (every base tried reproduces the
    buffer exactly, so the choice among them changes nothing the buffer says)."""
    import torch

    if not buffer.is_floating_point() or rotated < 4 or tuple(buffer.shape) != (rotated // 2,):
        return None
    values = buffer.detach().cpu().to(torch.float64).numpy()
    if not (np.all(np.isfinite(values)) and np.all(values > 0)):
        return None
    fit = float(values[-1] ** (-rotated / (rotated - 2)))  # the largest exponent: the fit least spread by rounding
    if not np.isfinite(fit) or fit <= 1.0:
        return None
    below = above = np.float32(fit)
    candidates = {fit, float(round(fit)), float(below)}
    for _ in range(_NEIGHBOURS):
        below, above = np.nextafter(below, np.float32(0)), np.nextafter(above, np.float32(np.inf))
        candidates |= {float(below), float(above)}
    for theta in sorted(candidates, key=lambda value: (not value.is_integer(), abs(value - fit))):
        if is_frequencies_of(buffer, theta, rotated):
            return theta
    return None
