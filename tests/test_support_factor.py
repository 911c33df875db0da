"""A plug-in kind whose formula reads the support χ as a factor (``tests/plugins/support_mean.py``: the mean over the
tokens a query sees). Attack 24: it derived, but its torch Block crashed on every call (torch's einsum has no bool)
and so did both network modules (they handed the step no χ). Now every module computes what plain NumPy does."""

import warnings

import numpy as np
import pytest
import torch

import splitformer

from conftest import ROOT, import_path, plugin_scheme

PLUGIN = ROOT / "tests" / "plugins" / "support_mean.py"
SCHEME = plugin_scheme("mean-step", norm1="layer-norm", mix="support-mean")
NETWORK = '''name = "vit-mean"
summary = "a ViT whose steps are the support mean"
[embedding]
operator = "embed"
kind = "patch-embedding"
[steps]
scheme = "mean-step.toml"
final_norm = true
[readout]
operator = "head"
kind = "class-token-head"
'''
EPS = 1e-5


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    splitformer.load_plugin(PLUGIN)
    folder = tmp_path_factory.mktemp("support")
    (folder / "mean-step.toml").write_text(SCHEME, encoding="utf-8")
    (folder / "vit-mean.toml").write_text(NETWORK, encoding="utf-8")
    splitformer.derive(str(folder / "mean-step.toml")).write(folder / "out")
    splitformer.derive(str(folder / "vit-mean.toml")).write(folder / "out")
    return {(backend, name): import_path(folder / "out" / backend / f"{name}.py")
            for backend in ("numpy", "torch") for name in ("mean_step", "vit_mean")}


def _reference(u, params, padding):
    """One step written out: u + (mean over the visible tokens of LN(u)) W + b."""
    centred = u - u.mean(-1, keepdims=True)
    normed = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + EPS) * params["norm1.gain"] + params["norm1.bias"]
    visible = (~padding).astype(float)[:, None, :]  # χ[b, i, j]: every query sees the unpadded keys
    mean = visible @ normed / visible.sum(-1, keepdims=True)
    return u + mean @ params["mix.W"] + params["mix.b"]


def _inputs(seed):
    rng = np.random.default_rng(seed)
    params = {"norm1.gain": rng.uniform(0.5, 1.5, 8), "norm1.bias": rng.standard_normal(8),
              "mix.W": rng.standard_normal((8, 8)) / 3, "mix.b": rng.standard_normal(8)}
    padding = np.zeros((2, 5), dtype=bool)
    padding[0, 3:] = True
    return rng.standard_normal((2, 5, 8)), params, padding


def test_the_numpy_and_torch_blocks_compute_the_mean_over_the_support(modules):
    u, params, padding = _inputs(0)
    expected = _reference(u, params, padding)
    numpy_out = modules["numpy", "mean_step"].forward(u, params, n_heads=2, key_padding_mask=padding)
    assert np.abs(numpy_out - expected).max() < 1e-12
    block = modules["torch", "mean_step"].Block(8, 2, 8, dtype=torch.float64).load_params(params)
    torch_out = block(torch.from_numpy(u), src_key_padding_mask=torch.from_numpy(padding))
    assert np.abs(torch_out.detach().numpy() - expected).max() < 1e-12
    assert np.abs(block(torch.from_numpy(u)).detach().numpy() - _reference(u, params, 0 * padding)).max() < 1e-12


def test_the_torch_blocks_derived_backward_equals_autograd(modules):
    u, params, padding = _inputs(1)
    gradients = {}
    for mode in ("autograd", "derived"):
        block = modules["torch", "mean_step"].Block(8, 2, 8, dtype=torch.float64, backward=mode).load_params(params)
        x = torch.from_numpy(u).requires_grad_()
        (block(x, src_key_padding_mask=torch.from_numpy(padding)) ** 2).sum().backward()
        gradients[mode] = [x.grad.numpy(), *(p.grad.numpy() for p in block.parameters())]
    assert all(np.abs(a - b).max() < 1e-10 for a, b in zip(*gradients.values()))


def _vit_reference(images, params, patch):
    """The ViT of ``NETWORK`` written out: patches embedded, the class token first, positions added, one step of
    ``_reference`` with every token visible, the final LayerNorm; (final states, the head's logits of the class
    token)."""
    batch, channels, rows, cols = images.shape
    patches = images.reshape(batch, channels, rows // patch, patch, cols // patch, patch)
    tokens = np.einsum("bcprqs,crsl->bpql", patches, params["embed.W"]).reshape(batch, -1, params["embed.b"].size)
    cls = np.broadcast_to(params["embed.cls"], (batch, 1, params["embed.cls"].size))
    u = np.concatenate([cls, tokens + params["embed.b"]], axis=1) + params["embed.pos"]
    step = {name[len("layers.0."):]: value for name, value in params.items() if name.startswith("layers.0.")}
    u = _reference(u, step, np.zeros(u.shape[:2], dtype=bool))
    centred = u - u.mean(-1, keepdims=True)
    hidden = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + EPS) * params["final_norm.gain"] + \
        params["final_norm.bias"]
    return hidden, hidden[:, 0] @ params["head.W"] + params["head.b"]


