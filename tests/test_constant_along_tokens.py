"""A plug-in field whose formula is the same at every query token (``m(x, y) = ∫ u dx̃ / ∫ u² dη``, free of ``x``):
derived, emitted by both backends and differentiated, against plain torch written here (review s32, F5: ``derive``
refused it with ``tuple.index(x)``, the adjoint read ``pool_out[j, l]`` at a summed index ``j``, and the emitted
forward reshaped a (batch, 1, d) pool into (batch, tokens, d))."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import splitformer

from conftest import ROOT

SCHEME = """\
name = "ratio-pool"
summary = "a linear map of the state's pool over every token, on the normalized state"
[operators]
norm = "layer-norm"
pool = "token-ratio"
[[steps]]
operator = "pool"
solver = "explicit"
on = "norm"
"""
D, TOKENS = 6, 5


@pytest.fixture(scope="module", params=["token-ratio", "feature-pool"])
def derivation(request, tmp_path_factory):
    """The pool declared on (x, y), free of x (elementwise statements made whole), or on y alone (the product made
    whole: review s32, M2)."""
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "token_pool.py")
    path = tmp_path_factory.mktemp("ratio") / "ratio-pool.toml"
    path.write_text(SCHEME.replace('"token-ratio"', f'"{request.param}"'), encoding="utf-8")
    return splitformer.derive(str(path))


def _reference(u, params):
    """u + (Σ_x̃ v / Σ_η v²) W with v = LayerNorm(u), in torch (float64): the same pool for every token."""
    mean = u.mean(-1, keepdim=True)
    v = (u - mean) / torch.sqrt(((u - mean) ** 2).mean(-1, keepdim=True) + 1e-5) * params["norm.gain"] + params["norm.bias"]
    pool = v.sum(-2, keepdim=True) / (v**2).sum(-2, keepdim=True)
    return u + (pool @ params["pool.W"]).expand_as(u)


def test_a_field_constant_along_the_tokens_derives_and_matches_torch(derivation, rng):
    params = {"norm.gain": 1 + rng.standard_normal(D) / 4, "norm.bias": rng.standard_normal(D) / 2,
              "pool.W": rng.standard_normal((D, D)) / 4}
    u, seed = rng.standard_normal((2, TOKENS, D)), rng.standard_normal((2, TOKENS, D))
    tensors = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
    x = torch.tensor(u, requires_grad=True)
    expected = _reference(x, tensors)
    expected.backward(torch.tensor(seed))
    assert float((expected[:, 0] - expected[:, 1] - x[:, 0] + x[:, 1]).abs().max().detach()) < 1e-14  # the same at every token
    numpy_module = derivation.numpy_module()
    np.testing.assert_allclose(numpy_module.forward(u, params, n_heads=1), expected.detach().numpy(), rtol=0, atol=1e-12)
    grad_u, grads = numpy_module.vjp(u, params, seed, n_heads=1)
    np.testing.assert_allclose(grad_u, x.grad.numpy(), rtol=1e-10, atol=1e-10)
    for name, tensor in tensors.items():
        np.testing.assert_allclose(grads[name], tensor.grad.numpy(), rtol=1e-10, atol=1e-10)
    for block in _torch_blocks_match(derivation, params, u, seed, expected, x.grad):
        np.testing.assert_allclose(block.pool.W.grad.numpy(), tensors["pool.W"].grad.numpy(), rtol=1e-10, atol=1e-10)


def _torch_blocks_match(derivation, params, u, seed, expected, grad) -> list:
    """The torch Block, with autograd and with its derived backward: its output is ``expected`` and its input's
    gradient along ``seed`` is ``grad``; the blocks, for their parameters' gradients."""
    blocks = []
    for backward in ("autograd", "derived"):
        block = derivation.torch_module().Block(D, 1, 4, dtype=torch.float64, backward=backward).load_params(params)
        y = torch.tensor(u, requires_grad=True)
        out = block(y)
        out.backward(torch.tensor(seed))
        np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(y.grad.numpy(), grad.numpy(), rtol=1e-10, atol=1e-10)
        blocks.append(block)
    return blocks


def test_its_semantics_and_adjoint_checks_hold_and_causality_fails(derivation):
    """The pool reads every token whatever the mask (no χ), so a causal call leaks: the causality checks fail, as
    docs/guide/plugins.md says; the others hold."""
    report = derivation.check(only=("semantics", "adjoint", "adjoint-test"))
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]
    causality = derivation.check(only=("causality",)).checks
    assert causality and not any(check.holds for check in causality)


def test_an_integral_over_a_definitions_own_variable_is_refused(tmp_path, capsys):
    """Review s32 (M1): ``∫ u(x, y) dx`` in a definition on (x, y) derived, and its adjoint took the summed index for
    the free one (grad u off by 1.39 of 3.76); refused in one line now. Control: token-ratio (∫ … dx̃) derives."""
    from splitformer.codegen.cli import main

    splitformer.load_plugin(ROOT / "tests" / "plugins" / "token_pool.py")
    for kind, code in (("token-ratio-own-variable", 2), ("token-ratio", 0)):
        path = tmp_path / f"{kind}.toml"
        path.write_text(SCHEME.replace('"token-ratio"', f'"{kind}"'), encoding="utf-8")
        assert main(["derive", str(path), "--out", str(tmp_path / kind)]) == code
        err = capsys.readouterr().err
        if code:
            assert err.count("\n") == 1 and "m integrates over x, one of the variables it is defined on" in err, err
            assert not (tmp_path / kind).exists()


def test_a_mean_over_every_token_is_made_whole_along_them(tmp_path, rng):
    """``m(x, y) = ∫ u(x̃, y) dx̃ / |Ω_x|``: one reduction free of x; its (batch, 1, d) result was reshaped into
    (batch · tokens, d) and both backends raised. Against plain torch, forward and both backwards."""
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "token_pool.py")
    path = tmp_path / "mean-pool.toml"
    path.write_text(SCHEME.replace('"token-ratio"', '"token-mean"'), encoding="utf-8")
    derivation = splitformer.derive(str(path))
    params = {"norm.gain": 1 + rng.standard_normal(D) / 4, "norm.bias": rng.standard_normal(D) / 2,
              "pool.W": rng.standard_normal((D, D)) / 4}
    u, seed = rng.standard_normal((2, TOKENS, D)), rng.standard_normal((2, TOKENS, D))
    x = torch.tensor(u, requires_grad=True)
    mean = x.mean(-1, keepdim=True)
    v = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) * torch.tensor(params["norm.gain"]) \
        + torch.tensor(params["norm.bias"])
    expected = x + (v.mean(-2, keepdim=True) @ torch.tensor(params["pool.W"])).expand_as(x)
    expected.backward(torch.tensor(seed))
    numpy_module = derivation.numpy_module()
    np.testing.assert_allclose(numpy_module.forward(u, params, n_heads=1), expected.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(numpy_module.vjp(u, params, seed, n_heads=1)[0], x.grad.numpy(), rtol=1e-10, atol=1e-10)
    _torch_blocks_match(derivation, params, u, seed, expected, x.grad)
    report = derivation.check(only=("semantics", "adjoint", "adjoint-test"))
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]
