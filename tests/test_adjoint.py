"""The derived adjoint: vjp / vjp_stack / Block(backward="derived") against torch.autograd."""

import copy
from dataclasses import replace

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.adapters import from_torch
from splitformer.codegen.adjoint import lower_adjoint
from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import derive, load_scheme
from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.codegen.verification.statements.adjoint import finite_difference_gap, flip_sign
from splitformer.symbolic.domains import VARIABLES

from conftest import GENERATED, ROOT, import_path, random_encoder_layer

import reference

SHAPES = [(8, 2, 20, 1e-5), (12, 3, 7, 1e-3), (16, 4, 24, 0.1)]  # (d, n_heads, d_ff ≠ d, eps)
N = 6


def _gradients_of(layer) -> dict:
    """The parameter gradients of a torch layer under their canonical names."""
    holder = copy.deepcopy(layer)
    with torch.no_grad():
        for mine, theirs in zip(holder.parameters(), layer.parameters()):
            mine.copy_(theirs.grad)
    return from_torch(holder)


def _masks(option: str, batch: int):
    padding = np.zeros((batch, N), dtype=bool)
    padding[-1, N - 2:] = True
    causal = option in ("causal", "both")
    return (padding if option in ("padding", "both") else None), causal


def _relative(got, expected, scale=None):
    return np.abs(got - expected).max() / (scale if scale is not None else np.abs(expected).max())


def _assert_close(grad_u, grads, expected_u, expected, tolerance):
    assert _relative(grad_u, expected_u) <= tolerance
    for name, value in expected.items():
        # ∂J/∂b_k vanishes in exact arithmetic (softmax ignores a per-row shift): compare it on W_k's scale
        key_weight = name[:-len("b_k")] + "W_k"
        scale = np.abs(expected[key_weight]).max() if name.endswith(".b_k") else None
        assert grads[name].shape == value.shape, name
        assert _relative(grads[name], value, scale) <= tolerance, name


@pytest.mark.parametrize("name, norm_first", [("post_ln", False), ("pre_ln", True)])
@pytest.mark.parametrize("d, n_heads, d_ff, eps", SHAPES)
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both"])
def test_vjp_equals_autograd_on_the_torch_layer(name, norm_first, d, n_heads, d_ff, eps, masks, rng):
    module = import_path(GENERATED / "numpy" / f"{name}.py")
    layer = random_encoder_layer(d, n_heads, d_ff, eps, norm_first=norm_first, seed=d + n_heads)
    params = from_torch(layer)
    u, grad_out = rng.standard_normal((3, N, d)), rng.standard_normal((3, N, d))
    padding, causal = _masks(masks, 3)
    x = torch.tensor(u, requires_grad=True)
    options = {}
    if padding is not None:
        options["src_key_padding_mask"] = torch.tensor(padding)
    if causal:
        options["src_mask"] = torch.ones(N, N, dtype=torch.bool).triu(1)
    layer(x, **options).backward(torch.tensor(grad_out))
    grad_u, grads = module.vjp(u, params, grad_out, n_heads=n_heads, eps=eps, key_padding_mask=padding, causal=causal)
    assert set(grads) == set(module.PARAMETERS)
    _assert_close(grad_u, grads, x.grad.numpy(), _gradients_of(layer), 1e-10)


def _generated(name, tmp_path_factory, activation="relu"):
    scheme = load_scheme(name)
    scheme = scheme if activation == scheme.activation else replace(scheme, activation=activation)
    if name in ("post-ln", "pre-ln", "macaron", "parallel", "symmetric-parallel", "rk2", "rk4") and activation == "relu":
        folder = GENERATED
    else:
        folder = tmp_path_factory.mktemp(scheme.module_name)
        write_files(generate(scheme, ("numpy", "torch"), folder))
    return (import_path(folder / "numpy" / f"{scheme.module_name}.py"),
            import_path(folder / "torch" / f"{scheme.module_name}.py"))


