"""ALiBi as a one-file plug-in (tests/plugins/alibi.py): derived, emitted, differentiated, checked.

The kind declares that it reads token positions and has a control per head; nothing else in the
package knows it. References are plain NumPy written here (float64, random parameters).
"""

import math
import subprocess
import sys

import numpy as np
import pytest

import splitformer
from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.codegen.verification.groups import GROUPS

from conftest import ROOT, import_path

PLUGIN = ROOT / "tests" / "plugins" / "alibi.py"
SCHEME = """\
name = "{name}"
summary = "pre-LN block with ALiBi attention"
activation = "relu"
causal = {causal}
order = 1
splitting_order = 1

[operators]
norm1 = "layer-norm"
attn = {attention}
norm2 = "layer-norm"
ffn = "feed-forward"

[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"

[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm2"
"""
CAUSAL = SCHEME.format(name="alibi-causal", causal="true", attention='{ kind = "alibi-attention", symmetric = false }')
ENCODER = SCHEME.format(name="alibi-encoder", causal="false", attention='"alibi-attention"')
D, HEADS, D_FF, EPS = 8, 2, 12, 1e-5


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    splitformer.load_plugin(PLUGIN)
    folder = tmp_path_factory.mktemp("alibi")
    emitted = {}
    for name, text in (("causal", CAUSAL), ("encoder", ENCODER)):
        path = folder / f"alibi-{name}.toml"
        path.write_text(text, encoding="utf-8")
        scheme = splitformer.load_scheme(str(path))
        write_files(generate(scheme, ("numpy", "torch"), folder / "out"))
        name = scheme.module_name
        emitted[scheme.causal] = (path, import_path(folder / "out" / "numpy" / f"{name}.py"),
                                  import_path(folder / "out" / "torch" / f"{name}.py"))
    return emitted


def _params(module, rng):
    sizes = {"d": D, "d_ff": D_FF, "n_heads": HEADS}
    params = {name: rng.standard_normal(tuple(sizes[axis] for axis in shape)) / math.sqrt(D)
              for name, shape in module.PARAMETERS.items()}
    params["attn.slopes"] = rng.uniform(0.2, 1.5, HEADS)
    return params


def _layer_norm(u, gain, bias):
    centred = u - u.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + EPS) * gain + bias


def _reference(u, p, positions, causal, slope_sign=1.0):
    """Press et al. 2022: scores + m_h (x̃ − x) (causal), −m_h |x − x̃| (bidirectional); pre-LN block."""
    batch, n, d = u.shape
    width = d // HEADS
    x = _layer_norm(u, p["norm1.gain"], p["norm1.bias"])
    q, k, v = (x @ p[f"attn.W_{c}"] + p[f"attn.b_{c}"] for c in "qkv")
    distance = positions[None, :] - positions[:, None]  # x̃ − x, [query, key]
    out = np.zeros_like(u)
    for h in range(HEADS):
        cut = slice(h * width, (h + 1) * width)
        slope = slope_sign * p["attn.slopes"][h]
        bias = slope * distance if causal else -slope * np.abs(distance)
        scores = q[..., cut] @ np.swapaxes(k[..., cut], 1, 2) / math.sqrt(width) + bias
        if causal:
            scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out[..., cut] = weights @ v[..., cut]
    u1 = u + out @ p["attn.W_o"] + p["attn.b_o"]
    x = _layer_norm(u1, p["norm2.gain"], p["norm2.bias"])
    return u1 + np.maximum(x @ p["ffn.W_1"] + p["ffn.b_1"], 0) @ p["ffn.W_2"] + p["ffn.b_2"]


