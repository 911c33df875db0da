"""A scheme's own derived and emitted program against the independent evaluator.

For any scheme, built-in or user file:

- ``derived``: the derived program, evaluated entry by entry with every parameter and input
  a symbol (2 tokens, 2 features, 1 head, ``d_ff = 2``, symbolic ε, a causal support),
  minus the evaluator's step in SymPy arithmetic, vanishes identically;
- ``emitted``: the emitted NumPy and PyTorch modules in float64 agree with the evaluator in
  50-digit arithmetic at a realistic size (2 sequences, 5 tokens, ``d = 8``, 2 heads,
  ``d_ff = 12``, random parameters, ε = 1e-5), without masks and with a padding mask plus
  the causal mask (one query with empty support).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import mpmath
import numpy as np
import sympy as sp

from splitformer.symbolic.checks import SKIPPED, Check
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.evaluate import evaluate
from splitformer.symbolic.operators import EPSILON
from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme

from .emitted import emitted_modules
from .semantics import MPMATH, SYMPY, OpaqueExp, OpaqueRelu, Semantics, Sizes, unevaluable

__all__ = ["scheme_checks", "random_parameters", "DIGITS", "TOLERANCE", "SKIPPED"]

DIGITS = 50
#: Float64 emitted code against the 50-digit evaluator, relative to the output's scale.
TOLERANCE = 1e-10
_EMITTED = Sizes(tokens=5, features=8, heads=2, hidden=12)
_TINY = Sizes(tokens=2, features=2, heads=1, hidden=2)


def random_parameters(scheme: Scheme, sizes: Sizes, seed: int) -> dict[str, np.ndarray]:
    """Float64 values for every parameter of ``scheme``, biases included; gains around 1."""
    rng = np.random.default_rng(seed)
    codes = {"d": sizes.features, "d_ff": sizes.hidden, "d_kv": sizes.features}  # n_kv_heads = n_heads
    params = {}
    for operator in scheme.instantiate().values():
        for parameter in operator.parameters():
            shape = tuple(codes[domain.code_name] for domain in parameter.shape)
            values = rng.standard_normal(shape) / np.sqrt(shape[0] if len(shape) == 2 else 1)
            params[f"{operator.key}.{parameter.name}"] = values * 0.5 + (1.0 if parameter.kind == "gain" else 0.0)
    return params


def _exact(array: np.ndarray) -> np.ndarray:
    """Float64 values as 50-digit mpmath numbers (exactly the same binary values)."""
    return np.frompyfunc(mpmath.mpf, 1, 1)(np.asarray(array, dtype=float))


def _support(n: int, padded: set[int], causal: bool) -> np.ndarray:
    return np.array([[int(j not in padded and (not causal or j <= i)) for j in range(n)] for i in range(n)])


def _unchecked(kinds: set[str]) -> str:
    return f"; kinds {', '.join(sorted(kinds))} evaluated from their continuous definitions" if kinds else ""


def emitted_check(scheme: Scheme, program: Program, modules: dict | None = None) -> Check:
    sizes, batch = _EMITTED, 2
    seed = zlib.crc32(f"{scheme.name}/{scheme.activation}".encode())
    params = random_parameters(scheme, sizes, seed)
    u = np.random.default_rng(seed + 1).standard_normal((batch, sizes.tokens, sizes.features))
    eps = 1e-5
    padding = np.zeros((batch, sizes.tokens), dtype=bool)
    padding[1, [0, 3]] = True  # with the causal mask, query 0 of sequence 1 has empty support
    modules = modules or emitted_modules(scheme, program)
    numpy_module, torch_module = modules["numpy"], modules["torch"]
    import torch

    block = torch_module.Block(sizes.features, sizes.heads, sizes.hidden, eps=eps, dtype=torch.float64)
    block.load_params(params)
    errors, unchecked, scale = {}, set(), 1.0
    with mpmath.workdps(DIGITS):
        exact = {name: _exact(value) for name, value in params.items()}
        for label, mask, causal in (("no mask", None, False), ("padding + causal", padding, True)):
            expected = []
            for b in range(batch):
                padded = set() if mask is None else set(np.flatnonzero(mask[b]).tolist())
                semantics = Semantics(scheme, exact, sizes, MPMATH, support=_support(sizes.tokens, padded, causal),
                                      eps=mpmath.mpf(eps))
                expected.append(np.array(semantics.step(_exact(u[b])).tolist(), dtype=float))
                unchecked |= semantics.unchecked
            expected = np.array(expected)
            scale = max(scale, float(np.abs(expected).max()))
            got_numpy = numpy_module.forward(u, params, n_heads=sizes.heads, eps=eps, key_padding_mask=mask, causal=causal)
            with torch.no_grad():
                got_torch = block(torch.tensor(u), key_padding_mask=None if mask is None else torch.tensor(mask),
                                  causal=causal).numpy()
            errors[f"numpy, {label}"] = float(np.abs(got_numpy - expected).max())
            errors[f"torch, {label}"] = float(np.abs(got_torch - expected).max())
    worst = max(errors.values())
    return Check(
        f"semantics/{scheme.name}/emitted", scheme.name,
        f"The emitted NumPy and PyTorch modules of {scheme.name} ({scheme.activation}, float64) compute one step of "
        "the scheme as the independent evaluator defines it (the continuous operators by the rectangle rule, "
        "composed by the scheme's steps, fractions, weights and stages; 50-digit arithmetic): 2 sequences of "
        f"{sizes.tokens} tokens, d = {sizes.features}, {sizes.heads} heads, d_ff = {sizes.hidden}, ε = 1e-5, random "
        "parameters, without masks and with padding plus causal masks (one query with empty support).",
        "numeric", worst <= TOLERANCE * scale,
        "max |emitted − evaluator|: " + ", ".join(f"{key} {value:.1e}" for key, value in errors.items())
        + f" (tolerance {TOLERANCE:g} × {scale:.2g}){_unchecked(unchecked)}",
    )


def _symbolic_inputs(program: Program, u, params, support, head_width: int) -> dict:
    from splitformer.symbolic.domains import VARIABLES

    domains_of = {variable.index: variable.domain for variable in VARIABLES.values()}
    inputs = {"u0": lambda i, k: u[i, k], "chi": lambda i, j: support[i, j]}
    for tensor in program.parameters():
        domains = [domains_of[index] for index in tensor.indices]
        array = params[tensor.parameter]

        def entry(*index, array=array, domains=domains):
            canonical, position = [], 0
            while position < len(domains):  # (h, e) of a head view → column h·d_h + e
                if domains[position] is HEADS:
                    canonical.append(index[position] * head_width + index[position + 1])
                    position += 2
                else:
                    canonical.append(index[position])
                    position += 1
            return array[tuple(canonical)]

        inputs[tensor.name] = entry
    return inputs


def _vanishes(expr: sp.Expr) -> str | None:
    """How ``expr ≡ 0`` was established, or ``None`` when a random point refutes it.

    Both sides are built from the same symbols, so an identity usually shows as structural
    zero after SymPy's automatic canonicalization; otherwise three random points at 30 digits
    (compiled with ``lambdify``: substituting into these expressions is slow, and a full
    expansion too costly to be a check).
    """
    if expr == 0:
        return "structural"
    symbols = sorted(expr.free_symbols, key=str)
    modules = [{"OpaqueExp": mpmath.exp, "OpaqueRelu": lambda v: max(v, 0)}, "mpmath"]
    function = sp.lambdify(symbols, expr, modules=modules)
    generator = random.Random(0)
    with mpmath.workdps(30):
        for _ in range(3):
            if abs(function(*(mpmath.mpf(generator.uniform(0.1, 1)) for _ in symbols))) > 1e-20:
                return None
    return "random points"


def _opaque(expr: sp.Expr) -> sp.Expr:
    """``exp`` → ``OpaqueExp``, ``max(v, 0)`` → ``OpaqueRelu``: the evaluator's symbolic functions."""
    expr = expr.replace(sp.exp, OpaqueExp)
    return expr.replace(lambda e: isinstance(e, sp.Max) and len(e.args) == 2 and 0 in e.args,
                        lambda e: OpaqueRelu(e.args[1 - e.args.index(0)]))


