"""Learned time steps (``step = "per-channel"``: LayerScale) and branch maps (``then``: the sandwich norm).

Each scheme derives, emits NumPy and torch equal to a NumPy reference written here (float64, every
parameter random), gets its adjoint (finite differences) and passes the independent evaluator's checks;
negative controls: the program of the scheme without its learned step or branch map fails those
checks. ``from_xtransformers`` maps ``use_layerscale`` and ``sandwich_norm`` (depth 1 and 2, Encoder and
Decoder, float64) to ≤ 1e-10; the unit offset of the learned step omitted is far off.
"""

from dataclasses import replace

import numpy as np
import pytest
import sympy as sp
import torch

import splitformer

from splitformer.adapters import from_xtransformers
from splitformer.codegen.verification.scheme_checks import derived_check, emitted_check
from splitformer.codegen.verification.statements.order import splitting_order
from splitformer.symbolic import derive, parse_scheme
from splitformer.symbolic.domains import X, Y
from splitformer.symbolic.errors import SplitformerError

import x_transformers

SCHEME = """
name = "sandwich-layerscale"
summary = "pre-LN fields, each normalized before it is added and scaled by a learned per-channel step"
final_norm = true

[operators]
norm1 = "layer-norm"
attn = "attention"
post1 = "layer-norm"
norm2 = "layer-norm"
ffn = "feed-forward"

[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
then = "post1"
step = "per-channel"

[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm2"
step = "per-channel"
fraction = "1/2"
"""
D, D_FF, HEADS = 8, 12, 2


def _scheme(text=SCHEME):
    return parse_scheme(text)


def _params(module, seed=0):
    rng = np.random.default_rng(seed)
    sizes = {"d": D, "d_ff": D_FF}
    return {name: rng.standard_normal(tuple(sizes[axis] for axis in axes)) * 0.5 + (name.endswith("gain"))
            for name, axes in module.PARAMETERS.items()}


def _reference(u, p):
    """The block written from the scheme by hand: u + λ₁ ⊙ LN(A(LN u)), then u + ½ λ₂ ⊙ F(LN u)."""
    def norm(x, key):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * p[f"{key}.gain"] + p[f"{key}.bias"]

    def attention(x):
        heads = [(x @ p[f"attn.W_{part}"] + p[f"attn.b_{part}"]).reshape(*x.shape[:-1], HEADS, D // HEADS).swapaxes(-2, -3)
                 for part in "qkv"]
        scores = heads[0] @ heads[1].swapaxes(-1, -2) / np.sqrt(D // HEADS)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        mixed = (weights / weights.sum(-1, keepdims=True)) @ heads[2]
        return mixed.swapaxes(-2, -3).reshape(x.shape) @ p["attn.W_o"] + p["attn.b_o"]

    u = u + p["attn.step"] * norm(attention(norm(u, "norm1")), "post1")
    hidden = np.maximum(norm(u, "norm2") @ p["ffn.W_1"] + p["ffn.b_1"], 0)
    return u + 0.5 * p["ffn.step"] * (hidden @ p["ffn.W_2"] + p["ffn.b_2"])


@pytest.fixture(scope="module")
def program():
    return derive(_scheme())


def test_numpy_and_torch_equal_the_hand_written_block():
    derivation = splitformer.derive(_scheme())
    numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
    assert numpy_module.PARAMETERS["attn.step"] == ("d",) and "post1.gain" in numpy_module.PARAMETERS
    p = _params(numpy_module)
    u = np.random.default_rng(1).standard_normal((2, 5, D))
    expected = _reference(u, p)
    assert np.abs(numpy_module.forward(u, p, n_heads=HEADS) - expected).max() <= 1e-12
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64)
    block.load_params(p)
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - expected).max() <= 1e-12
    fresh = torch_module.Block(D, HEADS, D_FF, bias=False)  # no biases, but the learned steps are controls
    assert isinstance(fresh.attn.step, torch.nn.Parameter) and float(fresh.attn.step.detach().abs().max()) == 0.0
    # the derived adjoint: the learned steps' gradients against central differences
    grad_out = np.random.default_rng(2).standard_normal(u.shape)
    _, grads = numpy_module.vjp(u, p, grad_out, n_heads=HEADS)
    direction = np.random.default_rng(3).standard_normal(D)
    for name in ("attn.step", "ffn.step", "post1.gain"):
        shifted = [dict(p, **{name: p[name] + sign * 1e-6 * direction}) for sign in (1, -1)]
        outputs = [numpy_module.forward(u, q, n_heads=HEADS) for q in shifted]
        difference = ((outputs[0] - outputs[1]) * grad_out).sum() / 2e-6
        assert abs(grads[name] @ direction - difference) <= 1e-6 * max(1, abs(difference)), name


