"""Figures that a notebook shows inline: a matplotlib ``Figure`` with ``_repr_png_``.

The plots are made outside pyplot (no global backend switch, nothing to close); such a
figure has no pyplot manager, so IPython would print ``<Figure size … with 1 Axes>``. This
one renders itself to PNG (matplotlib's Agg, whatever backend is active) when displayed.
Imported only where a plot is drawn: it imports matplotlib.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

__all__ = ["InlineFigure"]


class InlineFigure(Figure):
    """A ``Figure`` that a notebook displays as its PNG image."""

    def _repr_png_(self) -> bytes:
        image = io.BytesIO()
        self.savefig(image, format="png")
        return image.getvalue()

    def marked_png(self) -> bytes:
        """The PNG image to write to a file: its Software chunk says splitformer made it (``codegen.output``
        replaces such a file without ``--force``)."""
        from .output import MARKER

        image = io.BytesIO()
        self.savefig(image, format="png", metadata={"Software": MARKER})
        return image.getvalue()
