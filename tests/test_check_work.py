"""`splitformer check` within the scheme bounds: its costly parts scale, or stop at a counted budget.

Timings are noisy on shared machines, so the tests count work: the closures a 50-digit
evaluation calls (``evaluation_work``), for the largest scheme the bounds allow.
"""

from __future__ import annotations

import random

import sympy as sp

from splitformer.codegen.verification.statements import SKIPPED
from splitformer.codegen.verification.statements import adjoint as adjoint_statements
from splitformer.symbolic import derive, load_scheme, parse_scheme
from splitformer.symbolic.adjoint import DIFFERENTIABLE_ROLES, derive_adjoint
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.evaluate import evaluate, evaluation_work
from splitformer.symbolic.numeric_expressions import work
from splitformer.symbolic.scheme import MAX_EVALUATIONS
from splitformer.symbolic.tableaux import MAX_STAGES

_SIZES = {TOKENS.size: 3, FEATURES.size: 4, HEADS.size: 1, HEAD_FEATURES.size: 4, HIDDEN.size: 3}


def _dense_tableau(attention: str, feed_forward: str, norm: str):
    """A dense tableau of the most stages, four fields on projected states: the most evaluations a step may make."""
    rows = ", ".join("[" + ", ".join([f'"1/{i + 1}"'] * i) + "]" for i in range(MAX_STAGES))
    weights = ", ".join([f'"1/{MAX_STAGES}"'] * MAX_STAGES)
    fields = ", ".join(f'{{ operator = "{field}", on = "n{k}" }}' for k, field in enumerate(("a1", "f1", "a2", "f2")))
    return parse_scheme(f'name = "dense"\nsummary = "s"\n[tableaux.big]\na = [{rows}]\nb = [{weights}]\n'
                        f'[operators]\nn0 = "{norm}"\nn1 = "{norm}"\nn2 = "{norm}"\nn3 = "{norm}"\n'
                        f'a1 = "{attention}"\na2 = "{attention}"\nf1 = "{feed_forward}"\nf2 = "{feed_forward}"\n'
                        f'[[steps]]\nrk = "big"\nfields = [{fields}]\n')


def test_work_counts_each_closure_and_a_sum_once_per_term():
    x, y = sp.IndexedBase("x"), sp.IndexedBase("y")
    i = sp.Idx("i", (0, 2))
    # Sum: 1 + 3 terms × (Mul 1 + x[i] (1 + i 1) + y[i] (1 + i 1)); exp(eps): 2
    assert work(sp.Sum(x[i] * y[i], (i, 0, 2)) + sp.exp(sp.Symbol("eps"))) == 1 + (1 + 15) + 2


def test_the_largest_scheme_fits_the_finite_difference_budget(monkeypatch):
    scheme = _dense_tableau("attention", "feed-forward", "layer-norm")
    assert scheme.evaluations() == MAX_EVALUATIONS
    largest = adjoint_statements.forward_work(derive(scheme))
    small = adjoint_statements.forward_work(derive(load_scheme("pre-ln")))  # 2 evaluations
    assert 30 * small < largest <= adjoint_statements.MAX_WORK, (small, largest)  # linear in the evaluations
    # the control: above the budget the check is skipped, said so, and no adjoint is derived
    pre_ln = load_scheme("pre-ln")
    monkeypatch.setattr(adjoint_statements, "MAX_WORK", small - 1)
    monkeypatch.setattr(adjoint_statements, "derive_adjoint", lambda program: 1 / 0)
    checks = adjoint_statements.adjoint_checks(pre_ln, derive(pre_ln))
    assert [check.method for check in checks] == [SKIPPED, SKIPPED]
    assert all(f"not checked: budget: one evaluation of the step makes {small} operations" in check.detail
               for check in checks)


def test_the_numeric_evaluation_is_the_symbolic_one_to_40_digits():
    adjoint = derive_adjoint(derive(load_scheme("pre-ln")))
    generator = random.Random(7)
    table: dict = {}

    def value(*key):
        return table.setdefault(key, sp.Float(generator.uniform(-1, 1), 50))

    program = adjoint.program()
    inputs = {name: (lambda *index, name=name: value(name, *index)) for name, tensor in program.tensors.items()
              if tensor.role in DIFFERENTIABLE_ROLES}
    inputs |= {"chi": lambda i, j: int(j <= i), adjoint.seed: lambda *index: value("seed", *index)}
    eps = sp.Float("1e-3", 50)
    exact = evaluate(program, _SIZES, inputs, eps=eps)
    numeric = evaluate(program, _SIZES, inputs, eps=eps, digits=50)
    flipped = evaluate(adjoint_statements.flip_sign(adjoint).program(), _SIZES, inputs, eps=eps, digits=50)
    gradient = adjoint.gradients["u0"]
    gaps = [abs(sp.N(exact[gradient][index] - numeric[gradient][index], 50)) for index in exact[gradient]]
    assert max(gaps) < 1e-40 and evaluation_work(program, _SIZES) > 0
    # the control: one sign flipped inside the adjoint changes the numbers
    assert max(abs(exact[gradient][index] - flipped[gradient][index]) for index in exact[gradient]) > 1e-3
