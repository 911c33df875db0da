"""ResiDual (Xie et al. 2023, arXiv 2304.14802): a second state of the fields' increments (``stream = true``).

The paper's two streams, for each sublayer ``F`` (attention, then feed-forward) of a layer:
``y = F(x_a)``, ``x_a ← LN(x_a + y)``, ``x_d ← x_d + y``; ``x_a⁰ = x_d⁰ = x⁰`` (the embedding) and the
output is ``x_a^N + LN_final(x_d^N)``. x-transformers (2.31) has no flag for it: the reference here is
those equations over the submodules of a torch ``TransformerEncoderLayer`` (``nn.MultiheadAttention``,
``nn.Linear``, ``nn.LayerNorm``; every weight, bias and gain random) and an ``nn.LayerNorm``, in float64.
"""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sympy as sp
import torch

from conftest import import_path, random_encoder_layer
from splitformer.codegen.adapters.torch_encoder import read_encoder_layer
from splitformer.codegen.api import derive
from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.codegen.verification.structure import stream_stack_check
from splitformer.symbolic.across_layers import AcrossLayers
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.program import TIME_STEP
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence, Substep
from splitformer.symbolic.scheme_file import load_scheme, parse_scheme
from splitformer.symbolic.tableaux import EULER

SCHEME = Path(__file__).parent / "schemes" / "residual.toml"
D, HEADS, FF, EPS = 8, 2, 12, 1e-5


@pytest.fixture(scope="module")
def derived():
    return derive(load_scheme(SCHEME))


def _reference(layers, final, x, *, final_norm=True, start_at_input=True):
    """The paper's equations, one sublayer at a time (``final_norm=False``, ``start_at_input=False``: the controls)."""
    x_a = x
    x_d = x if start_at_input else torch.zeros_like(x)
    for layer in layers:
        y = layer.self_attn(x_a, x_a, x_a, need_weights=False)[0]
        x_a, x_d = layer.norm1(x_a + y), x_d + y
        y = layer.linear2(torch.relu(layer.linear1(x_a)))
        x_a, x_d = layer.norm2(x_a + y), x_d + y
    return x_a + (final(x_d) if final_norm else x_d)


def _model(depth, seed):
    layers = [random_encoder_layer(D, HEADS, FF, EPS, seed=seed + n) for n in range(depth)]
    final = torch.nn.LayerNorm(D, eps=EPS, dtype=torch.float64)
    with torch.no_grad():
        final.weight.copy_(torch.randn(D, dtype=torch.float64))
        final.bias.copy_(torch.randn(D, dtype=torch.float64))
    params = [dict(read_encoder_layer(layer).layers[0]) for layer in layers]  # for the residual scheme: not the reading
    return layers, final, params, {"gain": final.weight.detach().numpy(), "bias": final.bias.detach().numpy()}


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_numpy_and_torch_stacks_equal_the_papers_equations(derived, depth):
    layers, final, params, final_params = _model(depth, 10 * depth)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        expected = _reference(layers, final, x).numpy()
        forgets_final_norm = _reference(layers, final, x, final_norm=False).numpy()
        starts_at_zero = _reference(layers, final, x, start_at_input=False).numpy()
    out = derived.numpy_module().forward_stack(x.numpy(), params, n_heads=HEADS, eps=EPS, final_norm=final_params)
    assert np.abs(out - expected).max() < 1e-10
    stack = derived.torch_module().Stack(depth, D, HEADS, FF, eps=EPS, dtype=torch.float64).load_params(params, final_params)
    with torch.no_grad():
        assert np.abs(stack(x).numpy() - expected).max() < 1e-10
    # controls: a reference that forgets LN_final, or starts x_d at zero, is far from the emitted stacks
    assert np.abs(out - forgets_final_norm).max() > 1e-2
    assert np.abs(out - starts_at_zero).max() > 1e-2


def test_torch_gradients_equal_the_references(derived):
    layers, final, params, final_params = _model(2, 7)
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 5, D, dtype=torch.float64)
    (grad_expected,) = torch.autograd.grad((_reference(layers, final, x) * weight).sum(), x)
    stack = derived.torch_module().Stack(2, D, HEADS, FF, eps=EPS, dtype=torch.float64).load_params(params, final_params)
    (grad,) = torch.autograd.grad((stack(x) * weight).sum(), x)
    assert (grad - grad_expected).abs().max() < 1e-10
    stack.final_norm.gain.data.neg_()  # control: another LN_final
    (grad,) = torch.autograd.grad((stack(x) * weight).sum(), x)
    assert (grad - grad_expected).abs().max() > 1e-3


