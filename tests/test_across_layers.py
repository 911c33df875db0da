"""Schemes across layers (``[across_layers]``): Adams–Bashforth 2, heavy-ball and Nesterov momentum.

The stacks (NumPy ``forward_stack``/``vjp_stack``, torch ``Stack``) against plain NumPy loops written
here on the reference field of ``tests/reference.py``; the orders by series and their negative controls.
"""

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import sympy as sp
import torch

import reference
from splitformer.codegen.api import derive
from splitformer.codegen.verification.across_layers import (across_convergence, across_order_check, convergence_budget,
                                                          layer_counts)
from splitformer.symbolic.across_layers import AcrossLayers, adams_bashforth_weights
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.scheme_file import load_scheme, parse_scheme

SCHEMES = Path(__file__).parent / "schemes"
D, HEADS, FF, EPS, LAYERS = 8, 2, 12, 1e-5, 4


@pytest.fixture(scope="module", params=["adams-bashforth", "heavy-ball", "nesterov"])
def derived(request):
    scheme = load_scheme(SCHEMES / f"{request.param}.toml")
    return request.param, scheme, derive(scheme)


def _layers(module, seed):
    rng = np.random.default_rng(seed)
    layers = [reference.random_params(module.PARAMETERS, D, FF, rng) for _ in range(LAYERS)]
    final = {"gain": rng.standard_normal(D), "bias": rng.standard_normal(D)}
    return layers, final, rng.standard_normal((3, 5, D))


def _field(x, p):
    """``Δt G(x)`` of one layer (Δt = 1): the parallel pre-LN field, in plain NumPy."""
    return (reference.attention(reference.norm(x, p, "norm1", EPS), p, HEADS)
            + reference.feed_forward(reference.norm(x, p, "norm2", EPS), p))


def _plain_loop(method, layers, x, final):
    """The method as its textbook statement, one layer at a time."""
    if method == "adams-bashforth":
        previous = None
        for p in layers:
            g = _field(x, p)
            x = x + g if previous is None else x + 1.5 * g - 0.5 * previous
            previous = g
    else:
        beta = 0.5 if method == "heavy-ball" else 0.3
        v = np.zeros_like(x)
        for p in layers:
            y = x + beta * v if method == "nesterov" else x
            v = beta * v + _field(y, p)
            x = x + v
    return reference.layer_norm(x, final["gain"], final["bias"], EPS)


def test_numpy_and_torch_stacks_equal_the_plain_loop(derived):
    method, _, derivation = derived
    module = derivation.numpy_module()
    layers, final, x = _layers(module, 1)
    expected = _plain_loop(method, layers, x, final)
    out = module.forward_stack(x, layers, n_heads=HEADS, eps=EPS, final_norm=final)
    assert np.abs(out - expected).max() < 1e-12
    stack = derivation.torch_module().Stack(LAYERS, D, HEADS, FF, eps=EPS, dtype=torch.float64)
    stack.load_params(layers, final)
    assert np.abs(stack(torch.tensor(x)).detach().numpy() - expected).max() < 1e-12
    # control: the same layers stepped one after the other (no combination across layers)
    stepped = x
    for p in layers:
        stepped = module.forward(stepped, p, n_heads=HEADS, eps=EPS)
    assert np.abs(module.forward_stack(x, layers, n_heads=HEADS, eps=EPS) - stepped).max() > 1e-2


def test_vjp_stack_equals_torch_autograd_and_finite_differences(derived):
    method, _, derivation = derived
    module = derivation.numpy_module()
    layers, final, x = _layers(module, 2)
    grad_out = np.random.default_rng(3).standard_normal(x.shape)
    grad_u, grad_layers, grad_final = module.vjp_stack(x, layers, grad_out, n_heads=HEADS, eps=EPS, final_norm=final)
    stack = derivation.torch_module().Stack(LAYERS, D, HEADS, FF, eps=EPS, dtype=torch.float64)
    stack.load_params(layers, final)
    u = torch.tensor(x, requires_grad=True)
    (stack(u) * torch.tensor(grad_out)).sum().backward()
    assert np.abs(u.grad.numpy() - grad_u).max() < 1e-12
    for index, block in enumerate(stack.layers):
        for name, parameter in block.named_parameters():
            assert np.abs(parameter.grad.numpy() - grad_layers[index][name]).max() < 1e-12, (index, name)
    assert np.abs(stack.final_norm.gain.grad.numpy() - grad_final["gain"]).max() < 1e-12
    # the first layer's ffn.b_2 by central differences (a parameter the start-up step reads)
    direction = np.random.default_rng(4).standard_normal(D)

    def loss(t):
        moved = [dict(p) for p in layers]
        moved[0]["ffn.b_2"] = layers[0]["ffn.b_2"] + t * direction
        return float((module.forward_stack(x, moved, n_heads=HEADS, eps=EPS, final_norm=final) * grad_out).sum())

    numeric = (loss(1e-6) - loss(-1e-6)) / 2e-6
    assert abs(numeric - grad_layers[0]["ffn.b_2"] @ direction) < 1e-6 * max(1, abs(numeric))


