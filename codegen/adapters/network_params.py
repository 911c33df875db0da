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


def _agrees(value: Any, wanted: Any) -> bool:
    """A call's configuration value against the one read: numbers as ``same_argument`` takes them, sequences
    (``image_size``, ``stages``) and mappings (a stage's configuration) item by item."""
    if isinstance(wanted, Mapping):
        return isinstance(value, Mapping) and set(value) == set(wanted) and all(
            _agrees(value[key], wanted[key]) for key in wanted)
    if isinstance(wanted, (tuple, list)):
        return (isinstance(value, (tuple, list)) and len(value) == len(wanted)
                and all(_agrees(item, expected) for item, expected in zip(value, wanted)))
    return same_argument(value, wanted)


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
        if arguments is None:
            namespace = getattr(type(target).forward, "__globals__", {})
            arguments = getattr(target, "options", {})
        else:
            namespace = target
        digest = namespace.get("COMPUTES")
        if digest != builtin_computes(self.model):
            return (f"these are the {self.model} network's parameters; {namespace.get('__name__', 'the module')} "
                    f"computes another network (COMPUTES {digest}): derive {self.model} for them")
        for name, value in self.config.items():
            given = arguments.get(name, value)
            if given is not None and not _agrees(given, value):  # None: a size the call reads from its inputs
                return (f"the source was read with {name}={value!r}, the call has {name}={given!r}: "
                        "pass **adapted.config")
        return None