@pytest.mark.parametrize("name, activation", [
    ("post-ln", "relu"), ("pre-ln", "relu"), ("macaron", "relu"), ("parallel", "relu"),
    ("symmetric-parallel", "relu"), ("rk2", "relu"), ("rk4", "relu"), ("pre-ln", "gelu"), ("post-ln", "silu"),
    ("rk2", "tanh"), (str(ROOT / "tests" / "schemes" / "sandwich.toml"), "relu"),
    (str(ROOT / "tests" / "schemes" / "ssprk3.toml"), "relu"),
    (str(ROOT / "tests" / "schemes" / "pre-rms-glu.toml"), "silu"),  # RMSNorm and a gated feed-forward
])
def test_every_scheme_and_activation_against_autograd_through_its_torch_module(name, activation, tmp_path_factory,
                                                                                rng):
    numpy_module, torch_module = _generated(name, tmp_path_factory, activation)
    d, n_heads, d_ff = 8, 2, 12
    params = reference.random_params(numpy_module.PARAMETERS, d, d_ff, rng)
    u, grad_out = rng.standard_normal((2, N, d)), rng.standard_normal((2, N, d))
    padding, _ = _masks("padding", 2)
    for options in ({}, {"key_padding_mask": padding}, {"causal": True}):
        torch_options = {k: torch.tensor(v) if k == "key_padding_mask" else v for k, v in options.items()}
        results = {}
        for backward in ("autograd", "derived"):
            block = torch_module.Block(d, n_heads, d_ff, dtype=torch.float64, backward=backward).load_params(params)
            x = torch.tensor(u, requires_grad=True)
            block(x, **torch_options).backward(torch.tensor(grad_out))
            grads = {name: torch_module._tensor(block, name).grad.numpy() for name in torch_module.PARAMETERS}
            results[backward] = (x.grad.numpy(), grads)
        expected_u, expected = results["autograd"]
        _assert_close(*results["derived"], expected_u, expected, 1e-10)
        grad_u, grads = numpy_module.vjp(u, params, grad_out, n_heads=n_heads, **options)
        _assert_close(grad_u, grads, expected_u, expected, 1e-10)


def test_vjp_stack_equals_autograd_through_an_encoder_with_final_norm(rng):
    module = import_path(GENERATED / "numpy" / "pre_ln.py")
    d, n_heads, d_ff, eps = 8, 2, 12, 1e-5
    layers = [random_encoder_layer(d, n_heads, d_ff, eps, norm_first=True, seed=seed) for seed in (1, 2)]
    norm = torch.nn.LayerNorm(d, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d)), norm.bias.copy_(torch.randn(d))
    u, grad_out = rng.standard_normal((2, N, d)), rng.standard_normal((2, N, d))
    x = torch.tensor(u, requires_grad=True)
    y = x
    for layer in layers:
        y = layer(y)
    norm(y).backward(torch.tensor(grad_out))
    grad_u, grad_layers, grad_norm = module.vjp_stack(
        u, [from_torch(layer) for layer in layers], grad_out, n_heads=n_heads, eps=eps,
        final_norm={"gain": norm.weight.detach().numpy(), "bias": norm.bias.detach().numpy()})
    assert _relative(grad_u, x.grad.numpy()) <= 1e-10
    for grads, layer in zip(grad_layers, layers):
        _assert_close(grad_u, grads, x.grad.numpy(), _gradients_of(layer), 1e-10)
    assert _relative(grad_norm["gain"], norm.weight.grad.numpy()) <= 1e-10
    assert _relative(grad_norm["bias"], norm.bias.grad.numpy()) <= 1e-10


def test_float32_and_unbatched_inputs(rng):
    module = import_path(GENERATED / "numpy" / "post_ln.py")
    layer = random_encoder_layer(8, 2, 12, 1e-5)
    params = from_torch(layer)
    u, grad_out = rng.standard_normal((N, 8)), rng.standard_normal((N, 8))
    grad64, grads64 = module.vjp(u, params, grad_out, n_heads=2)
    assert grad64.shape == (N, 8)
    grad32, grads32 = module.vjp(u.astype(np.float32), {k: v.astype(np.float32) for k, v in params.items()},
                                 grad_out.astype(np.float32), n_heads=2)
    assert grad32.dtype == np.float32 and all(value.dtype == np.float32 for value in grads32.values())
    assert _relative(grad32, grad64) <= 1e-4
    assert all(_relative(grads32[k], grads64[k], np.abs(grads64["attn.W_k"]).max()) <= 1e-4 for k in grads64)