def test_both_network_modules_run_the_step_with_the_whole_support(modules):
    """A network's tokens are all visible (χ ≡ 1): its NumPy and torch modules equal the network written out in
    plain NumPy."""
    numpy_net, torch_net = modules["numpy", "vit_mean"], modules["torch", "vit_mean"]
    rng = np.random.default_rng(2)
    shapes = {"n_channels": 3, "patch_size": 2, "d": 8, "n_tokens": 5, "n_classes": 4, "d_ff": 8}
    params = {name: rng.standard_normal(tuple(shapes[axis] for axis in axes))
              for name, axes in {**numpy_net.PARAMETERS, **numpy_net.HEAD_PARAMETERS}.items()}
    params |= {f"layers.0.{name}": rng.standard_normal(tuple(shapes[axis] for axis in axes))
               for name, axes in numpy_net.LAYER_PARAMETERS.items()}
    images = rng.standard_normal((2, 3, 4, 4))
    expected, logits = _vit_reference(images, params, 2)
    assert np.abs(numpy_net.forward(images, params, patch_size=2, n_heads=2, eps=EPS) - expected).max() < 1e-12
    assert np.abs(numpy_net.logits(images, params, patch_size=2, n_heads=2, eps=EPS) - logits).max() < 1e-12
    single = {name: value.astype(np.float32) for name, value in params.items()}
    assert numpy_net.forward(images.astype(np.float32), single, patch_size=2, n_heads=2, eps=EPS).dtype == np.float32
    model = torch_net.Model(n_layers=1, d_model=8, n_heads=2, d_ff=8, n_channels=3, patch_size=2, image_size=(4, 4),
                            n_classes=4, eps=EPS, dtype=torch.float64).load_params(params)
    got = model(torch.from_numpy(images)).detach().numpy()
    assert np.abs(got - expected).max() < 1e-12


def _derived(tmp_path, kind):
    (tmp_path / "step.toml").write_text(f'name = "step"\nsummary = "s"\n[operators]\nmix = "{kind}"\n[[steps]]\n'
                                        'operator = "mix"\nsolver = "explicit"\n', encoding="utf-8")
    derivation = splitformer.derive(str(tmp_path / "step.toml"))
    return derivation.numpy_module(), derivation.torch_module()


def test_a_support_read_only_inside_a_product_is_whole_without_a_mask(modules, tmp_path):
    """Review of attack 24's fix: χ read only by a contraction was handed as None when no mask was given."""
    numpy_module, torch_module = _derived(tmp_path, "support-sum")
    u = np.random.default_rng(4).standard_normal((2, 5, 4))
    expected = u + np.ones((5, 5)) @ u / (u**2).sum(1, keepdims=True)
    assert np.abs(numpy_module.forward(u, {}, n_heads=1) - expected).max() < 1e-12
    block = torch_module.Block(4, 1, 4, dtype=torch.float64)
    assert np.abs(block(torch.from_numpy(u)).detach().numpy() - expected).max() < 1e-12


@pytest.mark.parametrize("masked", [False, True])
def test_the_memorys_support_read_as_a_factor(modules, tmp_path, masked):
    """χ_m (``memory_key_padding_mask``) as a factor: torch's einsum took it as bool, and without a mask it was None."""
    numpy_module, torch_module = _derived(tmp_path, "memory-mean")
    rng = np.random.default_rng(5)
    u, memory = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 3, 4))
    mask = np.array([[False, False, True], [False, False, False]]) if masked else None
    visible = np.ones((2, 3)) if mask is None else (~mask).astype(float)
    expected = u + visible[:, None, :] @ memory / visible.sum(1)[:, None, None]
    got = numpy_module.forward(u, memory, {}, n_heads=1, memory_key_padding_mask=mask)
    assert np.abs(got - expected).max() < 1e-12
    block = torch_module.Block(4, 1, 4, dtype=torch.float64)
    got = block(torch.from_numpy(u), torch.from_numpy(memory),
                memory_key_padding_mask=None if mask is None else torch.from_numpy(mask))
    assert np.abs(got.detach().numpy() - expected).max() < 1e-12


