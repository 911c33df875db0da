"""IR operations of whole models, besides those of the blocks (``codegen.ir``).

- ``Window``: a field read at shifted points ``S p + r − padding`` along some axes, as a
  view whose shifted axes are replaced by the coarse grid and whose kernel offsets are
  appended (what ``sliding_window_view`` / ``Tensor.unfold`` give);
- ``Interleave``: the inverse of a window view with kernel = stride: a field computed per
  coarse node and offset ``(…, p, …, r)`` written at the fine nodes ``S p + r``;
- ``Point``: a point functional, the state at one node of an axis;
- ``Rows``: a field read at the nodes ``offset + N_2 p + q`` of one axis, as a view with
  that axis unflattened to ``(p, q)`` (the grid nodes of the token domain);
- ``Fold``, ``Place`` and ``PlaceRows``: the adjoints of ``Window``, ``Point`` and ``Rows``
  (values written at the points a view read, summed where windows overlap, zero elsewhere),
  shaped like ``like``;
- ``Join``: token nodes written at patterns of the token axis (a node, the grid rows after
  it), one part after another (a token concatenation);
- ``Convolution`` and ``TransposedConvolution``: a ``Window`` and the contraction that sums
  it against a kernel, or a contraction and the ``Interleave`` of its blocks, recognized as
  one operation (``codegen.passes.convolution``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .ir import Op

__all__ = ["Window", "Interleave", "Point", "Rows", "Fold", "Place", "PlaceRows", "Join", "Convolution",
           "TransposedConvolution"]


@dataclass(frozen=True)
class _View(Op):
    """An operation on the one array ``source`` (a view of it, or its blocks written out)."""

    source: str = ""

    def reads(self) -> list[str]:
        return [self.source]


@dataclass(frozen=True)
class _Scatter(_View):
    """The adjoint of a view: ``source`` written at the points the view read, shaped like ``like``."""

    like: str = ""

    def reads(self) -> list[str]:
        return [self.source, self.like]


@dataclass(frozen=True)
class Window(_View):
    axes: tuple[int, ...] = ()
    size: sp.Expr = sp.Integer(1)
    stride: sp.Expr = sp.Integer(1)
    padding: sp.Expr = sp.Integer(0)


@dataclass(frozen=True)
class Interleave(_View):
    axes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Point(_View):
    index: tuple[str | int, ...] = ()


@dataclass(frozen=True)
class Rows(_View):
    axis: int = 1
    offset: int = 0
    sizes: tuple[sp.Expr, ...] = ()


@dataclass(frozen=True)
class Fold(_Scatter):
    axes: tuple[int, ...] = ()
    size: sp.Expr = sp.Integer(1)
    stride: sp.Expr = sp.Integer(1)
    padding: sp.Expr = sp.Integer(0)


@dataclass(frozen=True)
class Place(_Scatter):
    index: tuple[str | int, ...] = ()


@dataclass(frozen=True)
class PlaceRows(_Scatter):
    axis: int = 1
    offset: int = 0


@dataclass(frozen=True)
class Join(Op):
    parts: tuple[str, ...] = ()

    def reads(self) -> list[str]:
        return list(self.parts)


@dataclass(frozen=True)
class _Kernel(Op):
    """A contraction of ``x`` with a kernel ``weight`` (and a ``bias``)."""

    x: str = ""
    weight: str = ""
    bias: str | None = None

    def reads(self) -> list[str]:
        return [self.x, self.weight] + ([self.bias] if self.bias else [])


@dataclass(frozen=True)
class Convolution(_Kernel):
    """``out[b, l, p, q] = Σ_{c,r,s} x[b, c, S p + r − P, S q + s − P] W[c, r, s, l] (+ bias[l])``.

    ``depthwise``: ``W[r, s, l]`` and ``c = l`` (each channel convolved with its own kernel);
    ``channels_last``: ``out[b, p, q, l]`` (the patches of a patch embedding, as tokens).
    """

    size: sp.Expr = sp.Integer(1)
    stride: sp.Expr = sp.Integer(1)
    padding: sp.Expr = sp.Integer(0)
    depthwise: bool = False
    channels_last: bool = False


@dataclass(frozen=True)
class TransposedConvolution(_Kernel):
    """``out[b, l, S p + r, S q + s] = Σ_k x[b, k, p, q] W[k, r, s, l] (+ bias[l])``, kernel = stride ``S``."""