def test_the_block_is_post_ln_and_reports_its_stream_increment(derived):
    """``forward`` is the post-LN layer; ``stream`` receives ``y₁ + y₂``, the sublayers' outputs."""
    (layer,), _, (params,), _ = _model(1, 3)
    x = torch.randn(5, D, dtype=torch.float64)  # (tokens, d): the increment has the shape of u
    with torch.no_grad():
        y1 = layer.self_attn(x, x, x, need_weights=False)[0]
        y2 = layer.linear2(torch.relu(layer.linear1(layer.norm1(x + y1))))
        expected = (layer(x).numpy(), (y1 + y2).numpy())
    numpy_stream, torch_stream = [], []
    out = derived.numpy_module().forward(x.numpy(), params, n_heads=HEADS, eps=EPS, stream=numpy_stream)
    block = derived.torch_module().Block(D, HEADS, FF, eps=EPS, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        torch_out = block(x, stream=torch_stream)
    for result, increments in ((out, numpy_stream), (torch_out.numpy(), [t.numpy() for t in torch_stream])):
        assert len(increments) == 1 and increments[0].shape == x.shape
        assert np.abs(result - expected[0]).max() < 1e-10
        assert np.abs(increments[0] - expected[1]).max() < 1e-10
        assert np.abs(increments[0] - y1.numpy()).max() > 1e-2  # control: the attention's output alone


def test_the_stream_increment_is_derived_from_the_marked_substeps(derived):
    program = derived.program
    (record,) = [record for record in program.records if record.update.target == program.stream]
    fields = {str(item.base.label) for item in record.update.rhs.atoms(sp.Indexed)}
    assert fields == {"attn_out", "ffn_out"} and record.update.rhs.coeff(TIME_STEP) != 0
    only_attention = parse_scheme(SCHEME.read_text().replace("stream = true\n\n[[steps]]\noperator = \"norm2\"",
                                                               "\n[[steps]]\noperator = \"norm2\""))
    program = derive(only_attention).program
    (record,) = [record for record in program.records if record.update.target == program.stream]
    assert {str(item.base.label) for item in record.update.rhs.atoms(sp.Indexed)} == {"attn_out"}


def test_the_derived_adjoint_is_refused_for_the_stack(derived):
    _, _, params, final_params = _model(1, 5)
    with pytest.raises(ValueError, match="backward='derived'.*second stream"):
        derived.torch_module().Stack(1, D, HEADS, FF, backward="derived")
    x = np.zeros((5, D))
    with pytest.raises(NotImplementedError, match="vjp_stack.*second stream"):
        derived.numpy_module().vjp_stack(x, params, x, n_heads=HEADS, final_norm=final_params)
    with pytest.raises(TypeError, match="stream must be a list"):
        derived.numpy_module().forward(x, params[0], n_heads=HEADS, stream=())


@pytest.mark.parametrize("change, message", [
    (("operator = \"norm1\"\nsolver = \"projection\"", "operator = \"norm1\"\nsolver = \"projection\"\nstream = true"),
     "explicit substep of the top-level sequence"),
    (("stream = true", "stream = 1"), "stream: expected bool"),
    (("final_norm = true", "final_norm = true\ncausal = true"), "not supported with causal"),
])
def test_bad_streams_are_refused(change, message):
    with pytest.raises(SplitformerError, match=message):
        parse_scheme(SCHEME.read_text().replace(*change, 1))


def test_check_compares_the_stack_with_the_evaluators_two_states(derived):
    """``structure/residual/stack``: the emitted stack against the independent evaluator's ``(u, d)``."""
    module = derived.numpy_module()
    check = stream_stack_check(derived.scheme, module)
    assert check.holds and check.id == "structure/residual/stack", check.detail
    # control: a stack that reads out u + d, forgetting the final projection of d
    forgets = SimpleNamespace(forward_stack=lambda u, layers, **options: module.forward_stack(
        u, layers, **{**options, "final_norm": None}))
    assert not stream_stack_check(derived.scheme, forgets).holds


@pytest.mark.parametrize("body, across, message", [
    (Sequence((Substep("attn", "explicit", stream="yes"),)), None, r"stream: expected bool, got str"),
    (Sequence((Parallel((Sequence((Substep("attn", "explicit", stream=True),)), Sequence(())), ("1/2", "1/2")),)), None,
     "explicit substep of the top-level sequence"),
    (Sequence((RungeKutta((Substep("attn", "explicit", stream=True),), EULER),)), None, "top-level sequence"),
    (Sequence((Substep("attn", "explicit", stream=True),)), AcrossLayers("adams-bashforth"), "not supported with across_layers"),
])
def test_scheme_objects_with_bad_streams_are_refused(body, across, message):
    """A scheme built in Python (or edited after construction) is checked like a file."""
    scheme = Scheme("s", "one field", {"attn": "attention"}, body, across_layers=across)
    with pytest.raises(SplitformerError, match=message):
        scheme.check()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch 2.13; still works
def test_torchscript_compiles_the_stack(tmp_path):
    """The Block's ``stream`` list is typed, so TorchScript compiles the Stack that passes it."""
    write_files(generate(load_scheme(SCHEME), ("torch",), tmp_path))
    module = import_path(tmp_path / "torch" / "residual.py", "residual_torchscript")
    _, _, params, final_params = _model(2, 9)
    eager = module.Stack(2, D, HEADS, FF, eps=EPS, dtype=torch.float64).load_params(params, final_params)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        assert (torch.jit.script(eager)(x) - eager(x)).abs().max() < 1e-12


def test_torch_stack_with_tokens_first(derived):
    """``batch_first=False``: both streams in (tokens, batch, d)."""
    layers, final, params, final_params = _model(2, 11)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    stack = derived.torch_module().Stack(2, D, HEADS, FF, eps=EPS, dtype=torch.float64, batch_first=False)
    stack.load_params(params, final_params)
    with torch.no_grad():
        expected = _reference(layers, final, x)
        assert (stack(x.transpose(0, 1)).transpose(0, 1) - expected).abs().max() < 1e-10
