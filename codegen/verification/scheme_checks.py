"""A scheme's own derived and emitted program against the independent evaluator.

For any scheme, built-in or user file:

- ``derived``: the derived program, evaluated entry by entry with every parameter and input
  a symbol (2 tokens, 2 features, 1 head, ``d_ff = 2``, symbolic ε, a causal support),
  minus the evaluator's step in SymPy arithmetic, vanishes identically;
- ``emitted``: the emitted NumPy and PyTorch modules in float64 agree with the evaluator in
  50-digit arithmetic at a realistic size (2 sequences, 5 tokens, ``d = 8``, 2 heads,
  ``d_ff = 12``, random parameters, ε = 1e-5), without masks and with a padding mask plus
  the causal mask (one query with empty support). Rotary attention gets ``d = 16``, 4 query
  heads on 2 key/value heads, θ = 100 and positions that are not ``0 … N−1``;
  cross-attention a memory of 4 tokens, with a memory padding mask in the masked case.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field, replace
from inspect import signature

import mpmath
import numpy as np
import sympy as sp

from splitformer.codegen.verification.statements import SKIPPED, Check
from splitformer.symbolic.cross_attention import MEMORY_FIELD, MEMORY_SUPPORT
from splitformer.symbolic.domains import (
    ATTENTION_FEATURES, BUCKETS, FEATURES, FREQUENCIES, GROUP, HEAD_FEATURES, HEADS, HIDDEN, KV_FEATURES, KV_HEADS,
    MEMORY, PAIR, TOKENS,
)
from splitformer.symbolic.evaluate import evaluate, evaluation_work
from splitformer.symbolic.operators import EPSILON
from splitformer.symbolic.program import Program
from splitformer.symbolic.rotary_attention import POSITIONS
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence

from .emitted import TORCH_MISSING, emitted_modules
from .parameters import axis_extents, emitted_sizes, random_parameters, scheme_parameters
from .semantics import MPMATH, SYMPY, OpaqueExp, OpaqueRelu, Semantics, Sizes, unevaluable
from .structure import across_stack_check, stack_check, stream_stack_check
from .time_bound import OutOfTime, within
from .undefined import gap, undefined_note

__all__ = ["scheme_checks", "skipped_because", "emitted_check", "derived_check", "EmittedInputs", "nesting", "DIGITS",
           "TOLERANCE", "SKIPPED", "MAX_SYMBOLIC_NESTING", "MAX_EMITTED_WORK", "emitted_work"]

#: The symbolic comparison is made for steps that nest at most this many operator applications:
#: SymPy's cost grows exponentially with the nesting (a dense 10-stage tableau of a pre-LN field,
#: 20 applications: about 6 s of CPU; 12 stages, 24: more than a minute).
MAX_SYMBOLIC_NESTING = 20
#: The real time SymPy may take for the symbolic comparison: beyond, it is skipped (the emitted modules are compared
#: numerically). Built-in schemes take at most 0.4 s; a Strang step of RMS-normalized attention around a feed-forward
#: ran for minutes in SymPy's assumptions (a fuzzer's finding).
SYMBOLIC_SECONDS = 60.0
#: The most work (``emitted_work``, a count) the emitted check's 50-digit evaluator may do, about a
#: microsecond of CPU each: the densest scheme the bounds allow (a 16-stage tableau of four fields
#: on projected states, 64 evaluations) needs 4 080 640 with attention, feed-forward and LayerNorm
#: (about 4 s), 11 613 440 with rotary attention, gated feed-forward and RMSNorm (about 6 s).
MAX_EMITTED_WORK = 20_000_000

DIGITS = 50
#: Float64 emitted code against the 50-digit evaluator, relative to the output's scale.
TOLERANCE = 1e-10
_EMITTED = Sizes(tokens=5, features=8, heads=2, hidden=12)
#: Rotary attention: 4 query heads on 2 key/value heads (query head h reads ⌊h/2⌋, not h mod 2),
#: head width 4 (two frequencies, so θ matters).
_EMITTED_GROUPED = Sizes(tokens=5, features=16, heads=4, hidden=12, kv_heads=2)
_TINY = Sizes(tokens=2, features=2, heads=1, hidden=2)
#: Rotary attention's positions in the emitted check: uneven gaps (per sequence), so that the frequencies and
#: p(x) matter (its θ is its constant's ``check_value``, 100).
_POSITIONS = ((0, 1, 2, 3, 4), (2, 3, 5, 8, 9))
_MEMORY_TOKENS, _TINY_MEMORY_TOKENS = 4, 3


def _exact(array: np.ndarray) -> np.ndarray:
    """Float64 values as 50-digit mpmath numbers (exactly the same binary values)."""
    return np.frompyfunc(mpmath.mpf, 1, 1)(np.asarray(array, dtype=float))


def _support(n: int, padded: set[int], causal: bool, padded_queries_outside: bool = False) -> np.ndarray:
    """χ[i, j]: a padded token is no key (and, ``padded_queries_outside``, no query either)."""
    return np.array([[int(j not in padded and (not causal or j <= i) and not (padded_queries_outside and i in padded))
                       for j in range(n)] for i in range(n)])


def _unchecked(kinds: set[str]) -> str:
    return f"; kinds {', '.join(sorted(kinds))} evaluated from their continuous definitions" if kinds else ""


@dataclass(frozen=True)
class EmittedInputs:
    """What the emitted ``forward`` reads besides ``u`` and the parameters, by the scheme's operators."""

    rotary: bool
    memory: np.ndarray | None  # (batch, memory tokens, d)
    memory_mask: np.ndarray  # (batch, memory tokens), True = padded
    sizes: Sizes
    #: The keyword options of the emitted ``forward`` (``n_kv_heads``, constants where declared).
    options: frozenset[str] = frozenset()
    #: The declared constants at the values the check runs (``Constant.check_value``), by name.
    constants: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def default_sizes(forward) -> Sizes:
        """The check's sizes for an emitted ``forward``, before any scheme widens its heads (``emitted_sizes``)."""
        return _EMITTED_GROUPED if "n_kv_heads" in signature(forward).parameters else _EMITTED

    @classmethod
    def of(cls, forward, batch: int, seed: int, scheme: Scheme) -> "EmittedInputs":
        names = signature(forward).parameters
        sizes = emitted_sizes(cls.default_sizes(forward), scheme)
        memory = (np.random.default_rng(seed + 2).standard_normal((batch, _MEMORY_TOKENS, sizes.features))
                  if "memory" in names else None)
        mask = np.zeros((batch, _MEMORY_TOKENS), dtype=bool)
        mask[1, [0, 3]] = True
        constants: dict[str, float] = {}
        for operator in scheme.instantiate().values():
            for constant in operator.constants:  # one name, one value: the first declaration's
                constants.setdefault(constant.name, constant.check_value)
        return cls("positions" in names, memory, mask, sizes, frozenset(names), constants)

    def numpy(self, masked: bool) -> tuple[tuple, dict]:
        """Positional arguments before the parameters, and keyword options."""
        options = {}
        if self.rotary:
            options["positions"] = np.array(_POSITIONS, dtype=float)
        options.update({name: value for name, value in self.torch_block().items() if name in self.options})
        if self.memory is not None and masked:
            options["memory_key_padding_mask"] = self.memory_mask
        return ((self.memory,) if self.memory is not None else ()), options

    def torch_block(self) -> dict:
        grouped = {"n_kv_heads": self.sizes.key_value_heads} if "n_kv_heads" in self.options else {}
        return {**grouped, **self.constants}

    def torch(self, masked: bool) -> tuple[tuple, dict]:
        import torch

        leading, options = self.numpy(masked)
        for name in self.torch_block():  # the Block's, given when built
            options.pop(name, None)
        return (tuple(torch.tensor(value) for value in leading),
                {name: torch.tensor(value) for name, value in options.items()})

    def semantics(self, b: int, masked: bool, tokens: int) -> dict:
        """The same inputs of sequence ``b`` for the evaluator, as 50-digit numbers."""
        inputs = {}
        if self.rotary:
            inputs["positions"] = [mpmath.mpf(p) for p in _POSITIONS[b]]
        inputs["constants"] = {name: mpmath.mpf(value) for name, value in self.constants.items()}
        if self.memory is not None:
            inputs["memory"] = _exact(self.memory[b])
            if masked:
                inputs["memory_support"] = np.array([[int(not padded) for padded in self.memory_mask[b]]] * tokens)
        return inputs


