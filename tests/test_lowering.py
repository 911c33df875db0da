"""Lowering and the IR passes: what the index-notation assignments become."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

from splitformer.codegen.adjoint import lower_adjoint
from splitformer.codegen.ir import Attention, Contraction, Elementwise, MatMul, Normalize, Reduction, Softmax
from splitformer.codegen.lowering import lower
from splitformer.codegen.passes import DEFAULT, PASSES, fused_attention, inline_elementwise, layer_norm, matmul, select
from splitformer.codegen.printers import broadcast
from splitformer.symbolic import SplitformerError, derive, load_scheme
from splitformer.symbolic.adjoint import derive_adjoint


def _ops(passes=(), scheme="post-ln"):
    return {op.out: op for op in lower(derive(load_scheme(scheme)), passes).ops}


def test_projections_and_scores_become_einsum_contractions_with_bias_and_scale():
    ops = _ops()
    assert isinstance(ops["attn_q"], Contraction) and ops["attn_q"].spec == "bik,kme->bime"
    assert ops["attn_q"].bias.name == "attn_b_q"
    assert ops["attn_a"].spec == "bime,bjme->bmij"
    assert ops["attn_a"].scale == 1 / sp.sqrt(sp.Symbol("N_e", integer=True, positive=True))
    assert ops["attn_out"].spec == "bime,mel->bil"


def test_softmax_kernel_is_recognized_with_its_support():
    op = _ops()["attn_gamma"]
    assert isinstance(op, Softmax)
    assert op.scores.name == "attn_a" and op.support.name == "chi" and op.support.labels == ("b", "i", "j")


def test_layer_norm_lowers_to_two_means_and_elementwise_maps():
    ops = _ops()
    assert isinstance(ops["norm1_alpha"], Reduction) and ops["norm1_alpha"].mean
    assert isinstance(ops["norm1_beta"], Reduction) and ops["norm1_beta"].axis == "k"
    assert {"norm1_p", "norm1_out", "u2"} <= set(ops)


def test_inline_pass_merges_single_use_elementwise_maps():
    module = lower(derive(load_scheme("post-ln")), passes=())
    inlined = {op.out: op for op in inline_elementwise(module).ops}
    assert len(inlined) == len(module.ops) - 4
    assert isinstance(inlined["u2"], Elementwise) and "norm1_p" not in inlined


def test_default_passes_produce_fused_operations():
    ops = _ops(DEFAULT)
    assert isinstance(ops["attn_qkv"], MatMul) and [name for name, _ in ops["attn_qkv"].outputs] == ["attn_q", "attn_k", "attn_v"]
    assert isinstance(ops["attn_o"], Attention) and ops["attn_o"].support.name == "chi"
    assert isinstance(ops["attn_out"], MatMul) and ops["attn_out"].contracted == ("m", "e")
    assert isinstance(ops["u2"], Normalize) and (ops["u2"].gain, ops["u2"].bias) == ("norm1_gain", "norm1_bias")
    assert ops["ffn_s"].reuse == "ffn_w" and ops["u1"].reuse == "attn_out"


@pytest.mark.parametrize("name", PASSES)
def test_each_pass_can_be_switched_off(name):
    without = tuple(p for n, p in PASSES.items() if n != name)
    kinds = {type(op) for op in lower(derive(load_scheme("post-ln")), without).ops}
    expected_missing = {"layer-norm": Normalize, "fused-attention": Attention, "matmul": MatMul}
    if name in expected_missing:
        assert expected_missing[name] not in kinds


def test_pass_selection():
    assert select("all") == DEFAULT and select("none") == ()
    assert select("matmul, layer-norm") == (PASSES["layer-norm"], PASSES["matmul"])
    with pytest.raises(SplitformerError, match="unknown pass 'fast'"):
        select("fast")


def test_symmetric_parallel_shares_kernels_between_its_two_attention_evaluations():
    ops = lower(derive(load_scheme("symmetric-parallel"))).ops
    products = [op for op in ops if isinstance(op, MatMul) and "attn_W_o" in op.weights]
    assert len(products) == 2


def test_broadcast_inserts_new_axes_only_where_needed():
    assert broadcast("g", ("l",), ("b", "i", "l")) == "g"
    assert broadcast("alpha", ("b", "i"), ("b", "i", "l")) == "alpha[:, :, None]"
    assert broadcast("chi", ("b", "i", "j"), ("b", "m", "i", "j")) == "chi[:, None]"


def test_sums_inside_an_elementwise_map_become_temporaries():
    """The general fallback: v[i, l] = u[i, l] · Σ_k u[i, k]² lowers to a reduction and a map."""
    import numpy as np

    from splitformer.codegen.backends import BACKENDS
    from splitformer.symbolic.domains import XI, X, Y
    from splitformer.symbolic.program import Assignment, Program, SubstepRecord, Tensor

    u, v = sp.IndexedBase("u0"), sp.IndexedBase("v")
    i, k, l = X.index, XI.index, Y.index
    rhs = u[i, l] * sp.Sum(u[i, k] ** 2, (k, 0, k.upper))
    tensors = {"u0": Tensor("u0", "u", (i, l), "input"), "v": Tensor("v", "v", (i, l), "state")}
    record = SubstepRecord("test", "", (), Assignment(v[i, l], rhs, "test"))
    module = lower(Program("test", tensors, [record], "v"), passes=DEFAULT)
    kinds = [type(op) for op in module.ops]
    assert kinds == [Reduction, Elementwise]
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    namespace = {"np": np, "u0": x}
    for op in module.ops:
        for line in BACKENDS["numpy"].statements(module, op):
            exec(line, namespace)
    np.testing.assert_allclose(namespace["v"], x * (x**2).sum(-1, keepdims=True), rtol=1e-14)


#: A built-in each pass was written for: a pattern that stopped matching only costs speed, so
#: no parity test would notice it.
_FIRES_ON = {"inline-elementwise": "post-ln", "layer-norm": "post-ln", "rms-norm": "llama", "unroll-pairs": "llama",
             "fused-attention": "gpt2", "gelu": ("post-ln", "gelu"), "gelu-tanh": "gpt2", "silu": "llama", "shared-trig": "llama", "pair-tables": "llama",
             "matmul": "post-ln", "fuse-projections": "llama", "reuse-buffers": "post-ln",
             "local-kernel": str(Path(__file__).parent / "schemes" / "shifted-pre-ln.toml"),
             "one-hot": str(Path(__file__).parent / "schemes" / "t5-pre-ln.toml")}


#: Passes written for a program lowered with its derived adjoint (``lower_adjoint``).
_FIRES_ON_ADJOINT = {"attention-adjoint": "post-ln", "layer-norm-adjoint": "post-ln", "kept-layer-norm": "post-ln",
                     "silu-adjoint": "llama", "gelu-adjoint": "gpt2"}
#: Passes written for a network's programs: the built-in network whose NumPy module changes with them.
_FIRES_ON_NETWORK = {"scratch-outputs": "unet-level", "convolution-adjoint": "cvt"}
#: Passes written for what no built-in has: the test plug-in and its kind whose NumPy module changes with them.
_FIRES_ON_PLUGIN = {"masked-sums": ("support_mean.py", "support-mean")}


@pytest.mark.parametrize("name", PASSES)
def test_every_pass_fires_on_the_builtin_it_was_written_for(name, tmp_path):
    without = tuple(p for p in DEFAULT if p is not PASSES[name])
    if name in _FIRES_ON_PLUGIN:
        from conftest import derived_plugin, plugin_scheme

        plugin, kind = _FIRES_ON_PLUGIN[name]
        import splitformer

        derivation = derived_plugin(tmp_path, plugin, plugin_scheme(f"s-{kind}", mix=kind))
        unpassed = splitformer.derive(str(tmp_path / plugin.replace(".py", ".toml")), passes=without)
        assert derivation.source("numpy") != unpassed.source("numpy")
        return
    if name in _FIRES_ON_NETWORK:
        import splitformer

        network = _FIRES_ON_NETWORK[name]
        assert splitformer.derive(network).source("numpy") != splitformer.derive(network, passes=without).source("numpy")
        return
    if name in _FIRES_ON_ADJOINT:
        adjoint = derive_adjoint(derive(load_scheme(_FIRES_ON_ADJOINT[name])))
        passed, other = lower_adjoint(adjoint, DEFAULT), lower_adjoint(adjoint, without)
        assert (passed.forward.ops, passed.adjoint.ops) != (other.forward.ops, other.adjoint.ops)
        return
    scheme, *activation = (_FIRES_ON[name],) if isinstance(_FIRES_ON[name], str) else _FIRES_ON[name]
    program = derive(load_scheme(scheme).with_activation(*activation) if activation else load_scheme(scheme))
    assert lower(program, DEFAULT) != lower(program, without)


def test_rms_norm_is_fused_in_llama():
    ops = _ops(DEFAULT, "llama")
    fused = [op for op in ops.values() if isinstance(op, Normalize)]
    assert len(fused) == 2 and not any(op.centred for op in fused)


def test_a_kernel_with_a_second_factor_beside_its_support_is_not_a_softmax():
    """Only ``e^a χ / Σ e^a χ`` is the fused softmax: a further factor ``w`` would be dropped by it."""
    from splitformer.codegen.lowering import Lowering

    program = derive(load_scheme("post-ln"))
    lowering = Lowering(program)
    gamma = next(assignment for assignment in program.assignments if assignment.target == "attn_gamma")
    numerator, denominator = sp.fraction(gamma.rhs)
    (dummy, *_), = denominator.limits
    key = next(factor for factor in sp.Mul.make_args(numerator) if isinstance(factor, sp.exp)).args[0].indices[-1]
    weight = sp.IndexedBase("w")
    query = gamma.lhs.indices[-2]
    wider = (numerator * weight[query, key]) / sp.Sum(denominator.function * weight[query, dummy], *denominator.limits)
    labels = lowering.labels(gamma.lhs)
    assert isinstance(lowering.softmax("g", labels, gamma.rhs), Softmax)
    assert lowering.softmax("g", labels, wider) is None


@pytest.mark.parametrize("value, text", [(sp.Rational(1, 3), "1/3"), (sp.Rational(-5, 2), "-5/2"),
                                         (sp.Rational(7, 1), "7"), (sp.pi, "math.pi")])
def test_printed_numbers_are_exact_python_expressions(value, text):
    """A rational prints as ``p/q`` (Python's true division), never truncated to its numerator."""
    from splitformer.codegen.printers import NumpyPrinter, TorchPrinter

    module = lower(derive(load_scheme("post-ln")))
    for printer in (NumpyPrinter(module), TorchPrinter(module)):
        assert printer.doprint(value) == text
        assert eval(text, {"math": __import__("math")}) == float(value)


@pytest.mark.parametrize("power", [2, 3, 4, 5, -3])
def test_numpy_raises_an_array_to_a_small_power_by_multiplying(power):
    """NumPy's ``x**3`` runs ``pow`` per element (about 250 times x·x·x): powers 3 and 4 of an array print as products,
    of a sum parenthesized; the values are the power's (float64, 1e-15 relative)."""
    from splitformer.codegen.printers import NumpyPrinter

    i = sp.Idx("i")
    x, y = sp.IndexedBase("x")[i], sp.IndexedBase("y")[i]
    printer = NumpyPrinter(lower(derive(load_scheme("post-ln"))), ("b", "i"))
    values = {"x": np.linspace(-3, 3, 7), "y": np.linspace(0.5, 2, 7), "np": np}
    for expr in (x**power, (x + 2 * y) ** power, 3 * x**power / y):
        code = printer.doprint(expr)
        assert power not in (3, 4) or "**" not in code, code
        expected = sp.lambdify((sp.Symbol("x"), sp.Symbol("y")), expr.xreplace({x: sp.Symbol("x"), y: sp.Symbol("y")}))
        np.testing.assert_allclose(eval(code, values), expected(values["x"], values["y"]), rtol=1e-15)


# -- what each recognizer refuses (and accepts only by proof) -----------------------------------

def _before(*names, scheme="post-ln"):
    return lower(derive(load_scheme(scheme)), tuple(PASSES[name] for name in names))


def _replaced(module, out, **changes):
    return replace(module, ops=[replace(op, **changes) if op.out == out else op for op in module.ops])


def test_fused_attention_pairs_each_query_head_with_its_own_key_head():
    module = _before("inline-elementwise", "layer-norm")
    [fused] = [op for op in fused_attention(module).ops if isinstance(op, Attention)]
    assert (fused.q.name, fused.k.name, fused.v.name) == ("attn_q", "attn_k", "attn_v")
    # keys and values on another head axis n: scores pair query head m with key head n, not a head's attention
    scores = next(op for op in module.ops if op.out == "attn_a")
    mixing = next(op for op in module.ops if op.out == "attn_o")
    other = ("b", "j", "n", "e")
    module = _replaced(module, "attn_a", operands=(scores.operands[0], replace(scores.operands[1], labels=other)))
    module = _replaced(module, "attn_o", operands=(mixing.operands[0], replace(mixing.operands[1], labels=other)))
    assert not any(isinstance(op, Attention) for op in fused_attention(module).ops)


def test_matmul_binds_only_learned_kernels_as_the_matrix():
    module = _before("inline-elementwise", "layer-norm", "fused-attention")
    assert isinstance({op.out: op for op in matmul(module).ops}["ffn_w"], MatMul)
    # the same product with a per-sequence right-hand array is no GEMM with one shared matrix
    per_sequence = replace(module, tensors={**module.tensors, "ffn_W_1": replace(module.tensors["ffn_W_1"], role="temp")})
    assert isinstance({op.out: op for op in matmul(per_sequence).ops}["ffn_w"], Contraction)


def test_layer_norm_is_recognized_in_any_equal_form_and_only_then():
    module = _before("inline-elementwise")
    derived = next(op for op in module.ops if op.out == "u2").expr
    expanded = _replaced(module, "u2", expr=sp.expand(derived))  # equal, not structurally: needs the simplify
    assert sp.expand(derived) != derived
    [normalize, _] = [op for op in layer_norm(expanded).ops if isinstance(op, Normalize)]
    assert (normalize.out, normalize.gain, normalize.bias) == ("u2", "norm1_gain", "norm1_bias")
    bias = next(atom for atom in derived.atoms(sp.Indexed) if str(atom.base) == "norm1_bias")
    wrong = _replaced(module, "u2", expr=derived + bias)
    assert [op.out for op in layer_norm(wrong).ops if isinstance(op, Normalize)] == ["u4"]  # twice the bias: not LN


def test_a_sum_both_inside_a_sum_and_outside_it_is_taken_out_where_it_stands_outside():
    """Review 25: taking out only outermost sums left ``Σ_n c[i, n]`` raw where it also stood outside the outer sum."""
    from splitformer.codegen.lowering import Lowering

    class Recorder:
        temporaries, section = 0, ""

        def __init__(self):
            self.assigned = []

        def assignment(self, assignment, section):
            self.assigned.append(assignment)

    i, j, n = sp.Idx("i", 5), sp.Idx("j", 5), sp.Idx("n", 5)
    c, a = sp.IndexedBase("c"), sp.IndexedBase("a")
    inner = sp.Sum(c[i, n], (n, 0, 4))
    outer = sp.Sum(a[i, j] / inner, (j, 0, 4))
    for expr in (outer + inner, outer * inner):
        recorder = Recorder()
        rest = Lowering.hoist_sums(recorder, expr, ("b", "i"))
        assert not rest.has(sp.Sum) and sorted(str(assignment.rhs) for assignment in recorder.assigned) == sorted(
            [str(outer), str(inner)])