def _with_opaque_functions(program: Program) -> Program:
    """The same program written with the evaluator's symbolic functions."""
    records = []
    for record in program.records:
        evaluations = tuple(replace(evaluation, assignments=tuple(
            replace(assignment, rhs=_opaque(assignment.rhs)) for assignment in evaluation.assignments))
            for evaluation in record.evaluations)
        records.append(replace(record, evaluations=evaluations))
    return replace(program, records=records)


def derived_check(scheme: Scheme, program: Program) -> Check:
    sizes = _TINY
    codes = {"d": sizes.features, "d_ff": sizes.hidden}
    params = {}
    for operator in scheme.instantiate().values():
        for parameter in operator.parameters():
            shape = tuple(codes[domain.code_name] for domain in parameter.shape)
            name = f"{operator.key}.{parameter.name}"
            params[name] = np.array([sp.Symbol(f"{name}[{index}]", real=True) for index in np.ndindex(shape)],
                                    dtype=object).reshape(shape)
    u = np.array([[sp.Symbol(f"u[{i},{k}]", real=True) for k in range(sizes.features)]
                  for i in range(sizes.tokens)], dtype=object)
    support = _support(sizes.tokens, set(), causal=True)
    spacing = sp.Symbol(r"\Delta x", positive=True)  # must cancel: the derived program has no Δx
    semantics = Semantics(scheme, params, replace(sizes, token_spacing=spacing), SYMPY, support=support, eps=EPSILON)
    expected = semantics.step(u)
    table = {TOKENS.size: sizes.tokens, FEATURES.size: sizes.features, HEADS.size: sizes.heads,
             HEAD_FEATURES.size: sizes.head_features, HIDDEN.size: sizes.hidden}
    opaque = _with_opaque_functions(program)
    derived = evaluate(opaque, table, _symbolic_inputs(opaque, u, params, support, sizes.head_features))[opaque.output]
    how = {(i, k): _vanishes(derived[(i, k)] - expected[i, k]) for i in range(sizes.tokens) for k in range(sizes.features)}
    nonzero = [entry for entry, method in how.items() if method is None]
    numeric = [entry for entry, method in how.items() if method == "random points"]
    detail = (f"entries {nonzero} of derived − evaluator do not vanish" if nonzero
              else "every entry of derived − evaluator is 0 after canonicalization (Δx cancelled)" if not numeric
              else f"entries {numeric} of derived − evaluator vanish at 3 random points to 30 digits, the others are 0")
    return Check(
        f"semantics/{scheme.name}/derived", scheme.name,
        f"The derived program of {scheme.name} ({scheme.activation}) equals one step of the scheme as the independent "
        "evaluator defines it, exactly: every parameter and input a symbol, 2 tokens, 2 features, 1 head, d_ff = 2, "
        "symbolic ε and token spacing Δx, causal support.",
        "symbolic", not nonzero, detail + _unchecked(semantics.unchecked),
    )


