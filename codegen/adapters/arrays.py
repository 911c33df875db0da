"""Tensors ↔ NumPy arrays for the adapters, with the dtype conversions stated."""

from __future__ import annotations

from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

__all__ = ["array", "linear_weight", "tensor", "dtype_notes", "source_dtype", "floating_dtype", "torch_floating_dtype"]

#: Floating dtypes NumPy's generated code does not take → the float type they are read as.
_WIDENED = {"torch.bfloat16": "float32", "torch.float16": "float32"}
_SIGNIFICAND = {"torch.bfloat16": 8, "torch.float16": 11}


def array(value: Any) -> np.ndarray:
    """A tensor as a fresh NumPy array; bfloat16 and float16 are widened to float32 (exactly)."""
    value = value.detach().cpu()
    if not value.is_floating_point():
        raise SplitformerError(f"parameter of dtype {value.dtype} is not floating point")
    widened = _WIDENED.get(str(value.dtype))
    if widened is not None:
        value = value.float()
    return value.numpy().copy()


def linear_weight(value: Any) -> np.ndarray:
    """A ``torch.nn.Linear`` weight ``(out, in)`` as the canonical ``W`` ``(in, out)``."""
    return np.ascontiguousarray(array(value).T)


def tensor(value: np.ndarray, dtype: Any = None) -> Any:
    """A NumPy array as a torch tensor (``dtype``: cast, e.g. back to the source's bfloat16)."""
    import torch

    result = torch.from_numpy(np.array(value, copy=True, order="C"))
    return result if dtype is None else result.to(dtype)


def source_dtype(module: Any) -> str:
    """The one floating dtype of ``module``'s parameters (``"bfloat16"``); mixed dtypes are refused."""
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in module.parameters()})
    if len(dtypes) != 1:
        raise SplitformerError(f"{type(module).__name__} has parameters of dtypes {', '.join(dtypes) or 'none'}; "
                               "adapters read modules of one floating dtype")
    return dtypes[0]


def dtype_notes(module: Any) -> tuple[str, ...]:
    """How reading ``module``'s parameters changed their dtype, with the precision they keep."""
    notes = []
    for name in sorted({str(p.dtype) for p in module.parameters()} & set(_WIDENED)):
        bits = _SIGNIFICAND[name]
        notes.append(
            f"{name.removeprefix('torch.')} parameters read as {_WIDENED[name]} exactly; they keep a {bits}-bit "
            f"significand (relative precision 2^-{bits} = {2.0 ** -bits:.1e}), and the float32 forward differs "
            f"from the source's {name.removeprefix('torch.')} forward by that format's rounding of activations"
        )
    return tuple(notes)


def floating_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as float32 or float64, the dtypes adapters convert parameters to; any other is refused."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise SplitformerError(f"dtype={dtype!r} is not a NumPy dtype; use np.float32 or np.float64") from None
    if dtype not in (np.float32, np.float64):
        raise SplitformerError(f"dtype={dtype} is refused: adapters convert parameters to float32 or float64 only "
                               "(another dtype would round or truncate every weight)")
    return dtype


def torch_floating_dtype(dtype: Any) -> Any:
    """``dtype`` (``None``: the module's) as the floating torch dtype a writer returns; any other is refused."""
    import torch

    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise SplitformerError(f"dtype={dtype!r} is refused: writers return floating-point tensors "
                               "(another dtype would truncate every weight)")
    return dtype
