"""Devito's adjoint tests of the emitted ``vjp``: the dot-product test and the Taylor test, each with its
control; they hold for the emitted code and fail for a wrong gradient."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from splitformer.codegen.verification import network_adjoint_tests as network_adjoint_tests_module
from splitformer.codegen.verification.adjoint_tests import adjoint_tests, scheme_adjoint_tests
from splitformer.codegen.verification.emitted import emitted_with_adjoint
from splitformer.codegen.verification.network_adjoint_tests import network_adjoint_tests
from splitformer.symbolic import derive, load_scheme

from conftest import ROOT


def _cube(x):
    return {"y": x["a"] ** 3 * np.sin(x["b"])}["y"]


def _cube_vjp(x, w, factor=3.0):
    return {"a": factor * x["a"] ** 2 * np.sin(x["b"]) * w, "b": x["a"] ** 3 * np.cos(x["b"]) * w}


def _slopes(detail: str) -> list[float]:
    return [float(value) for value in re.findall(r"slope (-?[0-9.]+)", detail)]


def _point():
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal(5), "b": rng.standard_normal(5)}


def test_a_right_gradient_passes_both_tests_with_slope_two():
    dot, taylor = adjoint_tests("cube", None, "a³ sin b", _cube, _cube_vjp, _point(), 1)
    assert dot.holds and taylor.holds, (dot.detail, taylor.detail)
    slope, control = _slopes(taylor.detail)
    assert abs(slope - 2) < 0.01 and abs(control - 1) < 0.05


def test_a_wrong_gradient_fails_both_tests():
    dot, taylor = adjoint_tests("cube", None, "a³ sin b", _cube,
                                lambda x, w: _cube_vjp(x, w, factor=2.9), _point(), 1)
    assert not dot.holds and not taylor.holds
    assert abs(_slopes(taylor.detail)[0] - 1) < 0.05  # the wrong gradient's own slope drops to 1


def test_emitted_vjp_of_a_scheme_passes_and_a_flipped_parameter_gradient_fails():
    scheme = load_scheme("pre-ln")
    module = emitted_with_adjoint(scheme, derive(scheme))
    checks = scheme_adjoint_tests(scheme, module)
    assert [check.id for check in checks] == ["adjoint-test/pre-ln/dot", "adjoint-test/pre-ln/taylor"]
    assert all(check.holds for check in checks), [check.detail for check in checks]

    def wrong_vjp(*args, **options):
        grad_u, grads = module.vjp(*args, **options)
        return grad_u, {**grads, "attn.W_k": -grads["attn.W_k"]}

    wrong = SimpleNamespace(forward=module.forward, vjp=wrong_vjp)
    assert not any(check.holds for check in scheme_adjoint_tests(scheme, wrong))


@pytest.mark.parametrize("name", ["unet-level", "resnet-block"])
def test_emitted_vjp_of_a_grid_network_passes(name):
    checks = network_adjoint_tests(name)
    assert [check.id for check in checks] == [f"adjoint-test/{name}/dot", f"adjoint-test/{name}/taylor"]
    assert all(check.holds for check in checks), [check.detail for check in checks]


def test_a_network_vjp_missing_a_transposed_convolution_gradient_fails(monkeypatch):
    real = network_adjoint_tests_module.network_module

    def wrong(name):
        module = real(name)
        vjp = module.vjp

        def wrong_vjp(*args, **options):
            grad_u, grads = vjp(*args, **options)
            return grad_u, {key: value for key, value in grads.items() if key != "up.W"}  # read as zero

        return SimpleNamespace(PARAMETERS=module.PARAMETERS, TRANSFER_PARAMETERS=module.TRANSFER_PARAMETERS,
                               forward=module.forward, vjp=wrong_vjp)

    monkeypatch.setattr(network_adjoint_tests_module, "network_module", wrong)
    assert not any(check.holds for check in network_adjoint_tests("unet-level"))


def _affine(x):
    return 3.0 * x["a"] - 2.0 * x["b"] + 0.5


def test_an_affine_map_has_no_h_squared_and_its_right_gradient_holds():
    """Φ linear in every input: r(h) is rounding at every h, no slope 2 to fit (a step that reads its memory only
    linearly, tests/plugins/support_mean.py's memory-mean, was refused so); the control still has slope 1."""
    dot, taylor = adjoint_tests("affine", None, "3a − 2b + 1/2", _affine,
                                lambda x, w: {"a": 3.0 * w, "b": -2.0 * w}, _point(), 1)
    assert dot.holds and taylor.holds, (dot.detail, taylor.detail)
    assert "affine along v" in taylor.detail and abs(_slopes(taylor.detail)[-1] - 1) < 0.05


@pytest.mark.parametrize("factor", [1.001, 1.0 + 1e-5])
def test_control_an_affine_maps_wrong_gradient_fails_the_taylor_test(factor):
    """A gradient off by 1e-3 or 1e-5 of an affine map: r(h) = h |δ·v| is no rounding, the slope fit says 1."""
    _, taylor = adjoint_tests("affine", None, "3a − 2b + 1/2", _affine,
                              lambda x, w: {"a": 3.0 * factor * w, "b": -2.0 * w}, _point(), 1)
    assert not taylor.holds and "affine" not in taylor.detail


def test_a_memory_read_only_linearly_has_its_adjoint_and_its_tests(tmp_path):
    """The memory-mean kind keeps no copy of the memory for its adjoint: the derived backward binds the memory's
    length only where a statement reads it (``mem`` is no argument of the backward), and its step is affine."""
    import splitformer

    splitformer.load_plugin(str(ROOT / "tests" / "plugins" / "support_mean.py"))
    path = tmp_path / "memory-only.toml"
    path.write_text('name = "memory-only"\nsummary = "the memory\'s mean added"\n[operators]\nnorm = "layer-norm"\n'
                    'mix = "memory-mean"\n[[steps]]\noperator = "mix"\nsolver = "explicit"\non = "norm"\n',
                    encoding="utf-8")
    report = splitformer.derive(str(path)).check(only=("adjoint-test",))
    assert [check.id for check in report.checks] == ["adjoint-test/memory-only/dot", "adjoint-test/memory-only/taylor",
                                                     "adjoint-test/memory-only/torch"]
    assert report.holds, [(check.id, check.detail) for check in report.checks]


def test_a_network_stepping_talking_heads_has_its_adjoint_tests(tmp_path):
    """Talking heads hold a control per head (shape (n_heads, n_heads)): the network's adjoint tests draw it at their
    2 heads (they raised ``KeyError: 'n_heads'``)."""
    import splitformer

    (tmp_path / "talk.toml").write_text(
        'name = "talk"\nsummary = "pre-ln with talking heads"\n[operators]\nnorm1 = "layer-norm"\n'
        'attn = { kind = "scored-attention", pre_talking_heads = true }\nnorm2 = "layer-norm"\nffn = "feed-forward"\n'
        '[[steps]]\noperator = "attn"\nsolver = "explicit"\non = "norm1"\n'
        '[[steps]]\noperator = "ffn"\nsolver = "explicit"\non = "norm2"\n', encoding="utf-8")
    (tmp_path / "vit-talk.toml").write_text(
        'name = "vit-talk"\nsummary = "ViT with talking-heads steps"\n[embedding]\noperator = "embed"\n'
        'kind = "patch-embedding"\n[steps]\nscheme = "talk.toml"\nactivation = "gelu"\nfinal_norm = true\n'
        '[readout]\noperator = "head"\nkind = "class-token-head"\n', encoding="utf-8")
    report = splitformer.derive(str(tmp_path / "vit-talk.toml")).check(only=("adjoint-test",))
    assert {check.id for check in report.checks} == {"adjoint-test/vit-talk/dot", "adjoint-test/vit-talk/taylor"}
    assert report.holds, [(check.id, check.detail) for check in report.checks]


@pytest.mark.parametrize("error", [1e-4, 1e-5, 1e-6])
def test_control_a_curvature_under_a_large_constant_is_not_taken_for_an_affine_map(error):
    """Φ = 1000 + sin a (the review's case): at h ≤ 1e-4 the curvature and a wrong gradient hide under the rounding
    of the constant part; at h = 1 they do not, so the Taylor test never calls Φ affine (the dot test fails them)."""
    x = {"a": np.random.default_rng(0).standard_normal(50)}
    dot, taylor = adjoint_tests("offset-sine", None, "1000 + sin a", lambda x: 1000.0 + np.sin(x["a"]),
                                lambda x, w: {"a": w * np.cos(x["a"]) * (1 + error)}, x, 3)
    assert "affine" not in taylor.detail and not dot.holds


@pytest.mark.parametrize("scale", [1e4, 1e5, 1e6])
def test_the_taylor_test_of_a_map_near_the_identity_lengthens_its_steps(scale, monkeypatch):
    """Φ = a + sin(a)/scale (review s32, F2: fields taking 1/1000 of a step failed with a right gradient, slope
    1.899): at h ≤ 1e-4 the curvature sits under the rounding of f, so the steps grow tenfold until the slope holds or
    r(h) stands clear of rounding. Controls: the old steps alone fail it, and a gradient without the small part fails
    both tests at the longer steps. How far they grow depends on f's last bits: at 1e6, r(1e-3) ≈ 1e-14 is at the
    rounding of Σ w Φ ≈ 40, and NumPy 2.4.6's sin needs h₀ = 0.01 where earlier builds held at 0.001."""
    from splitformer.codegen.verification import adjoint_tests as module

    x = {"a": np.random.default_rng(0).standard_normal(50)}

    def forward(x):
        return x["a"] + np.sin(x["a"]) / scale

    dot, taylor = adjoint_tests("near", None, "a + sin(a)/scale", forward,
                                lambda x, w: {"a": w * (1 + np.cos(x["a"]) / scale)}, x, 3)
    assert dot.holds and taylor.holds and "(h₀ = " in taylor.detail, taylor.detail  # h₀ shown: the steps grew
    dot, taylor = adjoint_tests("near", None, "a + sin(a)/scale", forward, lambda x, w: {"a": w}, x, 3)
    assert not dot.holds and not taylor.holds and abs(_slopes(taylor.detail)[0] - 1) < 0.1, taylor.detail
    monkeypatch.setattr(module, "_STEP_SCALES", (1.0,))
    assert not adjoint_tests("near", None, "a + sin(a)/scale", forward,
                             lambda x, w: {"a": w * (1 + np.cos(x["a"]) / scale)}, x, 3)[1].holds


def test_the_adjoint_tests_hold_on_a_block_whose_fields_take_a_thousandth_of_the_step():
    """The review's scheme (F2): pre-LN attention and feed-forward, each with fraction 1/1000; the Taylor test gave
    slope 1.899 with the dot test at 3e-12."""
    from splitformer.symbolic import parse_scheme

    text = (ROOT / "symbolic" / "schemes" / "pre-ln.toml").read_text(encoding="utf-8")
    scheme = parse_scheme(text.replace('solver = "explicit"', 'solver = "explicit"\nfraction = "1/1000"'))
    assert scheme.source.count('fraction = "1/1000"') == 2
    checks = scheme_adjoint_tests(scheme, emitted_with_adjoint(scheme, derive(scheme)))
    assert all(check.holds for check in checks), [check.detail for check in checks]


def test_both_tests_and_their_controls_hold_where_the_gradient_is_orthogonal_to_the_direction():
    """Φ = a² at a point where ⟨∇f, v⟩ = 0 (f = ⟨w, Φ⟩; v and w drawn as the tests draw them). There the dot test's
    sides are both the difference's rounding (their ratio 1: a false failure), so its gap is taken against 1e-3 |∇f|;
    and the old control, the gradient scaled by 1.01, moves nothing along v (its slope stays 2: a false failure, as on
    the review's pool step, control slope 1.141), where the gradient plus 1 % of its norm along v has slope 1.
    Controls: a gradient off by 1e-6 there fails the dot test; scaling the gradient is not seen."""
    rng = np.random.default_rng(5)
    v = rng.standard_normal(40)
    v /= np.linalg.norm(v)
    w = rng.standard_normal(40)
    a = np.random.default_rng(6).standard_normal(40)
    a -= (a @ (w * v)) / ((w * v) @ (w * v)) * (w * v)  # ⟨∇f, v⟩ = 2 Σ w a v = 0

    def tests(factor):
        return adjoint_tests("square", None, "a²", lambda x: x["a"] ** 2, lambda x, w: {"a": 2 * w * x["a"] * factor},
                             {"a": a}, 5)

    dot, taylor = tests(1.0)
    assert dot.holds and taylor.holds and abs(_slopes(taylor.detail)[1] - 1) < 0.1, (dot.detail, taylor.detail)
    assert not tests(1 + 1e-6 * np.sign(v))[0].holds
    assert abs(_slopes(tests(1.01)[1].detail)[0] - 2) < 0.1


@pytest.mark.parametrize("fraction", ["1/10000"])
def test_the_longer_taylor_steps_do_not_hide_a_gradient_error_the_short_ones_show(fraction):
    """Review s32 (H1): at this fraction a gradient of ffn.W_1 off by 0.1 % leaves r(h) under the rounding bound at
    the short steps, but as a clean a·h above f's rounding (slope 0.9); the steps grew until the curvature hid it and
    the Taylor test passed it. The short steps' linear term now keeps them; the right gradient still passes. (At
    1/1000000 the same error's a·h is below f's rounding at every short step: no float64 Taylor test tells it.)"""
    from splitformer.symbolic import parse_scheme

    text = (ROOT / "symbolic" / "schemes" / "pre-ln.toml").read_text(encoding="utf-8")
    scheme = parse_scheme(text.replace('solver = "explicit"', f'solver = "explicit"\nfraction = "{fraction}"'))
    module = emitted_with_adjoint(scheme, derive(scheme))

    def wrong_vjp(*args, **options):
        *gradients, params = module.vjp(*args, **options)
        return (*gradients, {**params, "ffn.W_1": 1.001 * params["ffn.W_1"]})

    assert all(check.holds for check in scheme_adjoint_tests(scheme, module))
    taylor = scheme_adjoint_tests(scheme, SimpleNamespace(forward=module.forward, vjp=wrong_vjp))[1]
    assert not taylor.holds and _slopes(taylor.detail)[0] < 1.1 and "h₀" not in taylor.detail, taylor.detail


def test_a_piecewise_affine_map_with_a_kink_before_a_quarter_step_holds():
    """A tester's grid file on a 1 × 1 grid (s43): convolutions and ReLUs, affine along v up to h = 1/10, a kink
    before h = 1/4; r(h) was rounding at the short steps, the slope fitted to rounding (0.166) failed a right
    gradient. Affine up to h = 1/100 holds now; control: a gradient off by 1e-6 along the direction fails."""
    def forward(x):
        a = x["a"]
        return 3 * a + np.maximum(a - 0.8, 0) + np.maximum(0.6 - a, 0)  # kinks 0.1 from the point, either way

    def vjp(scale):
        return lambda x, w: {"a": scale * w}

    checks = adjoint_tests("kinked", None, "a map with kinks", forward, vjp(3.0), {"a": np.array([0.7])}, seed=0)
    taylor = next(check for check in checks if check.id.endswith("taylor"))
    assert taylor.holds and "at h up to 0.01 too" in taylor.detail
    wrong = adjoint_tests("kinked", None, "a map with kinks", forward, vjp(3.0 + 1e-6), {"a": np.array([0.7])}, seed=0)
    assert not next(check for check in wrong if check.id.endswith("taylor")).holds
