"""From a scheme to a discrete program: time discretization, then space discretization.

Input: a ``Scheme``. Output: a ``Program`` whose assignments are in index notation.

1. Time: each substep is solved by its rule over its share ``f Δt`` of the step —
   explicit Euler ``u⁺ = u + f Δt A(u)`` for a vector field, the projection ``u⁺ = Proj_S(u)``
   for a normal cone (the cone absorbs ``Δt``). A parallel step runs its branches from one
   state and takes the weighted sum, simplified symbolically; a Runge–Kutta step (a Butcher
   tableau: Heun, rk4, a user's) evaluates the summed field at each stage state
   ``u + Δt Σ_j a_ij k_j`` and takes ``u + Δt Σ_i b_i k_i``.
2. Space: every operator's continuous definitions are discretized by the rectangle rule
   (``quadrature.Grid``); kernels absorb the spacing of the variables they are integrated
   against, the token spacing ``Δx`` cancels in the softmax kernel, and the feature grids
   have unit spacing, which leaves the score scale ``|Ω_e|^{-1/2} Δe = 1/√N_e``.
"""

from __future__ import annotations

from collections import ChainMap, Counter
from collections.abc import Mapping
from dataclasses import replace

import sympy as sp

from .domains import (
    ATTENTION_FEATURES, BUCKETS, FEATURES, FREQUENCIES, GROUP, HEAD_FEATURES, HEADS, HIDDEN, KV_FEATURES, KV_HEADS,
    ETA, PAIR, TOKENS, VARIABLES, X, X_KEY, Y, stores,
)
from .errors import SplitformerError
from .latex import equation, superscripted, to_latex, unicode_text
from .inputs import POSITIONS, Constant, Input
from .operators import BRANCH, STATE, SUPPORT, Definition, Operator, apply
from .program import TIME_STEP, LatexNames, Assignment, Evaluation, Program, SubstepRecord, Tensor, entry
from .quadrature import Grid
from .scheme import Parallel, RungeKutta, Scheme, Sequence, Substep

__all__ = ["derive", "discretize_definitions", "operator_arrays", "UNIT_SPACINGS"]

#: Feature-like grids have unit spacing; the learned kernels absorb any other choice.
UNIT_SPACINGS = {domain.spacing: sp.Integer(1) for domain in (FEATURES, HEAD_FEATURES, HEADS, HIDDEN, KV_HEADS,
                                                                 GROUP, PAIR, FREQUENCIES, KV_FEATURES, ATTENTION_FEATURES, BUCKETS)}


