"""Steps of the token positions computed with as numbers (``codegen.bool_values``; ``tests/plugins/running_means.py``).

Before, a strictly causal running mean's torch module failed in float64 (a count of bools divided in float32, then
an einsum of float32 and float64), its NumPy module turned a float32 state into float64, a step with ``H(0) = ½``
crashed ``check`` in the printer, two steps added as "or", and the first token, which sees no earlier one, was NaN
(0/0) where the evaluators' product rule gives 0. Every module now equals plain NumPy written here."""

import warnings

import numpy as np
import pytest
import torch

import splitformer
import splitformer.codegen.bool_values as bool_values

from conftest import ROOT, import_path

PLUGIN = ROOT / "tests" / "plugins" / "running_means.py"
#: A running mean's weight of the query's own token; a count's weight of the tokens before the last one.
KINDS = {"strict-running-mean": 0.0, "half-running-mean": 0.5, "inclusive-running-mean": 1.0, "step-count": 1.0,
         "third-count": 1 / 3, "strict-running-third": 0.0, "negative-count": None, "max-count": None,
         "shifted-running-mean": None, "negated-running-mean": 0.0, "two-thirds-running-mean": 0.0,
         "supported-running-mean": 0.0}
#: The strict running means' scales.
SCALES = {"strict-running-third": 1 / 3, "negated-running-mean": -1.0, "two-thirds-running-mean": 2 / 3}


def _scheme(kind: str) -> str:
    return f'name = "{kind}-step"\nsummary = "one explicit step"\n[operators]\nf = "{kind}"\n' \
           '[[steps]]\noperator = "f"\nsolver = "explicit"\n'


def _derived(folder, kind: str) -> dict:
    path = folder / f"{kind}.toml"
    path.write_text(_scheme(kind), encoding="utf-8")
    splitformer.derive(str(path)).write(folder / "out")
    name = f"{kind}-step".replace("-", "_")
    return {backend: import_path(folder / "out" / backend / f"{name}.py") for backend in ("numpy", "torch")}


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    splitformer.load_plugin(PLUGIN)
    folder = tmp_path_factory.mktemp("bool-values")
    return {kind: _derived(folder, kind) for kind in KINDS}


def _weights(kind: str, n: int) -> np.ndarray:
    """The operator's matrix over the tokens (positions 0, 1, …): a running mean's rows normalized, a row of no
    weight 0; a count's entries over n."""
    distance = np.arange(n)[:, None] - np.arange(n)[None, :]
    if kind == "negative-count":
        return -1.0 * (distance >= 0) / n
    if kind == "max-count":
        return ((distance >= 1) + 0.5 * (distance == 0)) / n
    if kind == "shifted-running-mean":
        weights = (distance > 1) + 0.5 * (distance == 1)
        total = weights.sum(1, keepdims=True)
        return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    if kind.endswith("count"):
        return ((distance >= 0) + KINDS[kind] * (distance >= 1)) / n
    weights = (distance > 0) + KINDS[kind] * (distance == 0)
    total = weights.sum(1, keepdims=True)
    return SCALES.get(kind, 1.0) * np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def _forward(modules, kind: str, backend: str, u: np.ndarray) -> np.ndarray:
    module = modules[kind][backend]
    if backend == "numpy":
        return module.forward(u, {})
    block = module.Block(u.shape[-1], 1, 4, dtype=getattr(torch, str(u.dtype)))
    with torch.no_grad():
        out = block(torch.from_numpy(u))
    assert out.dtype == getattr(torch, str(u.dtype))
    return out.numpy()


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-13), ("float32", 2e-6)])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_module_equals_plain_numpy_in_the_states_dtype(modules, kind, backend, dtype, tolerance):
    u = np.random.default_rng(0).standard_normal((2, 6, 4)).astype(dtype)
    expected = u.astype(float) + _weights(kind, 6) @ u.astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the strict mean's 1/0 outside its mask is discarded without a warning
        got = _forward(modules, kind, backend, u)
    assert got.dtype == np.dtype(dtype)
    assert np.abs(got - expected).max() < tolerance


@pytest.mark.parametrize("kind", ["strict-running-mean", "strict-running-third", "negative-count", "max-count",
                                  "shifted-running-mean", "negated-running-mean", "two-thirds-running-mean"])
def test_the_backwards_are_finite_and_equal_plain_numpys(modules, kind):
    """The first token's weights are 0, so its costate reaches no token; every other row as the weights' transpose:
    NumPy's ``vjp``, and torch's autograd and derived backward (autograd through ``torch.where`` of a quotient was
    NaN where the quotient divided by 0, though not selected)."""
    rng = np.random.default_rng(1)
    u, bar = rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 4))
    expected = bar + _weights(kind, 6).T @ bar
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        u_bar, _ = modules[kind]["numpy"].vjp(u, {}, bar)
        assert np.abs(u_bar - expected).max() < 1e-13
        for mode in ("autograd", "derived"):
            x = torch.from_numpy(u).requires_grad_()
            modules[kind]["torch"].Block(4, 1, 4, dtype=torch.float64, backward=mode)(x).backward(torch.from_numpy(bar))
            assert np.abs(x.grad.numpy() - expected).max() < 1e-13


