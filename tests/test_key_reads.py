"""Cached decoding of kinds that read positions or the state at a key's position (``tests/plugins/key_reads.py``):
it equals the full causal pass, NumPy and torch, and ``check``'s ``causality/<scheme>/cache`` says so; with the
copies read at ``x̃`` only (as before), cached decoding drifts and that check fails."""

import numpy as np
import pytest
import torch

import splitformer
import splitformer.symbolic.derivation as derivation
from splitformer.symbolic.domains import X_KEY

from conftest import ROOT

PLUGIN = ROOT / "tests" / "plugins" / "key_reads.py"


def _scheme(kind: str) -> str:
    return (f'name = "{kind}-step"\nsummary = "pre-LN, causal"\ncausal = true\n[operators]\nnorm1 = "layer-norm"\n'
            f'mix = "{kind}"\nnorm2 = "layer-norm"\nffn = "feed-forward"\n[[steps]]\noperator = "mix"\n'
            'solver = "explicit"\non = "norm1"\n[[steps]]\noperator = "ffn"\nsolver = "explicit"\non = "norm2"\n')


def _derived(tmp_path, kind: str):
    splitformer.load_plugin(PLUGIN)
    (tmp_path / "s.toml").write_text(_scheme(kind), encoding="utf-8")
    return splitformer.derive(str(tmp_path / "s.toml"))


@pytest.mark.parametrize("kind", ["window-attention", "support-mean-of-states"])
def test_cached_decoding_equals_the_full_pass(tmp_path, kind):
    derived = _derived(tmp_path, kind)
    numpy_module = derived.numpy_module()
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal([{"d": 8, "d_ff": 12}[axis] for axis in axes])
              for name, axes in numpy_module.PARAMETERS.items()}
    u = rng.standard_normal((2, 6, 8))
    full = numpy_module.forward(u, params, n_heads=2)
    cache = {}
    steps = [numpy_module.forward(u[:, :2], params, n_heads=2, cache=cache)]
    steps += [numpy_module.forward(u[:, i:i + 1], params, n_heads=2, cache=cache) for i in range(2, 6)]
    assert np.abs(np.concatenate(steps, axis=1) - full).max() < 1e-12
    block = derived.torch_module().Block(8, 2, 12, dtype=torch.float64).load_params(params)
    cache = {}
    with torch.no_grad():
        steps = [block(torch.from_numpy(u[:, i:i + 1]), cache=cache) for i in range(6)]
    assert np.abs(torch.cat(steps, dim=1).numpy() - full).max() < 1e-12
    checks = derived.check(only="causality").checks
    cached = next(check for check in checks if check.id.endswith("/cache"))
    assert cached.holds, cached.detail


def test_control_without_the_key_copies_at_eta_the_cache_check_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(derivation, "_KEYS", (X_KEY.symbol,))
    checks = _derived(tmp_path, "window-attention").check(only="causality").checks
    cached = next(check for check in checks if check.id.endswith("/cache"))
    assert not cached.holds and "max |cached − full|" in cached.detail


@pytest.mark.parametrize("kind", ["window-attention", "half-edge-window-attention"])
def test_a_window_of_padded_keys_alone_is_zero_and_its_checks_hold(tmp_path, kind):
    """Not causal, padding the last three tokens: the first query's window (keys 0–2 at distance 2) keeps keys, the
    last query's (keys 3–5) none. Its softmax is 0 there, finite in both backends and both backwards; the weight
    ``H(v, 0) + δ(v, 0)/2`` of the half edge masks the quotient as the step ``H(v, 1)`` does (it was NaN)."""
    splitformer.load_plugin(PLUGIN)
    (tmp_path / "s.toml").write_text(_scheme(kind).replace("causal = true\n", ""), encoding="utf-8")
    derived = splitformer.derive(str(tmp_path / "s.toml"))
    rng = np.random.default_rng(1)
    params = {name: rng.standard_normal([{"d": 8, "d_ff": 12}[axis] for axis in axes])
              for name, axes in derived.numpy_module().PARAMETERS.items()}
    u, padding = rng.standard_normal((2, 6, 8)), np.zeros((2, 6), dtype=bool)
    padding[:, 3:] = True
    for mode in ("autograd", "derived"):
        x = torch.from_numpy(u).requires_grad_()
        block = derived.torch_module().Block(8, 2, 12, dtype=torch.float64, backward=mode).load_params(params)
        out = block(x, src_key_padding_mask=torch.from_numpy(padding))
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
        assert all(torch.isfinite(parameter.grad).all() for parameter in block.parameters())
    checks = derived.check(only="semantics,adjoint-test").checks
    assert all(check.holds for check in checks), [(check.id, check.detail) for check in checks if not check.holds]