class _Deriver:
    def __init__(self, scheme: Scheme):
        self.scheme = scheme
        self.operators = scheme.instantiate()
        self.tensors: dict[str, Tensor] = {}
        self.records: list[SubstepRecord] = []
        self.evaluations: Counter[str] = Counter()
        self.memo: dict[tuple[str, str, str | None], str] = {}
        self.states = 0
        self.substeps = 0
        self.cached: dict[str, str] = {}
        self.uncached: list[str] = []
        self.memoized: dict[str, str] = {}
        #: The increments of the stream substeps, (discrete, continuous), in order.
        self.stream_terms: list[tuple[sp.Expr, sp.Expr]] = []
        #: Every ``p`` such that some array is named ``p_…`` (a later evaluation must not reuse it).
        self.prefixes: set[str] = set()
        for operator in self.operators.values():
            for parameter in operator.parameters():
                _check_layout(f"{operator.key}.{parameter.name}", parameter, scheme.head_width())
                name = f"{operator.key}_{parameter.name}"
                latex = _keyed(parameter.latex, operator.key_latex())
                indices = tuple(variable.index for variable in parameter.arguments)
                self.declare(Tensor(name, latex, indices, "param",
                                    f"{operator.key}.{parameter.name}", parameter.shape, parameter.kind))
        for key, control in scheme.step_controls().items():
            self.declare(Tensor(f"{key}_{control.name}", _keyed(control.latex, self.operators[key].key_latex()),
                                tuple(variable.index for variable in control.arguments), "param",
                                f"{key}.{control.name}", control.shape, control.kind))
        self.tensors["u0"] = Tensor("u0", "u^{(0)}", (X.index, Y.index), "input")
        if any(operator.uses_support() for operator in self.operators.values()):
            self.tensors[SUPPORT] = Tensor(SUPPORT, r"\chi", (X.index, X_KEY.index), "support")
        #: The inputs and constants the operators declare (each once, in the order first declared).
        self.inputs: dict[str, Input] = {}
        self.constants: dict[str, Constant] = {}
        for operator in self.operators.values():
            self.inputs.update({field.name: field for field in operator.input_fields if operator.reads_input(field.name)})
            self.constants.update({constant.name: constant for constant in operator.constants})
        for field in self.inputs.values():
            self.tensors[field.name] = Tensor(field.name, field.latex, field.indices, field.role)

    # -- names -------------------------------------------------------------------------
    def declare(self, tensor: Tensor) -> None:
        if tensor.name in self.tensors:
            raise SplitformerError(
                f"scheme {self.scheme.name!r}: two arrays would be named {tensor.name!r}; rename an operator")
        self.tensors[tensor.name] = tensor
        self.prefixes.update(tensor.name[:end] for end, letter in enumerate(tensor.name) if letter == "_")

    def new_state(self) -> str:
        self.states += 1
        name = f"u{self.states}"
        self.tensors[name] = Tensor(name, f"u^{{({self.states})}}", (X.index, Y.index), "state")
        return name

    def state(self, name: str) -> sp.Indexed:
        return sp.IndexedBase(name)[X.index, Y.index]

    def stream(self) -> str | None:
        """The record of the second state's increment ``Δd = Σ`` (the stream substeps' increments), after
        the last substep; its name, or ``None`` without stream substeps."""
        if not self.stream_terms:
            return None
        name = "ds"
        self.declare(Tensor(name, r"\Delta d", (X.index, Y.index), "state"))
        discrete = sp.Add(*(term for term, _ in self.stream_terms))
        continuous = sp.Add(*(term for _, term in self.stream_terms))
        update = Assignment(self.state(name), discrete, "increment of the second state (the stream substeps' increments)",
                            quadrature=equation(self.state(name), discrete, self.latex_names()))
        self.records.append(SubstepRecord("second state: the increments of the stream substeps, without projections",
                                          rf"d^{{(1)}} = d^{{(0)}} + \Delta d, \quad \Delta d = {to_latex(continuous)}",
                                          (), update))
        return name

    # -- space -------------------------------------------------------------------------
    def evaluate(self, key: str, argument: str, evaluations: list[Evaluation], branch: str | None = None) -> str:
        """Discretize operator ``key`` applied to the field ``argument`` (a combiner: and the branch
        output ``branch``); returns its output.

        An operator is a function of its arguments: a second evaluation on the same fields
        reuses the first (the parallel block normalizes once for both branches).
        """
        if (key, argument, branch) not in self.memo:
            evaluation, output = self.discretize(key, argument, branch)
            evaluations.append(evaluation)
            self.memo[(key, argument, branch)] = output
        return self.memo[(key, argument, branch)]

    def discretize(self, key: str, argument: str, branch: str | None = None) -> tuple[Evaluation, str]:
        operator: Operator = self.operators[key]
        self.evaluations[key] += 1
        count = self.evaluations[key]
        prefix = key if count == 1 else f"{key}{count}"
        while count > 1 and prefix in self.prefixes:
            prefix += "x"  # a later evaluation must not reuse another operator's names
        definitions = operator.definitions()
        # a kind causal by χ or by steps of its positions keeps its reads of earlier tokens for a cached step
        keeps_keys = self.scheme.causal and (operator.uses_support() or _positions_at_keys(definitions))
        definitions = _with_key_inputs(operator) if keeps_keys else definitions
        arrays, absorbed = operator_arrays(operator, definitions, prefix)
        arrays.update({STATE: sp.IndexedBase(argument), SUPPORT: sp.IndexedBase(SUPPORT),
                       **{name: sp.IndexedBase(name) for name in self.inputs}})
        if branch is not None:
            arrays[BRANCH] = sp.IndexedBase(branch)
        names = ChainMap({}, self.latex_names())
        for definition in definitions:
            suffix = "" if count == 1 else f",{count}"
            names[f"{prefix}_{definition.function}"] = superscripted(definition.latex, operator.key_latex() + suffix)
        assignments = discretize_definitions(operator, definitions, Grid(VARIABLES, arrays, absorbed), names,
                                             UNIT_SPACINGS, (TOKENS.spacing,))
        for assignment in assignments:
            self.declare(Tensor(assignment.target, names[assignment.target], assignment.lhs.indices, "temp"))
        output = str(assignments[-1].lhs.base.label)
        own = key if count == 1 else f"{key}{count}"
        if keeps_keys:
            for function in _key_side(definitions):
                self.cached[f"{prefix}_{function}"] = f"{own}.{function}"
            if (_support_of_keys(definitions) or _reads_token_count(definitions)) and operator.kind not in self.uncached:
                self.uncached.append(operator.kind)
        for function in _memory_side(operator, definitions):
            self.memoized[f"{prefix}_{function}"] = f"{own}.{function}"
        return Evaluation(key, operator.kind, argument, tuple(assignments)), output

    def latex_names(self) -> Mapping[str, str]:
        """The LaTeX name of every array so far, as a live view (no copy per formula)."""
        return LatexNames(self.tensors)

    # -- time --------------------------------------------------------------------------
    def symbol(self, state: str) -> sp.Symbol:
        return sp.Symbol(self.tensors[state].latex)

    def field(self, step: Substep, state: str, evaluations: list[Evaluation]) -> tuple[sp.Expr, sp.Expr]:
        """``A(u)``, ``A(Proj(u))`` with ``on``, ``A(S(·))`` with ``shift``, ``Proj(A(u))`` with ``then``, times the learned step
        ``λ`` where the substep has one, ``c(u, ·)`` of that with ``combine``, at ``state``: (discrete
        value, continuous expression)."""
        argument, continuous = state, self.symbol(state)
        if step.on is not None:
            argument = self.evaluate(step.on, state, evaluations)
            continuous = sp.Function(self.operators[step.on].labelled())(continuous)
        if step.shift is not None:  # a token map of the branch input (token shift)
            argument = self.evaluate(step.shift, argument, evaluations)
            continuous = sp.Function(self.operators[step.shift].labelled())(continuous)
        output = self.evaluate(step.operator, argument, evaluations)
        applied = sp.Function(self.operators[step.operator].labelled())(continuous)
        if step.then is not None:
            output = self.evaluate(step.then, output, evaluations)
            applied = sp.Function(self.operators[step.then].labelled())(applied)
        value = sp.IndexedBase(output)[X.index, Y.index]
        if step.step != "fixed":
            control = self.tensors[f"{step.operator}_step"]
            value = entry(control.name, control.indices) * value
            applied = sp.Mul(sp.Symbol(control.latex), applied, evaluate=False)
        if step.combine is not None:  # the combiner's field c(u, v) of the state and the branch output
            output = self.evaluate(step.combine, state, evaluations, branch=output)
            value = sp.IndexedBase(output)[X.index, Y.index]
            applied = sp.Function(self.operators[step.combine].labelled())(self.symbol(state), applied)
        return value, applied

    def substep(self, step: Substep, state: str, evaluations: list[Evaluation]) -> tuple[sp.Expr, sp.Expr]:
        """The update of one substep as (discrete expression, continuous expression)."""
        value, applied = self.field(step, state, evaluations)
        if step.solver == "projection":
            return value, applied
        fraction = step.fraction * TIME_STEP
        return self.state(state) + fraction * value, self.symbol(state) + fraction * applied

    def sequence(self, sequence: Sequence, state: str, title: str) -> tuple[str, sp.Expr]:
        for step in sequence.steps:
            evaluations: list[Evaluation] = []
            if isinstance(step, Parallel):
                discrete, continuous, label = self.parallel(step, state, evaluations)
            elif isinstance(step, RungeKutta):
                discrete, continuous, label = self.runge_kutta(step, state, evaluations)
            else:
                discrete, continuous = self.substep(step, state, evaluations)
                label = f"{step.operator}, {_solver_label(step)}"
                if step.stream:  # the same increment, added to the second state
                    self.stream_terms.append((sp.expand(discrete - self.state(state)), continuous - self.symbol(state)))
            self.substeps += 1
            target = self.new_state()
            update = Assignment(self.state(target), discrete, f"state after substep {self.substeps}",
                                quadrature=equation(self.state(target), discrete, self.latex_names()))
            rhs = continuous if isinstance(continuous, str) else to_latex(continuous)
            rule = f"{self.tensors[target].latex} = {rhs}"
            self.records.append(SubstepRecord(f"{title}substep {self.substeps}: {label}", rule,
                                              tuple(evaluations), update))
            state = target
        return state, self.symbol(state)

    def parallel(self, step: Parallel, state: str, evaluations: list[Evaluation]) -> tuple[sp.Expr, sp.Expr, str]:
        """The weighted sum of the branches from ``state``.

        Branches of several steps are derived first: each records its own substeps, and an
        operator evaluation they share with a one-substep branch is then computed inside them,
        before any record reads it. The one-substep branches come last, so what they evaluate
        themselves goes to this step's own record, which follows every branch's.
        """
        branches: dict[int, tuple[sp.Expr, sp.Expr, str]] = {}
        single = [len(branch.steps) == 1 and isinstance(branch.steps[0], Substep) for branch in step.branches]
        for position in sorted(range(len(step.branches)), key=lambda position: single[position]):
            branch = step.branches[position]
            if single[position]:
                discrete, continuous = self.substep(branch.steps[0], state, evaluations)
                branches[position] = discrete, continuous, _branch_title(branch.steps[0])
            elif not branch.steps:
                branches[position] = self.state(state), self.symbol(state), "u"
            else:
                final, continuous = self.sequence(branch, state, "branch ")
                branches[position] = self.state(final), continuous, "(sequence)"
        discrete_terms, continuous_terms, title = [], [], ""
        for position, weight in enumerate(step.weights):
            discrete, continuous, label = branches[position]
            discrete_terms.append(weight * discrete)
            continuous_terms.append(sp.Mul(weight, continuous, evaluate=False))
            sign = ("−" if weight < 0 else "") if not title else (" − " if weight < 0 else " + ")
            title += f"{sign}{abs(weight)}·{label}"
        combined = sp.expand(sum(discrete_terms))
        unevaluated = sp.Add(*continuous_terms, evaluate=False)
        simplified = sp.expand(sum(term.doit() for term in continuous_terms))
        return combined, sp.Eq(unevaluated, simplified, evaluate=False), f"parallel: {title}"

    def runge_kutta(self, step: RungeKutta, state: str,
                    evaluations: list[Evaluation]) -> tuple[sp.Expr, str, str]:
        """The tableau's stages for the summed field ``G = Σ f_i A_i``, sharing the controls."""
        method = step.tableau
        k = sp.symbols(f"k_1:{method.stages + 1}")

        def stage(at: str) -> tuple[sp.Expr, sp.Expr]:
            pairs = [self.field(field, at, evaluations) for field in step.fields]
            return (sum(f.fraction * value for f, (value, _) in zip(step.fields, pairs)),
                    sum(f.fraction * applied for f, (_, applied) in zip(step.fields, pairs)))

        values, parts = [], []
        for i, row in enumerate(method.a):
            at = state
            if any(row):
                at = self.new_state()
                discrete = self.state(state) + TIME_STEP * sum(a * value for a, value in zip(row, values))
                assignment = Assignment(self.state(at), discrete, f"stage {i + 1} state",
                                        quadrature=equation(self.state(at), discrete, self.latex_names()))
                evaluations.append(Evaluation(method.name, f"stage {i + 1}", state, (assignment,)))
                increment = self.symbol(state) + TIME_STEP * sp.factor_terms(sum(a * k[j] for j, a in enumerate(row)))
                parts.append(f"{self.tensors[at].latex} = {to_latex(increment)}")
            value, continuous = stage(at)
            values.append(value)
            parts.append(f"k_{i + 1} = {to_latex(continuous)}")
        discrete = sp.expand(self.state(state) + TIME_STEP * sum(b * value for b, value in zip(method.b, values)))
        update = self.symbol(state) + TIME_STEP * sp.factor_terms(sum(b * k[i] for i, b in enumerate(method.b)))
        rule = r",\quad ".join([to_latex(update)] + parts)
        return discrete, rule, f"{method.title} of " + " + ".join(field.operator for field in step.fields)


