"""The derivation: exact agreement with the reference encoder formulas at a symbolic size."""

import pytest
import sympy as sp

from splitformer.symbolic import derive, load_scheme
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.evaluate import evaluate
from splitformer.symbolic.program import TIME_STEP

N, D, FF = 2, 2, 3
EPS = sp.Symbol("eps", positive=True)


def _symbols(program):
    def entry(name):
        return lambda *index: sp.Symbol(f"{name}_{'_'.join(map(str, index))}", real=True)

    inputs = {"u0": entry("u"), "chi": lambda i, j: 1}
    inputs.update({tensor.name: entry(tensor.name) for tensor in program.parameters()})
    return inputs


def _reference_block(inputs, norm_first):
    """The encoder layer written from its published formulas with SymPy matrices."""
    ones = sp.ones(N, 1)
    U = sp.Matrix(N, D, lambda i, k: inputs["u0"](i, k))

    def weight(name):  # canonical (d, d) layout; one head, so the head axis is 0
        if name == "attn_W_o":
            return sp.Matrix(D, D, lambda k, l: inputs[name](0, k, l))
        return sp.Matrix(D, D, lambda k, l: inputs[name](k, 0, l))

    def row(name, width, head=False):
        return ones * sp.Matrix(1, width, lambda _, l: inputs[name](0, l) if head else inputs[name](l))

    def attention(X):
        Q = X * weight("attn_W_q") + row("attn_b_q", D, True)
        K = X * weight("attn_W_k") + row("attn_b_k", D, True)
        V = X * weight("attn_W_v") + row("attn_b_v", D, True)
        S = Q * K.T / sp.sqrt(D)
        P = sp.Matrix(N, N, lambda i, j: sp.exp(S[i, j]) / sum(sp.exp(S[i, n]) for n in range(N)))
        return P * V * weight("attn_W_o") + row("attn_b_o", D)

    def layer_norm(X, name):
        out = sp.zeros(N, D)
        for i in range(N):
            mean = sum(X[i, k] for k in range(D)) / D
            var = sum((X[i, k] - mean) ** 2 for k in range(D)) / D
            for l in range(D):
                out[i, l] = (X[i, l] - mean) / sp.sqrt(var + EPS) * inputs[f"{name}_gain"](l) + inputs[f"{name}_bias"](l)
        return out

    def feed_forward(X):
        W1 = sp.Matrix(D, FF, lambda k, z: inputs["ffn_W_1"](k, z))
        W2 = sp.Matrix(FF, D, lambda z, l: inputs["ffn_W_2"](z, l))
        hidden = (X * W1 + row("ffn_b_1", FF)).applyfunc(lambda x: sp.Max(x, 0, evaluate=False))
        return hidden * W2 + row("ffn_b_2", D)

    if norm_first:
        X = U + attention(layer_norm(U, "norm1"))
        return X + feed_forward(layer_norm(X, "norm2"))
    X = layer_norm(U + attention(U), "norm1")
    return layer_norm(X + feed_forward(X), "norm2")


@pytest.mark.parametrize("name, norm_first", [("post-ln", False), ("pre-ln", True)])
def test_derived_program_equals_the_reference_encoder_exactly(name, norm_first):
    program = derive(load_scheme(name))
    inputs = _symbols(program)
    sizes = {TOKENS.size: N, FEATURES.size: D, HEADS.size: 1, HEAD_FEATURES.size: D, HIDDEN.size: FF}
    values = evaluate(program, sizes, inputs)[program.output]
    reference = _reference_block(inputs, norm_first)
    for (i, l), value in values.items():
        assert sp.expand(value - reference[i, l]) == 0


def test_parallel_relaxation_yields_the_exact_residual_sum():
    program = derive(load_scheme("post-ln"))
    record = next(record for record in program.records if "parallel" in record.title)
    # ½(u + 2Δt F) + ½ u, simplified by the derivation to u + Δt F
    assert record.update.rhs == sp.IndexedBase("u2")[record.update.lhs.indices] + TIME_STEP * sp.IndexedBase("ffn_out")[record.update.lhs.indices]


def test_token_spacing_cancels_and_score_scale_is_one_over_root_head_width():
    program = derive(load_scheme("post-ln"))
    for assignment in program.assignments:
        assert not assignment.rhs.has(TOKENS.spacing)
    scores = next(a for a in program.assignments if a.target == "attn_a")
    assert scores.rhs.has(HEAD_FEATURES.size ** sp.Rational(-1, 2))


def test_every_assignment_carries_provenance_and_latex():
    program = derive(load_scheme("post-ln"))
    for record in program.records:
        assert record.title and record.rule
        for evaluation in record.evaluations:
            for assignment in evaluation.assignments:
                assert assignment.meaning and assignment.continuous and assignment.quadrature


def test_layer_norm_substep_uses_the_derived_projection():
    from splitformer.symbolic.projections import derive_layer_norm_projection
    program = derive(load_scheme("post-ln"))
    projected = next(a for a in program.assignments if a.target == "norm1_p")
    from splitformer.symbolic.projections import SYMBOLS as S

    beta = sp.IndexedBase("norm1_beta")[projected.lhs.indices[0]]
    assert projected.rhs.has((EPS + beta) ** sp.Rational(-1, 2))
    assert derive_layer_norm_projection().formula.has((S.beta + S.epsilon) ** sp.Rational(-1, 2))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_a_bias_free_feed_forward_derives_no_bias(activation):
    """``bias = false``: ``u + act(u W_1) W_2`` exactly, nothing added inside or after the activation."""
    from splitformer.symbolic import parse_scheme

    scheme = parse_scheme('name = "bias-free"\nsummary = "s"\n[operators]\n'
                          f'ffn = {{ kind = "feed-forward", bias = false, activation = "{activation}" }}\n'
                          '[[steps]]\noperator = "ffn"\nsolver = "explicit"\n')
    program = derive(scheme)
    inputs = _symbols(program)
    assert {tensor.name for tensor in program.parameters()} == {"ffn_W_1", "ffn_W_2"}
    values = evaluate(program, {TOKENS.size: N, FEATURES.size: D, HIDDEN.size: FF}, inputs)[program.output]
    act = (lambda x: sp.Max(x, 0)) if activation == "relu" else sp.tanh
    U = sp.Matrix(N, D, lambda i, k: inputs["u0"](i, k))
    hidden = (U * sp.Matrix(D, FF, lambda k, z: inputs["ffn_W_1"](k, z))).applyfunc(act)
    expected = U + hidden * sp.Matrix(FF, D, lambda z, l: inputs["ffn_W_2"](z, l))
    for i in range(N):
        for l in range(D):
            assert sp.simplify(values[(i, l)].subs(TIME_STEP, 1) - expected[i, l]) == 0