@pytest.mark.parametrize("kind", ["strict-running-mean", "half-running-mean", "step-count", "third-count",
                                  "strict-running-third", "negative-count", "max-count", "shifted-running-mean"])
def test_check_holds_for_the_kinds_semantics_and_adjoint(kind, tmp_path):
    """The evaluators read ``H(0)`` from the step (they took 0 for every step) and make a product with a factor exactly
    0 zero before its reciprocal, as the emitted ``Masked`` does."""
    splitformer.load_plugin(PLUGIN)
    (tmp_path / "s.toml").write_text(_scheme(kind), encoding="utf-8")
    checks = splitformer.derive(str(tmp_path / "s.toml")).check(only="semantics,adjoint").checks
    assert checks and all(check.holds for check in checks), [(c.id, c.detail) for c in checks if not c.holds]


def test_control_without_the_numbers_the_modules_go_wrong(monkeypatch, tmp_path):
    """Negative control: with ``as_numbers`` the identity, the step count adds its steps as "or", torch's third of a
    step rounds to float32, torch's strict mean fails in float64 and NumPy's turns a float32 state into float64."""
    splitformer.load_plugin(PLUGIN)
    monkeypatch.setattr(bool_values, "as_numbers", lambda module: module)
    derived = {kind: _derived(tmp_path, kind) for kind in ("step-count", "third-count", "strict-running-mean")}
    u = np.random.default_rng(0).standard_normal((2, 6, 4))
    for kind, backend in (("step-count", "numpy"), ("third-count", "torch")):
        expected = u + _weights(kind, 6) @ u
        assert np.abs(_forward(derived, kind, backend, u) - expected).max() > 1e-9
    with pytest.raises(RuntimeError, match="expected scalar type"):
        _forward(derived, "strict-running-mean", "torch", u)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert derived["strict-running-mean"]["numpy"].forward(u.astype("float32"), {}).dtype == np.float64


def test_check_of_a_formula_infinite_at_the_first_token_fails_and_says_why(tmp_path):
    """``u |Ω| / ∫ H`` is u/0 at the first token: the exact evaluators raised ZeroDivisionError, reported as a crash
    of the semantics and adjoint checks; both now fail saying that the scheme divides by zero there."""
    splitformer.load_plugin(PLUGIN)
    (tmp_path / "s.toml").write_text(_scheme("inverse-count"), encoding="utf-8")
    checks = {check.id: check for check in
              splitformer.derive(str(tmp_path / "s.toml")).check(only="semantics,adjoint").checks}
    assert set(checks) == {"semantics/inverse-count-step", "adjoint/inverse-count-step/finite-difference",
                           "adjoint/inverse-count-step/negative-control"}
    for name in ("semantics/inverse-count-step", "adjoint/inverse-count-step/finite-difference"):
        assert checks[name].method == "numeric" and not checks[name].holds
        assert checks[name].detail.startswith("a formula of the scheme divides by zero at the check's point")
    assert checks["adjoint/inverse-count-step/negative-control"].method == "skipped"


def test_a_step_of_the_state_derives_and_its_derivative_is_the_steps(tmp_path):
    """``−H(u) u/2 + H(u, 1)/3``: its adjoint held ``DiracDelta(u)`` (no spelling: derive failed); a step's derivative
    is 0 wherever it is defined, so the step's gradient is ``1 − H(u)/2``."""
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "state_steps.py")
    modules = _derived(tmp_path, "state-steps")
    rng = np.random.default_rng(5)
    u, bar = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 4))
    u[0, 0, :2] = 0.0  # the steps' value at 0: H(0, 0) = 0, H(0, 1) = 1
    expected = u - np.maximum(u, 0) / 2 + (u >= 0) / 3
    assert np.abs(modules["numpy"].forward(u, {}) - expected).max() < 1e-15
    u_bar, _ = modules["numpy"].vjp(u, {}, bar)
    assert np.abs(u_bar - bar * (1 - (u > 0) / 2)).max() < 1e-15
    for mode in ("autograd", "derived"):
        x = torch.from_numpy(u).requires_grad_()
        modules["torch"].Block(4, 1, 4, dtype=torch.float64, backward=mode)(x).backward(torch.from_numpy(bar))
        assert np.abs(x.grad.numpy() - bar * (1 - (u > 0) / 2)).max() < 1e-15
    (tmp_path / "s.toml").write_text(_scheme("state-steps"), encoding="utf-8")
    checks = splitformer.derive(str(tmp_path / "s.toml")).check(only="semantics,adjoint").checks
    assert checks and all(check.holds for check in checks), [(c.id, c.detail) for c in checks if not c.holds]


