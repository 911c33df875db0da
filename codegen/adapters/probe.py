"""The probe: what an adapter read must compute what the source computes, on one random input.

A reader compares the attributes it knows; an attribute it does not read (a score scale, a
causality, a cached table edited after construction) would otherwise give an ``Adapted`` whose
generated forward differs from the source with no error. ``check_probe`` runs the source (a float64
copy: the source itself is left as it is) and the generated NumPy forward of what was read on one
random input of a few tokens, and refuses in one line when they differ by more than ``TOLERANCE``
relative. The generated module is derived once per scheme in a process (``Adapted.derivation``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .adapted import Adapted

__all__ = ["check_probe", "randomized", "PROBE_TOKENS", "TOLERANCE"]

#: Tokens (and batch 2) of the probe input: a few, so that the probe costs milliseconds.
PROBE_TOKENS = 6
#: The largest difference accepted, relative to the largest output (at least 1): float64 round-off only.
TOLERANCE = 1e-8


def check_probe(owner: str, adapted: Adapted, run_source: Callable[[np.ndarray, np.ndarray | None], np.ndarray]) -> None:
    """Refuse unless the generated forward of ``adapted`` (read from a float64 copy of the source) equals
    ``run_source`` (that copy's forward of a float64 ``(batch, tokens, d)`` array and a padding mask, True where a
    token is padded, or None) on a random input: without a mask, then with one (on the tokens not padded)."""
    read = adapted.astype(np.float64)
    u = np.random.default_rng(0).standard_normal((2, PROBE_TOKENS, read.sizes["d_model"]))
    padded = np.zeros(u.shape[:2], dtype=bool)
    padded[0, 0] = padded[1, -2:] = True  # one row padded on the left, one on the right
    module = read.derivation().numpy_module()
    for mask in (None, padded):
        try:
            expected = np.asarray(run_source(u, mask), dtype=np.float64)
        except Exception as error:  # the source's own failure, named: not a traceback from inside it
            raise SplitformerError(f"{owner}: its forward fails on a probe input{'' if mask is None else ' with a padding mask'} "
                                   f"({type(error).__name__}: {' '.join(str(error).split())[:200]})") from None
        options = dict(read.forward_kwargs) | ({} if mask is None else {"key_padding_mask": mask})
        if read.stack:
            got = module.forward_stack(u, list(read.layers), **options)
        else:
            got = module.forward(u, read.params, **options)
        valid = ~padded if mask is not None else np.ones(u.shape[:2], dtype=bool)
        difference = float(np.max(np.abs(got - expected)[valid])) if got.shape == expected.shape else float("inf")
        if not difference <= TOLERANCE * max(1.0, float(np.max(np.abs(expected[valid])))):  # nan included
            raise SplitformerError(
                f"{owner}: the generated forward of what was read ({read.scheme}) differs from the module's by "
                f"{difference:.3g} on a probe input{'' if mask is None else ' with a padding mask'}; the module computes "
                "something its attributes do not say (an attribute changed after construction?)")


def randomized(module: Any, seed: int = 0) -> Any:
    """``module`` (a torch module, changed in place) with every parameter random: weights of variance 1/fan-in, the
    rest N(0, ¼), seeded. A probe of the module's own weights misses any branch they zero (x-transformers'
    ``zero_init_branch_output``); the reader reads this copy, so the probe checks the computation, not the weights."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():  # shared (tied) parameters once, as parameters() yields them
            values = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            scale = parameter[0].numel() ** -0.5 if parameter.dim() > 1 else 0.5
            parameter.copy_(scale * values)
    return module

