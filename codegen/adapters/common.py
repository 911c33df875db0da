"""Checks and conversions every adapter shares: LayerNorms, biases, stacks, state dicts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .adapted import Adapted
from .arrays import array, tensor
from .inspection import library_name, runs_one_of

__all__ = ["activation_name", "check_attention", "check_head_split", "shared_layers", "zero_bias", "check_bias", "check_norms", "layer_norm_params", "same_configuration",
           "final_norm_params", "stack_state", "state_dict", "torch_dropout"]


#: Class names of activation modules (torch, transformers) → the scheme activation they compute.
ACTIVATION_CLASSES = {"ReLU": "relu", "GELUActivation": "gelu", "SiLU": "silu", "SiLUActivation": "silu", "Tanh": "tanh",
                      "GELUTanh": "gelu-tanh"}  # timm's and transformers' GELUTanh: F.gelu(x, approximate="tanh")
#: ``torch.nn.functional``/``torch`` function names → the scheme activation.
ACTIVATION_FUNCTIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "tanh": "tanh"}


def activation_name(owner: str, function: Any, tanh_gelu: bool = True) -> str:
    """The scheme activation ``function`` computes (torch's ``GELU`` exact or tanh-approximated); anything else is
    refused, the message listing the tanh form only where the caller reads it (``tanh_gelu``)."""
    import torch

    name = library_name(function)  # a user class runs (and is read as) the library class it derives from
    approximate = getattr(function, "approximate", "none")  # timm's own GELU class has none: the exact form
    if name == "GELU" and approximate in ("none", "tanh"):
        return "gelu" if approximate == "none" else "gelu-tanh"
    if name in ACTIVATION_CLASSES and not getattr(function, "use_gelu_tanh_python", False):
        return ACTIVATION_CLASSES[name]
    plain = getattr(function, "__name__", "")
    if plain in ACTIVATION_FUNCTIONS and function in (getattr(torch.nn.functional, plain, None), getattr(torch, plain, None)):
        return ACTIVATION_FUNCTIONS[plain]
    shown = plain or repr(function)
    raise SplitformerError(f"{owner} activation {shown} has no scheme activation "
                           f"(supported: {', '.join(sorted(set(ACTIVATION_FUNCTIONS)))}, and torch's GELU exact"
                           + (" or approximate='tanh')" if tanh_gelu else ")"))


def check_attention(owner: str, path: str, attention: Any, head_dim: int, scheme: str) -> None:
    """Refuse a causal scheme's attention (``owner.path``) whose flags make it compute otherwise: ``is_causal``
    False (the sdpa path attends to later tokens), ``scaling`` (what the forward multiplies scores by) ≠ ``1/√head_dim``."""
    if getattr(attention, "is_causal", True) is not True:
        raise SplitformerError(f"{owner}.{path}.is_causal is {attention.is_causal!r}: it attends to later tokens; "
                               f"the {scheme} scheme is causal (x̃ ≤ x)")
    scale = getattr(attention, "scaling", head_dim ** -0.5)
    if not math.isclose(scale, head_dim ** -0.5, rel_tol=1e-12):
        raise SplitformerError(f"{owner} scales attention scores by {scale} ({path}.scaling), the {scheme} scheme "
                               f"by 1/sqrt(head_dim) = {head_dim ** -0.5:g}")


def check_head_split(owner: str, d: int, heads: tuple[str, Any], head_sizes: Mapping[str, Any],
                     widths: Mapping[str, Any] | None = None) -> None:
    """Refuse an attention whose forward splits its width ``d`` otherwise than into ``heads`` (``(path, count)``,
    what the adapter reads as ``n_heads``) heads of ``d / count``: ``head_sizes`` (attribute path → value) are
    what the forward splits by (``attention.self.attention_head_size``), ``widths`` what it takes as all heads'."""
    path, count = heads
    if type(count) is not int or count < 1 or d % count:
        raise SplitformerError(f"{owner}.{path} is {count!r}; the scheme's heads split d = {d} evenly")
    wanted = {name: (value, d // count) for name, value in head_sizes.items()}
    wanted |= {name: (value, d) for name, value in (widths or {}).items()}
    for name, (value, expected) in wanted.items():
        if type(value) is not int or value != expected:
            raise SplitformerError(f"{owner}.{name} is {value!r}, but {path} = {count} heads of d = {d} make it "
                                   f"{expected}; the forward splits the heads by {name}")


def shared_layers(owner: str, layers: Sequence[Any]) -> bool:
    """True when every one of ``layers`` is one module object (weight-shared depth: read as ``tied``), False when
    each is its own; another sharing has no generated Stack (``Stack(tied=True)`` runs one Block at every step)."""
    distinct = len({id(layer) for layer in layers})
    if distinct == len(layers):
        return False
    if distinct == 1:
        return True
    raise SplitformerError(f"{owner} shares some layer modules between steps but not all ({distinct} distinct of "
                           f"{len(layers)}); a generated Stack ties all its layers (tied=True) or none")


def torch_dropout(layer: Any, attentions: Sequence[Any]) -> float | None:
    """The one dropout probability of a torch Transformer layer (its ``Dropout`` modules and its
    attentions' ``dropout``), which a generated ``Block`` applies where torch does; ``None`` when they differ."""
    rates = {module.p for module in layer.modules() if runs_one_of(module, ("Dropout",))}
    rates |= {float(attention.dropout) for attention in attentions}
    return float(rates.pop()) if len(rates) == 1 else None


def zero_bias(size: int, dtype: np.dtype) -> np.ndarray:
    """The canonical bias of a bias-less source part."""
    return np.zeros(size, dtype=dtype)


def check_bias(owner: str, biases: Sequence[Any]) -> bool:
    """True when every bias tensor is present, False when none is; a mix is refused."""
    present = [bias is not None for bias in biases]
    if any(present) and not all(present):
        raise SplitformerError(f"{owner} has biases in some parts and not in others; "
                               "generated blocks have all biases (bias=True) or none (bias=False)")
    return all(present)


def check_norms(owner: str, norms: Mapping[str, Any]) -> float:
    """The ε shared by ``norms`` (LayerNorms with gain); refuses other norms and differing ε."""
    for name, norm in norms.items():
        if not runs_one_of(norm, ("LayerNorm",)):
            raise SplitformerError(f"{owner}.{name} is {type(norm).__name__} (a {library_name(norm)}); the scheme's "
                                   "projection is LayerNorm")
        if getattr(norm, "weight", None) is None:
            raise SplitformerError(f"{owner}.{name} has no elementwise affine parameters; the scheme's LayerNorm has a gain")
    eps = {name: float(norm.eps) for name, norm in norms.items()}
    if len(set(eps.values())) > 1:
        shown = ", ".join(f"{name}.eps={value:g}" for name, value in eps.items())
        raise SplitformerError(f"{owner} has different LayerNorm eps ({shown}); a generated forward takes one eps")
    return next(iter(eps.values()))


def layer_norm_params(prefix: str, norm: Any) -> dict[str, np.ndarray]:
    """``{prefix}.gain`` and ``{prefix}.bias`` of a LayerNorm (zero bias where it has none)."""
    gain = array(norm.weight)
    bias = zero_bias(gain.shape[0], gain.dtype) if norm.bias is None else array(norm.bias)
    return {f"{prefix}.gain": gain, f"{prefix}.bias": bias}


_SAME = ("scheme", "activation", "n_heads", "eps", "bias", "options", "batch_first", "dropout")


def same_configuration(owner: str, layers: Sequence[Adapted]) -> Adapted:
    """The first of ``layers`` after checking they all share its scheme and configuration."""
    if not layers:
        raise SplitformerError(f"{owner} has no layers")
    first = layers[0]
    for index, layer in enumerate(layers[1:], start=1):
        for key in _SAME:
            if getattr(layer, key) != getattr(first, key):
                raise SplitformerError(f"{owner} layer {index} has {key}={getattr(layer, key)!r}, "
                                       f"layer 0 {key}={getattr(first, key)!r}; a generated Stack repeats one block")
    return first


def final_norm_params(owner: str, norm: Any, first: Adapted) -> dict[str, np.ndarray]:
    """``{"gain", "bias"}`` of a stack's final LayerNorm, which must share the layers' ε and biases."""
    eps = check_norms(owner, {"norm": norm})
    if eps != first.eps:
        raise SplitformerError(f"{owner} final norm has eps={eps:g}, its layers eps={first.eps:g}; "
                               "a generated Stack takes one eps")
    if (norm.bias is not None) != first.bias:
        raise SplitformerError(f"{owner} final norm {'has' if norm.bias is not None else 'has no'} bias, "
                               f"its layers bias={first.bias}")
    params = layer_norm_params("final", norm)
    return {"gain": params["final.gain"], "bias": params["final.bias"]}


def stack_state(adapted: Adapted, layer_state: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
                layers: str, norm: str = "norm") -> dict[str, Any]:
    """A stack's state dict: ``{layers}.{i}.*`` from ``layer_state``, then ``{norm}.weight``/``bias``."""
    arrays = {f"{layers}.{index}.{key}": value
              for index, params in enumerate(adapted.layers) for key, value in layer_state(params).items()}
    if adapted.final_norm is not None:  # a bias-free Stack's final norm has no bias: nothing to leave out
        arrays |= {f"{norm}.{name}": adapted.final_norm[key] for key, name in (("gain", "weight"), ("bias", "bias"))
                   if key in adapted.final_norm}
    return state_dict(arrays, adapted.bias)


def state_dict(arrays: Mapping[str, np.ndarray], bias: bool) -> dict[str, Any]:
    """Tensors of a source state dict; keys ending in ``bias`` are left out for a bias-less source.

    A bias-less source cannot hold a nonzero bias: that is refused, naming the key.
    """
    state = {}
    for key, value in arrays.items():
        if key.endswith("bias") and not bias:
            if np.any(value != 0):
                raise SplitformerError(f"{key} is nonzero but the source module has no biases (bias=False)")
            continue
        state[key] = tensor(value)
    return state
