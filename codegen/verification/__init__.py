"""Verification, in one place: what is checked against what.

``splitformer check`` (``runner.py``) compares each claim with a witness that does not share
the code it checks. The modules here hold the runner, the independent evaluator, the checks
of a scheme's own program, and the studies; the symbolic statements about the mathematics
are the modules of ``statements/`` (SymPy only), which the runner calls.

======================================  ==========================================  ==============================================  =================================
check ids                               what is checked                             against (the independent witness)               module
======================================  ==========================================  ==============================================  =================================
``semantics/<scheme>/derived``          the derived program (every parameter a      the evaluator in SymPy arithmetic (token        ``scheme_checks.py``
                                        symbol, 2 tokens, causal support)           spacing Δx symbolic: it must cancel)
``semantics/<scheme>/emitted``          the emitted NumPy and torch modules         the evaluator in 50-digit arithmetic            ``scheme_checks.py``
                                        (float64, several heads, d_ff ≠ d, masks;
                                        RoPE: grouped heads, θ, positions;
                                        cross-attention: a padded memory)
``structure/<scheme>/stack``            ``forward_stack`` of N layers               N calls of ``forward``; control: reversed        ``structure.py``
``structure/attention/*``               the emitted attention field                 its symmetry: permutations, sum over heads,     ``structure.py``
                                                                                    causal and padding supports; each a control
``structure/rotary-attention/*``,       the emitted rotary and cross-attention      shifted positions (differences only); the       ``structure.py``
``structure/cross-attention/*``         fields                                      memory reordered, padded memory tokens; each
                                                                                    with a control
``paper-lie/post-ln-*``                 ``paper-lie`` under ``W̃ = I + W``           the evaluator's ``post-ln`` step (4ε; same ε)   ``paper.py``
``convergence/<scheme>``,               the order (and, above it, the splitting     the slope of the evaluator's flow against RK4   ``convergence.py``
``convergence/<scheme>/splitting``      order) the trees give                       on nonlinear fields; sub-flows by fine RK4
``recovery/<scheme>/*``                 one step of a built-in                      the published block, written by hand            ``statements.recovery``
``order/<scheme>``                      the order a scheme file claims              order conditions on rooted trees coloured by    ``statements.order``
                                                                                    the operator instances (B-series), ``trees``
``adjoint/<scheme>/*``                  the derived adjoint (``vjp``)               central differences in 50 digits; control:     ``statements.adjoint``
                                                                                    one flipped sign
``theorem-3.1/*``, ``layer-norm/*``,    closed forms of the projections,            the Lagrange/KKT system solved by SymPy;        ``statements.projections``,
``projection/*``, ``relu/kkt``,         activations, sign conventions, RoPE, GQA    exact identities                                ``activations``, ``sign``, ``llm``
``activation/*``, ``rope/*``, ``gqa/*``
======================================  ==========================================  ==============================================  =================================

- ``runner.py`` — ``run_checks``: the general checks once, then per scheme every check above;
  ``CheckReport`` formats them (text, JSON, Markdown).
- ``semantics.py`` — the independent evaluator: one step of any scheme, from the model's
  continuous operators discretized by hand (rectangle rule), composed by the scheme's own
  tree; shares no formula code with the derivation or the lowering. Every built-in kind has
  semantics here: attention, rotary attention (pairs turned by ``p(x) θ^{-2r/d_h}``, grouped
  key/value heads), cross-attention (a memory held fixed, its own support and spacing),
  LayerNorm, RMSNorm, feed-forward, gated feed-forward, the paper's affine and ``S₂``
  operators. A plugin's kind whose definitions read inputs it has no semantics for is named
  by ``unevaluable``; its semantics checks are skipped with that reason.
- ``definitions.py`` — user-registered operator kinds, from their continuous definitions.
- ``emitted.py`` — the NumPy and PyTorch modules of a program, generated in memory.
- ``mutation.py`` — ``make mutation``: how many mutants of the pipeline the checks and the
  fast tests kill.
"""