def emitted_check(scheme: Scheme, program: Program, modules: dict | None = None) -> Check:
    batch, eps = 2, 1e-5
    seed = zlib.crc32(f"{scheme.name}/{scheme.activation}".encode())
    modules = modules or emitted_modules(scheme, program)
    numpy_module, torch_module = modules["numpy"], modules.get("torch")
    inputs = EmittedInputs.of(numpy_module.forward, batch, seed, scheme)
    sizes = inputs.sizes
    params = random_parameters(scheme, sizes, seed)
    u = np.random.default_rng(seed + 1).standard_normal((batch, sizes.tokens, sizes.features))
    padding = np.zeros((batch, sizes.tokens), dtype=bool)
    padding[1, [0, 3]] = True  # with the causal mask, query 0 of sequence 1 has empty support
    block = None
    if torch_module is not None:
        import torch

        buckets = {"n_buckets": sizes.buckets} if "n_buckets" in signature(torch_module.Block).parameters else {}
        block = torch_module.Block(sizes.features, sizes.heads, sizes.hidden, eps=eps, dtype=torch.float64,
                                   **inputs.torch_block(), **buckets)
        block.load_params(params)
    errors, unchecked, scale, undefined = {}, set(), 1.0, ""
    with mpmath.workdps(DIGITS):
        exact = {name: _exact(value) for name, value in params.items()}
        for label, mask, causal in (("no mask", None, False), ("padding + causal", padding, True)):
            masked = mask is not None
            expected = []
            for b in range(batch):
                padded = set() if mask is None else set(np.flatnonzero(mask[b]).tolist())
                support = _support(sizes.tokens, padded, causal, scheme.padded_queries_outside)
                semantics = Semantics(scheme, exact, sizes, MPMATH, support=support,
                                      eps=mpmath.mpf(eps), **inputs.semantics(b, masked, sizes.tokens))
                expected.append(np.array(semantics.step(_exact(u[b])).tolist(), dtype=float))
                unchecked |= semantics.unchecked
            expected = np.array(expected)
            scale = max(scale, float(np.abs(expected).max(where=np.isfinite(expected), initial=0.0)))
            leading, options = inputs.numpy(masked)
            got_numpy = numpy_module.forward(u, *leading, params, n_heads=sizes.heads, eps=eps, key_padding_mask=mask,
                                             causal=causal, **options)
            errors[f"numpy, {label}"] = gap(got_numpy, expected)
            undefined = undefined or undefined_note(got_numpy, expected)
            if block is not None:
                leading, options = inputs.torch(masked)
                options = {name: value for name, value in options.items() if name in signature(block.forward).parameters}
                with torch.no_grad():
                    got_torch = block(torch.tensor(u), *leading, causal=causal, **options,
                                      key_padding_mask=None if mask is None else torch.tensor(mask)).numpy()
                errors[f"torch, {label}"] = gap(got_torch, expected)
    worst = max(errors.values())
    extra = ((f", {sizes.key_value_heads} key/value heads" if "n_kv_heads" in inputs.options else "")
             + "".join(f", {name} = {value:g}" for name, value in inputs.constants.items())
             + (f", positions {list(_POSITIONS)}" if inputs.rotary else "")
             + (f", a memory of {_MEMORY_TOKENS} tokens (padded too in the masked case)"
                if inputs.memory is not None else ""))
    return Check(
        f"semantics/{scheme.name}/emitted", scheme.name,
        f"The emitted NumPy and PyTorch modules of {scheme.name} ({_activation(scheme)}float64) compute one step of "
        "the scheme as the independent evaluator defines it (the continuous operators by the rectangle rule, "
        "composed by the scheme's steps, fractions, weights and stages; 50-digit arithmetic): 2 sequences of "
        f"{sizes.tokens} tokens, d = {sizes.features}, {sizes.heads} heads, d_ff = {sizes.hidden}{extra}, ε = 1e-5, "
        "random parameters, without masks and with padding plus causal masks (one query with empty support).",
        "numeric", worst <= TOLERANCE * scale,
        "max |emitted − evaluator|: " + ", ".join(f"{key} {value:.1e}" for key, value in errors.items())
        + f" (tolerance {TOLERANCE:g} × {scale:.2g}){undefined}{_unchecked(unchecked)}"
        + ("" if block is not None else f"; the PyTorch module was not run: {TORCH_MISSING}"),
    )


