"""The adapters' registry: ``(library, class name)`` → the reader and the writer of that class.

Each source family (``hf_bert``, ``timm_vit``, …) registers its functions here with
``@adapter`` and ``@writer``; the package (``codegen.adapters``) dispatches through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .adapted import Adapted

__all__ = ["ADAPTERS", "NETWORK_ADAPTERS", "WRITERS", "adapter", "network_adapter", "writer"]

#: ``(library, class name) → reader(module) → Adapted``; filled by ``adapter``.
ADAPTERS: dict[tuple[str, str], Callable[[Any], Adapted]] = {}
#: ``(library, class name, network) → reader(module) → AdaptedModel`` of a whole built-in network
#: (``from_timm(model, network="vit")``); filled by ``network_adapter``.
NETWORK_ADAPTERS: dict[tuple[str, str, str], Callable[[Any], Any]] = {}
#: ``(library, class name) → writer(Adapted) → state dict``; filled by ``writer``.
WRITERS: dict[tuple[str, str], Callable[[Adapted], dict[str, Any]]] = {}


def adapter(library: str, *class_names: str) -> Callable[[Callable], Callable]:
    """Register the reader of the named classes of ``library`` (``torch``, ``hf``, ``timm``)."""

    def register(function: Callable) -> Callable:
        for name in class_names:
            ADAPTERS[(library, name)] = function
        return function

    return register


def network_adapter(library: str, network: str, *class_names: str) -> Callable[[Callable], Callable]:
    """Register the reader of the named classes of ``library`` into the built-in ``network`` (whole model)."""

    def register(function: Callable) -> Callable:
        for name in class_names:
            NETWORK_ADAPTERS[(library, name, network)] = function
        return function

    return register


def writer(library: str, *class_names: str) -> Callable[[Callable], Callable]:
    """Register the writer (``Adapted`` → source state dict) of the named classes."""

    def register(function: Callable) -> Callable:
        for name in class_names:
            WRITERS[(library, name)] = function
        return function

    return register
