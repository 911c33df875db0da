"""User text in Markdown (reports, notebook views), shown as text: nothing in it is interpreted; and the last guard on
what splitformer renders (``inert``): no raw HTML, link or image anywhere in it, whatever a check upstream missed."""

from __future__ import annotations

import re

from .errors import SplitformerError

__all__ = ["markdown_text", "code_block", "inert", "MACRO", "ATTRIBUTES"]


def markdown_text(text: str) -> str:
    """``text`` (a summary, a description) as Markdown that shows it: raw HTML, links, images, math and code fences
    are never interpreted (``&``, ``<`` as entities; backslash, brackets, braces (Python-Markdown's ``{: attr=…}``),
    ``$`` and a fence's first mark escaped)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # CommonMark ends a line at a lone CR too
    escaped = re.sub(r"([\\\[\]${}])", r"\\\1", text.replace("&", "&amp;").replace("<", "&lt;"))
    escaped = re.sub(r"(?m)^( {0,3})([`~]{3})", r"\1\\\2", escaped)  # a fence's first mark: it opens no code block
    # a heading's first mark (ATX ``#``, a setext underline of ``=`` or ``-``): text reads as no section of the report
    return re.sub(r"(?m)^( {0,3})(#|=+[ \t]*$|-+[ \t]*$)", r"\1\\\2", escaped)


def code_block(text: str) -> str:
    """``text`` as an indented code block (every line four spaces in): every Markdown renderer shows it as it is,
    whatever it holds (a fence, by contrast, is closed by a line of backquotes, and plain Markdown has none)."""
    return "\n".join("    " + line if line else "" for line in text.splitlines())


#: Backslash escapes, removed before the scan (an escaped mark is text; inside code, where a backslash is literal,
#: everything is text anyway). Code spans and fences are scanned like the rest: where a renderer starts and ends them
#: is subtle (an indented line, a backquote in an info string), and splitformer's own reports hold no markup in code.
_ESCAPE = re.compile(r"\\[!-/:-@\[-`{-~]")
#: The one image a report holds: its convergence plot, by a path splitformer makes.
_PLOT = re.compile(r"^!\[Convergence of [\w-]+: error against Δt\]\(\.\./plots/\w+_convergence\.png\)$", re.M)
#: HTML attributes in Python-Markdown's ``attr_list`` form (``{: onclick=…}``), which mkdocs.yml enables.
ATTRIBUTES = re.compile(r"\{[^}\n]*\b(?:on[a-z]+|style|href|src|srcdoc|action|formaction)\s*=", re.I)
#: LaTeX that MathJax renders as a link, HTML attributes or an image (any number of backslashes before it).
MACRO = re.compile(r"\\(?:href|url|html\w*|class|cssId|style|data|includegraphics|mmlToken|require|bbox|unicode"
                    r"|texttip|mathtip|toggle)(?![a-zA-Z])")
#: Live markup: an HTML tag, comment or autolink; a link, image or link definition (in a list item too); HTML
#: attributes (Python-Markdown's ``attr_list``, which mkdocs.yml enables); a LaTeX link or attribute macro (a bare URL
#: shows where it leads: it stays).
_LIVE = (("raw HTML", re.compile(r"<[A-Za-z/!?]|<[^\s<>]*@[^\s<>]*>")),  # a tag, a comment; an email autolink
         ("a link, a link definition or an image",
          re.compile(r"\][(\[]|!\[|^(?:[ \t]*(?:>|[-*+][ \t]|\d+[.)][ \t]))*[ \t]*\[[^\]]*\]:", re.M)),
         ("HTML attributes", ATTRIBUTES),
         ("a LaTeX link or HTML macro", MACRO))


def inert(markdown: str, what: str) -> str:
    """``markdown`` as it is when nothing in it (code included) would render as HTML, a link or an image (the one
    image a report links, its convergence plot, apart); else one ``SplitformerError`` naming ``what`` and the markup.
    Text from data is escaped or refused where it is read; this guard holds whatever a check there missed."""
    unplotted = _PLOT.sub("", markdown)
    if MACRO.search(unplotted):  # before escapes are removed: Markdown shows "\\href" as "\href", which MathJax reads
        raise SplitformerError(f"{what}: would render a LaTeX link or HTML macro from text splitformer did not write; "
                               "refused")
    shown = _ESCAPE.sub("", unplotted)
    for name, pattern in _LIVE:
        found = pattern.search(shown)
        if found:
            near = shown[max(0, found.start() - 30):found.end() + 30].replace("\n", " ")
            raise SplitformerError(f"{what}: would render {name} from text splitformer did not write (near {near!r}); "
                                   "refused")
    return markdown
