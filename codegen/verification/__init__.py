"""Verification, in one place: what is checked against what.

- ``semantics.py`` — the independent evaluator: one step of any scheme, from the model's
  continuous operators discretized by hand (rectangle rule), composed by the scheme's own
  tree; shares no formula code with the derivation or the lowering.
- ``definitions.py`` — user-registered operator kinds, from their continuous definitions.
- ``emitted.py`` — the NumPy and PyTorch modules of a program, generated in memory.
- ``scheme_checks.py`` — a scheme's derived program (symbolically, tiny size) and emitted
  modules (float64, realistic size, masks) against the evaluator.
- ``structure.py`` — properties of attention and the block the recovery argument relies on.
- ``paper.py`` — the paper's own scheme against the post-LN block after ``W̃ = I + W``.
- ``convergence.py`` — the empirical order, on the evaluator's flow.
- ``splitformer.symbolic.checks`` — the symbolic statements (Theorem 3.1, KKT, sign,
  activations, published references, the order series); ``codegen.checking`` runs them all.
"""
