"""Weight adapters: source modules (torch, transformers, timm) → canonical parameters.

Each source family lives in its own module of this package and registers its module
classes by name with ``adapter``; ``from_torch``, ``from_hf`` and ``from_timm`` dispatch on
the class name of what they are given, so none of them imports transformers or timm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from splitformer.symbolic.errors import SplitformerError

from .torch_encoder import from_torch as _from_torch_encoder

__all__ = ["adapter", "from_torch", "from_hf", "from_timm", "ADAPTERS"]

#: ``(library, class name) → function(module) → adapted``; filled by ``adapter``.
ADAPTERS: dict[tuple[str, str], Callable[[Any], Any]] = {}


def adapter(library: str, *class_names: str) -> Callable[[Callable], Callable]:
    """Register ``function`` as the adapter of the named classes of ``library`` (torch, hf, timm)."""

    def register(function: Callable) -> Callable:
        for name in class_names:
            ADAPTERS[(library, name)] = function
        return function

    return register


def _dispatch(library: str, module: Any) -> Any:
    name = type(module).__name__
    function = ADAPTERS.get((library, name))
    if function is None:
        known = ", ".join(sorted(cls for lib, cls in ADAPTERS if lib == library)) or "none"
        raise SplitformerError(f"no {library} adapter for {name} (supported: {known})")
    return function(module)


def from_torch(module: Any) -> Any:
    """The canonical parameters of a torch module (``nn.TransformerEncoderLayer``, …)."""
    return _dispatch("torch", module)


def from_hf(module: Any) -> Any:
    """The canonical parameters of a ``transformers`` module."""
    return _dispatch("hf", module)


def from_timm(module: Any) -> Any:
    """The canonical parameters of a ``timm`` module."""
    return _dispatch("timm", module)


adapter("torch", "TransformerEncoderLayer")(_from_torch_encoder)

from . import hf_vision  # noqa: E402,F401 - registers the transformers vision models
