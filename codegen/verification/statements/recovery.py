"""Exact recovery: a derived program equals the published block it claims to be.

Symbolically at a small size (every parameter and input a symbol, 2 tokens, 2 features,
1 head) and numerically at a realistic one (random values, 50 significant digits, several
heads, ``d_ff ≠ d``).
"""

from __future__ import annotations

import random

import mpmath
import sympy as sp

from splitformer.symbolic.activations import activation as lookup_activation
from splitformer.symbolic.domains import (
    FEATURES, FREQUENCIES, GROUP, HEAD_FEATURES, HEADS, HIDDEN, KV_FEATURES, KV_HEADS, MEMORY, PAIR, TOKENS,
)
from splitformer.symbolic.evaluate import evaluate
from splitformer.symbolic.operators import EPSILON
from splitformer.symbolic.program import Program
from splitformer.symbolic.cross_attention import MEMORY_FIELD, MEMORY_SUPPORT
from splitformer.symbolic.rotary_attention import POSITIONS, ROPE_THETA
from splitformer.symbolic.references import has_published_reference, reference_block
from splitformer.symbolic.scheme import Scheme
from . import Check

__all__ = ["recovery_checks", "canonical_entry", "view_entry",
           "evaluation_inputs", "evaluation_sizes", "domain_sizes", "symbolic_parameters", "vanishes"]

_DIGITS = 50


def canonical_entry(domains, index, head_width):
    """Map an index of a parameter's view (``W_q[k, m, e]``) to its canonical layout (``W_q[k, m·d_h + e]``)."""
    canonical, position = [], 0
    while position < len(domains):
        if domains[position] is HEADS:
            canonical.append(index[position] * head_width + index[position + 1])
            position += 2
        else:
            canonical.append(index[position])
            position += 1
    return tuple(canonical)


def view_entry(view, shape, index, sizes):
    """Map an index of any parameter view (``W_q[k, g, s, c, r]``) to its canonical layout, given the
    grid sizes by domain: a view splits the canonical axes row-major (a reshape), so the flat
    position is the same."""
    flat = 0
    for domain, position in zip(view, index):
        flat = flat * sizes[domain] + position
    canonical = []
    for domain in reversed(shape):
        flat, position = divmod(flat, sizes[domain])
        canonical.append(position)
    return tuple(reversed(canonical))


def evaluation_inputs(program: Program, params: dict[str, sp.Matrix], u: sp.Matrix, sizes, causal: bool = False) -> dict:
    """Inputs of ``evaluate``; ``sizes``: grid sizes by domain, or (the older form) the head width."""
    from splitformer.symbolic.domains import VARIABLES

    index_domains = {variable.index: variable.domain for variable in VARIABLES.values()}
    inputs = {"u0": lambda i, k: u[i, k], "chi": lambda i, j: int(j <= i or not causal)}
    if "positions" in params:
        inputs[POSITIONS] = lambda i: params["positions"][i]
    if "memory" in params:
        inputs[MEMORY_FIELD] = lambda t, k: params["memory"][t, k]
        inputs[MEMORY_SUPPORT] = lambda i, t: 1
    for tensor in program.parameters():
        domains = [index_domains[index] for index in tensor.indices]
        array = params[tensor.parameter]

        def entry(*index, array=array, domains=domains, shape=tensor.shape):
            canonical = (canonical_entry(domains, index, sizes) if isinstance(sizes, int)
                         else view_entry(domains, shape, index, sizes))
            return array[canonical] if len(canonical) == 2 else array[canonical[0]]

        inputs[tensor.name] = entry
    return inputs


def domain_sizes(sizes: dict) -> dict:
    """Grid sizes by domain (``FEATURES → 8``), derived ones included."""
    by_symbol = dict(sizes)
    by_domain = {domain: by_symbol.get(domain.size, domain.size) for domain in
                 (TOKENS, FEATURES, HEADS, HEAD_FEATURES, HIDDEN, KV_HEADS, GROUP, PAIR, FREQUENCIES, KV_FEATURES)}
    return {domain: int(size) for domain, size in by_domain.items() if isinstance(size, (int, sp.Integer))}


def symbolic_parameters(program: Program, sizes: dict, value) -> dict[str, sp.Matrix]:
    """Each parameter of ``program`` as a matrix of ``value(name, i, j)`` at the grid sizes ``sizes``."""
    code = domain_sizes(sizes)
    params = {}
    for tensor in program.parameters():
        shape = [code[domain] for domain in tensor.shape]
        rows, columns = (shape[0], shape[1]) if len(shape) == 2 else (shape[0], 1)
        params[tensor.parameter] = sp.Matrix(rows, columns, lambda i, j, name=tensor.parameter: value(name, i, j))
    return params