def operator_arrays(operator: Operator, definitions, prefix: str) -> tuple[dict, dict]:
    """The arrays of an operator's parameters (``key_name``) and of its ``definitions`` (``prefix_f``), and the
    variables each absorbs (its quadrature weights)."""
    arrays, absorbed = {}, {}
    for function, name, absorbs in [*((p.function, f"{operator.key}_{p.name}", p.absorbs) for p in operator.parameters()),
                                    *((d.function, f"{prefix}_{d.function}", d.absorbs) for d in definitions)]:
        arrays[function] = sp.IndexedBase(name)
        absorbed[function] = tuple(variable.symbol for variable in absorbs)
    return arrays, absorbed


def discretize_definitions(operator: Operator, definitions, grid: Grid, names: Mapping[str, str],
                           unit: dict, spacings: tuple, targets: dict | None = None,
                           sizes: dict | None = None) -> tuple[Assignment, ...]:
    """Each of ``definitions`` on ``grid``: the stored array (at ``targets[f]`` when given, e.g. shifted
    points) times the weights it absorbs = the rectangle rule of its right-hand side, the ``unit`` spacings
    set to 1 and the ``sizes`` an operator fixes substituted; ``names`` holds every array's LaTeX name.
    A spacing of ``spacings`` left over is an error: it must cancel."""
    assignments = []
    for definition in definitions:
        own = {variable.symbol for variable in definition.arguments}
        shadowed = sorted({str(limit[0]) for integral in definition.rhs.atoms(sp.Integral) for limit in integral.limits
                           if limit[0] in own})
        if shadowed:  # ∫ u(x, y) dx on (x, y): the discrete sum would reuse the free index (a wrong adjoint)
            raise SplitformerError(f"{operator.key}: {definition.function} integrates over {shadowed[0]}, one of the "
                                   "variables it is defined on; integrate over another variable of the same domain "
                                   "(x̃ or η for the tokens, ξ for the features)")
        target = (targets or {}).get(definition.function, definition.applied())
        weight = grid.absorption(definition.function, target.args)
        lhs = (grid(target) * weight).xreplace(sizes or {})
        if not isinstance(lhs, sp.Indexed):
            raise AssertionError(f"{definition.function}: stored array is {lhs}")
        quadrature = (grid(definition.rhs) * weight).xreplace(sizes or {})
        discrete = quadrature.xreplace(unit)
        left = [spacing for spacing in spacings if discrete.has(spacing) or lhs.has(spacing)]
        if left:
            remedy = ("it declares absorbs=…, but nothing in its formula brings that spacing (a normalizing integral "
                      "over the variable, as the softmax's)" if definition.absorbs else
                      "an integral's rectangle rule brings its variable's spacing, which a stored array must absorb "
                      "(absorbs=(…,) on the Definition or Parameter, e.g. a kernel normalized by an integral over "
                      "that variable)")
            raise SplitformerError(f"{operator.key}: the grid spacing {', '.join(unicode_text(str(s)) for s in left)} "
                                   f"did not cancel in {definition.function}: {remedy}; docs/guide/plugins.md, "
                                   f"'Quadrature weights'")
        assignments.append(Assignment(lhs, discrete, definition.meaning,
                                      continuous=equation(target, definition.rhs, operator.latex_names()),
                                      quadrature=equation(lhs, quadrature, names)))
    return tuple(assignments)