def test_the_adjoint_check_of_a_derivative_exactly_zero_has_a_verdict(tmp_path):
    """``2u + |H(u, 0) − H(u, 1)|``: the adjoint with a sign flipped (the check's negative control) has the directional
    derivative exactly 0; the relative gap divided by it (SymPy's ``zoo``, then a crash comparing it)."""
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "state_steps.py")
    (tmp_path / "s.toml").write_text(_scheme("step-gap"), encoding="utf-8")
    checks = splitformer.derive(str(tmp_path / "s.toml")).check(only="adjoint").checks
    assert [check.method for check in checks] == ["numeric", "numeric"], [(c.id, c.detail) for c in checks]
    assert checks[0].holds and checks[1].holds, [check.detail for check in checks]  # the control fails as it should


def test_a_sum_over_other_tokens_than_those_counted_keeps_its_infinity(tmp_path):
    """``∫ H(δ, 1) u / ∫ H(δ, 0)``: at the first token the count is 0 and the sum is its own state, so the formula is
    ∞; it was masked by the count (0), silently, where only a sum over the counted tokens is 0. Elsewhere plain NumPy."""
    splitformer.load_plugin(PLUGIN)
    modules = {"mismatched-mean": _derived(tmp_path, "mismatched-mean")}
    u = np.random.default_rng(6).standard_normal((2, 5, 4))
    distance = np.arange(5)[:, None] - np.arange(5)[None, :]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = u + ((distance >= 0) @ u) / (distance > 0).sum(1)[:, None]
        for backend in ("numpy", "torch"):
            got = _forward(modules, "mismatched-mean", backend, u)
            assert np.isinf(got[:, 0]).all() and np.abs(got[:, 1:] - expected[:, 1:]).max() < 1e-13


def test_a_step_times_an_integer_keeps_a_float32_state_float32(tmp_path):
    """``2 H(u) u``: the step was left a bool beside the integer, and NumPy's int64 product made the result float64."""
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "state_steps.py")
    modules = _derived(tmp_path, "twice-relu")
    u = np.random.default_rng(7).standard_normal((2, 5, 4)).astype(np.float32)
    got = modules["numpy"].forward(u, {})
    assert got.dtype == np.float32 and np.abs(got - (u + 2 * np.maximum(u, 0))).max() < 1e-6
    u_bar, _ = modules["numpy"].vjp(u, {}, np.ones_like(u))
    assert u_bar.dtype == np.float32 and np.abs(u_bar - (1 + 2 * (u > 0))).max() < 1e-6


@pytest.mark.parametrize("attention", [False, True], ids=["alone", "after-an-attention"])
def test_a_kind_causal_by_its_steps_decodes_with_a_cache_as_the_full_pass(tmp_path, attention):
    """A running mean reads no χ: its causal Stack kept no cache (a language model refused it), and beside an
    attention, whose cache the Stack keeps, each cached step averaged the new tokens alone (a tester: off by up to
    4.0, which only ``check``'s causality statement caught). Now the states and positions it reads at the keys are
    cached: token by token equals the full pass in NumPy and torch, and a LanguageModel decodes with it."""
    from splitformer.codegen.nn import LanguageModel

    splitformer.load_plugin(PLUGIN)
    scheme = tmp_path / "s.toml"
    steps = '[[steps]]\noperator = "attn"\nsolver = "explicit"\n' if attention else ""
    scheme.write_text('name = "mean-decoding"\nsummary = "s"\ncausal = true\n[operators]\n'
                      + ('attn = "attention"\n' if attention else "") + 'pk = "inclusive-running-mean"\n'
                      + steps + '[[steps]]\noperator = "pk"\nsolver = "explicit"\n')
    derivation = splitformer.derive(str(scheme))
    numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal([{"d": 8}[axis] for axis in axes]) * 0.5
              for name, axes in numpy_module.PARAMETERS.items()}
    u = rng.standard_normal((2, 6, 8))
    full, cache = numpy_module.forward(u, params, n_heads=2), {}
    steps = np.concatenate([numpy_module.forward(u[:, i:i + 1], params, n_heads=2, cache=cache) for i in range(6)], 1)
    assert np.abs(steps - full).max() < 1e-12 and "pk.u_k" in cache and "pk.pos_k" in cache
    block = torch_module.Block(8, 2, 8, dtype=torch.float64)
    block.load_params(params)
    with torch.no_grad():
        full, cache = block(torch.from_numpy(u)), {}
        steps = torch.cat([block(torch.from_numpy(u[:, i:i + 1]), cache=cache) for i in range(6)], 1)
    assert (steps - full).abs().max() < 1e-12
    model = LanguageModel(str(scheme), 16, d_model=8, n_heads=2, n_layers=2, dtype=torch.float64)
    tokens = torch.randint(0, 16, (1, 3))
    with torch.no_grad():
        generated = model.generate(tokens, 4, greedy=True)  # with the cache, and without it: the reference
        assert torch.equal(generated, model.generate(tokens, 4, greedy=True, use_cache=False))