def _difference(program: Program, scheme: Scheme, sizes: dict, value, eps, position=sp.Integer,
                digits: int | None = None) -> sp.Matrix:
    """Derived − reference; ``position(i)`` is token i's position (a Float keeps numeric evaluation numeric);
    ``digits``: numeric values, the derived program evaluated in that many digits (``evaluate``'s mpmath closures)."""
    n, d, heads = sizes[TOKENS.size], sizes[FEATURES.size], sizes[HEADS.size]
    params = symbolic_parameters(program, sizes, value)
    if POSITIONS in program.tensors:
        params["positions"] = sp.Matrix([position(i) for i in range(n)])
    if MEMORY_FIELD in program.tensors:
        params["memory"] = sp.Matrix(sizes[MEMORY.size], d, lambda t, k: value("m", t, k))
    u = sp.Matrix(n, d, lambda i, k: value("u", i, k))
    inputs = evaluation_inputs(program, params, u, domain_sizes(sizes), scheme.causal)
    values = evaluate(program, sizes, inputs, eps=eps, digits=digits)[program.output]
    activation = lookup_activation(scheme.activation)
    if scheme.activation == "relu":  # SymPy's Max simplifies large arguments very slowly
        activation = lambda x: sp.Max(x, 0, evaluate=x.is_number)  # noqa: E731
    expected = reference_block(scheme.name, u, params, heads, eps, activation)
    return sp.Matrix(n, d, lambda i, k: values[(i, k)] - expected[i, k])


def vanishes(expr: sp.Expr) -> bool:
    """``expr == 0`` identically: a random point refutes cheaply, expansion confirms."""
    if expr == 0:
        return True
    return abs(_at_random_point(expr)) <= 1e-20 and sp.expand(expr) == 0


def _at_random_point(expr: sp.Expr):
    """``expr`` at 30 digits with its symbols (in name order) uniform in [0.1, 1]: through its common subexpressions
    in mpmath (a difference in post-ln's recovery, 117 k operations: 1.2 s, where SymPy's substitution, evaluating
    every node as it rebuilds the tree, takes 5.3), by substitution where mpmath lacks one of its functions."""
    generator = random.Random(0)
    symbols = sorted(expr.free_symbols, key=str)
    point = [sp.Float(generator.uniform(0.1, 1), 30) for _ in symbols]
    try:
        function = sp.lambdify(symbols, expr, "mpmath", cse=True)
        with mpmath.workdps(30):
            return function(*map(mpmath.mpf, point))
    except (NameError, TypeError, AttributeError):  # a function mpmath does not know
        return sp.N(expr.xreplace(dict(zip(symbols, point))), 30)


def evaluation_sizes(n, d, heads, hidden, kv_heads=1, theta=10000, memory=2):
    """Grid sizes (and RoPE's θ) of one evaluation; ``kv_heads`` matters to grouped-query attention."""
    head_width = d // heads
    return {TOKENS.size: n, FEATURES.size: d, HEADS.size: heads, HEAD_FEATURES.size: head_width, HIDDEN.size: hidden,
            KV_HEADS.size: kv_heads, GROUP.size: heads // kv_heads, FREQUENCIES.size: head_width // 2,
            KV_FEATURES.size: kv_heads * head_width, MEMORY.size: memory, ROPE_THETA: theta}


def recovery_checks(scheme: Scheme, program: Program) -> list[Check]:
    """Symbolic and numeric agreement of ``program`` with the published block of ``scheme``."""
    if not has_published_reference(scheme):
        return []
    statement = (f"One step of the derived {scheme.name} program ({scheme.activation}) equals the published "
                 f"{scheme.name} block, with every parameter (biases and gains included) free")
    # one memory token keeps the symbolic cross-attention small (its softmax over two is checked numerically)
    symbolic = _difference(program, scheme, evaluation_sizes(2, 2, 1, 2, memory=1),
                           lambda name, i, j: sp.Symbol(f"{name}[{i},{j}]", real=True), EPSILON)
    nonzero = [(i, k) for i in range(symbolic.rows) for k in range(symbolic.cols) if not vanishes(symbolic[i, k])]
    checks = [Check(
        f"recovery/{scheme.name}/symbolic", scheme.name,
        statement + ": exactly, for 2 tokens (1 memory token), 2 features, 1 head, d_ff = 2, symbolic ε.",
        "symbolic", not nonzero,
        "every entry of derived − reference expands to 0" if not nonzero
        else f"entries {nonzero} of derived − reference do not vanish",
    )]
    generator = random.Random(f"{scheme.name}/{scheme.activation}")
    numbers: dict = {}

    def value(name, i, j):
        key = (name, i, j)
        if key not in numbers:
            numbers[key] = sp.Float(generator.uniform(-1, 1), _DIGITS)
        return numbers[key]

    # d_head = 4 keeps the score scale 1/√d_head rational, so every entry evaluates to a number
    # (θ = 10⁴ keeps the rotary frequencies θ^(−2r/4) rational too; one key/value head for both query heads)
    numeric = _difference(program, scheme, evaluation_sizes(3, 8, 2, 6), value, sp.Float("1e-5", _DIGITS),
                          lambda i: sp.Float(i, _DIGITS), _DIGITS)
    error = max(abs(sp.N(entry, _DIGITS)) for entry in numeric)
    checks.append(Check(
        f"recovery/{scheme.name}/numeric", scheme.name,
        statement + ": numerically at random values in 50-digit arithmetic, 3 tokens, 8 features, "
        "2 heads (sharing 1 key/value head where grouped), d_ff = 6, 2 memory tokens, ε = 1e-5.",
        "numeric", bool(error < sp.Float(10) ** (-40)), f"max |derived − reference| = {sp.N(error, 3)}",
    ))
    return checks
