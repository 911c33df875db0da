"""resnet-block and unet-level: parity with compositions of torch Conv2d / BatchNorm2d (eval) / ReLU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splitformer.runtime import numpy_grids
from splitformer.symbolic.network_spec import load_network

from conftest import ROOT, derived_now, generated_now

RESNET = dict(zip(("numpy", "torch"), generated_now("resnet-block")))
UNET = dict(zip(("numpy", "torch"), generated_now("unet-level")))


def _conv(c_in, c_out, kernel, stride=1, padding=0, transposed=False):
    cls = torch.nn.ConvTranspose2d if transposed else torch.nn.Conv2d
    conv = cls(c_in, c_out, kernel, stride=stride, padding=padding).double()
    with torch.no_grad():
        conv.bias.normal_()  # default init is random too; make it plainly nonzero
    return conv


def _batch_norm(channels):
    norm = torch.nn.BatchNorm2d(channels).double().eval()
    with torch.no_grad():  # random statistics, not the defaults (0 and 1)
        norm.weight.normal_()
        norm.bias.normal_()
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
    return norm


def _kernel(conv) -> dict:
    weight = conv.weight.detach().numpy()
    permuted = weight.transpose(0, 2, 3, 1) if isinstance(conv, torch.nn.ConvTranspose2d) else weight.transpose(1, 2, 3, 0)
    return {"W": permuted.copy(), "b": conv.bias.detach().numpy().copy()}


def _norm(norm) -> dict:
    return {"gain": norm.weight.detach().numpy().copy(), "bias": norm.bias.detach().numpy().copy(),
            "mean": norm.running_mean.numpy().copy(), "var": norm.running_var.numpy().copy()}


def _canonical(**groups) -> dict:
    return {f"{group}.{name}": value for group, values in groups.items() for name, value in values.items()}


def _resnet(c_in, c_out, stride, shortcut):
    torch.manual_seed(stride * 10 + shortcut)
    conv1, bn1, conv2, bn2 = _conv(c_in, c_out, 3, stride, 1), _batch_norm(c_out), _conv(c_out, c_out, 3, 1, 1), _batch_norm(c_out)
    projection, bn3 = _conv(c_in, c_out, 1, stride), _batch_norm(c_out)

    def reference(x):
        field = bn2(conv2(torch.relu(bn1(conv1(x)))))
        return torch.relu(field + (bn3(projection(x)) if shortcut else x))

    params = _canonical(conv1=_kernel(conv1), bn1=_norm(bn1), conv2=_kernel(conv2), bn2=_norm(bn2))
    if shortcut:
        params.update(_canonical(shortcut=_kernel(projection), bn3=_norm(bn3)))
    return reference, params


RESNET_CASES = {"identity": (4, 4, 1, False), "strided-projection": (3, 5, 2, True), "projection": (3, 5, 1, True)}


@pytest.mark.parametrize("case", RESNET_CASES.values(), ids=RESNET_CASES.keys())
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_resnet_block_parity(case, dtype):
    c_in, c_out, stride, shortcut = case
    reference, params = _resnet(c_in, c_out, stride, shortcut)
    x = torch.randn(2, c_in, 9, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        expected = reference(x).numpy()
    tolerance = 1e-10 if dtype == np.float64 else 1e-4
    params = {name: value.astype(dtype) for name, value in params.items()}
    out = RESNET["numpy"].forward(x.numpy().astype(dtype), params, stride=stride)
    assert out.dtype == dtype and np.abs(out - expected).max() <= tolerance
    model = RESNET["torch"].Model(c_in, c_out, stride=stride, transfer=shortcut, dtype=torch.from_numpy(x.numpy().astype(dtype)).dtype)
    with torch.no_grad():
        out = model.load_params(params)(torch.from_numpy(x.numpy().astype(dtype)))
    assert np.abs(out.numpy() - expected).max() <= tolerance


def _unet():
    torch.manual_seed(3)
    down, conv, norm, up = _conv(3, 6, 3, 2, 1), _conv(6, 6, 3, 1, 1), _batch_norm(6), _conv(6, 3, 2, 2, transposed=True)

    def reference(x):
        return x + up(torch.relu(norm(conv(down(x)))))

    return reference, _canonical(down=_kernel(down), conv=_kernel(conv), bn=_norm(norm), up=_kernel(up))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unet_level_parity(dtype):
    reference, params = _unet()
    x = torch.randn(2, 3, 8, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        expected = reference(x).numpy()
    tolerance = 1e-10 if dtype == np.float64 else 1e-4
    params = {name: value.astype(dtype) for name, value in params.items()}
    out = UNET["numpy"].forward(x.numpy().astype(dtype), params)
    assert out.dtype == dtype and np.abs(out - expected).max() <= tolerance
    u = torch.from_numpy(x.numpy().astype(dtype))
    model = UNET["torch"].Model(3, 6, dtype=u.dtype).load_params(params)
    with torch.no_grad():
        assert np.abs(model(u).numpy() - expected).max() <= tolerance


def test_a_stride_the_unet_level_does_not_read_is_refused_by_name():
    """Its network file fixes each convolution's stride: another ``stride`` is refused, not ignored (found by an
    attacker: ``stride=7`` computed what ``stride=1`` does, both backends)."""
    _, params = _unet()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8))
    refusal = r"stride must be 1, got 7: no operator of this network reads it"
    with pytest.raises(ValueError, match=refusal):
        UNET["torch"].Model(3, 6, stride=7)
    for function, extra in ((UNET["numpy"].forward, ()), (UNET["numpy"].vjp, (np.ones((2, 3, 8, 8)),))):
        with pytest.raises(ValueError, match=refusal):
            function(x, params, *extra, stride=7)
    with pytest.raises(ValueError, match=r"stride must be 1, got True"):
        UNET["numpy"].forward(x, params, stride=True)
    assert np.array_equal(UNET["numpy"].forward(x, params, stride=1), UNET["numpy"].forward(x, params))  # control
    assert UNET["torch"].Model(3, 6, stride=1).stride == 1
    _, params = _resnet(3, 5, 2, True)  # control: resnet-block reads its stride
    assert RESNET["numpy"].forward(np.zeros((1, 3, 4, 4)), params, stride=2).shape == (1, 5, 2, 2)


def test_grids_that_do_not_meet_are_rejected_before_work():
    reference, params = _unet()
    odd = np.zeros((1, 3, 7, 8))
    with pytest.raises(RuntimeError):
        reference(torch.tensor(odd))  # the torch composition cannot add the skip either
    # tester s42: unet-level's message named "stride 1", an argument it does not read (its file fixes each stride)
    with pytest.raises(ValueError, match=r"^u of shape \(1, 3, 7, 8\): F\(u\) has 3 channels on a 8x8 grid, R u 3 on 7x8"):
        UNET["numpy"].forward(odd, params)
    with pytest.raises(ValueError, match="they must agree"):
        UNET["torch"].Model(3, 6, dtype=torch.float64).load_params(params)(torch.tensor(odd))
    _, params = _resnet(3, 5, 2, False)
    with pytest.raises(ValueError, match="with stride 2: F\\(u\\) has 5 channels on a 2x2 grid, R u 3 on 4x4"):
        RESNET["numpy"].forward(np.zeros((1, 3, 4, 4)), params, stride=2)


def test_an_input_of_other_channels_than_the_parameters_is_named_as_the_wrong_argument():
    """A tester's finding: a (2, 2, 8, 8) input to a 3-channel block's NumPy ``forward``/``vjp`` blamed ``conv1.W``
    (its channels were read off ``u``); now ``u`` is named, as the torch ``Model`` names it."""
    _, params = _resnet(3, 5, 2, True)
    wrong = np.zeros((2, 2, 8, 8))
    message = r"u must have shape \(batch, 3, height, width\) \(its parameters' n_channels\), got \(2, 2, 8, 8\)"
    for function, extra in ((RESNET["numpy"].forward, ()), (RESNET["numpy"].vjp, (np.ones((2, 5, 4, 4)),))):
        with pytest.raises(ValueError, match=message):
            function(wrong, params, *extra, stride=2)
    _, params = _unet()
    with pytest.raises(ValueError, match=message.replace("got \\(2, 2", "got \\(1, 2")):
        UNET["numpy"].forward(np.zeros((1, 2, 8, 8)), params)
    assert RESNET["numpy"].forward(np.zeros((2, 3, 8, 8)), _resnet(3, 5, 2, True)[1], stride=2).shape == (2, 5, 4, 4)
    params = {**params, "down.W": np.zeros((2, *params["down.W"].shape[1:]))}  # a reviewer's case: the parameters
    with pytest.raises(ValueError, match=r"parameter 'down.W' has shape \(2, "):  # disagree, u agrees with up.W
        UNET["numpy"].forward(np.zeros((1, 3, 8, 8)), params)


def test_a_kernel_wider_than_its_field_has_no_nodes_at_any_width():
    """Review s33: a NumPy convolution whose kernel reaches past the field by more than a stride gave a negative node
    count, whose slices read the field from its end: two 40-wide kernels on 60 × 60 returned a 3 × 3 grid of garbage
    (one past by less returned none, as ``test_network_passes`` holds). Now none at any width; the control: the
    narrowest field the kernel spans has one node."""
    for side in (0, 4, 21):
        assert numpy_grids._conv2d(np.ones((1, 4, side, side)), np.ones((4, 40, 40, 4)), 1, 0).shape == (1, 4, 0, 0)
    assert numpy_grids._conv2d(np.ones((1, 4, 40, 40)), np.ones((4, 40, 40, 4)), 1, 0).shape == (1, 4, 1, 1)


def test_the_report_derives_the_adjoint_of_each_transfer_the_network_has():
    resnet = derived_now("resnet-block").report.split("the derived adjoint")[1]
    assert [line for line in resnet.splitlines() if line.startswith("### R")] == ["### R = bn3 ∘ shortcut", "### R = 1"]
    projected, identity = resnet.split("### R = 1")
    assert "#### adjoint of shortcut" in projected and "#### adjoint of bn3" in projected
    assert "#### adjoint of conv1" in identity and "shortcut" not in identity and "bn3" not in identity
    unet = derived_now("unet-level").report.split("the derived adjoint")[1]
    assert [line for line in unet.splitlines() if line.startswith("### R")] == ["### R = 1"]



def _reused(folder, field, projection):
    """A resnet-block file whose step applies its operators ``field`` then ``projection``."""
    text = (ROOT / "symbolic" / "networks" / "resnet-block.toml").read_text().replace('name = "resnet-block"',
                                                                                     'name = "reused"')
    text = text.replace('field = ["conv1", "bn1", "relu", "conv2", "bn2"]', "field = [%s]" % ", ".join(
        f'"{key}"' for key in field)).replace('projection = "relu"', f'projection = "{projection}"')
    (folder / "reused.toml").write_text(text)
    return folder / "reused.toml"


def test_the_emitted_vjp_of_an_identity_step_ending_on_the_features_is_tested(tmp_path):
    """R = 1 and F ending on the features: the adjoint tests take as many input channels as features."""
    from splitformer.codegen.verification.network_adjoint_tests import network_adjoint_tests
    from splitformer.codegen.verification.statements import SKIPPED

    text = (ROOT / "symbolic" / "networks" / "resnet-block.toml").read_text().replace('name = "resnet-block"',
                                                                                     'name = "plain"')
    for line in ('transfer = ["shortcut", "bn3"]\n', 'shortcut = { kind = "convolution", kernel = 1, stride = "stride", '
                 'inputs = "c" }\n', 'bn3 = { kind = "batch-norm" }\n'):  # an operator no step applies is refused
        assert line in text
        text = text.replace(line, "")
    (tmp_path / "plain.toml").write_text(text)
    checks = network_adjoint_tests(load_network(str(tmp_path / "plain.toml")))
    assert all(check.method != SKIPPED and check.holds for check in checks) and "4 channels" in checks[0].statement


def test_the_emitted_vjp_of_a_grid_step_of_another_composition_is_tested(tmp_path):
    """No built-in shares this composition: the adjoint tests take the first grid sizes it accepts, not a skip."""
    from splitformer.codegen.verification.network_adjoint_tests import network_adjoint_tests
    from splitformer.codegen.verification.statements import SKIPPED

    spec = load_network(str(_reused(tmp_path, ["conv1", "bn1", "relu", "conv2", "conv2", "bn2"], "relu")))
    checks = network_adjoint_tests(spec)
    assert len(checks) >= 2 and all(check.method != SKIPPED and check.holds for check in checks)
    assert "stride 2, with its transfer" in checks[0].statement


def test_a_transfer_that_no_image_runs_fails_the_adjoint_tests_saying_so(tmp_path):
    """A tester's finding: a first convolution padded 9 with a 5 × 5 kernel beside a 3 × 3 shortcut padded 1 never
    lands on the shortcut's grid, so the file's transfer can never run; the adjoint tests ran the step without it and
    every check held. Now a check of the transfer fails, saying why. Control: where the transfer runs (the same file
    padded 2), the tests run it and no such check is added."""
    from splitformer.codegen.verification.network_adjoint_tests import network_adjoint_tests

    text = (ROOT / "symbolic" / "networks" / "resnet-block.toml").read_text().replace('name = "resnet-block"',
                                                                                     'name = "padded"')
    assert 'conv1 = { kind = "convolution", kernel = 3, padding = 1,' in text
    for padding, runs in ((9, False), (2, True)):
        (tmp_path / "padded.toml").write_text(text.replace(
            'conv1 = { kind = "convolution", kernel = 3, padding = 1,',
            f'conv1 = {{ kind = "convolution", kernel = 5, padding = {padding},'))
        checks = network_adjoint_tests(load_network(str(tmp_path / "padded.toml")))
        transfer = [check for check in checks if check.id == "adjoint-test/padded/transfer"]
        assert all(check.holds for check in checks if check not in transfer)
        if runs:
            assert not transfer and "with its transfer" in checks[0].statement
        else:
            (check,) = transfer
            assert not check.holds and "can never run" in check.detail


@pytest.mark.parametrize("field, projection", [
    (["conv1", "bn1", "relu", "conv2", "conv2", "bn2"], "relu"),    # an operator applied twice in a row
    (["conv1", "bn1", "relu", "conv2", "conv2", "conv2", "bn2"], "relu"),  # three times: conv2, conv22, conv23
    (["conv1", "bn1", "relu", "conv2", "bn2"], "conv2")],            # and again as the projection
    ids=["twice-in-the-field", "thrice-in-the-field", "again-as-the-projection"])
def test_an_operator_applied_twice_gets_the_sum_of_both_applications_gradients(tmp_path, field, projection):
    """Each application of a reused kernel reads its own input at windows: its gradient sums both (they once shared
    one window view, and the gradient read the second input twice). Reference: torch autograd through one shared
    Conv2d / BatchNorm2d per key, R = 1."""
    import splitformer

    module = splitformer.derive(str(_reused(tmp_path, field, projection))).numpy_module()
    torch.manual_seed(3)
    layers = {"conv1": _conv(4, 4, 3, 1, 1), "bn1": _batch_norm(4), "conv2": _conv(4, 4, 3, 1, 1), "bn2": _batch_norm(4)}
    apply = {"relu": torch.relu, **layers}

    def step(u):
        x = u
        for key in field:
            x = apply[key](x)
        return apply[projection](x + u)

    u = torch.randn(2, 4, 5, 5, dtype=torch.float64, requires_grad=True)
    out = step(u)
    seed = torch.randn_like(out)
    out.backward(seed)
    params = _canonical(**{key: _kernel(layer) if key.startswith("conv") else _norm(layer) for key, layer in layers.items()})
    np.testing.assert_allclose(module.forward(u.detach().numpy(), params), out.detach().numpy(), atol=1e-12)
    grad_u, grads = module.vjp(u.detach().numpy(), params, seed.numpy())
    np.testing.assert_allclose(grad_u, u.grad.numpy(), atol=1e-12)
    for key in ("conv1", "conv2"):
        np.testing.assert_allclose(grads[f"{key}.W"], layers[key].weight.grad.numpy().transpose(1, 2, 3, 0), atol=1e-11)
        np.testing.assert_allclose(grads[f"{key}.b"], layers[key].bias.grad.numpy(), atol=1e-11)


@pytest.mark.parametrize("operators, step, message", [
    ('relu2 = { kind = "relu-projection" }', 'field = ["conv1", "bn1", "relu", "conv2", "bn2", "relu2", "relu"]',
     "application 2 of 'relu' is named 'relu2' in the code, as another operator or application is; rename 'relu2'"),
    ("", 'field = ["conv1", "bn1", "relu", "conv2", "bn2"]\nprojection = "conv1"',
     'step.projection: operators.conv1 reads channels "c" where the projection reads "y"'),
    ("", 'field = ["conv1", "bn1", "relu", "conv2", "bn2"]\nprojection = "bn3"',  # R's only BatchNorm as Proj
     "step.transfer: 'bn3' is in the projection too"),
    ('down = { kind = "convolution", kernel = 3, padding = 1, stride = 2 }',
     'field = ["conv1", "bn1", "relu", "conv2", "bn2"]\nprojection = "down"', "operators.down changes the grid"),
    ('bnx = { kind = "batch-norm", inputs = "c", outputs = "y" }', 'field = ["conv1", "bn1", "relu", "conv2", "bn2"]',
     'bnx: inputs = "c" and outputs = "y"; batch-norm acts on each channel alone')],
    ids=["application-name-taken", "projection-channels", "transfer-as-projection", "projection-off-the-grid",
         "per-channel-relabelling"])
def test_grid_files_whose_applications_clash_or_misread_channels_are_refused(tmp_path, capsys, operators, step, message):
    """Refused when read, in one line: an application named as another operator is (its arrays would be shared), a
    projection reading other channels than the update holds (it used to fail in numpy's matmul)."""
    from splitformer.codegen.cli import main

    text = (ROOT / "symbolic" / "networks" / "resnet-block.toml").read_text().replace('name = "resnet-block"',
                                                                                     'name = "clash"')
    text = text.replace("[step]\n", f"{operators}\n\n[step]\n" if operators else "[step]\n")
    text = text.replace('projection = "relu"', "").replace('field = ["conv1", "bn1", "relu", "conv2", "bn2"]', step)
    text = text if "projection" in step else text + 'projection = "relu"\n'
    (tmp_path / "clash.toml").write_text(text)
    assert main(["derive", str(tmp_path / "clash.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_transposed_convolution_from_features_to_features_derives_and_matches_torch(tmp_path):
    """kernel = stride prolongation y → y (the adjoint once ran out of index letters: a traceback)."""
    import splitformer

    text = (ROOT / "symbolic" / "networks" / "unet-level.toml").read_text().replace('name = "unet-level"', 'name = "up-y"')
    text = text.replace('inputs = "y", outputs = "c" }', 'inputs = "y", outputs = "y" }')
    (tmp_path / "up-y.toml").write_text(text)
    module = splitformer.derive(str(tmp_path / "up-y.toml")).numpy_module()
    torch.manual_seed(5)
    down, conv, bn, up = _conv(4, 4, 3, 2, 1), _conv(4, 4, 3, 1, 1), _batch_norm(4), _conv(4, 4, 2, 2, transposed=True)
    u = torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    out = u + up(torch.relu(bn(conv(down(u)))))
    seed = torch.randn_like(out)
    out.backward(seed)
    params = _canonical(down=_kernel(down), conv=_kernel(conv), bn=_norm(bn), up=_kernel(up))
    np.testing.assert_allclose(module.forward(u.detach().numpy(), params), out.detach().numpy(), atol=1e-12)
    grad_u, grads = module.vjp(u.detach().numpy(), params, seed.numpy())
    np.testing.assert_allclose(grad_u, u.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(grads["up.W"], up.weight.grad.numpy().transpose(0, 2, 3, 1), atol=1e-11)


def test_a_network_refuses_parameters_of_another_precision_than_its_input():
    """Attack s33 L4: the NumPy networks rounded float64 parameters to a float32 image without a word. Refused;
    controls: the same parameters in float32 run, and widen to a float64 image."""
    _, params = _resnet(4, 4, 1, False)
    image = np.zeros((1, 4, 6, 6), np.float32)
    with pytest.raises(ValueError, match=r"^parameter '.*' has dtype float64, the input float32: a parameter is not "
                                         r"rounded to the input's precision$"):
        RESNET["numpy"].forward(image, {name: np.asarray(value, np.float64) for name, value in params.items()})
    single = {name: np.asarray(value, np.float32) for name, value in params.items()}
    assert RESNET["numpy"].forward(image, single).dtype == np.float32
    # review s33: float32 parameters widen exactly to a float64 image (the networks guide's CvT example runs so)
    assert RESNET["numpy"].forward(image.astype(np.float64), single).dtype == np.float64


def test_an_input_too_small_for_a_grid_is_refused_by_name(tmp_path):
    """A tester's unpadded 3 × 3 convolution (and shortcut) on a 2 × 2 image: the NumPy ``forward`` returned a
    (2, 3, 0, 0) array, its ``vjp`` failed inside NumPy naming nothing, the torch ``Model`` inside ``conv2d``. Now a
    ValueError naming ``u`` in each, before any work; the control: 3 × 3, the smallest image the kernel spans."""
    import splitformer

    (tmp_path / "nopad.toml").write_text(
        'name = "nopad"\nsummary = "a valid convolution and a valid shortcut"\n[operators]\n'
        'c1 = { kind = "convolution", kernel = 3, padding = 0, stride = 1, inputs = "c" }\n'
        'c2 = { kind = "convolution", kernel = 1, padding = 0, stride = 1 }\n'
        'sc = { kind = "convolution", kernel = 3, padding = 0, inputs = "c" }\nbn = { kind = "batch-norm" }\n'
        '[step]\nfield = ["c1", "c2"]\ntransfer = ["sc", "bn"]\n')
    derivation = splitformer.derive(str(tmp_path / "nopad.toml"))
    numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
    rng = np.random.default_rng(0)
    sizes = {"n_channels": 2, "d": 3}
    params = {name: np.abs(rng.standard_normal(tuple(sizes.get(axis, axis) for axis in axes))) + 0.5
              for name, axes in {**numpy_module.PARAMETERS, **numpy_module.TRANSFER_PARAMETERS}.items()}
    model = torch_module.Model(2, 3, transfer=True, dtype=torch.float64).load_params(params)
    message = r"u of shape \(2, 2, 2, 2\) is too small: a grid of F or R would have no points"  # no stride read
    small = rng.standard_normal((2, 2, 2, 2))
    with pytest.raises(numpy_module.GridTooSmall, match=message):  # a ValueError of its own: check tells it by class
        numpy_module.forward(small, params)
    with pytest.raises(ValueError, match=message):
        numpy_module.vjp(small, params, np.zeros((2, 3, 0, 0)))
    with pytest.raises(ValueError, match=message):
        model(torch.tensor(small))
    spanned = rng.standard_normal((2, 2, 3, 3))
    np.testing.assert_allclose(numpy_module.forward(spanned, params), model(torch.tensor(spanned)).detach().numpy(),
                               rtol=0, atol=1e-12)
    assert numpy_module.forward(spanned, params).shape == (2, 3, 1, 1)


PREACT = '''name = "preact"
summary = "pre-activation ResNet block: BN, ReLU, conv, BN, ReLU, conv; 1x1 strided shortcut"

[operators]
bn1 = { kind = "batch-norm", inputs = "c" }
relu1 = { kind = "relu-projection", inputs = "c" }
conv1 = { kind = "convolution", kernel = 3, padding = 1, stride = "stride", inputs = "c" }
bn2 = { kind = "batch-norm" }
relu2 = { kind = "relu-projection" }
conv2 = { kind = "convolution", kernel = 3, padding = 1 }
shortcut = { kind = "convolution", kernel = 1, stride = "stride", inputs = "c" }

[step]
field = ["bn1", "relu1", "conv1", "bn2", "relu2", "conv2"]
transfer = ["shortcut"]
'''


def test_a_field_beginning_on_the_input_channels_reads_its_width_where_d_is(tmp_path):
    """Tester s39 M1: a pre-activation block (BatchNorm on the 3 input channels first) took d from its first parameter,
    bn1.gain, so every parameter set with d ≠ n_channels was refused (numpy and torch Model alike). Reference: the block
    composed of torch Conv2d / BatchNorm2d (eval) / ReLU, every parameter random, float64, 3 → 5 channels, stride 2."""
    import splitformer

    (tmp_path / "preact.toml").write_text(PREACT)
    derivation = splitformer.derive(str(tmp_path / "preact.toml"))
    numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
    torch.manual_seed(7)
    bn1, conv1, bn2, conv2 = _batch_norm(3), _conv(3, 5, 3, 2, 1), _batch_norm(5), _conv(5, 5, 3, 1, 1)
    shortcut = _conv(3, 5, 1, 2)
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = (conv2(torch.relu(bn2(conv1(torch.relu(bn1(x)))))) + shortcut(x)).numpy()
    params = _canonical(bn1=_norm(bn1), conv1=_kernel(conv1), bn2=_norm(bn2), conv2=_kernel(conv2),
                        shortcut=_kernel(shortcut))
    out = numpy_module.forward(x.numpy(), params, stride=2)
    assert out.shape == (2, 5, 5, 4) and np.abs(out - expected).max() <= 1e-12
    with pytest.raises(ValueError, match=r"^missing parameter 'conv1.W'$"):  # named, not a shape read with d = 3
        numpy_module.forward(x.numpy(), {name: value for name, value in params.items() if name != "conv1.W"}, stride=2)
    model = torch_module.Model(3, 5, stride=2, transfer=True, dtype=torch.float64)
    model.load_params(params)
    with torch.no_grad():
        assert np.abs(model(x).numpy() - expected).max() <= 1e-12


def test_a_projection_that_changes_the_channels_is_refused_and_another_operator_is_not_called_one(tmp_path, capsys):
    """Tester s39 M2: a convolution writing other channels than the update's in the projection slot made vjp ask for
    the update's shape and crash, and check crash; it is refused when read. A convolution keeping them is run, and
    the report names it instead of writing Proj_{S_2}; the plain-text show holds no LaTeX."""
    from splitformer.codegen.cli import main

    head = 'name = "slot"\nsummary = "x"\n\n[operators]\n'
    (tmp_path / "changes.toml").write_text(head + 'c1 = { kind = "convolution", kernel = 3, padding = 1, inputs = "c" }\n'
                                           'c2 = { kind = "convolution", kernel = 3, padding = 1, outputs = "c" }\n\n'
                                           '[step]\nfield = ["c1", "c2"]\nprojection = "c1"\n')
    assert main(["derive", str(tmp_path / "changes.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert 'step.projection: operators.c1 writes channels "y" from "c"; the projection keeps' in err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()
    (tmp_path / "keeps.toml").write_text(head + 'c1 = { kind = "convolution", kernel = 3, padding = 1, inputs = "c" }\n'
                                         'c2 = { kind = "convolution", kernel = 3, padding = 1 }\n\n'
                                         '[step]\nfield = ["c1"]\nprojection = "c2"\n')
    assert main(["derive", str(tmp_path / "keeps.toml"), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "reports" / "slot.md").read_text()
    assert r"u^{+} = \mathrm{c2}\big(R\,u" in report and "Proj}_{S_2}" not in report.split("## 2.")[0]
    capsys.readouterr()
    for name in ("keeps.toml", "unet-level", "resnet-block"):
        assert main(["show", str(tmp_path / name) if name.endswith(".toml") else name]) == 0
        shown = capsys.readouterr().out
        assert "$" not in shown and "\\" not in shown and "Δt" in shown, name


TWO_ASCENTS = '''name = "two-ascents"
summary = "two stride-2 descents, two transposed ascents"

[operators]
d1 = { kind = "convolution", kernel = 2, stride = 2, inputs = "c" }
d2 = { kind = "convolution", kernel = 2, stride = 2 }
u2 = { kind = "transposed-convolution", kernel = 2 }
u1 = { kind = "transposed-convolution", kernel = 2, outputs = "c" }

[step]
field = ["d1", "d2", "u2", "u1"]
'''


def test_two_transposed_convolutions_in_a_row_have_their_adjoint(tmp_path):
    """Found in s39: the costate of an array a transposed convolution writes (at S p + r) was indexed by that pattern,
    and the next transposed convolution's reader renamed onto it captured its own kernel offset (2 (2 p + r) + r):
    derive failed with an AssertionError. Costates now live on the array's own grid. Reference: torch autograd through
    Conv2d, Conv2d, ConvTranspose2d, ConvTranspose2d, every parameter random, float64."""
    import splitformer

    (tmp_path / "two-ascents.toml").write_text(TWO_ASCENTS)
    module = splitformer.derive(str(tmp_path / "two-ascents.toml")).numpy_module()
    torch.manual_seed(11)
    d1, d2 = _conv(3, 4, 2, 2), _conv(4, 4, 2, 2)
    u2, u1 = _conv(4, 4, 2, 2, transposed=True), _conv(4, 3, 2, 2, transposed=True)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    out = x + u1(u2(d2(d1(x))))
    seed = torch.randn_like(out)
    out.backward(seed)
    params = _canonical(d1=_kernel(d1), d2=_kernel(d2), u2=_kernel(u2), u1=_kernel(u1))
    assert np.abs(module.forward(x.detach().numpy(), params) - out.detach().numpy()).max() <= 1e-12
    grad_u, grads = module.vjp(x.detach().numpy(), params, seed.numpy())
    assert np.abs(grad_u - x.grad.numpy()).max() <= 1e-12
    for key, layer in (("d1", d1), ("d2", d2), ("u2", u2), ("u1", u1)):
        expected = layer.weight.grad.numpy()
        expected = expected.transpose(0, 2, 3, 1) if key.startswith("u") else expected.transpose(1, 2, 3, 0)
        assert np.abs(grads[f"{key}.W"] - expected).max() <= 1e-11, key
        assert np.abs(grads[f"{key}.b"] - layer.bias.grad.numpy()).max() <= 1e-11, key