def test_the_independent_evaluator_holds_and_catches_a_missing_step_or_branch_map(program):
    scheme = _scheme()
    for check in (derived_check(scheme, program), emitted_check(scheme, program)):
        assert check.holds, (check.id, check.detail)
    # negative controls: the program with the learned step of attn set to 1, or without the branch map
    i, l = X.index, Y.index
    for wrong in ({sp.IndexedBase("attn_step")[l]: 1}, {sp.IndexedBase("post1_out")[i, l]: sp.IndexedBase("attn_out")[i, l]}):
        mutated = replace(program, records=[replace(record, update=replace(record.update, rhs=record.update.rhs.xreplace(wrong)))
                                            for record in program.records])
        assert mutated.records != program.records
        assert not emitted_check(scheme, mutated).holds


def test_orders_and_equation_name_the_learned_step_and_branch_map():
    scheme = _scheme()
    result = splitting_order(scheme)
    assert (result.order, result.splitting_order) == (1, 1)
    from splitformer.symbolic.equation import equation_text

    assert equation_text(scheme) == "u_t = λ[attn] ⊙ Proj[post1](attn(Proj[norm1](u))) + 1/2·λ[ffn] ⊙ ffn(Proj[norm2](u))"


@pytest.mark.parametrize("edit, message", [
    (('step = "per-channel"\nfraction', 'step = "per-token"\nfraction'), "steps[1].step: unknown step 'per-token'"),
    (('then = "post1"', 'then = "ffn"'), "'then' must name a projection, not 'ffn'"),
    (('then = "post1"', 'then = "nowhere"'), "steps[0].then: unknown operator 'nowhere'"),
    (('operator = "ffn"\nsolver = "explicit"\non = "norm2"\nstep = "per-channel"',
      'operator = "ffn"\nsolver = "explicit"\non = "norm2"\nstep = "per-channel"\n\n[[steps]]\noperator = "ffn"\n'
      'solver = "explicit"'), "the field 'ffn' has steps 'per-channel' and 'fixed'"),
])
def test_bad_steps_are_refused_in_one_line(edit, message):
    with pytest.raises(SplitformerError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _scheme(SCHEME.replace(*edit))


def _xtransformers(cls, depth, **flags):
    torch.manual_seed(depth)
    module = cls(dim=16, depth=depth, heads=2, attn_dim_head=8, attn_flash=True, **flags).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return module.eval()


_DERIVED = {}


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("cls", ["Encoder", "Decoder"])
@pytest.mark.parametrize("flags", [{"use_layerscale": True}, {"use_layerscale": True, "macaron": True},
                                   {"sandwich_norm": True}, {"sandwich_norm": True, "use_rmsnorm": True}],
                         ids=["use_layerscale", "use_layerscale+macaron", "sandwich_norm", "sandwich_norm+rmsnorm"])
def test_xtransformers_flags_equal_numpy_and_torch(flags, cls, depth):
    source = _xtransformers(getattr(x_transformers, cls), depth, **flags)
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    derivation = _DERIVED.setdefault(adapted.scheme_file, adapted.derivation())
    forward_stack = derivation.numpy_module().forward_stack
    assert np.abs(forward_stack(u.numpy(), list(adapted.layers), **adapted.forward_kwargs) - expected).max() <= 1e-10
    stack = adapted.build(derivation.torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10
    if "use_layerscale" in flags:  # negative control: the learned step without x-transformers' unit offset
        layers = [{name: value - (name.endswith(".step")) for name, value in layer.items()} for layer in adapted.layers]
        assert np.abs(forward_stack(u.numpy(), layers, **adapted.forward_kwargs) - expected).max() > 1e-3



def test_the_python_builder_writes_the_same_scheme():
    built = splitformer.scheme(
        "sandwich-layerscale", "pre-LN fields, each normalized before it is added and scaled by a learned per-channel step",
        operators={"norm1": "layer-norm", "attn": "attention", "post1": "layer-norm", "norm2": "layer-norm",
                   "ffn": "feed-forward"},
        steps=[splitformer.substep("attn", on="norm1", then="post1", step="per-channel"),
               splitformer.substep("ffn", on="norm2", step="per-channel", fraction="1/2")],
        final_norm=True)
    assert built.body == _scheme().body
