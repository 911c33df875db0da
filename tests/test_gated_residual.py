"""A residual combiner (``combine = "gate"``, kind ``gru-gate``): the GRU-gated residual of the gated Transformer.

The field of a combined substep is ``c(u, v) = (1 − z) ⊙ (n − u)``, ``v`` the branch output; one explicit step
is ``GRUCell(v, u)``. The scheme derives, emits NumPy and torch equal to a reference written here with
``torch.nn.GRUCell`` (float64, every parameter random); the derived ``vjp`` equals torch autograd on it; the
independent evaluator's checks hold and fail with the plain residual sum in place of the gate.
``from_xtransformers`` maps ``gate_residual`` (Encoder and Decoder, depth 1 and 2; the Decoder also
decoded token by token through its KV cache) to ≤ 1e-10; the reset and update gates swapped are far off.
"""

from dataclasses import replace

import numpy as np
import pytest
import sympy as sp
import torch

import splitformer

from splitformer.adapters import from_xtransformers
from splitformer.codegen.verification.runner import order_check
from splitformer.codegen.verification.scheme_checks import derived_check, emitted_check
from splitformer.codegen.verification.statements.order import splitting_order
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.domains import X, Y
from splitformer.symbolic.equation import equation_text
from splitformer.symbolic.errors import SplitformerError

import x_transformers

SCHEME = """
name = "gated-pre-ln"
summary = "pre-LN fields, each combined with the state by a GRU gate"

[operators]
norm1 = "layer-norm"
attn = "attention"
gate1 = "gru-gate"
norm2 = "layer-norm"
ffn = "feed-forward"
gate2 = "gru-gate"

[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
combine = "gate1"

[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm2"
combine = "gate2"
"""
D, D_FF, HEADS = 8, 12, 2


@pytest.fixture(scope="module")
def derivation():
    return splitformer.derive(parse_scheme(SCHEME))


def _params(module, seed=0):
    rng = np.random.default_rng(seed)
    sizes = {"d": D, "d_ff": D_FF}
    return {name: rng.standard_normal(tuple(sizes[axis] for axis in axes)) * 0.5 + name.endswith("gain")
            for name, axes in module.PARAMETERS.items()}


def _reference(u, p):
    """The block in torch: u ← GRUCell(A(LN u), u), then u ← GRUCell(F(LN u), u)."""
    def norm(x, key):
        return torch.nn.functional.layer_norm(x, (D,), p[f"{key}.gain"], p[f"{key}.bias"], 1e-5)

    def attention(x):
        heads = [(x @ p[f"attn.W_{part}"] + p[f"attn.b_{part}"]).reshape(*x.shape[:-1], HEADS, D // HEADS).transpose(-2, -3)
                 for part in "qkv"]
        mixed = torch.nn.functional.scaled_dot_product_attention(*heads)
        return mixed.transpose(-2, -3).reshape(x.shape) @ p["attn.W_o"] + p["attn.b_o"]

    def gru(key, branch, state):
        weights = {source: torch.cat([p[f"{key}.W_{source}{gate}"] for gate in "rzn"], 1).T for source in "ih"}
        biases = {source: torch.cat([p[f"{key}.b_{source}{gate}"] for gate in "rzn"]) for source in "ih"}
        out = torch._VF.gru_cell(branch.reshape(-1, D), state.reshape(-1, D), weights["i"], weights["h"],
                                 biases["i"], biases["h"])
        return out.reshape(state.shape)

    u = gru("gate1", attention(norm(u, "norm1")), u)
    feed_forward = torch.relu(norm(u, "norm2") @ p["ffn.W_1"] + p["ffn.b_1"]) @ p["ffn.W_2"] + p["ffn.b_2"]
    return gru("gate2", feed_forward, u)


def test_numpy_torch_and_vjp_equal_a_gru_cell_and_autograd(derivation):
    numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
    assert numpy_module.PARAMETERS["gate1.W_ir"] == ("d", "d") and numpy_module.PARAMETERS["gate2.b_hn"] == ("d",)
    p = _params(numpy_module)
    u = np.random.default_rng(1).standard_normal((2, 5, D))
    tensors = {name: torch.tensor(value, requires_grad=True) for name, value in p.items()}
    state = torch.tensor(u, requires_grad=True)
    expected = _reference(state, tensors)
    assert np.abs(numpy_module.forward(u, p, n_heads=HEADS) - expected.detach().numpy()).max() <= 1e-12
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64)
    block.load_params(p)
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - expected.numpy()).max() <= 1e-12
    grad_out = np.random.default_rng(2).standard_normal(u.shape)
    grad_u, grads = numpy_module.vjp(u, p, grad_out, n_heads=HEADS)
    expected.backward(torch.tensor(grad_out))
    assert np.abs(grad_u - state.grad.numpy()).max() <= 1e-10
    for name, tensor in tensors.items():
        assert np.abs(grads[name] - tensor.grad.numpy()).max() <= 1e-10, name