def test_a_mean_over_no_key_is_zero_and_the_adjoint_tests_hold(modules, tmp_path):
    """Padding key 0 under a causal mask leaves query 0 no key: ``∫ χ u / ∫ χ`` is 0/0 there. The mean is 0 there,
    as the evaluators' product rule and the softmax's empty row say (``codegen.bool_values``; before: NaN, the
    adjoint tests failed, and the semantics check passed by comparing NaN with Python's ``max``)."""
    u, params, padding = _inputs(2)
    padding[:] = False
    padding[1, 0] = True
    visible = (~padding)[:, None, :] & np.tril(np.ones((5, 5), dtype=bool))
    counts = visible.sum(-1, keepdims=True)
    centred = u - u.mean(-1, keepdims=True)
    normed = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + EPS) * params["norm1.gain"] + params["norm1.bias"]
    mean = np.divide(visible @ normed, counts, out=np.zeros_like(u), where=counts > 0)
    expected = u + mean @ params["mix.W"] + params["mix.b"]
    assert counts[1, 0, 0] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = modules["numpy", "mean_step"].forward(u, params, n_heads=2, key_padding_mask=padding, causal=True)
    assert np.abs(got - expected).max() < 1e-12
    block = modules["torch", "mean_step"].Block(8, 2, 8, dtype=torch.float64).load_params(params)
    got = block(torch.from_numpy(u), src_key_padding_mask=torch.from_numpy(padding), causal=True)
    assert np.abs(got.detach().numpy() - expected).max() < 1e-12
    (tmp_path / "mean-step.toml").write_text(SCHEME, encoding="utf-8")
    checks = splitformer.derive(str(tmp_path / "mean-step.toml")).check(only="adjoint-test,semantics").checks
    assert {"semantics/mean-step/emitted", "adjoint-test/mean-step/dot", "adjoint-test/mean-step/torch"} <= \
        {check.id for check in checks}
    assert all(check.holds for check in checks), [c.detail for c in checks if not c.holds]


def _torch_reference(u, params, visible):
    """One step in plain torch, the mean 0 over an empty support (its count read as 1 there, so that autograd never
    divides by 0)."""
    centred = u - u.mean(-1, keepdim=True)
    normed = centred / torch.sqrt((centred**2).mean(-1, keepdim=True) + EPS) * params["norm1.gain"] + params["norm1.bias"]
    counts = visible.sum(-1, keepdim=True)
    mean = torch.where(counts > 0, visible @ normed / torch.where(counts > 0, counts, torch.ones_like(counts)), 0)
    return u + mean @ params["mix.W"] + params["mix.b"]


def test_the_gradients_at_a_query_with_no_key_are_finite_and_exact(modules):
    """torch's autograd through the emitted block was NaN in every parameter (the quotient's 0/0, though not selected
    by ``torch.where``), and a feature of the mean exactly 0 on every token had its gradient dropped (the mask was
    the numerator ≠ 0): autograd, the derived backward and plain torch now agree, in every parameter."""
    u, params, padding = _inputs(3)
    padding[:] = False
    padding[1, 0] = True
    params["norm1.gain"][0] = params["norm1.bias"][0] = 0.0  # feature 0 of the mean is 0 at every token
    visible = torch.from_numpy(((~padding)[:, None, :] & np.tril(np.ones((5, 5), dtype=bool))).astype(float))
    bar = torch.from_numpy(np.random.default_rng(4).standard_normal(u.shape))
    leaves = {name: torch.from_numpy(value.copy()).requires_grad_() for name, value in params.items()}
    x = torch.from_numpy(u).requires_grad_()
    _torch_reference(x, leaves, visible).backward(bar)
    expected = {"u": x.grad, **{name: leaf.grad for name, leaf in leaves.items()}}
    for mode in ("autograd", "derived"):
        block = modules["torch", "mean_step"].Block(8, 2, 8, dtype=torch.float64, backward=mode).load_params(params)
        x = torch.from_numpy(u).requires_grad_()
        block(x, src_key_padding_mask=torch.from_numpy(padding), causal=True).backward(bar)
        got = {"u": x.grad, **{name: parameter.grad for name, parameter in block.named_parameters()}}
        for name, gradient in expected.items():
            assert torch.isfinite(got[name]).all() and (got[name] - gradient).abs().max() < 1e-12, (mode, name)


