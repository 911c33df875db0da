"""User text in Markdown (reports, notebook views), shown as text: nothing in it is interpreted."""

from __future__ import annotations

import re

__all__ = ["markdown_text", "code_block"]


def markdown_text(text: str) -> str:
    """``text`` (a summary, a description) as Markdown that shows it: raw HTML, links, images, math and code fences
    are never interpreted (``&``, ``<`` as entities; backslash, brackets, ``$`` and a fence's first mark escaped)."""
    escaped = re.sub(r"([\\\[\]$])", r"\\\1", text.replace("&", "&amp;").replace("<", "&lt;"))
    return re.sub(r"(?m)^( {0,3})([`~]{3})", r"\1\\\2", escaped)  # a fence's first mark: it opens no code block


def code_block(text: str) -> str:
    """``text`` as an indented code block (every line four spaces in): every Markdown renderer shows it as it is,
    whatever it holds (a fence, by contrast, is closed by a line of backquotes, and plain Markdown has none)."""
    return "\n".join("    " + line if line else "" for line in text.splitlines())
