"""Orders of one step on nonlinear fields, by the order conditions on coloured trees (docs/model.md §9).

Every operator *instance* is its own field, a colour of the trees (``ffn_pre`` and
``ffn_post`` of Macaron are two fields, docs/model.md §9); an operator used twice is one
instance (tied parameters: the same key). A field applied to a projected state (``on``) is
the field ``u ↦ A(Proj(u))``, projection included. Projection *substeps* are excluded, for
a stated reason (``PROJECTIONS``): they act as the identity here. One step is a B-series
over rooted trees coloured by the fields (``trees``); comparing with the exact solution of
``u_t = Σ c_k A_k(u)`` tree by tree gives the order ``p`` (every tree of at most ``p``
nodes agrees): ``order`` with the scheme's own substep solvers (explicit Euler,
Runge–Kutta tableaux), ``splitting_order`` with exact sub-flows (a Runge–Kutta step's: the
flow of its fields' sum), and ``tied_splitting_order`` with the instances of one kind and options merged
(what the order would be if they shared their parameters). Trees of up to ``MAX_NODES`` nodes are checked, so
orders up to ``MAX_NODES - 1`` are decided. The conditions checked are reported size by
size. The leading local error is shown on linear fields (the chains of the failing size:
words in non-commuting generators) and, where the step is right on linear fields, by the
elementary differentials of the failing trees (``f''(g, g)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from fractions import Fraction
from math import factorial

import sympy as sp

from splitformer.symbolic.latex import plain_text
from splitformer.symbolic.markdown import inert
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence, Substep
from .series import Series
from .trees import MAX_NODES, MAX_WORK, Forest, Program

__all__ = ["OrderResult", "splitting_order", "generator", "STEP", "PROJECTIONS", "MAX_WORDS"]

STEP = sp.Symbol("h", positive=True)
#: Why projection substeps are not in the series, and so which flow the orders refer to.
PROJECTIONS = ("projection substeps are excluded: Proj_S is the implicit step of the normal cone ∂I_S for "
               "every Δt > 0 (the cone absorbs Δt), so it is not O(h)-close to the identity and has no series "
               "in h; the orders are those of the flow of the vector fields (fields on a projected state, "
               "'on', included as their own generators) with the projection substeps replaced by the identity")
#: The leading error is expanded on linear fields when its words number at most this.
MAX_WORDS = 256


def generator(name: str) -> sp.Symbol:
    """The non-commuting generator of the operator instance (or, tied, the kind) ``name``."""
    return sp.Symbol(name.replace("-", "_"), commutative=False)


@dataclass(frozen=True)
class OrderResult:
    """``order``/``splitting_order`` are ``None`` when no tree up to ``checked_nodes`` nodes
    fails (an exact step, or one of order ``checked_nodes`` or more) or the work bound left them
    undecided; ``splitting_order`` also when the step is not a splitting. ``splitting_note`` says
    which, where ``splitting_order`` is ``None``."""

    order: int | None
    splitting_order: int | None
    leading_error: str
    exact_subflows_error: str
    leading_error_text: str
    leading: sp.Expr
    exact_subflows_leading: sp.Expr
    generators: dict[str, str] | None = None
    tied_splitting_order: int | None = None
    #: The order conditions checked, one line per tree size (own solvers, then exact sub-flows).
    conditions: tuple[str, ...] = ()
    splitting_conditions: tuple[str, ...] = ()
    #: Trees were checked up to this many nodes (fewer than ``MAX_NODES`` when the work bound stopped them).
    checked_nodes: int = MAX_NODES
    #: Node × state updates the analysis made (bounded by ``trees.MAX_WORK``).
    work: int = 0
    #: Some sub-flow's field is no multiple of the whole field, or the multiples do not compose to its flow (else the
    #: exact sub-flows are the equation's own flow).
    is_splitting: bool = True
    #: Why ``splitting_order`` is ``None`` (``""`` where it is a number): not a splitting, exact, or undecided.
    splitting_note: str = ""

    def __str__(self) -> str:
        if self.order is None:
            return f"no local error term up to h^{self.checked_nodes} (order ≥ {self.checked_nodes})"
        splitting = "—" if self.splitting_order is None else self.splitting_order
        return f"order {self.order}, splitting order {splitting}; leading local error {self.leading_error_text}"

    def _repr_markdown_(self) -> str:
        if self.order is None:
            return f"no local error term up to $h^{{{self.checked_nodes}}}$"
        text = f"**order {self.order}** (own substep solvers), leading local error $${self.leading_error}$$"
        if self.splitting_order is not None:
            text += f"\n\n**splitting order {self.splitting_order}** (exact sub-flows), leading term $${self.exact_subflows_error}$$"
        return inert(text, "the orders' view")


def _colours(scheme: Scheme, names: dict[str, str]) -> dict[tuple, str]:
    """The colour of each field ``Substep.field``: its operator's name (``names``: its own, or its kind's where
    instances are tied), with its ``on`` (``@``), ``then`` (``>``), ``combine`` (``&``) and ``shift`` (``~``) where
    that name has fields of several such maps (two tied feed-forwards, one on a norm and one on the raw state, are
    two fields: an order auditor found them merged, s46)."""
    def maps(field: tuple) -> str:
        _, on, then, _, combine, shift = field
        return ((f"@{names[on]}" if on else "") + (f">{names[then]}" if then else "")
                + (f"&{names[combine]}" if combine else "") + (f"~{names[shift]}" if shift else ""))

    fields = {step.field for step in scheme.substeps() if step.solver != "projection"}
    used: dict[str, set] = {}
    for field in fields:
        used.setdefault(names[field[0]], set()).add(maps(field))
    return {field: names[field[0]] + (maps(field) if len(used[names[field[0]]]) > 1 else "") for field in fields}


def _fraction(value) -> Fraction:
    value = sp.Rational(value)
    return Fraction(int(value.p), int(value.q))


class _Builder:
    """Adds the states of one step to a ``Program``; ``exact`` swaps each substep's solver for its exact sub-flow (a
    Runge–Kutta step's: the flow of its summed field), and ``flows`` lists the field of each sub-flow. With ``whole``
    (every field a multiple of it), each field is that multiple of the one generator ``_WHOLE``."""

    def __init__(self, program: Program, colours: dict, exact: bool, whole: dict[str, Fraction] | None = None):
        self.program, self.colours, self.exact, self.whole = program, colours, exact, whole
        self.flows: list[dict[str, Fraction]] = []

    def field(self, steps: tuple[Substep, ...]) -> dict[str, Fraction]:
        total: dict[str, Fraction] = {}
        for step in steps:
            colour = self.colours[step.field]
            total[colour] = total.get(colour, Fraction(0)) + _fraction(step.fraction)
        if self.whole is None:
            return total
        # the ratio to the whole field, read where it has a coefficient (a sum would cancel: G = attn − ffn)
        colour = next((colour for colour, c in self.whole.items() if c), None)
        return {_WHOLE: Fraction(0) if colour is None else total.get(colour, Fraction(0)) / self.whole[colour]}

    def sequence(self, sequence: Sequence, state: int) -> int:
        for step in sequence.steps:
            state = self.step(step, state)
        return state

    def step(self, step, state: int) -> int:
        program = self.program
        if isinstance(step, Parallel):
            ends = [self.sequence(branch, state) for branch in step.branches]
            return program.combine((_fraction(weight), end) for weight, end in zip(step.weights, ends))
        if isinstance(step, RungeKutta):
            of, tableau, slopes = self.field(step.fields), step.tableau, []
            if self.exact:
                return self.flow(state, of)
            for row in tableau.a:
                stage = program.combine([(Fraction(1), state)] + [(_fraction(a), k) for a, k in zip(row, slopes)])
                slopes.append(program.field(stage, of))
            return program.combine([(Fraction(1), state)] + [(_fraction(b), k) for b, k in zip(tableau.b, slopes)])
        if step.solver == "projection":
            return state
        of = self.field((step,))
        if self.exact:
            return self.flow(state, of)
        return program.combine([(Fraction(1), state), (Fraction(1), program.field(state, of))])

    def flow(self, state: int, of: dict[str, Fraction]) -> int:
        self.flows.append(of)
        return self.program.flow(state, of)


def _proportional(field: dict[str, Fraction], whole: dict[str, Fraction]) -> bool:
    """``field`` is a multiple of ``whole`` (fields by colour, zero coefficients ignored)."""
    field = {colour: c for colour, c in field.items() if c}
    whole = {colour: c for colour, c in whole.items() if c}
    if field.keys() != whole.keys():
        return False
    ratios = {field[colour] / whole[colour] for colour in field}
    return len(ratios) <= 1


def _text(label) -> str:
    """A tree as ``colour[children]`` (``•`` for an uncoloured node)."""
    if label and isinstance(label[0], str):
        colour, children = label
    else:
        colour, children = "•", label
    return colour + (f"[{', '.join(map(_text, children))}]" if children else "")


def _symmetry(tree) -> int:
    """``σ(t)``: the automorphisms of a coloured tree."""
    _, children = tree
    result = 1
    for child in set(children):
        result *= factorial(children.count(child)) * _symmetry(child) ** children.count(child)
    return result


def _differential(tree) -> str:
    """The elementary differential ``F(t)``, e.g. ``f''(g, g)``."""
    colour, children = tree
    return colour + "'" * len(children) + (f"({', '.join(map(_differential, children))})" if children else "")


@dataclass
class _Mode:
    """The decision for one variant of the step (own solvers or exact sub-flows)."""

    state: int
    order: int | None = None
    failing: tuple[int, ...] = ()
    lines: list[str] | None = None
    #: The work bound stopped the trees before a condition failed.
    undecided: bool = False

    def __post_init__(self) -> None:
        self.lines = []


#: The one generator of ``_Analysis(…, one_field=True)``: every field of the step as one.
_WHOLE = "G"


class _Analysis:
    def __init__(self, scheme: Scheme, names: dict[str, str], own: bool, one_field: bool = False):
        from splitformer.symbolic.equation import equation_terms

        self.colours = _colours(scheme, names)
        exact_field: dict[str, Fraction] = {}
        for term in equation_terms(scheme):
            if not term.projection:
                colour = self.colours[term.substep.field]
                exact_field[colour] = exact_field.get(colour, Fraction(0)) + _fraction(term.coefficient)
        whole = exact_field if one_field else None  # every sub-flow a multiple of it: the one generator G
        if one_field:
            exact_field = {_WHOLE: Fraction(1 if any(whole.values()) else 0)}
        self.forest = Forest(tuple(sorted(exact_field if one_field else set(self.colours.values()))))
        self.program = program = Program()
        self.exact_field = exact_field
        self.reference = program.flow(0, exact_field)
        self.modes: dict[str, _Mode] = {}
        if own:
            self.modes["order"] = _Mode(_Builder(program, self.colours, False).sequence(scheme.body, 0))
        exact = _Builder(program, self.colours, True, whole)
        split = exact.sequence(scheme.body, 0)
        # a splitting where some sub-flow's field is not a multiple of the equation's, or where the multiples do
        # not compose to its flow (a relaxation ½ φ_{2hG} + ½ u); one field's sub-flows, a Runge–Kutta step of every
        # field or its fractional steps in sequence are the equation's own flow: no splitting
        if one_field or not all(_proportional(flow, exact_field) for flow in exact.flows) or \
                _multiples_order(scheme, names) is not None:
            self.modes["splitting"] = _Mode(split)
        self.checked = 0
        self._decide()

    def _decide(self) -> None:
        program, forest = self.program, self.forest
        if not program.consistent:  # a parallel step whose weights do not sum to 1: wrong at h^0
            for mode in self.modes.values():
                mode.order, mode.lines = 0, ["the weights of a parallel step do not sum to 1: the step is wrong at h^0"]
            return
        for size in range(1, MAX_NODES + 1):
            pending = [mode for mode in self.modes.values() if mode.order is None]
            if not pending:
                return
            if program.work + program.cost(forest.new_nodes(size), size) > MAX_WORK:
                for mode in pending:
                    mode.undecided = True
                    mode.lines.append(f"{size} nodes: not checked ({forest.new_nodes(size)} trees over "
                                      f"{len(forest.colours)} fields × {len(program.operations)} states exceed the "
                                      f"work bound {MAX_WORK}; tie operators or shorten the step to decide it)")
                return
            exact = forest.exact(size)
            roots = forest.add(size)
            program.evaluate(forest.nodes)
            self.checked = size
            values, reference = program.values, program.values[self.reference]
            for mode in pending:
                failing = [root for root in roots if values[mode.state][root] != reference[root]]
                kind = "coloured trees" if exact else "trees, all colourings at once (random weights)"
                line = f"{size} node{'s' * (size > 1)}: {len(roots) - len(failing)} of {len(roots)} {kind} hold"
                if failing:
                    shown = [_text(forest.nodes[root].label) + ("" if not exact else f": {values[mode.state][root]} ≠ "
                                                                  f"{reference[root]}") for root in failing[:3]]
                    line += "; fail " + "; ".join(shown) + (" …" if len(failing) > 3 else "")
                    mode.order, mode.failing = size - 1, tuple(failing)
                mode.lines.append(line)

    def leading(self, mode: _Mode | None) -> tuple[sp.Expr, Series | None]:
        """The leading local error: on linear fields (words), plus the failing non-chain trees."""
        if mode is None or mode.order is None or mode.order == 0:
            return sp.Integer(0), None
        size, forest, program = mode.order + 1, self.forest, self.program
        words = None
        count = len(forest.colours) ** size
        if count <= MAX_WORDS and program.work + program.cost(count * size, size) <= MAX_WORK:
            chains = forest.chains(size)
            program.evaluate(forest.nodes)
            terms = {}
            for chain in chains:
                difference = program.values[mode.state][chain] - program.values[self.reference][chain]
                if difference:
                    word, label = [], forest.nodes[chain].label
                    while True:
                        word.append(generator(label[0]))
                        if not label[1]:
                            break
                        label = label[1][0]
                    terms[tuple(word)] = sp.Rational(difference.numerator, difference.denominator)
            words = Series(terms, size)
        if words is not None and not words.is_zero():
            return words.expression(STEP), words
        nonlinear = sp.Integer(0)  # the step is right on linear fields: the failing trees branch
        for root in mode.failing:
            label = forest.nodes[root].label
            if isinstance(label[0], str) and any(len(node[1]) > 1 for node in _walk(label)):
                difference = program.values[mode.state][root] - program.values[self.reference][root]
                coefficient = sp.Rational(difference.numerator, difference.denominator * _symmetry(label))
                nonlinear += coefficient * STEP**size * sp.Symbol(_differential(label), commutative=False)
        return nonlinear, None

    def field(self) -> Series:
        return Series.field([(sp.Rational(c.numerator, c.denominator), generator(colour))
                             for colour, c in self.exact_field.items()], MAX_NODES)


def _multiples_order(scheme: Scheme, names: dict[str, str]) -> int | None:
    """The order of the exact sub-flows' composition where each is the flow of a multiple of the whole field G: they
    commute, so the step is Σ_i w_i φ_{s_i h G}, decided on the trees of G alone (order p: Σ_i w_i s_i^k = 1 for k ≤ p;
    post-LN's relaxation without its attention, ½ φ_{2hG} + ½ u, has order 1). None where it is G's own flow on every
    tree checked. ``names`` as the caller's analysis colours the fields (tied instances one field)."""
    return _Analysis(scheme, names, own=False, one_field=True).modes["splitting"].order


def _walk(tree):
    yield tree
    for child in tree[1]:
        yield from _walk(child)


def _as_power(leading: sp.Expr, words: Series | None, field: Series) -> sp.Expr:
    """``c (h G)^p`` when the leading term is a power of the summed field ``G`` (Runge–Kutta
    steps of the whole field), else the term with its common factors pulled out."""
    if words is None or words.is_zero() or field.is_zero():
        return sp.factor_terms(leading)
    power = len(next(iter(words.terms)))
    candidate = field.power(power)
    scale = words.coefficient_sum() / candidate.coefficient_sum()
    if scale == 0 or not (words - candidate.scaled(scale)).is_zero():
        return sp.factor_terms(leading)
    return sp.Mul(scale, sp.Pow(sp.Mul(STEP, field.part(1).expression(), evaluate=False), power, evaluate=False),
                  evaluate=False)


#: Characters of a generator's name (a key, its colour's ``@on``, ``>then``, ``&combine``, ``~shift``) that LaTeX reads.
_LATEX_CHARACTERS = {"_": r"\_", "&": r"\&", "%": r"\%", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
                     "~": r"\sim ", ">": r"\triangleright ", "^": r"\hat{}", "\\": r"\backslash "}


def _roman(name: str) -> str:
    """A generator's name as one upright group (``ffn_pre`` → ``\\mathrm{ffn\\_pre}``): italic letters would read as a
    product, and a power binds to the whole name."""
    return r"\mathrm{" + "".join(_LATEX_CHARACTERS.get(character, character) for character in name) + "}"


def latex(expr: sp.Expr) -> str:
    """``expr`` as LaTeX, its generators (non-commutative symbols) upright."""
    return sp.latex(expr, symbol_names={symbol: _roman(symbol.name) for symbol in expr.free_symbols
                                        if not symbol.is_commutative})


def _shown(leading: sp.Expr, mode: _Mode | None, analysis: _Analysis, printer) -> str:
    """The leading term as ``printer`` writes it, or why it is not written out."""
    if leading != 0 or mode is None or not mode.order:
        return printer(leading)
    words = len(analysis.forest.colours) ** (mode.order + 1)
    text = (f"not expanded: {words} words of length {mode.order + 1} in {len(analysis.forest.colours)} fields "
            f"(at most {MAX_WORDS}, within the work bound); the failing trees are listed with the conditions")
    return rf"\text{{{text}}}" if printer is latex else text


def _tied_generators(scheme: Scheme) -> dict[str, str]:
    """Each operator instance's field when instances share their parameters: one per kind and options. Two
    feed-forwards with other activations (or a plug-in kind with other options) stay two fields, as tied weights
    leave them two maps (a tester's Macaron of GELU and tanh halves was given tied order 2; it is 1)."""
    operators, fields, named = scheme.instantiate(), [], {}
    for key, kind in scheme.operators.items():
        operator = operators[key]
        options = (type(operator), {item.name: getattr(operator, item.name) for item in dataclass_fields(operator)
                                    if item.name != "key"})
        if options not in fields:
            fields.append(options)
        index = fields.index(options)
        same_kind = [other for other in fields[:index] if other[0] is type(operator)]
        named[key] = kind if not same_kind else f"{kind}-{len(same_kind) + 1}"
    return named


def splitting_order(scheme: Scheme) -> OrderResult:
    """Orders, leading local-error terms and the order conditions of one step of ``scheme``."""
    analysis = _Analysis(scheme, {key: key for key in scheme.operators}, own=True)
    own, split = analysis.modes["order"], analysis.modes.get("splitting")
    leading, words = analysis.leading(own)
    split_leading, _ = analysis.leading(split)
    by_kind = _tied_generators(scheme)
    tied = split.order if split is not None else None
    work = analysis.program.work
    if len(set(by_kind.values())) < len(by_kind):
        merged = _Analysis(scheme, by_kind, own=False)
        tied, work = (merged.modes["splitting"].order if "splitting" in merged.modes else None), work + merged.program.work
    shown = _as_power(leading, words, analysis.field())
    return OrderResult(
        order=own.order,
        splitting_order=None if split is None else split.order,
        leading_error=_shown(shown, own, analysis, latex),
        exact_subflows_error=(_shown(sp.factor_terms(split_leading), split, analysis, latex) if split is not None
                              else r"\text{not a splitting}"),
        leading_error_text=_shown(shown, own, analysis, plain_text),
        leading=leading,
        exact_subflows_leading=split_leading,
        generators=_generators(scheme, analysis.colours),
        tied_splitting_order=tied,
        conditions=tuple(own.lines),
        splitting_conditions=tuple(split.lines) if split is not None else (),
        checked_nodes=analysis.checked,
        work=work,
        is_splitting=split is not None,
        splitting_note=_splitting_note(analysis, split),
    )


def _generators(scheme: Scheme, colours: dict[tuple, str]) -> dict[str, str]:
    """Each generator (colour) of the trees and the field it stands for: an operator's kind and name, with the
    projection it reads, the map after it, its combiner and its token shift (one operator read on two projections is
    two generators, ``attn`` and ``attn@norm1``)."""
    named: dict[str, str] = {}
    for step in scheme.substeps():  # in the step's order
        if step.solver != "projection":
            operator, on, then, _, combine, shift = step.field
            named.setdefault(colours[step.field], f"{scheme.operators[operator]} {operator}" + (
                f" on Proj({on})" if on else "") + (f" then {then}" if then else "") + (
                f" combined by {combine}" if combine else "") + (f" shifted by {shift}" if shift else ""))
    return named


def _splitting_note(analysis: _Analysis, split: _Mode | None) -> str:
    """Why the splitting order is no number (``""`` where it is one)."""
    if split is None:
        return "not a splitting: every sub-flow is a multiple of the whole field, and together they are its flow"
    if split.order is not None:
        return ""
    if split.undecided:
        return f"undecided: the work bound stopped the trees at {analysis.checked} nodes"
    return f"exact: no order condition fails on trees of up to {analysis.checked} nodes"
