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
``semantics/<network>/emitted``         the emitted NumPy vit, cvt, resnet-block    an evaluator of patch and convolution           ``network_semantics.py``
                                        and unet-level (float64)                    windows (padding, strides, transposed), the
                                                                                    class node, BatchNorm; 50 digits; controls:
                                                                                    window transposed or shifted, kernel
                                                                                    flipped, class node last, CvT's keys padded
                                                                                    as its queries, head-width score scale
``structure/<scheme>/stack``            ``forward_stack`` of N layers               N calls of ``forward``; control: reversed        ``structure.py``
``structure/attention/*``               the emitted attention field                 its symmetry: permutations, sum over heads,     ``structure.py``
                                                                                    causal and padding supports; each a control
``structure/rotary-attention/*``,       the emitted rotary and cross-attention      shifted positions (differences only); the       ``structure.py``
``structure/cross-attention/*``         fields                                      memory reordered, padded memory tokens; each
                                                                                    with a control
``causality/<scheme>/block``,           the emitted ``forward``, ``forward_stack``  prefix dependence: tokens after position i      ``causality.py``
``…/stack``, ``…/next-token``           and a decoder's next-token distribution     changed, outputs ≤ i unchanged; control:
                                        (table, positions, tied read-out written    ``causal=False``
                                        in the check)
``causality/<scheme>/cache``            ``forward_stack`` with its cache            decoding = the full causal pass; control: a     ``causality.py``
                                                                                    cache filled from other first tokens
``attention/kernel-rows``,              the emitted attention kernel (read off      the Markov-kernel properties: rows ≥ 0          ``attention_kernel.py``
``attention/convex-hull``,              with one-hot values) and mixing             summing to 1 on the support, outputs within
``attention/constant-rows``                                                         the values' range, constant values fixed;
                                                                                    each with a control
``attention/circuits``                  the emitted attention's QK and OV circuits  the per-head gauge R, R^-T on W^Q, W^K and      ``circuits.py``
                                                                                    S, S^-1 on W^V, W^O leaves A(u) unchanged;
                                                                                    controls: R for R^-T, S for S^-1
``rms-norm/scale-invariance``           the derived RMSNorm                         RMS(c x) = RMS(x) at ε = 0, symbolically;       ``statements.rms_norm_scale``
                                                                                    control: ε = 1/10
``paper-lie/post-ln-*``                 ``paper-lie`` under ``W̃ = I + W``           the evaluator's ``post-ln`` step (4ε; same ε)   ``paper.py``
``convergence/<scheme>``,               the order (and, above it, the splitting     the slope of the evaluator's flow against RK4   ``convergence.py``
``convergence/<scheme>/splitting``      order) the trees give                       on nonlinear fields; sub-flows by fine RK4
``recovery/<scheme>/*``                 one step of a built-in                      the published block, written by hand            ``statements.recovery``
``order/<scheme>``                      the order a scheme file claims              order conditions on rooted trees coloured by    ``statements.order``
                                                                                    the operator instances (B-series), ``trees``
``adjoint/<scheme>/*``                  the derived adjoint (``vjp``)               central differences in 50 digits; control:     ``statements.adjoint``
                                                                                    one flipped sign
``adjoint-test/<name>/dot``,            the emitted ``vjp`` (NumPy, float64) of     Devito's tests: ⟨J v, w⟩ = ⟨v, Jᵀ w⟩, J v by    ``adjoint_tests.py``
``adjoint-test/<name>/taylor``          every scheme and network (``vjp_logits``    differences of the emitted ``forward``;
                                        for vit and cvt)                            Taylor residual slope 2; control: the
                                                                                    gradient + 1 % of its norm along v (slope 1)
``adjoint-test/<scheme>/torch``         the emitted torch ``Block``'s gradients     autograd and the derived backward = the NumPy   ``torch_gradients.py``
                                        (autograd and ``backward="derived"``)       ``vjp``; control: its largest gradient set
                                                                                    to 0
``theorem-3.1/*``, ``layer-norm/*``,    closed forms of the projections,            the Lagrange/KKT system solved by SymPy;        ``statements.projections``,
``projection/*``, ``relu/kkt``,         activations, sign conventions, RoPE, GQA    exact identities                                ``activations``, ``sign``, ``llm``
``activation/*``, ``rope/*``, ``gqa/*``
======================================  ==========================================  ==============================================  =================================

- ``runner.py`` — ``run_checks``: the general checks once, then per scheme every check above;
  ``CheckReport`` formats them (text, JSON, Markdown).
- ``guard.py`` — a group of checks that raises (anything but ``SplitformerError``) is one failed
  check of method ``crashed`` naming the exception and where it was raised, never a traceback.
- ``semantics.py`` — the independent evaluator: one step of any scheme, from the model's
  continuous operators discretized by hand (rectangle rule), composed by the scheme's own
  tree; shares no formula code with the derivation or the lowering. Every built-in kind has
  semantics here: attention, rotary attention (pairs turned by ``p(x) θ^{-2r/d_h}``, grouped
  key/value heads), cross-attention (a memory held fixed, its own support and spacing),
  LayerNorm, RMSNorm, feed-forward, gated feed-forward, the paper's affine and ``S₂``
  operators. A plugin's kind whose definitions read inputs it has no semantics for is named
  by ``unevaluable``; its semantics checks and its convergence study are skipped with that reason.
- ``causality.py``, ``attention_kernel.py`` — the statements of the paper's Lean formalization
  (SauersML/params) that the structural checks did not state: prefix dependence of a block, a
  stack and the next-token distribution; the attention kernel's rows, hull and constant rows.
- ``adjoint_tests.py`` — the dot-product and Taylor tests of an emitted ``vjp`` against its own
  ``forward``; ``network_adjoint_tests.py`` — the same for vit, cvt, resnet-block, unet-level.
- ``circuits.py`` — the QK/OV gauge of attention (Lean ``Circuits.lean``).
- ``network_semantics.py`` — the independent evaluator of the networks' own operators (patch
  embedding, convolutions and their transposes with padding and strides, the class node, CvT's
  convolutional projections); the steps by ``semantics.py``.
- ``definitions.py`` — user-registered operator kinds, from their continuous definitions.
- ``emitted.py`` — the NumPy and PyTorch modules of a program, generated in memory.
"""
