"""Parameters that share memory: refused at read time, except the whole-layer tying the adapters map.

A generated Block/Stack holds one copy of each canonical entry: two source entries that are one Parameter, or
two Parameters viewing one storage (``norm1.weight`` is ``norm2.weight``, ``layers.0.linear1.weight`` is
``layers.1.linear1.weight``), would be trained as two copies, and writing them back would keep one. Memory is
compared (the storage and the bytes each tensor spans), not the objects.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import Any

from splitformer.symbolic.errors import SplitformerError

__all__ = ["check_shared_storage"]


def check_shared_storage(owner: str, module: Any, exempt: Collection[str] = ()) -> None:
    """Refuse two parameters of ``module`` whose memory overlaps, naming both; ``exempt`` names a mapped tie
    (``lm_head.weight`` of a head tied to the token embedding). One layer module at every index of a
    ``ModuleList`` (``shared_layers``' ``tied``) is left to the readers."""
    by_storage: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if name in exempt or parameter.numel() == 0:
            continue
        start = parameter.storage_offset() * parameter.element_size()
        extent = 1 + sum((size - 1) * stride for size, stride in zip(parameter.shape, parameter.stride()))
        by_storage[parameter.untyped_storage().data_ptr()].append((name, start, start + extent * parameter.element_size()))
    for spans in by_storage.values():
        spans.sort(key=lambda span: span[1])
        for k, (first, _, end) in enumerate(spans):
            for second, start, _ in spans[k + 1:]:
                if start >= end:
                    break
                if not _same_layer_module(module, first, second):
                    raise SplitformerError(f"{owner}.{first} and {owner}.{second} share one parameter's memory; a "
                                           "generated Block/Stack would train two copies and writing them back would "
                                           "keep one (only whole layers shared at every step are read, as tied)")


def _same_layer_module(module: Any, first: str, second: str) -> bool:
    """True when ``first`` and ``second`` name one entry of one module object found at two indices of a list
    (``layers.0.norm.weight`` and ``layers.1.norm.weight`` with ``layers[0] is layers[1]``)."""
    a, b = first.split("."), second.split(".")
    if len(a) != len(b):
        return False
    differing = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(differing) != 1 or not (a[differing[0]].isdigit() and b[differing[0]].isdigit()):
        return False
    cut = differing[0] + 1
    return module.get_submodule(".".join(a[:cut])) is module.get_submodule(".".join(b[:cut]))
