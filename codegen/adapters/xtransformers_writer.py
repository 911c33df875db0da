"""Canonical parameters → an x-transformers ``Encoder``/``Decoder``/``TransformerWrapper``'s state dict
(``splitformer.adapters.to_xtransformers``).

The writer is the reader's inverse, found from the reader itself rather than written a second
time: ``from_xtransformers`` maps every entry of x-transformers' parameters to canonical entries by
affine maps of one source entry each (a transpose, a permutation of rotary pairs, repeated
key/value heads, a score scale, a unit offset, GLU halves). Three
reads of a float64 copy, with every parameter entry set to ``0``, to ``1`` and to its own index
``j + 1``, give each canonical entry's source ``j``, slope ``a`` and offset ``c``; then each source
entry is ``(t − c) / a`` of a canonical entry ``t`` it feeds. A canonical entry that x-transformers
cannot hold is refused by name: one its layout fixes (``a = 0``: a SimpleRMSNorm gain, the
final LayerNorm's bias, ALiBi's slopes, a missing qk-norm scale), or one that differs from another
entry of the same source (copies of a shared key/value head, tied layers, ScaleNorm's one gain).
The result is read back and compared before it is returned.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .adapted import Adapted

__all__ = ["xtransformers_state"]

#: How close the written parameters must read back, relative to the largest canonical entry.
_READ_BACK = 1e-10


def _flat(adapted: Adapted) -> tuple[list[str], np.ndarray]:
    """Names (``layer 1: attn.W_q[0, 3]``) and values of every canonical entry, in one order."""
    names, values = [], []
    parts = [(f"layer {index}", layer) for index, layer in enumerate(adapted.layers)]
    parts += [("final_norm", adapted.final_norm)] if adapted.final_norm is not None else []
    for where, params in parts:
        for key in sorted(params):
            value = np.asarray(params[key], dtype=np.float64)
            names += [f"{where}: {key}{list(index) if value.ndim else ''}" for index in np.ndindex(value.shape)]
            values.append(value.reshape(-1))
    return names, np.concatenate(values)


class _Probe:
    """A float64 copy of ``module`` whose parameters are set from one flat vector, read by ``read``."""

    def __init__(self, module: Any, read):
        self.module = copy.deepcopy(module).double()
        self.parameters = list(dict(self.module.named_parameters()).values())  # shared (tied) ones once
        self.sizes = [parameter.numel() for parameter in self.parameters]
        self.read = read

    def __call__(self, values: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            for parameter, chunk in zip(self.parameters, np.split(values, np.cumsum(self.sizes)[:-1])):
                parameter.copy_(torch.from_numpy(chunk.reshape(parameter.shape)))
        return _flat(self.read(self.module))[1]


def _rounding(adapted: Adapted) -> np.ndarray:
    """Each canonical entry's spacing in its own dtype (``_flat``'s order): how far a float32 reading may hold a value
    its layout fixes (qk-norm's 10·√d_head, no float32 number) from that value."""
    parts = [*adapted.layers] + ([adapted.final_norm] if adapted.final_norm is not None else [])
    return np.concatenate([np.abs(np.spacing(np.asarray(params[key]))).astype(np.float64).reshape(-1)
                           for params in parts for key in sorted(params)])


def _solve(probe: _Probe, names: list[str], target: np.ndarray,
           rounding: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The source entries whose read is ``target``, which of them it sets, and which canonical entries the layout
    fixes (no source entry moves them); refuses an entry
    x-transformers cannot hold: off what its layout fixes by more than ``_READ_BACK`` (relative to the largest
    entry) and the entry's own ``rounding``, or off another canonical entry held in one source entry by more than
    ``_READ_BACK`` (both read from one value: equal unless changed)."""
    count = sum(probe.sizes)
    offset = probe(np.zeros(count))
    slope = probe(np.ones(count)) - offset
    moving = slope != 0
    source = np.full(target.shape, -1)
    source[moving] = np.rint((probe(np.arange(1.0, count + 1)) - offset)[moving] / slope[moving]).astype(int) - 1
    scale = max(1.0, float(np.abs(target).max()))
    fixed = ~moving & (np.abs(target - offset) > _READ_BACK * scale + rounding)
    if fixed.any():
        k = int(np.flatnonzero(fixed)[0])
        raise SplitformerError(f"{names[k]} = {target[k]:.9g} cannot be written: x-transformers' layout fixes it at "
                               f"{offset[k]:.9g} (an entry it does not have, or a buffer)")
    values = np.zeros(count)
    written = np.zeros(count, dtype=bool)
    for k in np.flatnonzero(moving):
        value = (target[k] - offset[k]) / slope[k]
        j = source[k]
        if written[j] and abs(values[j] - value) > _READ_BACK * scale:
            raise SplitformerError(f"{names[k]} = {target[k]:.6g} cannot be written: x-transformers holds it in one "
                                   "entry with another canonical entry that differs (a shared key/value head, tied "
                                   "layers, the relative-position table all layers share, ScaleNorm's one gain)")
        values[j], written[j] = value, True
    return values, written, ~moving


def xtransformers_state(adapted: Adapted, module: Any, read: Callable[[Any], Adapted], dtype: Any = None) -> dict[str, Any]:
    """The state dict of ``module`` whose read (``read``: ``from_xtransformers``) is ``adapted``'s parameters."""
    names, target = _flat(adapted)
    probe = _Probe(module, read)
    rounding = _rounding(adapted)
    values, written, held = _solve(probe, names, target, rounding)
    current = np.concatenate([parameter.detach().cpu().double().numpy().reshape(-1)
                              for parameter in dict(module.named_parameters()).values()])
    values = np.where(written, values, current)
    slack = np.where(held, rounding, 0.0)  # a fixed entry reads back exact where the reading holds it rounded
    error = float(np.max(np.abs(probe(values) - target) - slack))
    if error > _READ_BACK * max(1.0, float(np.abs(target).max())):
        raise SplitformerError(f"to_xtransformers: the written parameters read back {error:.2e} off the canonical ones")
    return _state_dict(module, probe, values, dtype)


def _state_dict(module: Any, probe: _Probe, values: np.ndarray, dtype: Any) -> dict[str, Any]:
    """``module``'s state dict with its parameters (tied ones under each of their keys) set to ``values``."""
    import torch

    originals = list(dict(module.named_parameters()).values())
    chunks = dict(zip(map(id, originals), np.split(values, np.cumsum(probe.sizes)[:-1])))
    state = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        chunk = chunks.get(id(tensor))
        value = tensor.detach().clone() if chunk is None else torch.from_numpy(chunk.reshape(tensor.shape).copy())
        state[key] = value.to(dtype or tensor.dtype) if value.is_floating_point() else value
    return state