def test_one_state_stacks_are_unchanged():
    """A scheme without [across_layers] emits the loop it always had (goldens hold the bytes)."""
    source = derive(load_scheme("parallel")).source("numpy")
    assert "velocity" not in source and "state = forward(state, params" in source


def test_adams_bashforth_weights_are_derived():
    assert adams_bashforth_weights(1) == (1,)
    assert adams_bashforth_weights(2) == (sp.Rational(3, 2), sp.Rational(-1, 2))
    assert adams_bashforth_weights(3) == (sp.Rational(23, 12), sp.Rational(-4, 3), sp.Rational(5, 12))


@pytest.mark.parametrize(("method", "scale", "order"), [
    (AcrossLayers("adams-bashforth"), 1, 2),
    (AcrossLayers("heavy-ball", sp.Rational(9, 10)), 10, 1),
    (AcrossLayers("nesterov", sp.Rational(1, 2)), 2, 1),
    (AcrossLayers("two-step", weights=(sp.Integer(2), sp.Integer(-1))), 1, 1),  # wrong weights: order drops
])
def test_series_orders(method, scale, order):
    result = method.order()
    assert (result.scale, result.order) == (scale, order)


def test_heavy_ball_leading_error_is_the_closed_form():
    """By hand: the scheme's step minus the exact flow's, −h² s²(1 + β)/2 f′f for heavy-ball with s = 1/(1 − β) (the
    sign of a block's leading error; a tester's finding: the series gave exact − scheme)."""
    beta = sp.Rational(1, 3)
    result = AcrossLayers("heavy-ball", beta).order()
    h, x = sp.symbols("h x")
    f = sp.Function("f")
    s = 1 / (1 - beta)
    assert sp.simplify(result.leading + h ** 2 * s ** 2 * (1 + beta) / 2 * f(x) * sp.diff(f(x), x)) == 0
    # numerically, on u' = s u from u = 1 with exact history v = 1 − e^{−s h}: (scheme − exact)/h² → the coefficient
    step, scale = 1e-4, float(s)
    scheme = 1 + float(beta) * (1 - math.exp(-scale * step)) + step
    coefficient = float((result.leading / h ** 2).subs(f(x), x).doit().subs(x, 1))
    assert (scheme - math.exp(scale * step)) / step ** 2 == pytest.approx(coefficient, rel=1e-3)


def _two_step(weights: str, order: int):
    text = (SCHEMES / "adams-bashforth.toml").read_text()
    return parse_scheme(text.replace('method = "adams-bashforth"', f'method = "two-step"\nweights = {weights}')
                        .replace("order = 2", f"order = {order}"))


def test_order_and_convergence_checks_hold_and_their_controls_fail():
    scheme = load_scheme(SCHEMES / "adams-bashforth.toml")
    check, recorded = across_order_check(scheme)
    assert check.holds and recorded["order"] == 2
    # as compare writes it, not in SymPy's f(x) and Derivative (an order auditor, s46)
    assert recorded["leading_error"] == "-5*G*h**3*(G*G'' + G'**2)/12" and "Derivative" not in check.detail
    convergence, study = across_convergence(scheme, 2)
    assert convergence.holds and abs(study.slope - 2) < 0.3
    assert "layers of Δt = 1/N_t) against u' = 1·G(u) over [0, 1] " in convergence.statement  # not 1/(1 N_t), 1/1
    wrong = _two_step('["2", "-1"]', 2)  # consistent weights of the wrong method claiming AB2's order
    check, recorded = across_order_check(wrong)
    assert not check.holds and recorded["order"] == 1
    convergence, study = across_convergence(wrong, 2)
    assert not convergence.holds and abs(study.slope - 1) < 0.3


def test_momentum_converges_to_the_scaled_flow_only():
    scheme = load_scheme(SCHEMES / "heavy-ball.toml")
    check, recorded = across_order_check(scheme)
    assert check.holds and recorded["order"] == 1 and recorded["consistent_scale"] == "2"
    assert across_convergence(scheme, 1)[0].holds
    assert "layers of Δt = 1/(2 N_t)) against u' = 2·G(u) over [0, 1/2] " in across_convergence(scheme, 1)[0].statement
    assert not across_convergence(scheme, 1, scale=1.0)[0].holds  # not the flow of G itself


