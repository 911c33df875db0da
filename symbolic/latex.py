"""LaTeX that renders on code-hosting sites, and its plain-text counterparts.

``to_latex``/``equation`` print formulas with short index names and ``∫_Ω`` integrals;
``align`` stacks them into one ``align*`` environment; ``plain_text`` prints an expression
for a terminal (no LaTeX: ``Δt``, not ``\\Delta t``).
"""

from __future__ import annotations

import re
from collections import ChainMap
from collections.abc import Mapping
from functools import lru_cache

import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.printing.latex import LatexPrinter
from sympy.printing.str import StrPrinter

__all__ = ["to_latex", "superscripted", "equation", "plain_equation", "plain_formula", "align", "text_latex", "plain_text",
           "unicode_text"]


class _MathPrinter(LatexPrinter):
    def _print_Symbol(self, expr: sp.Symbol, style: str = "plain") -> str:
        if expr.name.startswith("|") or expr.name.startswith("\\"):
            return self._settings["symbol_names"].get(expr, expr.name)
        return super()._print_Symbol(expr, style)

    def _print_Function(self, expr: sp.Function, exp: str | None = None) -> str:
        if not isinstance(expr, AppliedUndef):
            return super()._print_Function(expr, exp)
        name = self._settings["symbol_names"].get(sp.Symbol(expr.func.__name__), expr.func.__name__)
        text = name + ("(" + ", ".join(self._print(argument) for argument in expr.args) + ")" if expr.args else "")
        return f"{text}^{{{exp}}}" if exp else text  # a one-number control, read without arguments: its name

    def _print_Idx(self, expr: sp.Idx) -> str:
        return self._print(expr.label)

    def _print_Integral(self, expr: sp.Integral) -> str:
        limits = []
        for variable, lower, upper in expr.limits:
            name = str(upper)
            if lower == 0 and name.startswith("|") and name.endswith("|"):
                limits.append((rf"\int_{{{name[1:-1]}}}", self._print(variable)))
            else:
                limits.append(
                    (rf"\int_{{{self._print(lower)}}}^{{{self._print(upper)}}}", self._print(variable))
                )
        prefix = " ".join(sign for sign, _ in limits)
        differentials = r" \, ".join(f"d{variable}" for _, variable in reversed(limits))
        return rf"{prefix} {self._print(expr.function)} \, {differentials}"

    def _print_Sum(self, expr: sp.Sum) -> str:
        text = ""
        for index, _, _ in expr.limits:
            text += rf"\sum_{{{self._print(index)}}} "
        body = expr.function
        inner = self._print(body)
        if isinstance(body, sp.Add):
            inner = rf"\left({inner}\right)"
        return text + inner


#: Names every formula uses: LayerNorm's ε is ``eps`` in code.
_DEFAULT_NAMES = {"eps": r"\varepsilon"}


def superscripted(latex: str, label: str) -> str:
    """``r`` → ``r^{label}``; ``r^{i}`` and ``r^i`` → ``r^{label,i}`` (never a double superscript, which TeX rejects);
    a superscript inside braces (``x_{a^{2}}``) is not the name's own."""
    depth = 0
    for position, character in enumerate(latex):
        depth += {"{": 1, "}": -1}.get(character, 0)
        if character == "^" and depth == 0:
            rest = latex[position + 1:]
            if rest.startswith("{"):
                return f"{latex[:position]}^{{{label},{rest[1:]}"
            single = re.match(r"\\[A-Za-z]+|.", rest)  # one token: a character or a macro
            return f"{latex[:position]}^{{{label},{single.group()}}}{rest[single.end():]}"
    return f"{latex}^{{{label}}}"


def to_latex(expr: sp.Basic, names: Mapping[str, str] | None = None) -> str:
    """LaTeX of ``expr``; ``names`` renames symbols and array bases (``attn_q`` → ``Q``)."""
    names = ChainMap(names or {}, _DEFAULT_NAMES)  # no copy: derivations pass every array's name
    symbols, functions = _named(expr)
    symbol_names = {symbol: names[symbol.name] for symbol in symbols if symbol.name in names}
    for name in functions:
        if name in names:
            symbol_names[sp.Symbol(name)] = names[name]
    return _printed(expr, frozenset(symbol_names.items()))


@lru_cache(maxsize=8192)
def _named(expr: sp.Basic) -> tuple[frozenset, frozenset]:
    """The symbols and the names of the undefined functions in ``expr`` (what ``names`` may rename)."""
    return frozenset(expr.atoms(sp.Symbol)), frozenset(applied.func.__name__ for applied in expr.atoms(AppliedUndef))


