"""The mutants of one file: AST mutants of Python modules, text mutants of code templates.

Python (``ast``): ``+ ↔ −``, ``* ↔ /``, ``** → *``, comparison flips (``< ↔ <=``, ``> ↔ >=``,
``== ↔ !=``), ``and ↔ or``, integer constants ``n → n + 1``, ``True ↔ False``; nothing inside
docstrings, ``__all__`` or type annotations.

Templates (``*.py.j2``, the emitted code): the same operators, integers and booleans, plus the
names ``max ↔ min``, ``maximum ↔ minimum``, ``sum ↔ mean``, found by a scanner in the code of each
line (emitted Python and the Jinja expressions that compute it), never inside a string literal,
a comment, a docstring or a Jinja delimiter (``{%-`` is not a minus).
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutant", "file_mutants", "apply", "diff"]

_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
          ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
          ast.NotEq: ast.Eq, ast.And: ast.Or, ast.Or: ast.And}
_TEXT_SWAPS = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "*", "**": "*", "@": "*", "<": "<=", "<=": "<",
               ">": ">=", ">=": ">", "==": "!=", "!=": "==", "and": "or", "or": "and", "True": "False",
               "False": "True", "max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum",
               "sum": "mean", "mean": "sum"}
#: What the template scanner masks: float literals, strings, comments, Jinja delimiters.
_MASKED = re.compile(r"""\b\d+(?:\.\d*)?[eE][-+]?\d+\b|\b\d+\.\d*|\{#.*?#\}|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"|\{[{%]-?|-?[}%]\}|(?<!\{)#.*$""")
_TOKEN = re.compile(r"\*\*|//|<=|>=|==|!=|->|[-+*/@<>]|(?<![\w.])\d+(?![\w.])|\b(?:and|or|True|False|max|min|"
                    r"maximum|minimum|sum|mean)\b")


@dataclass(frozen=True)
class Mutant:
    path: str
    index: int  # the index-th candidate of the file (``ast.walk`` order; text order in a template)
    line: int
    description: str
    text: str  # the mutated line of the source, stripped

    @property
    def key(self) -> str:
        """``path:line description``: how reports name a mutant."""
        return f"{self.path}:{self.line} {self.description}"

    @property
    def identity(self) -> tuple[str, str, str]:
        """(path, line text, description): how the judged equivalents name a mutant, unmoved by
        edits that shift lines."""
        return self.path, self.text, self.description


def _numbered(path: str, candidates) -> list[Mutant]:
    """Mutants of (line, description, line text) in candidate order; the n-th same mutation of the same
    line text in the file (n > 1) is described ``… #n``, so that no two mutants share an identity."""
    seen: dict[tuple[str, str], int] = {}
    mutants = []
    for index, (line, description, text) in enumerate(candidates):
        count = seen[text, description] = seen.get((text, description), 0) + 1
        mutants.append(Mutant(path, index, line, description + (f" #{count}" if count > 1 else ""), text))
    return mutants


# -- Python modules ---------------------------------------------------------------------------

def _mutable(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _SWAPS:
            yield node, f"{type(node.op).__name__} → {_SWAPS[type(node.op)].__name__}"
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _SWAPS:
            yield node, f"{type(node.ops[0]).__name__} → {_SWAPS[type(node.ops[0])].__name__}"
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            yield node, f"{node.value} → {not node.value}"
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, f"{node.value} → {node.value + 1}"


def _skipped(tree: ast.AST) -> set[int]:
    """Nodes inside docstrings, ``__all__`` and type annotations are not behaviour."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            skipped |= {id(child) for child in ast.walk(node)}
        if isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            skipped |= {id(child) for child in ast.walk(node.annotation)}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            skipped |= {id(child) for child in ast.walk(node.returns)}
    return skipped


def _python_mutants(path: str, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skipped, lines = _skipped(tree), source.splitlines()
    mutable = list(_mutable(tree))
    candidates = [(node.lineno, description, lines[node.lineno - 1].strip()) for node, description in mutable]
    return [mutant for (node, _), mutant in zip(mutable, _numbered(path, candidates)) if id(node) not in skipped]


def _apply_python(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    node, _ = list(_mutable(tree))[mutant.index]
    if isinstance(node, ast.BinOp | ast.BoolOp):
        node.op = _SWAPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops = [_SWAPS[type(node.ops[0])]()]
    elif type(node.value) is bool:
        node.value = not node.value
    else:
        node.value += 1
    return ast.unparse(tree)


# -- code templates ---------------------------------------------------------------------------

def _code_lines(source: str):
    """(line number, text) of the lines that hold code: not in a docstring or a Jinja comment."""
    in_docstring = in_comment = False
    for number, text in enumerate(source.splitlines(), 1):
        quotes = text.count('"""') + text.count("'''")
        if in_comment:
            in_comment = "#}" not in text
            continue
        if in_docstring or quotes:
            in_docstring ^= quotes % 2 == 1
            continue
        if "{#" in text and "#}" not in text:
            in_comment = True
            text = text[:text.index("{#")]
        yield number, text


def _template_candidates(source: str):
    """(line, start, end, replacement) of every text mutation, in text order."""
    for number, text in _code_lines(source):
        masked = _MASKED.sub(lambda match: " " * len(match.group()), text)
        if masked.lstrip().startswith("@"):  # a decorator, not a product
            continue
        for match in _TOKEN.finditer(masked):
            token = match.group()
            if token == "->" or (token in ("*", "**") and re.search(r"[(,]\s*$", masked[:match.start()])):
                continue  # an annotation arrow; ``*args`` and keyword-only markers
            replacement = str(int(token) + 1) if token.isdigit() else _TEXT_SWAPS[token]
            yield number, match.start(), match.end(), replacement


def _template_mutants(path: str, source: str) -> list[Mutant]:
    lines = source.splitlines()
    return _numbered(path, [(number, f"{lines[number - 1][start:end]} → {replacement}", lines[number - 1].strip())
                            for number, start, end, replacement in _template_candidates(source)])


def _apply_template(source: str, mutant: Mutant) -> str:
    number, start, end, replacement = list(_template_candidates(source))[mutant.index]
    lines = source.splitlines(keepends=True)
    lines[number - 1] = lines[number - 1][:start] + replacement + lines[number - 1][end:]
    return "".join(lines)


# -- either kind ------------------------------------------------------------------------------

def file_mutants(root: Path, path: str) -> list[Mutant]:
    """Every mutant of the file ``path`` (relative to ``root``)."""
    source = (root / path).read_text(encoding="utf-8")
    return _template_mutants(path, source) if path.endswith(".j2") else _python_mutants(path, source)


def apply(source: str, mutant: Mutant) -> str:
    """The text of the mutated file."""
    return _apply_template(source, mutant) if mutant.path.endswith(".j2") else _apply_python(source, mutant)


def diff(source: str, mutant: Mutant) -> str:
    """The mutated lines as a unified diff (Python sources compared after ``ast.unparse``)."""
    before = source if mutant.path.endswith(".j2") else ast.unparse(ast.parse(source))
    lines = difflib.unified_diff(before.splitlines(), apply(source, mutant).splitlines(), lineterm="", n=0)
    return "\n".join(line for line in list(lines)[2:] if not line.startswith("@@"))