@pytest.mark.parametrize(("table", "message"), [
    ('method = "leapfrog"', "unknown method 'leapfrog'"),
    ('method = "heavy-ball"', "needs a momentum β with 0 < β < 1"),
    ('method = "nesterov"\nmomentum = 1', "needs a momentum β with 0 < β < 1"),
    ('method = "adams-bashforth"\nweights = ["1", "0"]', "takes no weights (they are derived)"),
    ('method = "two-step"\nweights = ["1", "1"]', "2 weights summing to 1"),
    ('method = "two-step"\nweights = "1"', "across_layers.weights: expected a list"),
    ('method = "heavy-ball"\nmomentum = "1/2"\nbeta = 1', "across_layers.beta: unknown field"),
])
def test_bad_across_layers_tables_are_refused(table, message):
    text = (SCHEMES / "adams-bashforth.toml").read_text().replace('method = "adams-bashforth"', table)
    with pytest.raises(SplitformerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_scheme(text, "f.toml")


@pytest.mark.parametrize("momentum, message", [("true", "across_layers.momentum: expected a number, got bool"),
                                               ('"abc"', "across_layers.momentum: not a number: 'abc'")])
def test_a_bad_number_is_placed_once(momentum, message):
    """New user, s32: "f.toml: across_layers: f.toml: across_layers.momentum: …", the place said twice."""
    text = (SCHEMES / "adams-bashforth.toml").read_text().replace(
        'method = "adams-bashforth"', f'method = "heavy-ball"\nmomentum = {momentum}')
    with pytest.raises(SplitformerError) as error:
        parse_scheme(text, "f.toml")
    assert str(error.value).startswith(f"f.toml: {message}") and str(error.value).count("f.toml") == 1


class _Spoof(str):
    """Equal to and hashed as "heavy-ball", but printing other text (attack5 01)."""

    def __eq__(self, other):
        return other == "heavy-ball" or str.__eq__(self, other)

    __hash__ = lambda self: hash("heavy-ball")  # noqa: E731


def _edited(field, value):
    across = AcrossLayers("heavy-ball", momentum="1/2")
    object.__setattr__(across, field, value)
    return across


@pytest.mark.parametrize("across, message", [
    (AcrossLayers(_Spoof("heavy-ball\n  import os  #"), momentum="1/2"), "method: expected one of"),
    (_edited("method", "heavy-ball\n  import os  #"), "method: expected one of"),
    (_edited("momentum", 0.5), r"momentum: expected an exact rational"),
    (_edited("momentum", sp.Integer(2)), "needs a momentum"),
    (_edited("weights", [sp.Integer(1)]), "weights: expected a tuple"),
    (_edited("weights", (sp.Integer(1), sp.Integer(0))), "takes no weights"),
], ids=["str-subclass", "setattr-text", "float-momentum", "momentum-out-of-range", "list-weights", "extra-weights"])
def test_scheme_check_refuses_an_across_layers_edited_after_construction(across, message):
    """``Scheme.check`` (every scheme's path to emission) checks each field by exact type and value."""
    scheme = replace(load_scheme(SCHEMES / "heavy-ball.toml"), across_layers=across)
    with pytest.raises(SplitformerError, match=f"across_layers: .*{message}"):
        scheme.check()
    replace(scheme, across_layers=AcrossLayers("heavy-ball", momentum="1/2")).check()  # control


def test_a_step_that_is_not_one_euler_evaluation_is_refused():
    text = load_scheme("pre-ln").source.replace("splitting_order = 1\n", "")
    with pytest.raises(SplitformerError, match="one explicit Euler evaluation of the field"):
        parse_scheme(text + '\n[across_layers]\nmethod = "adams-bashforth"\n')
    causal = (SCHEMES / "adams-bashforth.toml").read_text().replace("final_norm = true", "final_norm = true\ncausal = true")
    with pytest.raises(SplitformerError, match="not supported with causal = true"):
        parse_scheme(causal)


def test_a_network_refuses_a_scheme_combined_across_layers(tmp_path):
    from importlib import resources

    from splitformer.symbolic.network_spec import load_network

    (tmp_path / "block.toml").write_text((SCHEMES / "heavy-ball.toml").read_text(), encoding="utf-8")
    network = (resources.files("splitformer.symbolic") / "networks" / "vit.toml").read_text(encoding="utf-8")
    (tmp_path / "net.toml").write_text(network.replace('scheme = "pre-ln"', 'scheme = "block.toml"'), encoding="utf-8")
    with pytest.raises(SplitformerError, match="heavy-ball across layers.*one layer at a time"):
        load_network(tmp_path / "net.toml")


def test_the_report_states_the_combination_and_its_order(derived):
    method, _, derivation = derived
    report = derivation.report
    order = "order 2 for the flow $u' = 1" if method == "adams-bashforth" else "order 1 for the flow $u' = "
    assert f"**Across layers ({method}).**" in report and order in report
    assert "Across layers" not in derive(load_scheme("parallel")).report


def test_the_stack_check_holds_and_fails_on_a_stack_stepping_one_layer_at_a_time(derived):
    from types import SimpleNamespace

    from splitformer.codegen.verification.structure import across_stack_check

    _, scheme, derivation = derived
    module = derivation.numpy_module()
    assert across_stack_check(scheme, module).holds

    def one_state(u, layers, **options):  # the loop of a one-state scheme
        for params in layers:
            u = module.forward(u, params, **options)
        return u

    assert not across_stack_check(scheme, SimpleNamespace(forward=module.forward, forward_stack=one_state)).holds


def test_the_check_report_lists_the_order_of_the_stack():
    from splitformer.codegen.verification.runner import CheckReport, _orders

    report = CheckReport()
    check = _orders(load_scheme(SCHEMES / "adams-bashforth.toml"), report)
    assert check.holds and report.orders["adams-bashforth"]["order"] == 2
    assert "adams-bashforth          2         —" in report.as_text() and "| `adams-bashforth` | 2 |" in report.as_markdown()


def test_derive_causal_is_refused_on_the_command_line_and_writes_nothing(tmp_path, capsys):
    from splitformer.codegen.cli import main

    code = main(["derive", str(SCHEMES / "adams-bashforth.toml"), "--causal", "--out", str(tmp_path / "out")])
    assert code == 2 and not (tmp_path / "out").exists()
    assert "not supported with causal = true" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["heavy-ball", "nesterov"])