def _two_hop_reference(u, padding, causal):
    """``u + Σ_j c[i, j] u[j]/Σ_j c[i, j]`` with ``c[i, j] = Σ_n χ[i, n] χ[n, j]/Σ_n χ[i, n]``, in float64."""
    visible = np.broadcast_to(~padding[:, None, :], (len(u), u.shape[1], u.shape[1])).astype(float)
    if causal:
        visible = visible * np.tril(np.ones((u.shape[1], u.shape[1])))
    reach = visible @ visible / visible.sum(-1, keepdims=True)
    return u + reach @ u / reach.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
def test_a_contraction_of_supports_alone_counts_in_the_states_dtype(modules, tmp_path, causal):
    """Σ_n χ[i, n] χ[n, j]: NumPy's einsum of two bool arrays computed in bool (1 + 1 = 1: 0.26 off with causal χ),
    torch's had no bool ("bmm" not implemented), and NumPy's integer counts made a float32 forward float64. Before
    that, the derived adjoint (a sum over j holding Σ_n c[j, n]) could not be lowered: the inner sum was taken out
    at the outer sum's axes, where j is not one."""
    numpy_module, torch_module = _derived(tmp_path, "two-hop-mean")
    rng = np.random.default_rng(6)
    u, padding = rng.standard_normal((2, 5, 4)), np.zeros((2, 5), dtype=bool)
    padding[0, 3:] = True
    expected = _two_hop_reference(u, padding, causal)
    assert np.abs(numpy_module.forward(u, {}, n_heads=1, key_padding_mask=padding, causal=causal) - expected).max() < 1e-12
    single = numpy_module.forward(u.astype(np.float32), {}, n_heads=1, key_padding_mask=padding, causal=causal)
    assert single.dtype == np.float32 and np.abs(single - expected).max() < 1e-5
    block = torch_module.Block(4, 1, 4, dtype=torch.float64)
    got = block(torch.from_numpy(u), src_key_padding_mask=torch.from_numpy(padding), causal=causal)
    assert np.abs(got.detach().numpy() - expected).max() < 1e-12
    gradients = {}
    for mode in ("autograd", "derived"):
        x = torch.from_numpy(u).requires_grad_()
        step = torch_module.Block(4, 1, 4, dtype=torch.float64, backward=mode)
        (step(x, src_key_padding_mask=torch.from_numpy(padding), causal=causal) ** 2).sum().backward()
        gradients[mode] = x.grad.numpy()
    assert np.abs(gradients["derived"] - gradients["autograd"]).max() < 1e-10


@pytest.mark.parametrize("kind", ["support-mean", "support-sum", "memory-mean"])
def test_a_float32_forward_stays_float32(modules, tmp_path, kind):
    """A count of the support (``Σ_n χ[i, n]``) was NumPy's int64, and a float32 quotient by it float64."""
    numpy_module, _ = _derived(tmp_path, kind)
    rng = np.random.default_rng(7)
    u = rng.standard_normal((2, 5, 4)).astype(np.float32)
    params = {name: rng.standard_normal(tuple(4 for _ in axes)).astype(np.float32)
              for name, axes in numpy_module.PARAMETERS.items()}
    memory = (rng.standard_normal((2, 3, 4)).astype(np.float32),) if kind == "memory-mean" else ()
    assert numpy_module.forward(u, *memory, params, n_heads=1).dtype == np.float32


def test_a_float_mask_is_refused_where_a_contraction_reads_the_support(modules, tmp_path):
    """A float mask holds log-weights (0, −∞), not an indicator: a formula reading χ as a factor refuses it, a
    contraction reading it too (before, only an elementwise map or a sum did)."""
    _, torch_module = _derived(tmp_path, "support-sum")
    block = torch_module.Block(4, 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="must be bool here"):
        block(torch.zeros(2, 5, 4, dtype=torch.float64), src_mask=torch.zeros(5, 5, dtype=torch.float64))