def _branch_title(substep: Substep) -> str:
    """What a one-substep branch of a parallel step computes: ``(u + 2Δt·ffn(Proj[norm2] u))``, ``Proj[norm](u)``."""
    if substep.solver == "projection":
        return f"Proj[{substep.operator}](u)"
    size = abs(substep.fraction)
    step = "Δt" if size == 1 else f"{size}Δt" if size.is_Integer else f"({size})Δt"
    state = f"Proj[{substep.on}] u" if substep.on else "u"
    return f"(u {'−' if substep.fraction < 0 else '+'} {step}·{substep.operator}({state}))"


#: The token variables of keys: a field read at one of them is read of every earlier token in a cached step.
_KEYS = (X_KEY.symbol, ETA.symbol)


def _with_key_inputs(operator: Operator) -> tuple[Definition, ...]:
    """The definitions, where the state or a declared input of a token read at a key's position ``x̃`` or ``η`` (the
    key positions of a score bias, a normalizer's, a mean of the earlier tokens' states) is read through a copy of its
    own (``pos`` → ``pos_k``, ``u`` → ``u_k``): that copy is a key-side field, so the cache keeps it for later tokens.
    (Read at ``η`` through the query's own array, a cached step summed the new tokens' values over every key.)"""
    definitions = operator.definitions()
    copies = []
    fields = [(field.name, field.arguments, field.latex, f"the {field.role} of the keys, kept by the cache")
              for field in operator.input_fields]
    for name, arguments, latex, meaning in [*fields, (STATE, (X, Y), "u", "the state of the keys, kept by the cache")]:
        if X not in arguments:
            continue
        at = arguments.index(X)
        keyed = {applied for definition in definitions for applied in definition.rhs.atoms(sp.core.function.AppliedUndef)
                 if applied.func.__name__ == name and applied.args[at] in _KEYS}
        if not keyed:
            continue
        copy = Definition(f"{name}_k", rf"\tilde{{{latex}}}", arguments, apply(name, *arguments), meaning)
        copies.append(copy)
        renamed = {applied: sp.Function(copy.function)(*applied.args) for applied in keyed}
        definitions = tuple(replace(definition, rhs=definition.rhs.xreplace(renamed)) for definition in definitions)
    return (*copies, *definitions)


