"""Deep schemes (many substeps) derive and lower in time linear in their length.

Timings are noisy on shared machines, so the tests count the work that used to grow
quadratically: expression traversals for read sets in the lowering passes, copies of the
table of LaTeX names, and ``simplify`` calls when recognizing LayerNorm.
"""

from __future__ import annotations

import importlib

import sympy as sp

from splitformer.codegen import ir
from splitformer.codegen.lowering import lower
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.derivation import derive

_KINDS = ('{ operator = "attn", solver = "explicit" }', '{ operator = "norm", solver = "projection" }',
          '{ operator = "ffn", solver = "explicit" }')


def _deep(substeps: int):
    steps = ",\n".join(_KINDS[n % 3] for n in range(substeps))
    return parse_scheme(f'name = "deep"\nsummary = "deep"\nsteps = [\n{steps}\n]\n'
                        '[operators]\nattn = "attention"\nnorm = "layer-norm"\nffn = "feed-forward"\n')


def _traversals(substeps: int, monkeypatch) -> int:
    calls = []
    real = ir._indexed_names
    monkeypatch.setattr(ir, "_indexed_names", lambda expr: calls.append(1) or real(expr))
    lower(derive(_deep(substeps)))
    monkeypatch.undo()
    return len(calls)


def test_lowering_traverses_each_expression_a_bounded_number_of_times(monkeypatch):
    short, long = _traversals(12, monkeypatch), _traversals(36, monkeypatch)
    assert long <= 3.3 * short, (short, long)


def test_layer_norm_recognition_needs_no_simplify(monkeypatch):
    calls = []
    layer_norm_pass = importlib.import_module("splitformer.codegen.passes.layer_norm")
    real = sp.simplify
    monkeypatch.setattr(layer_norm_pass.sp, "simplify", lambda expr: calls.append(expr) or real(expr))
    module = lower(derive(_deep(6)))
    assert sum(isinstance(op, ir.Normalize) for op in module.ops) == 2 and calls == []


def test_latex_names_are_a_view_not_a_copy():
    program = derive(_deep(3))
    names = program.latex_names()
    assert not isinstance(names, dict) and names["u1"] == program.tensors["u1"].latex
    assert len(names) == len(program.tensors)
