"""Random parameters of a scheme's emitted code, for the numerical checks.

Every parameter gets float64 values, biases included (a zero bias would hide a wrong
statement), gains around 1; the extents of its axes come from the check's ``Sizes``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from splitformer.symbolic.operators import Parameter
from splitformer.symbolic.scheme import Scheme

from ..render import narrowest_head
from .semantics import Sizes

__all__ = ["random_parameters", "axis_extents", "scheme_parameters", "emitted_sizes"]


def emitted_sizes(sizes: Sizes, scheme: Scheme) -> Sizes:
    """``sizes`` for ``scheme``'s emitted code: its head width (``Sizes.of``), heads at least as wide as its
    operators ask (``narrowest_head``: ``attn.rotary_dim = 8``, which the emitted code refuses narrower heads than),
    by more features per head, the heads as many, and at least the features its operators need to exercise every
    term (``Operator.checked_features``: a token shift's segments)."""
    sizes = sizes.of(scheme)
    bound = narrowest_head(scheme)
    if bound is not None and sizes.head_width is None and sizes.head_features < bound["width"]:
        sizes = replace(sizes, features=sizes.heads * bound["width"])
    fewest = max((operator.checked_features() for operator in scheme.instantiate().values()), default=0)
    if sizes.features < fewest:
        per_head = -(-fewest // sizes.heads)
        per_head += per_head % 2  # heads of pairs (rotary attention's) stay even: an odd width crashed its checks
        sizes = replace(sizes, features=fewest if sizes.head_width is not None else sizes.heads * per_head)
    return sizes


def axis_extents(sizes: Sizes) -> dict[str, int]:
    """The extent of each axis name of a parameter's shape (``n_heads`` for a control per head)."""
    return {"d": sizes.features, "d_ff": sizes.hidden, "d_kv": sizes.key_value_heads * sizes.head_features,
            "d_inner": sizes.heads * sizes.head_features, "n_heads": sizes.heads, "n_buckets": sizes.buckets}


def random_parameters(scheme: Scheme, sizes: Sizes, seed: int) -> dict[str, np.ndarray]:
    """Float64 values for every parameter of ``scheme``, biases included; gains around 1."""
    rng = np.random.default_rng(seed)
    codes = axis_extents(sizes.of(scheme))
    params = {}
    for key, parameter in scheme_parameters(scheme):
        shape = tuple(codes[domain.code_name] for domain in parameter.shape)
        values = rng.standard_normal(shape) / np.sqrt(shape[0] if len(shape) == 2 else 1)
        params[f"{key}.{parameter.name}"] = values * 0.5 + (1.0 if parameter.kind == "gain" else 0.0)
    return params


def scheme_parameters(scheme: Scheme) -> list[tuple[str, Parameter]]:
    """``(operator key, parameter)`` of every control of ``scheme``: its operators', then its learned steps."""
    found = [(operator.key, parameter) for operator in scheme.instantiate().values() for parameter in operator.parameters()]
    return found + list(scheme.step_controls().items())