def _positions_at_keys(definitions: tuple[Definition, ...]) -> bool:
    """Whether a definition reads the positions at a key's position (``p(x̃)``, ``p(η)``): steps of the positions can
    make the kind causal without χ (a running mean), so a cached step needs the earlier tokens' positions."""
    return any(applied.func.__name__ == POSITIONS.name and applied.args and applied.args[0] in _KEYS
               for definition in definitions for applied in definition.rhs.atoms(sp.core.function.AppliedUndef))


def _reads_token_count(definitions: tuple[Definition, ...]) -> bool:
    """Whether a definition reads the tokens' measure ``|Ω_x|`` other than as an integral's range (a sum over the
    tokens divided by their count): its value at a token changes with the tokens after it, which a cached step
    does not see."""
    measure = X.domain.measure
    for definition in definitions:
        ranges_aside = definition.rhs.replace(lambda node: isinstance(node, sp.Integral),
                                              lambda node: sp.Integral(node.function, *(limit[0] for limit in node.limits)))
        if measure in ranges_aside.free_symbols:
            return True
    return False


def _support_of_keys(definitions: tuple[Definition, ...]) -> bool:
    """Whether a definition reads the support with a key in the query's place, ``χ(x̃, x)`` or ``χ(η, x)``."""
    return any(applied.func.__name__ == SUPPORT and applied.args[0] in _KEYS
               for definition in definitions for applied in definition.rhs.atoms(sp.core.function.AppliedUndef))


