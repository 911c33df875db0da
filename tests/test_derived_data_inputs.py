"""``backward="derived"`` reads masks and positions as data: one that requires grad is refused by name
(autograd would differentiate it; the derived adjoint has no gradient for it and would leave ``.grad`` None)."""

import pytest
import torch

from conftest import GENERATED, import_path


def _block(name, backward):
    module = import_path(GENERATED / "torch" / f"{name}.py")
    torch.manual_seed(0)
    block = module.Block(16, 4, 32, backward=backward) if name != "llama" else module.Block(16, 4, 32, n_kv_heads=2, backward=backward)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    return block.double()


def _inputs():
    torch.manual_seed(1)
    return torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("name, argument", [("llama", "positions"), ("post_ln", "src_mask"), ("post_ln", "key_padding_mask")])
def test_a_data_input_that_requires_grad_is_refused_under_the_derived_backward(name, argument):
    value = {"positions": torch.arange(5.0).expand(2, 5).clone(), "src_mask": 0.1 * torch.randn(5, 5),
             "key_padding_mask": 0.1 * torch.randn(2, 5)}[argument].double().requires_grad_()
    u = _inputs()
    _block(name, "autograd")(u, **{argument: value}).sum().backward()  # control: autograd differentiates it
    assert value.grad is not None and value.grad.abs().max() > 1e-6
    value.grad = None
    with pytest.raises(ValueError, match=rf"backward='derived' reads .*{argument if argument == 'positions' else 'mask'}.* requires grad"):
        _block(name, "derived")(_inputs(), **{argument: value})
    out = _block(name, "derived")(_inputs(), **{argument: value.detach()})  # control: as data, it runs
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["post_ln", "llama"])
def test_the_derived_backward_refuses_autocast_by_name(name):
    """A tester's finding: under ``torch.autocast`` the derived backward failed inside ``backward()`` with torch's
    "expected scalar type BFloat16 but found Float" (the adjoint read autocast's mixed dtypes). Refused when called;
    control: autograd runs under autocast, and the derived backward without it."""
    u = _inputs().float().detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _block(name, "autograd").float()(u).float().sum().backward()
        with pytest.raises(ValueError, match=r"^backward='derived' has no adjoint of autocast's mixed dtypes: use "
                                             r"backward='autograd' under torch.autocast$"):
            _block(name, "derived").float()(u)
    _block(name, "derived").float()(u).sum().backward()
    assert torch.isfinite(u.grad).all()


def test_a_networks_derived_backward_refuses_autocast_too():
    """Under autocast a network's derived Function computed in float32, ignoring it (its gradient 1.01 from
    autocast's autograd one on a ResNet block): refused as a Block's; control: autograd under autocast runs."""
    module = import_path(GENERATED / "torch" / "resnet_block.py")
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(module.Model(4, 4).eval()(x)).all()
        with pytest.raises(ValueError, match=r"^backward='derived' has no adjoint of autocast's mixed dtypes"):
            module.Model(4, 4, backward="derived").eval()(x)


def _modules_and_input(name):
    """The generated module ``name``'s block (d 16, 4 heads) or ResNet block (4 channels) built with
    ``backward="autograd"`` and with ``"derived"``, and an input for them."""
    module = import_path(GENERATED / "torch" / f"{name}.py")
    if name == "resnet_block":
        return [module.Model(4, 4, backward=backward).eval() for backward in ("autograd", "derived")], torch.randn(2, 4, 6, 6)
    return [module.Block(16, 4, 32, backward=backward) for backward in ("autograd", "derived")], torch.randn(2, 5, 16)


@pytest.mark.parametrize("name", ["post_ln", "resnet_block"])
def test_the_derived_backward_refuses_torch_func_by_name(name):
    """A tester's finding: ``torch.func.grad`` and ``vmap`` of a derived module failed with torch's "must override the
    setup_context staticmethod", which names neither the option nor the way out. Refused by name; controls:
    autograd's module under the same transforms, and the derived module's forward under ``vmap`` without grad."""
    torch.manual_seed(2)
    (autograd, derived), u = _modules_and_input(name)
    gradient = torch.func.grad(lambda x: autograd(x).pow(2).sum())(u)
    assert gradient.shape == u.shape and gradient.abs().max() > 0
    for transform in (lambda: torch.func.grad(lambda x: derived(x).pow(2).sum())(u),
                      lambda: torch.func.vmap(derived)(u[:, None])):
        with pytest.raises(RuntimeError, match=r"^backward='derived' does not run inside torch.func transforms"):
            transform()
    with torch.no_grad():
        assert torch.func.vmap(derived)(u[:, None]).shape[:2] == (2, 1)


@pytest.mark.parametrize("name", ["pre_ln", "resnet_block"])
def test_the_derived_backward_refuses_trace_and_export_by_name(name):
    """A tester's finding: ``torch.jit.trace`` of a derived module failed its sanity check ("Graphs differed across
    invocations") and an exported one's backward ran into "modified by an inplace operation", neither naming the
    option. Refused by name, as a scripted module is; controls: both record without autograd, and
    ``torch.compile`` of the derived module still differentiates (the autograd module's gradient)."""
    torch.manual_seed(3)
    (autograd, derived), u = _modules_and_input(name)
    autograd.load_state_dict(derived.state_dict())
    for record in (lambda: torch.jit.trace(derived, (u,)), lambda: torch.export.export(derived, (u,)),
                   lambda: torch.export.export(derived, (u,), strict=False)):
        with pytest.raises(ValueError, match=r"^backward='derived' runs in Python .* torch.jit.trace and torch.export"):
            record()
    with torch.no_grad():
        expected = derived(u)
        assert torch.allclose(torch.jit.trace(derived, (u,))(u), expected, atol=1e-6)
        assert torch.allclose(torch.export.export(derived, (u,)).module()(u), expected, atol=1e-6)
    x, y = u.clone().requires_grad_(), u.clone().requires_grad_()
    torch.compile(derived, backend="aot_eager")(x).pow(2).sum().backward()
    autograd(y).pow(2).sum().backward()
    assert torch.allclose(x.grad, y.grad, atol=1e-5)
