"""The parameters and inputs of the generated PyTorch network modules: registered under their
canonical names, checked before any work, loaded all or nothing (``_Network``). Inlined where used
(``codegen.runtime_source``)."""

import torch

from .checks import _as_read, _mapping
from .torch_helpers import _as_tensor, _loads_finite


def _group(module, table, sizes, factory):
    """Register the parameters of ``table`` under their canonical names (``embed.W``)."""
    for name, axes in table.items():
        group, attribute = name.split(".")
        if not hasattr(module, group):
            module.add_module(group, torch.nn.Module())
        shape = tuple(sizes[axis] if isinstance(axis, str) else axis for axis in axes)
        getattr(module, group).register_parameter(attribute, torch.nn.Parameter(torch.empty(shape, **factory)))


def _shape(value):
    """The shape of a parameter."""
    return tuple(value.shape)


def _table(params, table, sizes, dtype, prefix=""):
    """The parameters of ``table`` (under ``prefix``) in ``params``, by canonical name: present, of ``dtype`` and
    their shape."""
    tensors = {}
    for name, axes in table.items():
        expected = tuple(sizes[axis] if isinstance(axis, str) else axis for axis in axes)
        if prefix + name not in params:
            raise ValueError(f"missing parameter {prefix + name!r} of shape {expected}")
        value = params[prefix + name]
        if value.dtype != dtype:
            raise ValueError(f"parameter {prefix + name!r} has dtype {value.dtype}, the input {dtype}")
        if tuple(value.shape) != expected:
            raise ValueError(f"parameter {prefix + name!r} has shape {tuple(value.shape)}, expected {expected}")
        tensors[name] = value
    return tensors


def _input(name, value, shape, dtype, device):
    """``value`` checked before any work: a tensor of ``dtype`` on ``device`` and shape (batch, *shape), an axis
    named by a string of any size ≥ 1 (a grid of no nodes has no convolution)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != 1 + len(shape) or any(isinstance(n, int) and n != m for n, m in zip(shape, value.shape[1:])):
        raise ValueError(f"{name} must have shape (batch, {', '.join(map(str, shape))}), got {tuple(value.shape)}")
    empty = [axis for axis, size in zip(shape, value.shape[1:]) if isinstance(axis, str) and size == 0]
    if empty:
        raise ValueError(f"{name} must hold at least one node along {' and '.join(empty)}, got {tuple(value.shape)}")
    if value.dtype != dtype:
        raise ValueError(f"{name} has dtype {value.dtype}, the model's parameters {dtype}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}, the model's parameters on {device}")
    return value


def _initialize(module, init, default):
    """Initialize each parameter by its attribute: ``init`` by name, else by first letter (``b``: the biases), else
    ``default``."""
    with torch.no_grad():
        for name, tensor in module.named_parameters():
            attribute = name.rsplit(".", 1)[1]
            init.get(attribute, init.get(attribute[0], default))(tensor)


class _Network(torch.nn.Module):
    """A network whose parameters carry their canonical names."""

    def load_params(self, params):
        """Copy a mapping of canonical names to arrays or tensors into the parameters; returns ``self``.

        Every name, dtype and shape is checked before the first copy: nothing loads partially."""
        _mapping("params", params)
        _as_read(params, self)  # an adapter's reading: refused where this Model would not compute its source
        own = dict(self.named_parameters())
        unknown = sorted(set(params) - set(own), key=str)
        if unknown:
            raise ValueError(f"unexpected parameter {unknown[0]!r}")
        values = {}
        for name, target in own.items():
            if name not in params:
                raise ValueError(f"missing parameter {name!r} of shape {tuple(target.shape)}")
            value = _as_tensor(name, params[name])
            if value.dtype == torch.bool or value.is_complex():
                raise ValueError(f"parameter {name!r} has dtype {value.dtype}, expected a real floating type")
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"parameter {name!r} has shape {tuple(value.shape)}, expected {tuple(target.shape)}")
            _loads_finite(name, value, target.dtype)
            values[name] = value
        with torch.no_grad():
            for name, value in values.items():
                own[name].copy_(value)
        return self