def _canonical_entry(array: np.ndarray, index: tuple[int, ...], counts: list[int]):
    """The entry of a canonical array at a point of a parameter's grid variables.

    Consecutive variables make up one canonical axis, row-major (``(h, e) → h·d_h + e``,
    ``(g, s, c, r) → ((g·N_s + s)·2 + c)·N_r + r``); they are grouped by the axis lengths.
    """
    if not array.ndim:  # a 0-d control (a learned scalar step): its one entry
        return array[()]
    canonical, flat, product = [], 0, 1
    for position, count in zip(index, counts):
        flat, product = flat * count + position, product * count
        if len(canonical) < array.ndim and product == array.shape[len(canonical)]:
            canonical.append(flat)
            flat, product = 0, 1
    if len(canonical) < array.ndim:
        raise ValueError(f"grid of shape {counts} does not fit the canonical shape {array.shape}")
    canonical[-1] = canonical[-1] * product + flat  # trailing variables of extent 1
    return array[tuple(canonical)]


def _symbolic_inputs(program: Program, inputs: dict, params, counts: dict) -> dict:
    """``inputs`` (state, supports, positions, memory) and every parameter of ``program`` as entry functions."""
    from splitformer.symbolic.domains import VARIABLES

    domains_of = {variable.index: variable.domain for variable in VARIABLES.values()}
    inputs = dict(inputs)
    for tensor in program.parameters():
        extents = [counts[domains_of[index]] for index in tensor.indices]
        inputs[tensor.name] = (lambda *index, array=params[tensor.parameter], extents=extents:
                               _canonical_entry(array, index, extents))
    return inputs


