"""Rewrites of the tensor IR, one per module; each takes a ``Module`` and returns one.

``DEFAULT`` lists the passes run by ``codegen.lowering.lower``; pass ``passes=[]`` to
switch them all off (the emitted code stays correct, only less compact).
"""

from .inline_elementwise import inline_elementwise

__all__ = ["DEFAULT", "PASSES", "inline_elementwise"]

PASSES = {"inline-elementwise": inline_elementwise}
DEFAULT = tuple(PASSES.values())