def test_a_grad_out_of_the_wrong_shape_is_refused_before_any_work(rng):
    module = import_path(GENERATED / "numpy" / "post_ln.py")
    params = reference.random_params(module.PARAMETERS, 8, 12, rng)
    with pytest.raises(ValueError, match="grad_out"):
        module.vjp(rng.standard_normal((2, 5, 8)), params, rng.standard_normal((2, 5, 7)), n_heads=2)


def test_the_softmax_adjoint_is_derived_in_terms_of_the_kernel():
    adjoint = derive_adjoint(derive(load_scheme("post-ln")))
    scores = next(a for a in adjoint.assignments if a.target == "attn_a_bar")
    gamma, bar = sp.IndexedBase("attn_gamma"), sp.IndexedBase("attn_gamma_bar")
    m, i, j = scores.lhs.indices
    n = next(index for index in scores.rhs.atoms(sp.Idx) if index not in (m, i, j))
    expected = gamma[m, i, j] * bar[m, i, j] - gamma[m, i, j] * sp.Sum(gamma[m, i, n] * bar[m, i, n], (n, 0, n.upper))
    assert sp.simplify(scores.rhs - expected) == 0
    assert not any(a.rhs.has(sp.exp) for a in adjoint.assignments)  # the kernel is reused, never recomputed


def test_no_intermediate_has_two_feature_axes_and_a_token_axis():
    """GEMMs, no d×d×N intermediates: every adjoint contraction has at most two operands."""
    domains = {str(v.index): v.domain for v in VARIABLES.values()}
    for name in ("post-ln", "rk2", "llama", "decoder"):
        backward = lower_adjoint(derive_adjoint(derive(load_scheme(name))))
        for op in backward.forward.ops + backward.adjoint.ops:
            axes = [domains[label].name for label in op.labels if label != "b"]
            assert not (axes.count("y") + axes.count("z") >= 2 and "x" in axes), (op.out, op.labels)
            assert len(getattr(op, "operands", ())) <= 2


def test_finite_differences_in_50_digits_and_the_negative_control():
    adjoint = derive_adjoint(derive(load_scheme("rk2")))
    assert finite_difference_gap(adjoint) < 1e-20
    assert finite_difference_gap(flip_sign(adjoint)) > 1e-3


def test_a_query_with_empty_support_gets_zero_kernel_and_a_consistent_gradient(rng):
    """Padding the first key under a causal mask leaves query 0 no key: float64 central differences agree."""
    module = import_path(GENERATED / "numpy" / "post_ln.py")
    params = reference.random_params(module.PARAMETERS, 4, 6, rng)
    u, grad_out = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 3, 4))
    options = {"n_heads": 2, "key_padding_mask": np.array([[True, False, False]]), "causal": True}
    grad_u, grads = module.vjp(u, params, grad_out, **options)
    assert np.isfinite(grad_u).all()
    direction = {name: rng.standard_normal(value.shape) for name, value in params.items()}
    du = rng.standard_normal(u.shape)
    step = 1e-6

    def objective(shift):
        shifted = {name: value + shift * direction[name] for name, value in params.items()}
        return float(np.sum(grad_out * module.forward(u + shift * du, shifted, **options)))

    numeric = (objective(step) - objective(-step)) / (2 * step)
    derived = np.sum(grad_u * du) + sum(np.sum(grads[name] * direction[name]) for name in params)
    assert abs(numeric - derived) <= 1e-7 * abs(derived)


def test_derived_torch_backward_in_float32_without_biases_and_unbatched():
    torch_module = import_path(GENERATED / "torch" / "pre_ln.py")
    results = {}
    for backward in ("autograd", "derived"):
        torch.manual_seed(1)
        block = torch_module.Block(8, 2, 12, bias=False, backward=backward)
        with torch.no_grad():
            for parameter in block.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.3)
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
        block(x, causal=True).square().sum().backward()
        results[backward] = [x.grad] + [p.grad for name, p in block.named_parameters() if not name.endswith("b_k")]
    assert results["derived"][0].shape == (5, 8) and results["derived"][0].dtype == torch.float32
    for derived, expected in zip(results["derived"], results["autograd"]):
        assert float((derived - expected).abs().max() / expected.abs().max()) <= 1e-4
    with pytest.raises(ValueError, match="backward"):
        torch_module.Block(8, 2, 12, backward="tape")