def test_a_product_of_supports_where_a_softmax_reads_them_too_is_refused(modules, tmp_path):
    """Review 25: beside an attention (whose softmax needs χ as bool), two-hop's Σ_n χ[i, n] χ[n, j] counted in bool
    in NumPy (0.41 off, causal) and crashed torch: refused in one line. Control: beside an attention, the support
    mean (χ times a field) is emitted and equals the two substeps run one after the other."""
    def scheme(*kinds):
        steps = "".join(f'[[steps]]\noperator = "{kind.split("-")[0]}"\nsolver = "explicit"\n' for kind in kinds)
        operators = "".join(f'{kind.split("-")[0]} = "{kind}"\n' for kind in kinds)
        name = "-".join(kind.split("-")[0] for kind in kinds)
        (tmp_path / f"{name}.toml").write_text(f'name = "{name}"\nsummary = "s"\n[operators]\n{operators}{steps}',
                                               encoding="utf-8")
        return splitformer.derive(str(tmp_path / f"{name}.toml")).numpy_module()

    with pytest.raises(splitformer.SplitformerError, match="a product of the support χ alone, where a softmax reads "
                       "it too, cannot be emitted yet"):
        scheme("attention", "two-hop-mean")
    both, attention, mean = scheme("attention", "support-mean"), scheme("attention"), scheme("support-mean")
    rng = np.random.default_rng(8)
    u = rng.standard_normal((2, 5, 4))
    params = {name: rng.standard_normal(tuple(4 for _ in axes)) / 2 for name, axes in both.PARAMETERS.items()}
    first = attention.forward(u, {name: value for name, value in params.items() if name.startswith("attention.")},
                              n_heads=1, causal=True)
    expected = mean.forward(first, {name: value for name, value in params.items() if name.startswith("support.")},
                            n_heads=1, causal=True)
    assert np.abs(both.forward(u, params, n_heads=1, causal=True) - expected).max() < 1e-12


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")
def test_control_a_mean_of_nan_fails_the_semantics_check(modules, monkeypatch, tmp_path):
    """Negative control: without ``as_numbers`` the emitted mean is NaN (0/0) where query 0 sees no key, where the
    evaluator's is finite. The semantics check fails and names the entries; it passed before, since Python's ``max``
    of the error per case skipped a NaN after a finite one."""
    import splitformer.codegen.bool_values as bool_values

    monkeypatch.setattr(bool_values, "as_numbers", lambda module: module)
    (tmp_path / "mean-step.toml").write_text(SCHEME, encoding="utf-8")
    checks = {check.id: check for check in splitformer.derive(str(tmp_path / "mean-step.toml")).check(
        only="semantics").checks}
    emitted = checks["semantics/mean-step/emitted"]
    assert not emitted.holds and "the emitted output is not finite at 8 entries where the evaluator's is" in \
        emitted.detail


def test_the_two_hop_mean_over_no_key_is_zero_and_its_gradients_agree(modules, tmp_path):
    """Padding key 0 under a causal mask: query 0 of sequence 1 reaches no token. The forward is 0 there and every
    backward finite and equal (the NumPy vjp and torch's derived backward were NaN in every gradient: the adjoint's
    weights are a count, which masked nothing)."""
    numpy_module, torch_module = _derived(tmp_path, "two-hop-mean")
    rng = np.random.default_rng(8)
    u, bar, padding = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 4)), np.zeros((2, 5), dtype=bool)
    padding[1, 0] = True
    visible = ((~padding)[:, None, :] & np.tril(np.ones((5, 5), dtype=bool))).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        reach = np.nan_to_num(visible @ visible / visible.sum(-1, keepdims=True))
        expected = u + np.nan_to_num(reach @ u / reach.sum(-1, keepdims=True))
    assert np.abs(numpy_module.forward(u, {}, n_heads=1, key_padding_mask=padding, causal=True) - expected).max() < 1e-12
    u_bar, _ = numpy_module.vjp(u, {}, bar, n_heads=1, key_padding_mask=padding, causal=True)
    assert np.isfinite(u_bar).all()
    for mode in ("autograd", "derived"):
        x = torch.from_numpy(u).requires_grad_()
        step = torch_module.Block(4, 1, 4, dtype=torch.float64, backward=mode)
        step(x, src_key_padding_mask=torch.from_numpy(padding), causal=True).backward(torch.from_numpy(bar))
        assert np.abs(x.grad.numpy() - u_bar).max() < 1e-12, mode


def test_torchs_memory_mask_read_as_a_factor(modules, tmp_path):
    """The decoder layer's ``memory_mask`` narrows χ_m per query: bool read as the factor; a float one, which torch adds
    to scores, is refused by name where χ_m is a factor, not a log-weight."""
    _, torch_module = _derived(tmp_path, "memory-mean")
    rng = np.random.default_rng(6)
    u, memory = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 3, 4))
    mask = rng.random((5, 3)) < 0.5
    mask[:, 0] = False
    visible = (~mask).astype(float)
    expected = u + visible @ memory / visible.sum(1)[:, None]
    block = torch_module.Block(4, 1, 4, dtype=torch.float64)
    got = block(torch.from_numpy(u), torch.from_numpy(memory), memory_mask=torch.from_numpy(mask))
    assert np.abs(got.detach().numpy() - expected).max() < 1e-12
    with pytest.raises(ValueError, match="memory_mask must be bool here"):
        block(torch.from_numpy(u), torch.from_numpy(memory), memory_mask=torch.zeros(5, 3, dtype=torch.float64))
