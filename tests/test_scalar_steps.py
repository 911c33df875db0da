"""A learned scalar time step (``step = "scalar"``: ReZero, one number per field, a 0-d control).

The scheme derives, emits NumPy and torch equal to ReZero written here in torch (``u + α F(u)``,
Bachlechner et al. 2020; float64, every parameter random); the derived ``vjp`` (and the torch Block's
derived backward) returns the 0-d gradients torch's autograd computes on that reference; the independent evaluator's checks hold and
fail with the learned step dropped. x-transformers 2.31 has no ReZero flag (``use_rezero`` is gone):
its ``use_layerscale`` with every γ of a LayerScale set to one number is ReZero on a pre-norm
block, and equals the scalar-step scheme.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

import splitformer

from splitformer.adapters import from_xtransformers
from splitformer.codegen.verification.scheme_checks import derived_check, emitted_check
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.equation import equation_text
from splitformer.symbolic.program import Number

import x_transformers

SCHEME = """
name = "rezero"
summary = "ReZero: every field scaled by one learned number, no norms"

[operators]
attn = "attention"
ffn = "feed-forward"

[[steps]]
operator = "attn"
solver = "explicit"
step = "scalar"

[[steps]]
operator = "ffn"
solver = "explicit"
step = "scalar"
"""
D, D_FF, HEADS = 8, 12, 2


@pytest.fixture(scope="module")
def derivation():
    return splitformer.derive(parse_scheme(SCHEME))


def _params(module, seed=0):
    rng = np.random.default_rng(seed)
    sizes = {"d": D, "d_ff": D_FF}
    return {name: np.asarray(rng.standard_normal(tuple(sizes[axis] for axis in axes)) * 0.5)
            for name, axes in module.PARAMETERS.items()}


def _rezero(u, p):
    """ReZero written in torch: u + α_A A(u), then + α_F F(u) (α one number each)."""
    def attention(x):
        heads = [(x @ p[f"attn.W_{part}"] + p[f"attn.b_{part}"]).reshape(*x.shape[:-1], HEADS, D // HEADS).transpose(-2, -3)
                 for part in "qkv"]
        weights = torch.softmax(heads[0] @ heads[1].transpose(-1, -2) / (D // HEADS) ** 0.5, dim=-1)
        return (weights @ heads[2]).transpose(-2, -3).reshape(x.shape) @ p["attn.W_o"] + p["attn.b_o"]

    u = u + p["attn.step"] * attention(u)
    return u + p["ffn.step"] * (torch.relu(u @ p["ffn.W_1"] + p["ffn.b_1"]) @ p["ffn.W_2"] + p["ffn.b_2"])


def test_numpy_torch_and_the_derived_vjp_equal_rezero_and_autograd(derivation):
    numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
    assert numpy_module.PARAMETERS["attn.step"] == () and numpy_module.PARAMETERS["ffn.step"] == ()
    p = _params(numpy_module)
    u = np.random.default_rng(1).standard_normal((2, 5, D))
    tensors = {name: torch.tensor(value, requires_grad=True) for name, value in p.items()}
    state = torch.tensor(u, requires_grad=True)
    expected = _rezero(state, tensors)
    assert np.abs(numpy_module.forward(u, p, n_heads=HEADS) - expected.detach().numpy()).max() <= 1e-12
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64)
    block.load_params(p)
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - expected.numpy()).max() <= 1e-12
    fresh = torch_module.Block(D, HEADS, D_FF, bias=False)  # a learned 0-d step: kept, zero at the start
    assert fresh.attn.step.shape == () and float(fresh.attn.step.detach()) == 0.0
    # the derived adjoint against torch autograd: every gradient, the 0-d ones included
    grad_out = np.random.default_rng(2).standard_normal(u.shape)
    grad_u, grads = numpy_module.vjp(u, p, grad_out, n_heads=HEADS)
    expected.backward(torch.tensor(grad_out))
    assert np.shape(grads["attn.step"]) == () and abs(float(tensors["attn.step"].grad)) > 1
    assert np.abs(grad_u - state.grad.numpy()).max() <= 1e-10
    for name, tensor in tensors.items():
        assert np.abs(grads[name] - tensor.grad.numpy()).max() <= 1e-10 * max(1, np.abs(grads[name]).max()), name
    # the torch Block's derived backward (the emitted adjoint as its autograd Function) returns them too
    derived = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64, backward="derived")
    derived.load_params(p)
    (derived(torch.tensor(u)) * torch.tensor(grad_out)).sum().backward()
    assert derived.ffn.step.grad.shape == () and abs(float(derived.ffn.step.grad) - grads["ffn.step"]) <= 1e-10 * abs(grads["ffn.step"])


def test_the_independent_evaluator_holds_and_catches_a_missing_scalar_step(derivation):
    scheme, program = parse_scheme(SCHEME), derivation.program
    for check in (derived_check(scheme, program), emitted_check(scheme, program)):
        assert check.holds, (check.id, check.detail)
    # negative control: the program with the learned step of ffn set to 1
    mutated = replace(program, records=[replace(record, update=replace(record.update, rhs=record.update.rhs.xreplace(
        {Number("ffn_step"): 1}))) for record in program.records])
    assert mutated.records != program.records
    assert not emitted_check(scheme, mutated).holds


def test_the_equation_and_the_builder_name_the_scalar_step():
    scheme = parse_scheme(SCHEME)
    assert equation_text(scheme) == "u_t = λ[attn]·attn(u) + λ[ffn]·ffn(u)"
    built = splitformer.scheme("rezero", "ReZero: every field scaled by one learned number, no norms",
                               operators={"attn": "attention", "ffn": "feed-forward"},
                               steps=[splitformer.substep("attn", step="scalar"), splitformer.substep("ffn", step="scalar")])
    assert built.body == scheme.body


@pytest.mark.parametrize("depth", [1, 2])
def test_xtransformers_layerscale_with_one_number_per_field_equals_the_scalar_step(depth):
    torch.manual_seed(depth)
    source = x_transformers.Encoder(dim=16, depth=depth, heads=2, attn_dim_head=8, attn_flash=True,
                                    use_layerscale=True).double()
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
        for module in source.modules():
            if type(module).__name__ == "LayerScale":  # one number per field: γ + unit offset = α
                module.gamma.fill_(float(torch.randn(())) - module.unit_offset)
    source.eval()
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    layers = tuple({name: value[0] if name.endswith(".step") else value for name, value in layer.items()}
                   for layer in adapted.layers)
    adapted = replace(adapted, layers=layers,
                      scheme_file=adapted.scheme_file.replace('step = "per-channel"', 'step = "scalar"'))
    derivation = adapted.derivation()
    forward_stack = derivation.numpy_module().forward_stack
    assert np.abs(forward_stack(u.numpy(), list(layers), **adapted.forward_kwargs) - expected).max() <= 1e-10
    stack = adapted.build(derivation.torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10
    # negative control: x-transformers' unit offset left out of α
    wrong = [{name: value - (name.endswith(".step")) for name, value in layer.items()} for layer in layers]
    assert np.abs(forward_stack(u.numpy(), wrong, **adapted.forward_kwargs) - expected).max() > 1e-3