@lru_cache(maxsize=8192)
def _printed(expr: sp.Basic, symbol_names: frozenset) -> str:
    """The printer's LaTeX (remembered: schemes that share a substep print its formulas once)."""
    return _MathPrinter({"symbol_names": dict(symbol_names), "mul_symbol": None}).doprint(expr)


def equation(lhs: sp.Basic, rhs: sp.Basic, names: Mapping[str, str] | None = None) -> str:
    """``lhs = rhs`` in LaTeX, without SymPy deciding whether the two are equal (slow)."""
    return f"{to_latex(lhs, names)} = {to_latex(rhs, names)}"


#: LaTeX macros of symbol names and their plain-text letters.
_UNICODE = {
    r"\Delta": "Δ", r"\alpha": "α", r"\beta": "β", r"\gamma": "γ", r"\sigma": "σ", r"\varepsilon": "ε",
    r"\lambda": "λ", r"\mu": "μ", r"\chi": "χ", r"\kappa": "κ", r"\phi": "φ", r"\theta": "θ", r"\tau": "τ",
    r"\omega": "ω", r"\varphi": "φ", r"\ell": "ℓ", r"\pi": "π", r"\nu": "ν", r"\delta": "δ", r"\psi": "ψ", r"\rho": "ρ", r"\eta": "η", r"\xi": "ξ", r"\zeta": "ζ", r"\Omega": "Ω",
}
_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
#: Characters of plain titles and their LaTeX in math mode.
_MATH_CHARACTERS = {"×": r"\times", "Δ": r"\Delta", "ε": r"\varepsilon", "σ": r"\sigma", "α": r"\alpha",
                    "β": r"\beta", "γ": r"\gamma", "→": r"\to", "≥": r"\ge", "≤": r"\le", "−": "-", "·": r"\cdot"}
_TEXT_ESCAPES = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
                 "{": r"\{", "}": r"\}", "^": r"\^{}", "~": r"\~{}", "–": "--", "—": "---"}


def unicode_text(text: str) -> str:
    r"""LaTeX macros of symbol names as letters: ``\Delta t`` → ``Δt``, ``\sigma_1`` → ``σ₁``."""
    text = re.sub(r"\\math(?:cal|rm|bf|it)\{([^{}]*)\}", r"\1", text)
    for macro, letter in sorted(_UNICODE.items(), key=lambda item: -len(item[0])):
        text = re.sub(re.escape(macro) + r"(?![A-Za-z])(?: (?=\w))?", letter, text)
    text = re.sub(r"([\u0391-\u03c9])_\{?([0-9]+)\}?",
                  lambda match: match.group(1) + match.group(2).translate(_SUBSCRIPTS), text)
    return text


class _PlainPrinter(StrPrinter):
    """Formulas as one line of plain text: ``Q^attn[i,m,e] = b^Q_attn[m,e] + Σ_k(W^Q_attn[k,m,e]*u^(0)[i,k])``."""

    def __init__(self, symbol_names: Mapping[str, str]) -> None:
        super().__init__()
        self.symbol_names = symbol_names

    def _print_Symbol(self, expr: sp.Symbol) -> str:
        return self.symbol_names.get(expr.name) or _plain_name(expr.name)

    def _print_Function(self, expr: sp.Function) -> str:
        if not isinstance(expr, AppliedUndef):
            return super()._print_Function(expr)
        name = self.symbol_names.get(expr.func.__name__, expr.func.__name__)
        return name + ("(" + ", ".join(self._print(argument) for argument in expr.args) + ")" if expr.args else "")

    def _print_Indexed(self, expr: sp.Indexed) -> str:
        return self._print(expr.base.label) + "[" + ",".join(self._print(index) for index in expr.indices) + "]"

    def _print_Idx(self, expr: sp.Idx) -> str:
        return self._print(expr.label)

    def _print_Pi(self, expr: sp.Basic) -> str:
        return "π"

    def _print_Sum(self, expr: sp.Sum) -> str:
        indices = ",".join(self._print(index) for index, _, _ in expr.limits)
        return f"Σ_{indices if len(expr.limits) == 1 else '{' + indices + '}'}({self._print(expr.function)})"


#: Braces around a plain subscript or superscript that needs none: ``Q^{attn}`` → ``Q^attn``.
_NEEDLESS_BRACES = re.compile(r"([_^])\{([\w()]+)\}")


