"""A derivation report as data, a block's or a network's: a title, then numbered sections, rendered by the one
report template (``report/report.md.j2``)."""

from __future__ import annotations

from collections import namedtuple

import sympy as sp

from splitformer.symbolic import __version__
from splitformer.symbolic.markdown import inert

from .render import environment

__all__ = ["Document", "Section", "domain_rows", "render_document"]

#: A numbered section: its prose (``text``, Markdown; or ``partial``, a template under ``report/`` rendered with the
#: document's context), then its table of domains (``domain_rows``) and the stages it discretizes, in order.
Section = namedtuple("Section", "title text stages partial domains", defaults=("", (), None, ()))
#: A report: its heading (``title``), what it is derived from (``origin``: scheme or network, and its ``name``), the
#: ``splitformer derive`` arguments that regenerate it, its summary, an optional ``intro`` partial under the
#: summary, its sections, and the variables its partials read (``context``).
Document = namedtuple("Document", "title origin name regenerate summary sections intro context",
                      defaults=(None, {}))


def domain_rows(domains) -> list[tuple[str, str, str, str]]:
    """The rows of a report's domain table: LaTeX, meaning, grid points, name in code."""
    return [(domain.latex, domain.description, sp.latex(domain.size), domain.code_name) for domain in domains]


def render_document(document: Document) -> str:
    """The Markdown of ``document``; refused when anything in it would render as HTML, a link or an image."""
    template = environment().get_template("report/report.md.j2")
    return inert(template.render(document._asdict(), **document.context, version=__version__),
                 f"the report of {document.name!r}")