def _vanishes(expr: sp.Expr) -> str | None:
    """How ``expr ≡ 0`` was established, or ``None`` when a random point refutes it (or gives NaN).

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
            if not abs(function(*(mpmath.mpf(generator.uniform(0.1, 1)) for _ in symbols))) <= 1e-20:
                return None  # NaN too: NaN − NaN is no agreement
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


def _symbols(name: str, shape: tuple[int, ...], **assumptions) -> np.ndarray:
    return np.array([sp.Symbol(f"{name}[{','.join(map(str, index))}]", **assumptions) for index in np.ndindex(shape)],
                    dtype=object).reshape(shape)


def _domain_counts(sizes: Sizes, memory_tokens: int) -> dict:
    """The number of grid points of each domain at ``sizes``."""
    return {TOKENS: sizes.tokens, FEATURES: sizes.features, HEADS: sizes.heads, HEAD_FEATURES: sizes.head_features,
            HIDDEN: sizes.hidden, KV_HEADS: sizes.key_value_heads, GROUP: sizes.heads // sizes.key_value_heads,
            PAIR: 2, FREQUENCIES: sizes.head_features // 2, KV_FEATURES: axis_extents(sizes)["d_kv"],
            ATTENTION_FEATURES: axis_extents(sizes)["d_inner"], MEMORY: memory_tokens, BUCKETS: sizes.buckets}


def emitted_work(program: Program, sizes: Sizes) -> int:
    """The work of the emitted check's evaluator, counted: the closures one evaluation of the step at
    ``sizes`` makes (``evaluation_work``; the evaluator computes the same step, operator by operator),
    once per sequence and mask case (4)."""
    table = {domain.size: count for domain, count in _domain_counts(sizes, _MEMORY_TOKENS).items() if domain is not PAIR}
    return 4 * evaluation_work(program, table)


def derived_check(scheme: Scheme, program: Program) -> Check:
    sizes, memory_tokens = _TINY.of(scheme), _TINY_MEMORY_TOKENS
    codes = axis_extents(sizes)
    params = {}
    for key, parameter in scheme_parameters(scheme):
        name = f"{key}.{parameter.name}"
        params[name] = _symbols(name, tuple(codes[domain.code_name] for domain in parameter.shape), real=True)
    u = _symbols("u", (sizes.tokens, sizes.features), real=True)
    support = _support(sizes.tokens, set(), causal=True)
    # rotary attention: symbolic positions and base; cross-attention: a symbolic memory, its last token padded.
    # A table over buckets of distances (T5) is read at integer positions 0 and 3 (a bucket of a symbol is opaque)
    bucketed = any(BUCKETS in (tensor.shape or ()) for tensor in program.parameters())
    positions = np.array([sp.Integer(0), sp.Integer(3)]) if bucketed else _symbols("p", (sizes.tokens,), real=True)
    memory = _symbols("m", (memory_tokens, sizes.features), real=True)
    memory_support = np.array([[int(t < memory_tokens - 1) for t in range(memory_tokens)]] * sizes.tokens)
    spacing = sp.Symbol(r"\Delta x", positive=True)  # must cancel: the derived program has no Δx
    memory_spacing = sp.Symbol(r"\Delta \hat{x}", positive=True)  # and no Δx̂
    semantics = Semantics(scheme, params, replace(sizes, token_spacing=spacing), SYMPY, support=support, eps=EPSILON,
                          positions=positions, constants={constant.name: constant.symbol for constant in program.constants},
                          memory=memory, memory_support=memory_support,
                          memory_spacing=memory_spacing)
    expected = semantics.step(u)
    counts = _domain_counts(sizes, memory_tokens)
    table = {domain.size: count for domain, count in counts.items() if domain is not PAIR}
    opaque = _with_opaque_functions(program)
    inputs = {"u0": lambda i, k: u[i, k], "chi": lambda i, j: support[i, j], POSITIONS: lambda i: positions[i],
              MEMORY_FIELD: lambda t, k: memory[t, k], MEMORY_SUPPORT: lambda i, t: memory_support[i, t]}
    derived = evaluate(opaque, table, _symbolic_inputs(opaque, inputs, params, counts))[opaque.output]
    how = {(i, k): _vanishes(derived[(i, k)] - expected[i, k]) for i in range(sizes.tokens) for k in range(sizes.features)}
    nonzero = [entry for entry, method in how.items() if method is None]
    numeric = [entry for entry, method in how.items() if method == "random points"]
    detail = (f"entries {nonzero} of derived − evaluator do not vanish" if nonzero
              else "every entry of derived − evaluator is 0 after canonicalization (Δx cancelled)" if not numeric
              else f"entries {numeric} of derived − evaluator vanish at 3 random points to 30 digits, the others are 0")
    return Check(
        f"semantics/{scheme.name}/derived", scheme.name,
        f"The derived program of {scheme.name}{_activation(scheme, alone=True)} equals one step of the scheme as the independent "
        "evaluator defines it, exactly: every parameter and input a symbol, 2 tokens, 2 features, 1 head, d_ff = 2, "
        "symbolic ε and token spacing Δx, causal support; symbolic positions and θ (rotary attention; positions 0 "
        "and 3 for a table over buckets of distances), a symbolic "
        f"memory of {memory_tokens} tokens with the last one padded and its spacing Δx̂ symbolic (cross-attention).",
        "symbolic", not nonzero, detail + _unchecked(semantics.unchecked),
    )


def _bounded_derived_check(scheme: Scheme, program: Program) -> Check:
    """``derived_check``, skipped saying so where SymPy does not finish within ``SYMBOLIC_SECONDS`` (``within``: in
    the main thread; elsewhere unbounded)."""
    try:
        return within(SYMBOLIC_SECONDS, lambda: derived_check(scheme, program))
    except OutOfTime:
        return _derived_skipped(scheme, f"SymPy did not finish the symbolic comparison within {SYMBOLIC_SECONDS:g} s "
                                        "(its expressions swell with nested normalizations and softmaxes); the emitted "
                                        "modules are compared with the evaluator numerically")


def _derived_skipped(scheme: Scheme, why: str) -> Check:
    """``semantics/<scheme>/derived`` skipped, saying ``why``."""
    return Check(f"semantics/{scheme.name}/derived", scheme.name,
                 f"The derived program of {scheme.name} equals one step of the scheme as the independent evaluator "
                 "defines it (symbolic comparison at a tiny size).", SKIPPED, True, f"skipped: {why}")


def _activation(scheme: Scheme, alone: bool = False) -> str:
    """The scheme's activation as a check names it, where its operators take one: ``"relu, "`` (or ``" (relu)"``
    ``alone``); else nothing (a label for an activation no operator reads misled a tester)."""
    if not scheme.reads_activation():
        return ""
    return f" ({scheme.activation})" if alone else f"{scheme.activation}, "


def skipped_because(reasons: dict[str, str]) -> str:
    """The detail of a check skipped for the operators ``reasons`` names (``unevaluable``)."""
    return "skipped: the independent evaluator has no semantics for " + "; ".join(
        f"{key} ({reason})" for key, reason in reasons.items())


def _skipped(scheme: Scheme, reasons: dict[str, str], why: str | None = None,
             programs: tuple[str, ...] = ("derived", "emitted")) -> list[Check]:
    why = why or skipped_because(reasons)
    return [Check(f"semantics/{scheme.name}/{what}", scheme.name,
                  f"The {what} program of {scheme.name} equals one step of the scheme as the independent evaluator "
                  "defines it.", SKIPPED, True, why) for what in programs]


def nesting(scheme: Scheme) -> int:
    """The longest chain of operator applications in one step, each applied to the previous one's
    result (a field on a projected state counts two; a Runge–Kutta stage reads the stages its row uses)."""

    def applications(substep) -> int:
        return 1 + (substep.on is not None) + (substep.then is not None) + (substep.combine is not None) + (substep.shift is not None)

    def sequence(steps: Sequence, depth: int) -> int:
        for step in steps.steps:
            if isinstance(step, Parallel):
                depth = max(sequence(branch, depth) for branch in step.branches)
            elif isinstance(step, RungeKutta):
                field = max(map(applications, step.fields))
                slopes = []
                for row in step.tableau.a:
                    stage = max([depth] + [slope for a, slope in zip(row, slopes) if a != 0])
                    slopes.append(stage + field)
                depth = max([depth] + [slope for b, slope in zip(step.tableau.b, slopes) if b != 0])
            else:
                depth += applications(step)
        return depth

    return sequence(scheme.body, 0)


def _stack_check(scheme: Scheme, module) -> Check:
    """The emitted stack against N steps of ``forward`` (combined across layers when the scheme says so), or
    against the evaluator's two states when the scheme has a second one."""
    if scheme.streams:
        return stream_stack_check(scheme, module)
    return stack_check(scheme, module) if scheme.across_layers is None else across_stack_check(scheme, module)