def test_the_independent_evaluator_holds_and_catches_the_plain_residual(derivation):
    scheme, program = parse_scheme(SCHEME), derivation.program
    for check in (derived_check(scheme, program), emitted_check(scheme, program)):
        assert check.holds, (check.id, check.detail)
    # negative control: the first substep adds the attention's output (the plain residual sum)
    i, l = X.index, Y.index
    wrong = {sp.IndexedBase("gate1_out")[i, l]: sp.IndexedBase("attn_out")[i, l]}
    mutated = replace(program, records=[replace(record, update=replace(record.update, rhs=record.update.rhs.xreplace(wrong)))
                                        for record in program.records])
    assert mutated.records != program.records
    assert not emitted_check(scheme, mutated).holds


def test_the_equation_and_the_builder_name_the_combiner():
    scheme = parse_scheme(SCHEME)
    assert equation_text(scheme) == "u_t = gate1(u, attn(Proj[norm1](u))) + gate2(u, ffn(Proj[norm2](u)))"
    built = splitformer.scheme(
        "gated-pre-ln", "pre-LN fields, each combined with the state by a GRU gate",
        operators={"norm1": "layer-norm", "attn": "attention", "gate1": "gru-gate", "norm2": "layer-norm",
                   "ffn": "feed-forward", "gate2": "gru-gate"},
        steps=[splitformer.substep("attn", on="norm1", combine="gate1"),
               splitformer.substep("ffn", on="norm2", combine="gate2")])
    assert built.body == scheme.body


@pytest.mark.parametrize("edit, message", [
    (('combine = "gate1"', 'combine = "norm1"'), "'combine' must name a residual combiner"),
    (('combine = "gate1"', 'combine = "nowhere"'), r"steps\[0\].combine: unknown operator 'nowhere'"),
    (('combine = "gate1"', 'combine = "gate1"\nstep = "scalar"'), "takes no projection solver and no learned 'step'"),
    (('operator = "attn"\nsolver = "explicit"\non = "norm1"\ncombine = "gate1"',
      'operator = "gate1"\nsolver = "explicit"\n\n[[steps]]\noperator = "attn"\nsolver = "explicit"'),
     "'gate1' is a residual combiner"),
])
def test_bad_combiners_are_refused_in_one_line(edit, message):
    with pytest.raises(SplitformerError, match=message):
        parse_scheme(SCHEME.replace(*edit))


def _xtransformers(cls, depth):
    torch.manual_seed(depth)
    module = cls(dim=16, depth=depth, heads=2, attn_dim_head=8, attn_flash=True, gate_residual=True).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return module.eval()


_DERIVED = {}


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("cls", ["Encoder", "Decoder"])
def test_xtransformers_gate_residual_equals_numpy_and_torch(cls, depth):
    source = _xtransformers(getattr(x_transformers, cls), depth)
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    assert 'combine = "gate1"' in adapted.scheme_file
    scheme = parse_scheme(adapted.scheme_file)  # its claims (order 1, splitting order 1) hold
    assert order_check(scheme, splitting_order(scheme)).holds
    derivation = _DERIVED.setdefault(adapted.scheme_file, adapted.derivation())
    forward_stack = derivation.numpy_module().forward_stack
    assert np.abs(forward_stack(u.numpy(), list(adapted.layers), **adapted.forward_kwargs) - expected).max() <= 1e-10
    stack = adapted.build(derivation.torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10
    if cls == "Decoder":  # the gate is token-wise: KV-cached decoding, token by token, equals the full pass
        cache = [{} for _ in adapted.layers]
        steps = [forward_stack(u.numpy()[:, t:t + 1], list(adapted.layers), cache=cache, **adapted.forward_kwargs)
                 for t in range(u.shape[1])]
        assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    # negative control: the reset and update gates' input kernels swapped
    swapped = [dict(layer, **{"gate1.W_ir": layer["gate1.W_iz"], "gate1.W_iz": layer["gate1.W_ir"]})
               for layer in adapted.layers]
    assert np.abs(forward_stack(u.numpy(), swapped, **adapted.forward_kwargs) - expected).max() > 1e-3


def test_xtransformers_gate_residual_refusals_name_what_is_not_read():
    source = x_transformers.Encoder(dim=16, depth=1, heads=2, attn_dim_head=8, gate_residual=True, use_layerscale=True)
    with pytest.raises(SplitformerError, match="gate_residual with use_layerscale or macaron"):
        from_xtransformers(source)
    source = x_transformers.Encoder(dim=16, depth=1, heads=2, attn_dim_head=8, gate_residual=True)
    source.layers[0][2].gru.bias = False  # a cell without biases (no x-transformers flag builds it)
    with pytest.raises(SplitformerError, match="a GRUCell other than GRUCell"):
        from_xtransformers(source)
