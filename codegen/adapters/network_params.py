"""The parameters of a whole network as read from a source: a mapping of canonical names to arrays that can say why
a generated network module would not compute the source with them.

The generated modules ask it (``_as_read``, as of a block's ``Adapted``): NumPy's ``forward``/``logits``/``vjp`` with
their keyword arguments, torch's ``Model.load_params`` with the Model's configuration. So
``vit.logits(x, adapted.params, n_heads=2, …)`` for a three-head source is a ValueError naming ``params``, not logits
0.2 off.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .adapted import same_argument

__all__ = ["NetworkParams", "builtin_computes"]


@functools.lru_cache(maxsize=8)
def builtin_computes(model: str) -> str:
    """The ``COMPUTES`` digest of the built-in network ``model``."""
    from splitformer.symbolic.network_spec import load_network, network_fingerprint

    return network_fingerprint(load_network(model))


def _difference(name: str, value: Any, wanted: Any, single: bool) -> tuple[str, Any, Any] | None:
    """Where a call's configuration value ``value`` of ``name`` differs from the one read, ``wanted``: the place
    (``stages[1]['n_heads']``) and the two values there, or None. Numbers as ``same_argument`` takes them, or
    (``single``: a float32 reading) as float32 holds the value read, since the generated code takes ``eps`` as a
    Python float; sequences of settings (``stages``) and mappings (a stage's) item by item."""
    if isinstance(wanted, Mapping) and isinstance(value, Mapping) and set(value) == set(wanted):
        parts = ((f"{name}[{key!r}]", value[key], wanted[key]) for key in wanted)
    elif (isinstance(wanted, (tuple, list)) and isinstance(value, (tuple, list)) and len(value) == len(wanted)
          and any(isinstance(item, (Mapping, tuple, list)) for item in wanted)):  # a pair of numbers is named whole
        parts = ((f"{name}[{index}]", item, expected) for index, (item, expected) in enumerate(zip(value, wanted)))
    else:
        read_as = float(np.float32(wanted)) if single and isinstance(wanted, float) else wanted
        same = same_argument(value, wanted) or (single and same_argument(value, read_as))
        return None if same else (name, value, wanted)
    return next((found for found in (_difference(*part, single) for part in parts) if found), None)


class NetworkParams(Mapping[str, np.ndarray]):
    """``params`` of the built-in network ``model`` read with the keyword configuration ``config``."""

    __slots__ = ("_arrays", "model", "config")

    def __init__(self, arrays: Mapping[str, np.ndarray], model: str, config: Mapping[str, Any]) -> None:
        self._arrays = dict(arrays)
        self.model = model
        self.config = config

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"NetworkParams({self.model}, {len(self)} arrays, {dict(self.config)!r})"

    def unlike(self, target: Any, arguments: Mapping[str, Any] | None = None) -> str | None:
        """Why the generated module ``target`` would not compute the source with these parameters, or ``None``:
        ``target`` a torch ``Model`` (its ``options``), or a NumPy module's globals with the call's ``arguments``."""
        model = arguments is None
        if model:
            namespace = getattr(type(target).forward, "__globals__", {})
            arguments = getattr(target, "options", {})
        else:
            namespace = target
        digest = namespace.get("COMPUTES")
        if digest is None:
            return (f"{type(target).__name__ if model else 'the module'} is not a generated network module's (its "
                    "forward's module has no COMPUTES): load them into the generated Model itself")
        if digest != builtin_computes(self.model):
            return (f"these are the {self.model} network's parameters; {namespace.get('__name__', 'the module')} "
                    f"computes another network (COMPUTES {digest}): derive {self.model} for them")
        single = any(getattr(array, "dtype", None) == np.float32 for array in self._arrays.values())
        for name, value in self.config.items():
            given = arguments.get(name, value)
            difference = None if given is None else _difference(name, given, value, single)  # None: read from inputs
            if difference:
                place, called, read = difference
                return f"the source was read with {place}={read!r}, the call has {place}={called!r}: pass **adapted.config"
        return None