@lru_cache(maxsize=4096)
def _plain_name(latex: str) -> str:
    """A LaTeX symbol name as plain text: ``b^{Q}_{\\mathrm{attn}}`` → ``b^Q_attn`` (cached: every emitted statement's
    comment names its symbols again, and ``unicode_text`` runs one substitution per macro)."""
    text = _accented(unicode_text(latex)).replace(r"\,", "").replace(r"\_", "_")
    while True:
        shorter = re.sub(r"^\{([^{}]*)\}(?=[_^]|$)", r"\1", _NEEDLESS_BRACES.sub(r"\1\2", text))
        if shorter == text:
            return text.replace(" ", "")
        text = shorter


#: LaTeX accents and their combining marks (``\\overline`` marks every letter of a name).
_ACCENTS = {"hat": "\u0302", "tilde": "\u0303", "bar": "\u0304", "dot": "\u0307", "overline": "\u0305"}
_LETTER = re.compile(r"[^\W\d_][\u0300-\u036f]*")


def _accented(text: str) -> str:
    """``\\hat{K}`` → ``K̂``, ``\\overline{LN^{x}}`` → ``L̅N̅^{x}``: accents as combining marks, innermost first."""
    match = re.search(r"\\(" + "|".join(_ACCENTS) + r")\{", text)
    if match is None:
        return text
    depth = 1
    for end in range(match.end(), len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            body = _accented(text[match.end():end])
            mark, letters = _ACCENTS[match.group(1)], [_LETTER.match(body)]
            while match.group(1) == "overline" and letters[-1] and letters[-1].end() < len(body):
                letters.append(_LETTER.match(body, letters[-1].end()))
            marked = [letter for letter in letters if letter]
            cut = marked[-1].end() if marked else 0
            head = "".join(letter.group() + mark for letter in marked)
            return text[:match.start()] + head + body[cut:] + _accented(text[end + 1:])
    return text


def plain_formula(expr: sp.Basic, names: Mapping[str, str] | None = None) -> str:
    """``expr`` as one line of plain text, its names the plain forms of their LaTeX names."""
    names = ChainMap(names or {}, _DEFAULT_NAMES)
    symbols, functions = _named(expr)
    shown = {symbol.name: _plain_name(names[symbol.name]) for symbol in symbols if symbol.name in names}
    shown.update({name: _plain_name(names[name]) for name in functions if name in names})
    return _PlainPrinter(shown).doprint(expr)


def plain_equation(lhs: sp.Basic, rhs: sp.Basic, names: Mapping[str, str] | None = None) -> str:
    """``lhs = rhs`` as one line of plain text (the comment above an emitted statement)."""
    return f"{plain_formula(lhs, names)} = {plain_formula(rhs, names)}"


def plain_text(expr: sp.Basic) -> str:
    """One line of plain text for ``expr``: SymPy's string form, Greek letters for macros."""
    return unicode_text(sp.sstr(expr))


def text_latex(text: str) -> str:
    r"""A plain title as LaTeX (math mode): ``\text{…}`` pieces, symbols such as ``×`` as macros, a Markdown code span
    (a scheme's name in backticks) as ``\texttt{…}`` (LaTeX set its backticks as opening quotation marks)."""
    pieces, current = [], ""
    for number, part in enumerate(text.split("`")):
        if number % 2:  # inside a code span (an unmatched backtick: the rest)
            if current:
                pieces.append(r"\text{" + current + "}")
                current = ""
            pieces.append(r"\texttt{" + "".join(_TEXT_ESCAPES.get(character, character) for character in part) + "}")
        else:
            current = _text_pieces(part, pieces, current)
    if current:
        pieces.append(r"\text{" + current + "}")
    return "".join(pieces).strip()


def _text_pieces(text: str, pieces: list[str], current: str) -> str:
    r"""Append ``text``'s math symbols to ``pieces`` as macros, closing the ``\text{…}`` before each; return the text
    after the last."""
    for character in text:
        if character in _MATH_CHARACTERS:
            if current:
                pieces.append(r"\text{" + current + "}")
                current = ""
            pieces.append(_MATH_CHARACTERS[character] + " ")
        else:
            current += _TEXT_ESCAPES.get(character, character)
    return current


def align(rows: list[tuple[str, str]]) -> str:
    r"""One ``align*`` environment: each row is ``("equation", "lhs = rhs")`` (aligned at the
    first ``=``) or ``("text", "a plain title")`` (set as text after the alignment point)."""
    lines = []
    for kind, content in rows:
        if kind == "text":
            lines.append(r"&" + text_latex(content))
        elif " = " in content:
            lines.append(content.replace(" = ", " &= ", 1))
        else:
            lines.append("&" + content)
    return "\\begin{align*}\n" + " \\\\\n".join(lines) + "\n\\end{align*}"
