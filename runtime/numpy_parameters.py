"""The parameters and inputs of the generated NumPy network modules: each table's arrays checked
and cast, the image and a costate checked before any work. Inlined where used
(``codegen.runtime_source``)."""

import numpy as np

from .numpy_helpers import _unmasked


def _shape(value):
    """The shape of a parameter (an array or anything ``np.asarray`` takes)."""
    return np.shape(value)


def _table(params, table, sizes, dtype, prefix=""):
    """Check each parameter of ``table`` (under ``prefix``): present, real, of its shape; cast."""
    arrays = {}
    for name, axes in table.items():
        expected = tuple(sizes[axis] if isinstance(axis, str) else axis for axis in axes)
        if prefix + name not in params:
            raise ValueError(f"missing parameter {prefix + name!r} of shape {expected}")
        _unmasked(f"parameter {prefix + name!r}", params[prefix + name])
        value = np.asarray(params[prefix + name])
        if value.dtype.kind not in "fiu":  # floating or integer (np.issubdtype's answer, 10× faster)
            raise ValueError(f"parameter {prefix + name!r} has dtype {value.dtype}, expected a real floating type")
        if value.dtype.kind == "f" and not np.can_cast(value.dtype, dtype, "safe"):  # widened, never rounded
            raise ValueError(f"parameter {prefix + name!r} has dtype {value.dtype}, the input {np.dtype(dtype)}: "
                             "a parameter is not rounded to the input's precision")
        if value.shape != expected:
            raise ValueError(f"parameter {prefix + name!r} has shape {value.shape}, expected {expected}")
        arrays[name] = value.astype(dtype, copy=False)
    return arrays


def _input(name, value):
    """``value`` as a float32 or float64 array (batch, channels, height, width), checked before any work."""
    _unmasked(name, value)
    array = np.asarray(value)
    array = array.astype(array.dtype.newbyteorder("="), copy=False)  # big-endian data (a file's) in this machine's order
    if array.dtype not in (np.float32, np.float64):
        raise ValueError(f"{name} must be float32 or float64, got {array.dtype}")
    if array.ndim != 4:
        raise ValueError(f"{name} must have shape (batch, channels, height, width), got {array.shape}")
    empty = [axis for axis, size in zip(("height", "width"), array.shape[2:]) if size == 0]
    if empty:
        raise ValueError(f"{name} must hold at least one node along {' and '.join(empty)}, got {array.shape}")
    return array


def _costate(name, value, shape, dtype):
    """``value`` as the costate of an output of ``shape``: checked, cast to the model's dtype."""
    seed = np.asarray(value)
    if seed.dtype.kind not in "fiu":
        raise ValueError(f"{name} has dtype {seed.dtype}, expected a real floating type")
    if seed.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {seed.shape}")
    return seed.astype(dtype, copy=False)
