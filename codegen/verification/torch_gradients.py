"""torch's gradients through the emitted ``Block`` against the emitted NumPy ``vjp``.

``adjoint-test/<scheme>/torch``: at the adjoint tests' point (``SchemePoint``: causal plus padding masks, a query that
sees no key), the gradients of ``⟨w, Block(u)⟩`` with respect to the input (and a memory) and every parameter — by
torch's autograd through the emitted ``Block`` (its default) and by its derived backward (``backward="derived"``) —
equal the NumPy ``vjp``'s, within 1e-10 of the largest. The dot and Taylor tests hold that ``vjp`` to its ``forward``.
Control: the same comparison against the ``vjp``'s gradients with the largest of them set to 0 fails (each is
compared by name).

Autograd through the emitted code reads what the derived adjoints do not: a quotient masked by ``torch.where`` whose
other branch divides by 0 gave NaN in every parameter while every other check held.
"""

from __future__ import annotations

from inspect import signature

import numpy as np

from .adjoint_tests import SchemePoint
from .statements import Check

__all__ = ["torch_gradient_check"]

_TOLERANCE = 1e-10


def torch_gradient_check(scheme, numpy_module, torch_module) -> Check:
    """``adjoint-test/<scheme>/torch``: both torch backwards of the emitted ``Block`` against the NumPy ``vjp``."""
    at = SchemePoint.of(scheme, numpy_module)
    w = np.random.default_rng(at.seed + 1).standard_normal(at.x["u"].shape)
    expected = at.vjp(numpy_module, at.x, w)
    scale = max(1.0, max(float(np.abs(value).max()) for value in expected.values()))
    dropped: list[str] = []
    gradients = {mode: _torch_gradients(at, torch_module, w, mode, dropped) for mode in ("autograd", "derived")}
    gaps = {mode: _gap(got, expected) / scale for mode, got in gradients.items()}
    largest = max(expected, key=lambda name: float(np.abs(expected[name]).max()))
    control = _gap(gradients["autograd"], {**expected, largest: np.zeros_like(expected[largest])}) / scale
    holds = all(gap < _TOLERANCE for gap in gaps.values()) and control > 1e3 * _TOLERANCE
    unread = f"; not given to the Block, which takes none: {', '.join(sorted(set(dropped)))}" if dropped else ""
    return Check(
        f"adjoint-test/{scheme.name}/torch", scheme.name,
        f"torch's gradients of ⟨w, Block(u)⟩ through the emitted Block of {at.described(scheme)}, with respect to "
        "the input and every parameter, by autograd (the Block's default) and by its derived backward "
        "(backward=\"derived\"), equal the emitted NumPy vjp's (float64). Control: the vjp's gradients with the "
        "largest of them set to 0.",
        "numeric", holds,
        "max |torch − vjp| / max(1, |vjp|): " + ", ".join(f"{mode} {gap:.1e}" for mode, gap in gaps.items())
        + f" (tolerance {_TOLERANCE:g}); control ({largest} set to 0) {control:.1e}{unread}")


def _torch_gradients(at: SchemePoint, module, w: np.ndarray, mode: str, dropped: list[str]) -> dict[str, np.ndarray]:
    """The gradients of ⟨w, Block(u)⟩ by name, the Block built with ``backward=mode``; the inputs of the NumPy forward
    its ``forward`` takes none of are added to ``dropped``."""
    import torch

    options = {"n_buckets": at.sizes.buckets} if "n_buckets" in signature(module.Block).parameters else {}
    block = module.Block(at.sizes.features, at.sizes.heads, at.sizes.hidden, eps=1e-5, dtype=torch.float64,
                         backward=mode, **at.inputs.torch_block(), **options)
    arrays, params = at.split(at.x)
    block.load_params(params)
    leading = [torch.tensor(value, requires_grad=True) for value in arrays]
    _, extra = at.inputs.torch(masked=True)
    accepted = signature(block.forward).parameters
    dropped += [name for name in extra if name not in accepted]
    extra = {name: value for name, value in extra.items() if name in accepted}
    output = block(*leading, causal=True, key_padding_mask=torch.tensor(at.padding), **extra)
    output.backward(torch.tensor(w))
    gradients = {name: tensor.grad.numpy() for name, tensor in zip(at.front, leading)}
    return gradients | {name: np.zeros(tuple(parameter.shape)) if parameter.grad is None else parameter.grad.numpy()
                        for name, parameter in block.named_parameters()}


def _gap(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> float:
    """The largest difference over the gradients ``expected`` names; ∞ where one is missing or not finite."""
    if set(expected) - set(got):
        return float("inf")
    gaps = [np.abs(got[name] - value).max() for name, value in expected.items()]
    return float(np.max(gaps)) if np.isfinite(gaps).all() else float("inf")