@pytest.mark.parametrize("causal", [True, False])
def test_both_backends_match_a_numpy_reference(modules, causal):
    import torch

    _, numpy_module, torch_module = modules[causal]
    rng = np.random.default_rng(3 if causal else 4)
    params, u = _params(numpy_module, rng), rng.standard_normal((2, 6, D))
    positions = np.array([0.0, 1.0, 3.0, 4.0, 7.0, 9.0])
    expected = _reference(u, params, positions, causal)
    got = numpy_module.forward(u, params, n_heads=HEADS, eps=EPS, positions=positions)
    assert np.abs(got - expected).max() <= 1e-12
    block = torch_module.Block(D, HEADS, D_FF, eps=EPS, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        got_torch = block(torch.tensor(u), positions=torch.tensor(positions)).numpy()
    assert np.abs(got_torch - expected).max() <= 1e-12
    # negative control: the slopes' sign matters
    assert np.abs(got - _reference(u, params, positions, causal, slope_sign=-1.0)).max() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
def test_the_derived_adjoint_matches_autograd_and_finite_differences(modules, causal):
    import torch

    _, numpy_module, torch_module = modules[causal]
    rng = np.random.default_rng(5)
    params, u = _params(numpy_module, rng), rng.standard_normal((2, 5, D))
    positions, seed = np.array([0.0, 2.0, 3.0, 5.0, 6.0]), rng.standard_normal((2, 5, D))
    grad_u, grads = numpy_module.vjp(u, params, seed, n_heads=HEADS, eps=EPS, positions=positions)
    block = torch_module.Block(D, HEADS, D_FF, eps=EPS, dtype=torch.float64).load_params(params)
    state = torch.tensor(u, requires_grad=True)
    (block(state, positions=torch.tensor(positions)) * torch.tensor(seed)).sum().backward()
    assert np.abs(grad_u - state.grad.numpy()).max() <= 1e-10
    for name, gradient in grads.items():
        assert np.abs(gradient - getattr(getattr(block, name.split(".")[0]), name.split(".")[1]).grad.numpy()).max() <= 1e-10

    def loss(slopes):
        return float((numpy_module.forward(u, {**params, "attn.slopes": slopes}, n_heads=HEADS, eps=EPS,
                                           positions=positions) * seed).sum())

    step, direction = 1e-6, rng.standard_normal(HEADS)
    slopes = params["attn.slopes"]
    difference = (loss(slopes + step * direction) - loss(slopes - step * direction)) / (2 * step)
    assert abs(difference - grads["attn.slopes"] @ direction) <= 1e-7 * max(1.0, abs(difference))
    assert abs(difference + grads["attn.slopes"] @ direction) > 1e-6  # negative control: the sign is seen


def test_cached_decoding_keeps_the_key_positions(modules):
    import torch

    _, numpy_module, torch_module = modules[True]
    rng = np.random.default_rng(7)
    params, u = _params(numpy_module, rng), rng.standard_normal((2, 6, D))
    positions = np.array([0.0, 1.0, 3.0, 4.0, 7.0, 9.0])
    full = numpy_module.forward(u, params, n_heads=HEADS, eps=EPS, positions=positions)
    cache, parts = {}, []
    for start, stop in ((0, 3), (3, 4), (4, 6)):
        parts.append(numpy_module.forward(u[:, start:stop], params, n_heads=HEADS, eps=EPS,
                                          positions=positions[start:stop], cache=cache))
    assert sorted(cache) == ["attn.k", "attn.pos_k", "attn.v", "key_padding_mask", "options"]
    assert np.abs(np.concatenate(parts, axis=1) - full).max() <= 1e-12
    block = torch_module.Block(D, HEADS, D_FF, eps=EPS, dtype=torch.float64).load_params(params)
    cache, parts = {}, []
    with torch.no_grad():
        for start, stop in ((0, 2), (2, 6)):
            parts.append(block(torch.tensor(u[:, start:stop]), positions=torch.tensor(positions[start:stop]),
                               cache=cache).numpy())
    assert np.abs(np.concatenate(parts, axis=1) - full).max() <= 1e-12
    # negative control: without the cached key positions, the new tokens see the wrong distances
    cache = {}
    numpy_module.forward(u[:, :3], params, n_heads=HEADS, eps=EPS, positions=positions[:3], cache=cache)
    cache["attn.pos_k"] = cache["attn.pos_k"] + 1.0
    shifted = numpy_module.forward(u[:, 3:], params, n_heads=HEADS, eps=EPS, positions=positions[3:], cache=cache)
    assert np.abs(shifted - full[:, 3:]).max() > 1e-6


def test_torch_cached_decoding_copies_the_callers_positions(modules):
    """attack11 F4: the first call stored ``positions`` (a view of the caller's tensor) in the cache, so a loop
    refilling one positions buffer in place rewrote the cached key positions (0.0151 off the full pass)."""
    import torch

    _, numpy_module, torch_module = modules[True]
    rng = np.random.default_rng(11)
    params, u = _params(numpy_module, rng), torch.tensor(rng.standard_normal((2, 5, D)))
    block = torch_module.Block(D, HEADS, D_FF, eps=EPS, dtype=torch.float64).load_params(params)
    positions = torch.tensor([0.0, 2.0, 3.0, 5.0, 6.0])
    with torch.no_grad():
        full = block(u, positions=positions)
        for reuse in (False, True):  # control: a fresh positions tensor per call
            cache, parts, buffer = {}, [], torch.empty(1, dtype=torch.float64)
            for token in range(5):
                given = buffer if reuse else torch.empty(1, dtype=torch.float64)
                given.fill_(positions[token])
                parts.append(block(u[:, token:token + 1], positions=given, cache=cache))
            assert (torch.cat(parts, dim=1) - full).abs().max() <= 1e-12
            assert cache["attn.pos_k"].untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()


def test_splitformer_check_passes_on_the_plugin(modules):
    path = modules[True][0]
    own = ",".join(group for group in GROUPS if group != "general")  # general: no scheme's (test_plugins runs it with --load)
    result = subprocess.run([sys.executable, "-m", "splitformer", "check", "--load", str(PLUGIN), str(path),
                             "--format", "json", "--only", own], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert '"semantics/alibi-causal/emitted"' in result.stdout


def test_the_symbolic_semantics_check_of_two_plugin_attentions_a_step_is_compared(modules):
    """New user, s32: a Strang step of the plug-in (attention, feed-forward, attention) did not finish its symbolic
    comparison in minutes: the evaluator of continuous definitions asked ``free_symbols`` of expressions that share
    their subexpressions, a walk of the whole tree (exponential in the nesting). Now it holds in about a second."""
    from splitformer.codegen.verification.scheme_checks import derived_check
    from splitformer.symbolic import derive, parse_scheme

    steps = SCHEME.split("[[steps]]")
    text = steps[0].replace('order = 1\nsplitting_order = 1', 'order = 1\nsplitting_order = 2') + "[[steps]]".join(
        ["", steps[1].rstrip() + '\nfraction = "1/2"\n\n', steps[2], steps[1].rstrip() + '\nfraction = "1/2"\n'])
    scheme = parse_scheme(text.format(name="alibi-strang", causal="false", attention='"alibi-attention"'))
    assert [substep.operator for substep in scheme.body.steps] == ["attn", "ffn", "attn"]
    check = derived_check(scheme, derive(scheme))
    assert check.holds and "0 after canonicalization" in check.detail, check.detail


def test_the_evaluator_asks_whether_a_symbol_occurs_once_per_shared_subexpression():
    """The walk of ``_mentions`` visits each distinct subexpression once: 60 levels of e ← e·e + e share everything,
    a tree of 2⁶⁰ leaves (``free_symbols`` would not return)."""
    import sympy as sp

    from splitformer.codegen.verification.definitions import _mentions

    x, y = sp.symbols("x y")
    e = x
    for _ in range(60):
        e = e * e + e
    assert not _mentions(e, y) and _mentions(e + y, y) and _mentions(e, x) and not _mentions(2.0, x)