def scheme_checks(scheme: Scheme, program: Program) -> list[Check]:
    """The derived program (symbolically) and the emitted modules (numerically) against the evaluator,
    and the emitted stack against N steps; the first two are skipped, with the reason, for operators
    the evaluator cannot evaluate (inputs such as token positions or a memory)."""
    modules = emitted_modules(scheme, program)
    reasons = unevaluable(scheme)
    if reasons:
        return [*_skipped(scheme, reasons), _stack_check(scheme, modules["numpy"])]
    default = EmittedInputs.default_sizes(modules["numpy"].forward)
    work = emitted_work(program, default.of(scheme))
    if work > MAX_EMITTED_WORK:
        return [*_skipped(scheme, {}, f"not checked: budget: the evaluator's step makes {work} operations, more "
                                      f"than the {MAX_EMITTED_WORK} the semantics checks take on (it grows with the "
                                      "operator evaluations per step); use fewer stages, fields or substeps to have "
                                      "them"), _stack_check(scheme, modules["numpy"])]
    widened = emitted_sizes(default, scheme)
    work = emitted_work(program, widened) if widened != default.of(scheme) else work
    if work > MAX_EMITTED_WORK:  # heads widened for the operators (a wide rotary dimension): the numbers only
        emitted, = _skipped(scheme, {}, f"not checked: budget: with heads of {widened.head_features} features (as "
                                        f"the scheme's operators ask) the evaluator's step makes {work} operations, "
                                        f"more than the {MAX_EMITTED_WORK} the semantics checks take on", ("emitted",))
    else:
        emitted = emitted_check(scheme, program, modules)
    depth = nesting(scheme)
    if depth > MAX_SYMBOLIC_NESTING:
        derived = _derived_skipped(scheme, f"one step nests {depth} operator applications, more than the "
                                           f"{MAX_SYMBOLIC_NESTING} compared symbolically (the cost grows exponentially "
                                           "with the nesting); split the step into more steps (fewer stages or "
                                           "substeps each) to have it; the emitted modules are compared with the "
                                           "evaluator numerically")
    elif emitted.holds:
        derived = _bounded_derived_check(scheme, program)
    else:  # a wrong program makes the symbolic comparison very slow; the numbers already refute it
        derived = _derived_skipped(scheme, "the emitted module already disagrees with the evaluator (the fault may "
                                           "lie in the derivation or in its emission; a wrong program takes very long "
                                           "to compare symbolically)")
    skipped = [] if "torch" in modules else [Check(
        f"semantics/{scheme.name}/emitted-torch", scheme.name,
        f"The emitted PyTorch module of {scheme.name} computes what the NumPy module computes.",
        SKIPPED, True, f"skipped: {TORCH_MISSING}")]
    return [derived, emitted, *skipped, _stack_check(scheme, modules["numpy"])]