def test_a_language_model_of_a_scheme_without_a_cache_says_so():
    """Control: a module derived without causal has no cache to decode with."""
    from splitformer.codegen.nn import stack_module
    from splitformer.symbolic.errors import SplitformerError

    with pytest.raises(SplitformerError, match="derive it with causal=True"):
        stack_module(splitformer.derive("pre-ln").torch_module(), causal=True)


def test_a_masked_factor_that_overflows_is_zero_by_its_mask(tmp_path):
    """``H(p(x) − p(x̃)) e^{p(x̃) − p(x)} / count`` at 800 tokens: ``e^{799}`` outside the step. Written as the mask
    times the rest (the shortcut where the mask is what the count counts, second review), 0 · ∞ was NaN in 360 of
    3200 outputs and in torch's gradients, while check, at 6 tokens, held."""
    splitformer.load_plugin(PLUGIN)
    modules = _derived(tmp_path, "decayed-running-mean")
    tokens = 800
    u = np.random.default_rng(9).standard_normal((1, tokens, 4))
    query, key = np.meshgrid(np.arange(tokens, dtype=float), np.arange(tokens, dtype=float), indexing="ij")
    earlier = query > key
    weights = np.where(earlier, np.exp(np.minimum(key - query, 0)), 0) / np.maximum(earlier.sum(1, keepdims=True), 1)
    with np.errstate(over="ignore"):  # e^{799} is computed outside the mask, then not selected
        assert np.abs(modules["numpy"].forward(u, {}) - (u + weights @ u)).max() < 1e-12
    x = torch.from_numpy(u).requires_grad_()
    out = modules["torch"].Block(4, 1, 4, dtype=torch.float64)(x)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_a_mask_that_its_denominator_counts_is_computed_once(modules):
    """The strict running mean's weight ``H / Σ H``: the mask ``H ≠ 0`` makes the count ≥ 1, so its count is made
    safe at its own shape and the N² comparison is computed once (twice: 2.7× the statement's time). Control: the
    shifted mean's mask (a step with ½ at 0, no bool) takes the general form, its mask twice."""
    import inspect

    def weights_line(kind: str) -> str:
        source = inspect.getsource(modules[kind]["numpy"].forward)
        return next(line for line in source.splitlines() if line.strip().startswith("f_w = "))

    for kind in ("strict-running-mean", "supported-running-mean"):  # a mask of one factor, of two (χ H)
        line = weights_line(kind)
        assert line.count("> 0)") == 1 and "np.where(t1" in line, line
    assert weights_line("shifted-running-mean").count("> 0)") > 1


@pytest.mark.parametrize("kind, refused", [("negative-count", True), ("step-count", True),
                                           ("strict-running-mean", False)])
def test_a_kind_dividing_by_the_count_of_every_token_refuses_a_cache(tmp_path, kind, refused):
    """A reviewer's finding: with every kind's reads at keys cached, a count divided by |Ω_x| (the count of every
    token, which a cached step does not see) decoded other tokens with the cache than without, silently. Its emitted
    code refuses a cache by name now, as for χ(x̃, x); a running mean (control) decodes with it."""
    splitformer.load_plugin(PLUGIN)
    scheme = tmp_path / "s.toml"
    scheme.write_text(f'name = "counted"\nsummary = "s"\ncausal = true\n[operators]\nattn = "attention"\n'
                      f'pk = "{kind}"\n[[steps]]\noperator = "attn"\nsolver = "explicit"\n'
                      '[[steps]]\noperator = "pk"\nsolver = "explicit"\n')
    module = splitformer.derive(str(scheme)).numpy_module()
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal([{"d": 8}[axis] for axis in axes]) for name, axes in module.PARAMETERS.items()}
    u = rng.standard_normal((1, 4, 8))
    if refused:
        with pytest.raises(ValueError, match=f"cache: {kind} reads the support with a key in the query's place, "
                                             r"χ\(x̃, x\), or the count of every token, \|Ω_x\|"):
            module.forward(u, params, n_heads=2, cache={})
    else:
        cache = {}
        steps = np.concatenate([module.forward(u[:, i:i + 1], params, n_heads=2, cache=cache) for i in range(4)], 1)
        assert np.abs(steps - module.forward(u, params, n_heads=2)).max() < 1e-12
