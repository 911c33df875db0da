"""A LaTeX sanity check for emitted math (no TeX installation needed).

Structure: braces, ``\\left``/``\\right`` and ``\\begin``/``\\end`` balance, every macro is one
MathJax and KaTeX both know, every row of an ``align*`` has exactly one alignment point.
When ``node`` can load KaTeX (``SPLITFORMER_KATEX`` names a folder holding
``node_modules/katex``), the text is also rendered by KaTeX with errors turned on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

#: Macros of the math splitformer emits; all are standard LaTeX/amsmath and render in
#: MathJax and KaTeX. A new macro must be added here deliberately.
KNOWN_MACROS = {
    "mathrm", "mathcal", "text", "frac", "tfrac", "sqrt", "sum", "int", "left", "right", "langle", "rangle",
    "partial", "cdot", "times", "quad", "qquad", "max", "in", "to", "ge", "geq", "leq", "le", "iff", "Rightarrow",
    "xrightarrow", "tilde", "operatorname", "begin", "end", "displaystyle", "hline", "mathcal", "qquad",
    "textbackslash", "mathbf", "circ", "odot", "pm", "ldots", "cdots", "infty", "ne", "neq", "exp", "log",
    "tanh", "cos", "sin", "hat",  # gelu-tanh, the rotary kernel, the memory coordinate x̂
    "texttt",  # a scheme's name in a title of show --format latex
    "lfloor", "rfloor",  # a token shift's offsets
    "ell", "big", "top", "overline", "cup", "dots",  # costates x̄; a network's logits ℓ, its sized parentheses, the transpose in the stationarity conditions
    *"alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi pi rho "
     "varrho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega".split(),
}


def assert_balanced(text: str) -> None:
    stripped = re.sub(r"\\[{}]", "", text)
    depth = 0
    for character in stripped:
        depth += {"{": 1, "}": -1}.get(character, 0)
        assert depth >= 0, f"unbalanced '}}' in {text[:120]!r}"
    assert depth == 0, f"unclosed '{{' in {text[:120]!r}"
    assert len(re.findall(r"\\left\b", text)) == len(re.findall(r"\\right\b", text)), "\\left without \\right"
    stack = []
    for kind, name in re.findall(r"\\(begin|end)\{([^}]*)\}", text):
        if kind == "begin":
            stack.append(name)
        else:
            assert stack and stack.pop() == name, f"\\end{{{name}}} does not close what is open"
    assert not stack, f"unclosed environments {stack}"


#: A script group (``{…}`` with one level of nesting, or one character) followed by another script of the same kind:
#: ``r^{i}^{gate}``, which TeX, MathJax and KaTeX reject ("double superscript").
_DOUBLE_SCRIPT = re.compile(r"([\^_])(?:\{(?:[^{}]|\{[^{}]*\})*\}|\w)\s*\1")


def assert_single_scripts(text: str) -> None:
    double = _DOUBLE_SCRIPT.search(text)
    assert double is None, f"a double script at {text[max(double.start() - 30, 0):double.end() + 10]!r}"


def assert_known_macros(text: str) -> None:
    unknown = set(re.findall(r"\\([A-Za-z]+)", text)) - KNOWN_MACROS
    assert not unknown, f"macros outside the known set: {sorted(unknown)}"


def katex_errors(blocks: list[str]) -> list[str] | None:
    """KaTeX's error per block that fails to render; ``None`` when KaTeX is not available."""
    folder = os.environ.get("SPLITFORMER_KATEX")
    if not folder or shutil.which("node") is None:
        return None
    script = ("const k=require('katex');const b=JSON.parse(require('fs').readFileSync(0,'utf8'));"
              "const e=[];for(const s of b){try{k.renderToString(s,{displayMode:true,throwOnError:true})}"
              "catch(x){e.push(x.message)}}console.log(JSON.stringify(e))")
    import json

    result = subprocess.run(["node", "-e", script], input=json.dumps(blocks), capture_output=True, text=True,
                            cwd=folder, check=True)
    return json.loads(result.stdout)


def assert_renderable_align(text: str) -> None:
    assert_balanced(text)
    assert_single_scripts(text)
    assert_known_macros(text)
    body = text.removeprefix(r"\begin{align*}").removesuffix(r"\end{align*}")
    for row in body.split(r"\\"):
        if row.strip():
            assert row.count("&") - row.count(r"\&") == 1, f"row without one alignment point: {row[:80]!r}"
    errors = katex_errors([text])
    assert not errors, errors


def assert_renderable_math(blocks: list[str]) -> None:
    for block in blocks:
        assert_balanced(block)
        assert_single_scripts(block)
        assert_known_macros(block)
    errors = katex_errors(blocks)
    assert not errors, errors