def test_momentum_at_nine_tenths_converges_with_order_one(name):
    """The docs' β = 9/10 (new user, s32): 1 … 32 layers over [0, 1] integrate the flow of G over [0, 10] with a
    velocity that builds up over 10 layers, and the fitted order read 0.59; now 16 … 512 layers against the flow of G
    over [0, 1]. Control: the unscaled flow fails."""
    text = re.sub(r'momentum = "[0-9/]+"', 'momentum = "9/10"', (SCHEMES / f"{name}.toml").read_text())
    scheme = parse_scheme(text)
    assert float(scheme.across_layers.momentum) == 0.9
    check, study = across_convergence(scheme, 1)
    assert check.holds and study.steps == (16, 32, 64, 128, 256, 512) and abs(study.slope - 1) < 0.1, check.detail
    assert not across_convergence(scheme, 1, scale=1.0)[0].holds


def test_momentum_too_near_one_is_skipped_on_its_budget():
    """Review s32: the layers grow as 1/(1 − β), and β = 99999/100000 ran 4 million of them (killed at 150 s); past
    4096 layers the convergence check is skipped, saying why. Control: β = 99/100 runs (4096 layers)."""
    text = (SCHEMES / "heavy-ball.toml").read_text()
    for beta, skipped in (("999/1000", True), ("99/100", False)):
        scheme = parse_scheme(text.replace('momentum = "1/2"', f'momentum = "{beta}"'))
        check = convergence_budget(scheme)
        assert (check is not None) == skipped
        if skipped:
            assert check.holds and check.method == "skipped" and "32768 layers, more than the 4096" in check.detail
        else:
            assert layer_counts(scheme.across_layers)[-1] == 4096


def test_show_writes_the_update_across_layers_in_latex_and_text():
    """A tester's finding: ``show --format latex`` of a scheme combined across layers wrote one block's Euler step
    only: no second state v, no β, no u⁺ = u + v⁺ (the Markdown report had them)."""
    import subprocess
    import sys

    from latex_sanity import assert_renderable_align

    def show(*options):
        shown = subprocess.run([sys.executable, "-m", "splitformer", "show", str(SCHEMES / "heavy-ball.toml"), *options],
                               capture_output=True, text=True, timeout=600)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    latex = show("--format", "latex")
    assert r"u^{n+1} &= \Delta t\,G^{n}(w^{n}) + u^{n} + \frac{v^{n}}{2}" in latex
    assert r"v^{n+1} &= \Delta t\,G^{n}(w^{n}) + \frac{v^{n}}{2}" in latex
    assert_renderable_align(latex.strip())
    assert "w = u; u⁺ = D + u + v/2; v⁺ = D + v/2" in show()
    assert "v^{n+1}" not in subprocess.run([sys.executable, "-m", "splitformer", "show", "parallel", "--format", "latex"],
                                           capture_output=True, text=True, timeout=600).stdout  # the control