def _skipped(scheme: Scheme, reasons: dict[str, str]) -> list[Check]:
    why = "skipped: the independent evaluator has no semantics for " + "; ".join(
        f"{key} ({reason})" for key, reason in reasons.items())
    return [Check(f"semantics/{scheme.name}/{what}", scheme.name,
                  f"The {what} program of {scheme.name} equals one step of the scheme as the independent evaluator "
                  "defines it.", SKIPPED, True, why) for what in ("derived", "emitted")]


def scheme_checks(scheme: Scheme, program: Program) -> list[Check]:
    """The derived program (symbolically) and the emitted modules (numerically) against the evaluator,
    and the emitted stack against N steps; the first two are skipped, with the reason, for operators
    the evaluator cannot evaluate (inputs such as token positions or a memory)."""
    from .structure import stack_check

    modules = emitted_modules(scheme, program)
    reasons = unevaluable(scheme)
    if reasons:
        return [*_skipped(scheme, reasons), stack_check(scheme, modules["numpy"])]
    emitted = emitted_check(scheme, program, modules)
    if emitted.holds:
        derived = derived_check(scheme, program)
    else:  # a wrong program makes the symbolic comparison very slow; the numbers already refute it
        derived = Check(f"semantics/{scheme.name}/derived", scheme.name,
                        f"The derived program of {scheme.name} equals one step of the scheme as the independent "
                        "evaluator defines it (symbolic comparison at a tiny size).", "symbolic", False,
                        "not compared symbolically: the emitted program already disagrees with the evaluator")
    return [derived, emitted, stack_check(scheme, modules["numpy"])]