def _key_side(definitions: tuple[Definition, ...]) -> list[str]:
    """The operator's own fields of a token ``x`` read at a key's position ``x̃`` or ``η`` (keys and values, their
    normalizer's): what a causal token integral at a new token needs of every earlier token."""
    own = {definition.function: definition.arguments for definition in definitions}
    found = []
    for definition in definitions:
        for applied in sorted(definition.rhs.atoms(sp.core.function.AppliedUndef), key=sp.default_sort_key):
            name = applied.func.__name__
            if name in own and X in own[name] and applied.args[own[name].index(X)] in _KEYS and name not in found:
                found.append(name)
    return found


def _memory_side(operator: Operator, definitions: tuple[Definition, ...]) -> list[str]:
    """The operator's fields computed from a memory input alone (and its parameters): a decoder's keys and
    values of the memory, which do not change while the memory does not (a cache keeps them once per memory)."""
    memory = {field.name for field in operator.input_fields if field.role == "memory"}
    allowed = memory | {parameter.name for parameter in operator.parameters()}
    found: list[str] = []
    for definition in definitions:
        names = {applied.func.__name__ for applied in definition.rhs.atoms(sp.core.function.AppliedUndef)}
        if names & (memory | set(found)) and names <= allowed | set(found):
            found.append(definition.function)
    return found