def test_a_users_kinds_and_solver_get_their_adjoint(tmp_path, rng):
    """tests/plugins/my_kinds.py: a user's projection, affine field and Runge–Kutta tableau."""
    from splitformer.codegen.verification.statements.adjoint import adjoint_checks
    from splitformer.symbolic.plugins import load_plugin

    load_plugin(ROOT / "tests" / "plugins" / "my_kinds.py")
    scheme = load_scheme(str(ROOT / "tests" / "plugins" / "plugin-scheme.toml"))
    write_files(generate(scheme, ("numpy", "torch"), tmp_path))
    numpy_module = import_path(tmp_path / "numpy" / "plugin_scheme.py")
    torch_module = import_path(tmp_path / "torch" / "plugin_scheme.py")
    params = reference.random_params(numpy_module.PARAMETERS, 8, 12, rng)
    u, grad_out = rng.standard_normal((2, N, 8)), rng.standard_normal((2, N, 8))
    block = torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    x = torch.tensor(u, requires_grad=True)
    block(x).backward(torch.tensor(grad_out))
    expected = {name: torch_module._tensor(block, name).grad.numpy() for name in torch_module.PARAMETERS}
    grad_u, grads = numpy_module.vjp(u, params, grad_out, n_heads=2)
    assert _relative(grad_u, x.grad.numpy()) <= 1e-10
    assert all(_relative(grads[name], value) <= 1e-10 for name, value in expected.items())
    assert all(check.holds for check in adjoint_checks(scheme, derive(scheme)))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch 2.13; still works
def test_derived_backward_with_torch_options_float_mask_and_sequence_first():
    torch_module = import_path(GENERATED / "torch" / "post_ln.py")
    results = {}
    for backward in ("autograd", "derived"):
        torch.manual_seed(1)
        block = torch_module.Block(8, 2, 12, batch_first=False, backward=backward, dtype=torch.float64)
        with torch.no_grad():
            for parameter in block.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.3)
        x = torch.randn(N, 2, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64, requires_grad=True)
        mask = torch.randn(N, N, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        block(x, src_mask=mask).square().sum().backward()
        results[backward] = [x.grad] + [p.grad for name, p in block.named_parameters() if not name.endswith("b_k")]
    for derived, expected in zip(results["derived"], results["autograd"]):
        assert float((derived - expected).abs().max() / expected.abs().max()) <= 1e-10
    block = torch_module.Block(8, 2, 12, dropout=0.1, backward="derived")
    with pytest.raises(ValueError, match="dropout"):
        block(torch.randn(2, N, 8))
    assert block.eval()(torch.randn(2, N, 8)).shape == (2, N, 8)
    torch.jit.script(torch_module.Block(8, 2, 12, backward="derived"))  # the derived path is TorchScript-unused


def test_plain_indices_are_distinct_indices_only():
    """A repeated index (a diagonal) or an index expression (a window) is a pattern, not plain."""
    from splitformer.symbolic.adjoint import is_plain

    i, j, p, r = (sp.Idx(name, 4) for name in "ijpr")
    assert is_plain((i, j)) and is_plain(())
    assert not is_plain((i, i))
    assert not is_plain((2 * p + r,)) and not is_plain((i, sp.Integer(0)))


def test_index_patterns_take_integers_and_index_expressions():
    """A point (an integer), a window (``2p + r``) and a plain index are patterns; a reused index is not."""
    from splitformer.symbolic.adjoint import _is_pattern

    i, p, r = (sp.Idx(name, 4) for name in "ipr")
    assert _is_pattern((i, sp.Integer(0))) and _is_pattern((2 * p + r, i))
    assert not _is_pattern((p + r, r))


def test_the_normalizations_jacobians_hold_and_a_wrong_closed_form_fails(monkeypatch):
    from splitformer.codegen.verification.statements import adjoint

    assert all(check.holds for check in adjoint._jacobian_checks())
    # control: the closed form's rank-one term with the other sign is the one compared
    flipped = tuple((identifier, kind, lambda v, g, sign, jacobian=jacobian: jacobian(v, g, -sign), statement)
                    for identifier, kind, jacobian, statement in adjoint._JACOBIANS)
    monkeypatch.setattr(adjoint, "_JACOBIANS", flipped)
    checks = adjoint._jacobian_checks()
    assert not any(check.holds for check in checks)
    assert all("components differ" in check.detail for check in checks)
