r"""Reverse mode over a discrete program: the adjoint (costate) program, derived in SymPy.

Input: a forward ``Program``. Output: an ``Adjoint``, whose records hold the adjoint
assignments in index notation, one record per forward substep, in reverse order.

Training as optimal control: one step is ``u^{n+1} = Φ(u^n, θ^n)``; with the
discrete Hamiltonian ``H^n = ⟨λ^{n+1}, Φ(u^n, θ^n)⟩`` the stationarity conditions of the
Lagrangian are the costate recursion ``λ^n = ∂H^n/∂u^n = (∂Φ/∂u^n)ᵀ λ^{n+1}`` and the
gradients ``∂J/∂θ^n = ∂H^n/∂θ^n``. Inside a step ``Φ`` is the program's chain of
assignments ``y[I] = f(x_1[J_1], …)``, so the same conditions hold assignment by
assignment, read backwards: every array ``x`` read by ``f`` receives

    x̄[J] += Σ_{(I ∪ bound) \ J} ȳ[I] · ∂f/∂x[J]

where ``∂f/∂x[J]`` is SymPy's derivative of the right-hand side with respect to that
entry (through every enclosing ``Sum``: the sum is differentiated as an opaque symbol,
then its body with the summation index left free). Nothing is typed in per operator: the
softmax Jacobian, LayerNorm's and the activations' derivatives all come out of ``diff``.

An array read at a pattern (``I[c, P p + r, P q + s]``, ``u[0, l]``: a window, a point)
sends its adjoint back to that pattern: the adjoint assignment is written at the read's
indices and accumulates over them (``Ī[c, P p + r, P q + s] += …``: the transpose of the
window view), zero where nothing was read. An array written at a pattern (``t[1 + N₂ p + q, l]``)
reads its costate at that pattern.

Two rewrites keep the adjoint as cheap as the forward: a derivative that contains the
right-hand side of a forward assignment is written with that assignment's array
(``χ e^{a}/Σ χ e^{a}`` → ``γ``), and factors that do not depend on a summation index
are taken out of its sum. The derivative of ``max(0, v)`` is SymPy's ``Heaviside(v)``,
used with the subgradient ``0`` at ``v = 0`` (torch's convention), i.e. ``[v > 0]``; with
that value ``H(v) = H(max(0, v))``, so the step is read off the kept output ``s = max(0, w)``.

Only arrays that depend on the state, a decoder's memory or a control carry an adjoint
(``DIFFERENTIABLE_ROLES``, forward activity): masks, token positions and the rotary angles
computed from them are data, read by the adjoint as they are.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import sympy as sp

from .errors import SplitformerError
from .image import KERNEL_OFFSETS
from .latex import equation
from .program import Assignment, Program, Tensor, entry

__all__ = ["Adjoint", "AdjointRecord", "derive_adjoint", "adjoint_name", "is_plain", "RELU_SUBGRADIENT_AT_ZERO",
           "DIFFERENTIABLE_ROLES"]

#: The value taken for ∂max(0, v)/∂v at v = 0 (torch's ``relu`` backward uses 0).
RELU_SUBGRADIENT_AT_ZERO = sp.Integer(0)

#: Arrays whose gradient the adjoint returns: the state entering the step, a decoder's memory
#: (an encoder's output: its gradient trains the encoder) and the controls. Everything else
#: the step reads from outside (masks χ, token positions) is data: no adjoint flows into it,
#: nor into an array computed from data alone (the rotary angles φ).
DIFFERENTIABLE_ROLES = ("input", "memory", "param")


def adjoint_name(name: str) -> str:
    """The adjoint array of ``name`` (``u1`` → ``u1_bar``)."""
    return f"{name}_bar"


@dataclass(frozen=True)
class AdjointRecord:
    """The adjoint assignments of one forward substep."""

    title: str
    assignments: tuple[Assignment, ...]


@dataclass
class Adjoint:
    """The adjoint program of ``forward``: seed ``λ`` of the output, records in reverse order."""

    forward: Program
    tensors: dict[str, Tensor]
    records: list[AdjointRecord]
    seed: str
    #: forward input or parameter name → the name of its gradient array
    gradients: dict[str, str] = field(default_factory=dict)
    #: adjoint array written at a pattern → the forward array whose shape it has
    shapes: dict[str, str] = field(default_factory=dict)

    @property
    def assignments(self) -> list[Assignment]:
        return [assignment for record in self.records for assignment in record.assignments]

    def program(self) -> Program:
        """Forward and adjoint as one program (for evaluation and the lowering)."""
        from .program import Evaluation, SubstepRecord

        records = list(self.forward.records) + [
            SubstepRecord(record.title, "", (Evaluation("adjoint", "adjoint", "", record.assignments),), None)
            for record in self.records
        ]
        return Program(self.forward.name, {**self.forward.tensors, **self.tensors}, records, self.forward.output,
                       list(self.forward.notes), inputs=self.forward.inputs, constants=self.forward.constants)


# -- differentiation --------------------------------------------------------------------

def _outer_sums(expr: sp.Expr) -> list[sp.Sum]:
    sums = list(expr.atoms(sp.Sum))
    return sorted((s for s in sums if not any(o is not s and o != s and o.has(s) for o in sums)),
                  key=sp.default_sort_key)


@functools.lru_cache(maxsize=4096)
def _partials(rhs: sp.Expr) -> tuple[tuple[sp.Indexed, sp.Expr, tuple[sp.Idx, ...]], ...]:
    """``(x[J], ∂rhs/∂x[J], indices bound around x[J])`` for every array entry read by ``rhs``.

    A ``Sum`` is first treated as one symbol ``S``; its body is then differentiated with
    its summation index free and the chain factor ``∂rhs/∂S`` (the sum's limits bind the
    index, so the entry ``x[J]`` is one of the summands). A pure function of ``rhs``,
    remembered: schemes that share a substep differentiate its right-hand sides once.
    """
    found: list[tuple[sp.Indexed, sp.Expr, tuple[sp.Idx, ...]]] = []

    def walk(expr: sp.Expr, seed: sp.Expr, bound: tuple[sp.Idx, ...]) -> None:
        sums = {total: sp.Dummy("S", real=True) for total in _outer_sums(expr)}  # real: |x|' = sign(x)
        flat = expr.xreplace(sums)
        entries = {read_entry: sp.Dummy("x", real=True)
                   for read_entry in sorted(flat.atoms(sp.Indexed), key=sp.default_sort_key)}
        flat = flat.xreplace(entries)
        back = {symbol: original for original, symbol in (*sums.items(), *entries.items())}
        for read_entry, symbol in entries.items():
            found.append((read_entry, seed * _derivative(flat, symbol).xreplace(back), bound))
        for total, symbol in sums.items():
            limits = tuple(limit[0] for limit in total.limits)
            walk(total.function, seed * _derivative(flat, symbol).xreplace(back), bound + limits)

    walk(rhs, sp.Integer(1), ())
    return tuple(found)


def _derivative(expr: sp.Expr, symbol: sp.Symbol) -> sp.Expr:
    """``∂expr/∂symbol``; a step function's (``floor``'s) derivative is 0 wherever it is defined, as torch's autograd
    takes it."""
    derivative = sp.diff(expr, symbol).replace(lambda e: isinstance(e, sp.Derivative) and isinstance(e.expr, sp.floor),
                                               lambda e: sp.Integer(0))
    return derivative.replace(lambda e: isinstance(e, sp.Subs), lambda e: e.doit())  # floor(2x)'s chain rule: Subs(0, …)


def _index_atoms(indices) -> list[sp.Idx]:
    """The summation indices an index pattern uses, in order (``(c, P p + r)`` → ``c, p, r``)."""
    return [atom for index in indices for atom in sorted(sp.sympify(index).atoms(sp.Idx), key=str)]


def is_plain(indices) -> bool:
    """Whether ``indices`` are distinct indices (not a pattern such as ``P p + r`` or ``0``)."""
    return all(isinstance(index, sp.Idx) for index in indices) and len(set(indices)) == len(indices)


def own_indices(indices) -> tuple:
    """The plain indices of an array on its own grid: ``indices`` where plain; an axis written at a pattern
    ``S p + r`` (a transposed convolution's fine points) by its point index ``p``, the one that is no kernel offset.
    A costate lives on the array's grid, plain: a reader that reads the array plainly is renamed onto these, and the
    writer reads the costate at its pattern (renaming onto the pattern itself captured the reader's own kernel offsets:
    ``2 (2 p + r) + r``, two transposed convolutions in a row)."""
    own = []
    for index in indices:
        if isinstance(index, sp.Idx):
            own.append(index)
            continue
        points = [atom for atom in sorted(sp.sympify(index).atoms(sp.Idx), key=str) if str(atom) not in KERNEL_OFFSETS]
        if len(points) != 1:
            raise SplitformerError(f"an array written at {index} has no point index of its own")
        own.append(points[0])
    return tuple(own)


def _is_pattern(indices) -> bool:
    """Integers and expressions of indices, each index used once: a window, a point, a flattening."""
    atoms = _index_atoms(indices)
    return len(set(atoms)) == len(atoms) and all(
        sp.sympify(index).is_Integer or sp.sympify(index).atoms(sp.Idx) for index in indices)


def _with_step_conventions(expr: sp.Expr, written: sp.Expr) -> sp.Expr:
    """Each ``Heaviside(v)`` that differentiation made (``max(0, v)``'s derivative, ½ at 0 in SymPy) →
    ``Heaviside(v, 0)``: torch's subgradient at 0. A step the formula ``written`` holds itself keeps its value at 0
    (a plug-in's ``H(p(x) − p(x̃), 1)`` counts the query's own token). A step's own derivative, ``DiracDelta(v)``, is
    0 wherever it is defined, as torch's autograd of a comparison is."""
    own = written.atoms(sp.Heaviside)
    expr = expr.replace(lambda e: isinstance(e, sp.DiracDelta), lambda e: sp.Integer(0))
    return expr.replace(lambda e: isinstance(e, sp.Heaviside) and e not in own,
                        lambda e: sp.Heaviside(e.args[0], RELU_SUBGRADIENT_AT_ZERO))


# -- recognizing forward arrays ---------------------------------------------------------

def _powers(expr: sp.Expr) -> tuple[sp.Expr, dict[sp.Expr, sp.Expr]]:
    """A product as (numeric coefficient, {base: exponent}); sums of terms in a canonical form.

    A sum ``2α − 2u`` is written ``-2 (u − α)`` (its content taken out, one sign of the two)
    so that SymPy's distribution of numbers over sums does not hide a factor. A power whose
    exponent is not a number is one factor.
    """
    coefficient, powers = sp.Integer(1), {}
    for factor in sp.Mul.make_args(expr):
        if factor.is_number:
            coefficient *= factor
            continue
        base, exponent = (factor.base, factor.exp) if isinstance(factor, sp.Pow) else (factor, sp.Integer(1))
        if not exponent.is_number:  # θ^(−2r/N): one factor, its exponent an expression of indices
            base, exponent = factor, sp.Integer(1)
        if isinstance(base, sp.Add) and exponent.is_integer:
            content, base = base.as_content_primitive()
            if base.could_extract_minus_sign():
                content, base = -content, -base
            coefficient *= content**exponent
        powers[base] = powers.get(base, 0) + exponent
    return coefficient, powers


def _arrays(exprs) -> frozenset[str]:
    """The names of the arrays read by ``exprs`` (renaming indices keeps them)."""
    return frozenset(str(base.label) for expr in exprs for base in expr.atoms(sp.IndexedBase))


def _divides(part: sp.Expr, whole: sp.Expr) -> bool:
    """``whole = part · rest`` keeps the sign of each exponent and does not flip it."""
    return part.is_number and whole.is_number and (part > 0) == (whole > 0) and abs(whole) >= abs(part)


class _Recognizer:
    """Rewrite products that contain a forward right-hand side with that forward array.

    A rule ``y = c Π b^e`` matches a product that contains its numerator (the factors with
    ``e > 0``). Denominator factors the product lacks are compensated (``u − α =
    P √(β + ε)``) only when the numerator holds a compound factor and the missing factors
    hold no sum: a sum is never recomputed to reuse an array.
    """

    def __init__(self, assignments: list[Assignment]):
        self.rules = []
        for assignment in assignments:
            rhs = assignment.rhs
            if isinstance(rhs, (sp.Add, sp.Indexed)) or not rhs.has(sp.Indexed):
                continue
            coefficient, powers = _powers(rhs)
            self.rules.append((assignment.lhs, coefficient, powers, _arrays(b for b, e in powers.items() if e > 0)))
        self.rules.sort(key=lambda rule: -len(rule[2]))
        #: per rule, the indices its factors read
        self.read_indices = [frozenset().union(*(base.atoms(sp.Idx) for base in rule[2])) for rule in self.rules]
        #: (rule number, index mapping) → the rule's factors renamed (the same few are asked for often)
        self.renamed: dict[tuple, dict[sp.Expr, sp.Expr]] = {}

    def __call__(self, expr: sp.Expr) -> sp.Expr:
        if expr.is_Atom or isinstance(expr, sp.Indexed):
            return expr
        if isinstance(expr, sp.Add):
            return self.match(sp.Add(*(self(term) for term in expr.args)))
        if isinstance(expr, sp.Sum):
            return sp.Sum(self(expr.function), *expr.limits)
        if isinstance(expr, sp.Mul):
            expr = sp.Mul(*(self(factor) for factor in expr.args))
        elif isinstance(expr, sp.Pow):
            expr = sp.Pow(self(expr.base), expr.exp)
        else:
            expr = expr.func(*(self(argument) for argument in expr.args))
        return self.match(expr)

    def match(self, expr: sp.Expr) -> sp.Expr:
        changed = True
        while changed:
            changed = False
            coefficient, powers = _powers(expr)
            indices = sorted(expr.atoms(sp.Idx), key=str)
            free = sorted((symbol for symbol in expr.free_symbols if isinstance(symbol, sp.Idx)), key=str)
            present = _arrays([expr])
            for number, (lhs, rule_coefficient, rule, needed) in enumerate(self.rules):
                if not needed <= present:  # a factor of its numerator reads an array the product does not
                    continue
                for mapping in self.mappings(lhs, indices, free, self.read_indices[number]):
                    renamed = self.rename(number, mapping)
                    if not self.applies(renamed, powers):
                        continue
                    for base, exponent in renamed.items():
                        powers[base] = powers.get(base, 0) - exponent
                    target = lhs.xreplace(mapping)
                    powers[target] = powers.get(target, 0) + 1
                    expr = coefficient / rule_coefficient * sp.Mul(*(base**exponent for base, exponent in powers.items()))
                    changed = True
                    break
                if changed:
                    break
        return expr

    def rename(self, number: int, mapping: dict) -> dict[sp.Expr, sp.Expr]:
        key = (number, tuple(mapping.items()))
        if key not in self.renamed:
            self.renamed[key] = {base.xreplace(mapping): exponent for base, exponent in self.rules[number][2].items()}
        return self.renamed[key]

    @staticmethod
    def applies(rule: dict, powers: dict) -> bool:
        numerator = {base: exponent for base, exponent in rule.items() if exponent > 0}
        if not numerator or not all(base in powers and _divides(e, powers[base]) for base, e in numerator.items()):
            return False
        missing = [base for base, e in rule.items() if e < 0 and not (base in powers and _divides(e, powers[base]))]
        if not missing:
            return True
        compound = any(isinstance(base, sp.Add) for base in numerator)
        return compound and not any(base.has(sp.Sum) for base in missing)

    @staticmethod
    def mappings(lhs: sp.Indexed, indices: list[sp.Idx], free: list[sp.Idx], read: frozenset[sp.Idx]):
        """The renamings of ``lhs``'s indices onto the product's: an index the rule's right-hand side reads goes to
        any of the product's (its factors must then be the product's), one it does not (the array is constant
        along it: ``y[i] = Σ_j u[j]``) to a free index of the product only, never to one a sum binds."""
        choices = [[index for index in (indices if own in read else free) if index.upper == own.upper]
                   or ([own] if own in read else []) for own in lhs.indices]
        for targets in itertools.product(*choices):
            if len(set(targets)) == len(targets):
                yield dict(zip(lhs.indices, targets))


# -- sums and names ---------------------------------------------------------------------

def _sum(body: sp.Expr, indices: list[sp.Idx]) -> sp.Expr:
    """``Σ_indices body`` with every factor free of an index taken out of that index's sum."""
    size, inner = sp.Integer(1), []
    for index in indices:
        if body.has(index):
            inner.append(index)
        else:
            size *= index.upper - index.lower + 1
    if not inner:
        return size * body
    constant, dependent = [], []
    for factor in sp.Mul.make_args(body):
        (dependent if any(factor.has(index) for index in inner) else constant).append(factor)
    dependent_body = sp.Mul(*dependent)
    if all(isinstance(factor, sp.Indexed) for factor in dependent) or len(inner) == 1:
        limits = [(index, index.lower, index.upper) for index in inner]
        return size * sp.Mul(*constant) * sp.Sum(dependent_body, *limits)
    first, rest = inner[0], inner[1:]
    return size * sp.Mul(*constant) * _sum(sp.Sum(dependent_body, (first, first.lower, first.upper)), rest)


def _spare(index: sp.Idx, avoid: set[sp.Idx], pool: list[sp.Idx]) -> sp.Idx:
    for candidate in pool:
        if isinstance(candidate, sp.Idx) and candidate.upper == index.upper and candidate not in avoid:
            return candidate
    raise SplitformerError(f"no free index letter over the range of {index} to write an adjoint sum")


def _overline(latex: str) -> str:
    if latex.startswith("u^{"):  # a state u^{(n)}: its costate λ^{(n)}
        return r"\lambda" + latex[1:]
    return rf"\overline{{{latex}}}"


class _Reverse:
    def __init__(self, program: Program):
        self.program = program
        self.recognize = _Recognizer(program.assignments)
        self.pool = sorted({index for tensor in program.tensors.values() for index in tensor.indices}
                           | {index for a in program.assignments for index in a.rhs.atoms(sp.Idx)}, key=str)
        self.tensors: dict[str, Tensor] = {}
        self.pending: dict[str, list[sp.Expr]] = {}
        #: array → {read pattern: adjoint terms written at that pattern}
        self.scattered: dict[str, dict[tuple, list[sp.Expr]]] = {}
        self.shapes: dict[str, str] = {}
        self.alias: dict[str, sp.Indexed] = {}
        self.gradients: dict[str, str] = {}
        seed_tensor = program.tensors[program.output]
        self.seed = adjoint_name(program.output)
        self.declare(program.output, "seed")
        self.alias[program.output] = sp.IndexedBase(self.seed)[seed_tensor.indices]
        # the earliest reader of an input or control completes its gradient
        self.first_reader: dict[str, int] = {}
        self.active = {name for name, tensor in program.tensors.items() if tensor.role in DIFFERENTIABLE_ROLES}
        for position, assignment in enumerate(program.assignments):
            read = {str(item.base.label) for item in assignment.rhs.atoms(sp.Indexed)}
            for name in sorted(read & self.active):
                if program.tensors[name].role in DIFFERENTIABLE_ROLES:
                    self.first_reader.setdefault(name, position)
            if read & self.active:
                self.active.add(assignment.target)

    def declare(self, name: str, role: str) -> str:
        tensor = self.program.tensors[name]
        bar = adjoint_name(name)
        if bar in self.program.tensors:
            raise SplitformerError(f"scheme {self.program.name!r}: the adjoint of {name!r} would be named like the "
                                   f"array {bar!r}; rename an operator")
        if role == "gradient" or tensor.role == "param":
            self.tensors[bar] = Tensor(bar, _overline(tensor.latex), tensor.indices, "gradient",
                                       tensor.parameter, tensor.shape, tensor.kind)
        else:
            self.tensors[bar] = Tensor(bar, _overline(tensor.latex), own_indices(tensor.indices),
                                       "input" if role == "seed" else "temp")
        return bar

    def costate(self, name: str) -> sp.Indexed | None:
        """``ȳ`` of a forward array whose readers are all processed (None if nothing flows into it)."""
        if name in self.alias:
            return self.alias[name]
        tensor = self.program.tensors[name]
        if name in self.scattered:
            bar = self.declare(name, "temp")
            self.emit_scattered(name, bar, f"adjoint of {name}")
            self.alias[name] = entry(bar, own_indices(tensor.indices))
            return self.alias[name]
        terms = self.pending.pop(name, [])
        if not terms:
            return None
        total = sp.Add(*terms)
        own = own_indices(tensor.indices)
        if isinstance(total, sp.Indexed) and total.indices == own:
            self.alias[name] = total
            return total
        bar = self.declare(name, "temp")
        lhs = entry(bar, own)
        self.emitted.append(Assignment(lhs, total, f"adjoint of {name}",
                                       quadrature=equation(lhs, total, self.latex_names())))
        self.alias[name] = lhs
        return lhs

    def latex_names(self) -> dict[str, str]:
        return {name: tensor.latex for name, tensor in {**self.program.tensors, **self.tensors}.items()}

    def emit_scattered(self, name: str, bar: str, meaning: str) -> None:
        """``x̄[pattern] += …``: the adjoint of an array read at a pattern (a window, a point).

        Reads at several patterns, or at a pattern and plainly, give one part each, summed.
        """
        tensor = self.program.tensors[name]
        patterns, plain = self.scattered.pop(name), self.pending.pop(name, [])
        if len(patterns) == 1 and not plain:
            (pattern, terms), = patterns.items()
            self.emit(bar, pattern, terms, meaning, name)
            return
        parts, own = [], own_indices(tensor.indices)
        for number, (pattern, terms) in enumerate(patterns.items(), 1):
            part = f"{bar}{number}"
            self.tensors[part] = Tensor(part, rf"{self.tensors[bar].latex}^{{[{number}]}}", own, "temp")
            self.emit(part, pattern, terms, f"{meaning}: the part read at {', '.join(map(str, pattern))}", name)
            parts.append(entry(part, own))
        lhs = entry(bar, own)
        total = sp.Add(*parts, *plain)
        self.emitted.append(Assignment(lhs, total, meaning, quadrature=equation(lhs, total, self.latex_names())))

    def emit(self, target: str, pattern: tuple, terms: list[sp.Expr], meaning: str, like: str) -> None:
        """``target[pattern] = Σ terms``, an array shaped like the forward array ``like``."""
        lhs = sp.IndexedBase(target)[pattern]
        total = sp.Add(*terms)
        self.shapes[target] = like
        self.emitted.append(Assignment(lhs, total, meaning, quadrature=equation(lhs, total, self.latex_names())))

    def gradient(self, name: str) -> None:
        tensor = self.program.tensors[name]
        bar = self.declare(name, "gradient" if tensor.role == "param" else "temp")
        self.gradients[name] = bar
        if name in self.scattered:
            self.emit_scattered(name, bar, f"gradient with respect to {tensor.parameter or name}")
            return
        terms = self.pending.pop(name, [])
        lhs = entry(bar, tensor.indices)
        total = sp.Add(*terms) if terms else sp.Integer(0)
        self.emitted.append(Assignment(lhs, total, f"gradient with respect to {tensor.parameter or name}",
                                       quadrature=equation(lhs, total, self.latex_names())))

    def step_of_output(self, expr: sp.Expr) -> sp.Expr:
        """``H(w) = H(max(0, w))`` when ``H(0) = 0``: read the step off a kept ReLU output.

        Then the adjoint needs the activation's output only (as torch's ``relu`` backward),
        and the forward may overwrite its input.
        """
        def rewrite(step: sp.Heaviside) -> sp.Expr:
            candidate = self.recognize(sp.Heaviside(sp.Max(0, step.args[0]), RELU_SUBGRADIENT_AT_ZERO))
            return step if candidate.has(sp.Max) else candidate

        return expr.replace(lambda e: isinstance(e, sp.Heaviside), rewrite)

    def contribute(self, assignment: Assignment, costate: sp.Indexed) -> None:
        own = assignment.lhs.indices
        if not is_plain(own):  # written at a pattern: its costate is read there
            costate = costate.base[own]
            own = tuple(_index_atoms(own))
        for read_entry, partial, bound in _partials(assignment.rhs):
            name = str(read_entry.base.label)
            tensor = self.program.tensors[name]
            if name not in self.active:
                continue
            read = read_entry.indices
            plain = is_plain(read)
            if not plain and not _is_pattern(read):
                raise SplitformerError(f"cannot differentiate {assignment.lhs} = {assignment.rhs}: "
                                       f"{read_entry} is not read with distinct indices")
            partial = self.step_of_output(self.recognize(_with_step_conventions(partial, assignment.rhs)))
            if partial == 0:
                continue
            atoms = read if plain else tuple(_index_atoms(read))
            summed = [index for index in dict.fromkeys((*own, *bound)) if index not in atoms]
            body = costate * partial
            # plain: rename the entry's indices to the array's own; a pattern keeps them.
            # The summed indices move out of the way.
            own_grid = own_indices(tensor.indices)
            mapping = dict(zip(read, own_grid)) if plain else {}
            kept = body.atoms(sp.Idx) - set(atoms) - set(summed)
            avoid = (set(own_grid) if plain else set(atoms)) | kept
            for index in summed:
                target = index if index not in avoid else _spare(index, avoid, self.pool)
                mapping[index] = target
                avoid.add(target)
            body = body.xreplace(mapping)
            summed = [mapping[index] for index in summed]
            if plain:
                self.pending.setdefault(name, []).append(_sum(body, summed))
            else:
                self.scattered.setdefault(name, {}).setdefault(tuple(read), []).append(_sum(body, summed))

    def run(self) -> list[AdjointRecord]:
        records = []
        position = len(self.program.assignments)
        for record in reversed(self.program.records):
            self.emitted: list[Assignment] = []
            for assignment in reversed(record.assignments):
                position -= 1
                costate = self.costate(assignment.target)
                if costate is not None:
                    self.contribute(assignment, costate)
                for name, first in self.first_reader.items():
                    if first == position:
                        self.gradient(name)
            records.append(AdjointRecord(f"adjoint of {record.title}", tuple(self.emitted)))
        return records


def derive_adjoint(program: Program) -> Adjoint:
    """The adjoint program of ``program`` (reverse mode over its assignments); of its state alone when it
    also computes a second state's increment (``Program.without_stream``: ``vjp`` is the adjoint of ``forward``'s result)."""
    program = program.without_stream()
    reverse = _Reverse(program)
    records = reverse.run()
    return Adjoint(program, reverse.tensors, records, reverse.seed, reverse.gradients, reverse.shapes)