def _solver_label(step: Substep) -> str:
    on = f" on Proj({step.on})" if step.on else ""
    on += f", shifted by {step.shift}" if step.shift else ""
    then = f", then Proj({step.then})" if step.then else ""
    fraction = "" if step.fraction == 1 else f", fraction {step.fraction}"
    control = "" if step.step == "fixed" else f", learned {step.step} step"
    combine = f", combined by {step.combine}" if step.combine else ""
    return f"{step.solver}{on}{then}{fraction}{control}{combine}"


def _keyed(latex: str, label: str) -> str:
    """``W^{Q}`` → ``W^{Q}_{attn}``; ``W_{1}`` → ``W_{ffn,1}`` (never a double subscript)."""
    return latex.replace("_{", f"_{{{label},", 1) if "_{" in latex else f"{latex}_{{{label}}}"


def _applies_an_operator(deriver: _Deriver, output: str) -> bool:
    """Whether the state ``output`` depends on some operator evaluation (weights of a parallel step,
    ``0`` or opposite on equal branches, can cancel every term)."""
    updates = {str(record.update.lhs.base.label): record.update.rhs for record in deriver.records}
    pending, seen = [output], set()
    while pending:
        name = pending.pop()
        if name in seen or name not in updates:
            continue
        seen.add(name)
        for item in updates[name].atoms(sp.Indexed):
            read = str(item.base.label)
            if deriver.tensors[read].role == "temp":
                return True
            pending.append(read)
    return False


#: The axes a block's parameters may be stored on: those its emitted code sizes (from ``u``, ``n_heads`` and the
#: parameters' own shapes); a token or head-feature axis it does not.
_SIZED = (FEATURES, HIDDEN, HEADS, KV_FEATURES, ATTENTION_FEATURES, BUCKETS)


def _check_layout(name: str, parameter, head_width: int | None) -> None:
    """A parameter's stored axes are ones a block's code sizes; where an attention sets its head width, ``d`` is no
    longer heads × head features (``heads_domain(d_head)`` is)."""
    unsized = [domain.code_name for domain in parameter.shape if domain not in _SIZED]
    if unsized:
        raise SplitformerError(f"{name}: stored on {unsized[0]}, which a block's code does not size; store it on "
                               f"{', '.join(domain.code_name for domain in _SIZED)} (d holds n_heads × d_head)")
    domains = tuple(variable.domain for variable in parameter.arguments)
    if head_width is not None and not stores(parameter.shape, domains, frozenset({FEATURES})):
        raise SplitformerError(f"{name}: stores heads × head features on d, but the scheme sets d_head = {head_width}: "
                               "store them on d_inner (heads_domain(d_head))")


def derive(scheme: Scheme) -> Program:
    """The discrete program of one step of ``scheme``."""
    deriver = _Deriver(scheme)
    output, _ = deriver.sequence(scheme.body, "u0", "")
    if not _applies_an_operator(deriver, output):
        raise SplitformerError(f"scheme {scheme.name!r} applies no operator: the parallel weights cancel every "
                               "operator's term, so its step is the identity")
    notes = [
        r"Feature grids have unit spacing ($\Delta y = \Delta e = \Delta h = \Delta z = 1$); the learned "
        r"kernels absorb the quadrature weights, so the score scale $|\Omega_e|^{-1/2}\Delta e$ becomes $1/\sqrt{N_e}$.",
        r"The token spacing $\Delta x$ cancels between the kernel $\gamma$ and its normalizing integral: "
        r"the discrete kernel is the row-wise softmax.",
        r"The emitted code takes $\Delta t = 1$: the step size is absorbed into the learned controls (docs/model.md §3).",
    ]
    stream = deriver.stream()
    return Program(scheme.module_name, deriver.tensors, deriver.records, output, notes, deriver.cached,
                   tuple(deriver.inputs.values()), tuple(deriver.constants.values()), stream, deriver.memoized,
                   tuple(deriver.uncached))
