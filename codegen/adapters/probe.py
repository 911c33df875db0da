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

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .adapted import Adapted

__all__ = ["check_probe", "PROBE_TOKENS", "TOLERANCE"]

#: Tokens (and batch 2) of the probe input: a few, so that the probe costs milliseconds.
PROBE_TOKENS = 6
#: The largest difference accepted, relative to the largest output (at least 1): float64 round-off only.
TOLERANCE = 1e-8


def check_probe(owner: str, adapted: Adapted, run_source: Callable[[np.ndarray], np.ndarray]) -> None:
    """Refuse unless the generated forward of ``adapted`` (read from a float64 copy of the source) equals
    ``run_source`` (that copy's forward of a float64 ``(batch, tokens, d)`` array) on a random input."""
    read = adapted.astype(np.float64)
    u = np.random.default_rng(0).standard_normal((2, PROBE_TOKENS, read.sizes["d_model"]))
    try:
        expected = np.asarray(run_source(u), dtype=np.float64)
    except Exception as error:  # the source's own failure, named: not a traceback from inside it
        raise SplitformerError(f"{owner}: its forward fails on a probe input ({type(error).__name__}: "
                               f"{' '.join(str(error).split())[:200]})") from None
    module = read.derivation().numpy_module()
    if read.stack:
        got = module.forward_stack(u, list(read.layers), **read.forward_kwargs)
    else:
        got = module.forward(u, read.params, **read.forward_kwargs)
    difference = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else float("inf")
    if not difference <= TOLERANCE * max(1.0, float(np.max(np.abs(expected)))):  # nan included
        raise SplitformerError(f"{owner}: the generated forward of what was read ({read.scheme}) differs from the "
                               f"module's by {difference:.3g} on a probe input; the module computes something its "
                               "attributes do not say (an attribute changed after construction?)")
