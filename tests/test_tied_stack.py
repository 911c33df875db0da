"""``Stack(tied=True)``: every step runs one ``Block`` (an autonomous equation: one control for all steps).

It equals the untied Stack loaded with one mapping per layer, all equal (float64); its ``parameters()``
hold one block's; training moves one control; x-transformers' ``weight_tie_layers`` builds it. Negative
controls: unequal mappings are refused; an untied Stack of different layers computes something else.
"""

import numpy as np
import pytest
import torch

import splitformer

D, HEADS, D_FF, LAYERS = 8, 2, 12, 3


@pytest.fixture(scope="module")
def module():
    return splitformer.derive("pre-ln").torch_module()


def _params(module, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(tuple({"d": D, "d_ff": D_FF}[axis] for axis in axes)) * 0.5
            for name, axes in module.PARAMETERS.items()}


def test_tied_stack_is_one_control_for_all_steps(module):
    params = _params(module, 0)
    final = {"gain": np.ones(D) * 1.5, "bias": np.full(D, 0.25)}
    tied = module.Stack(LAYERS, D, HEADS, D_FF, dtype=torch.float64, tied=True).load_params([params], final)
    untied = module.Stack(LAYERS, D, HEADS, D_FF, dtype=torch.float64).load_params([params] * LAYERS, final)
    u = torch.randn(2, 5, D, dtype=torch.float64)
    assert (tied(u) - untied(u)).abs().max() <= 1e-12
    block_size = sum(p.numel() for p in module.Block(D, HEADS, D_FF).parameters())
    assert sum(p.numel() for p in tied.parameters()) == block_size + 2 * D
    assert all(layer is tied.layers[0] for layer in tied.layers) and "tied" in repr(tied)
    tied(u).square().sum().backward()  # the gradient of the one control sums every step's
    gradient = tied.layers[0].attn.W_q.grad.clone()
    untied(u).square().sum().backward()
    assert torch.allclose(gradient, sum(layer.attn.W_q.grad for layer in untied.layers), atol=1e-10)
    # negative control: different layers are not one control
    other = module.Stack(LAYERS, D, HEADS, D_FF, dtype=torch.float64).load_params(
        [params, _params(module, 1), params], final)
    assert (other(u) - tied(u)).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"tied layers: layers\[1\] differs from layers\[0\]"):
        tied.load_params([params, _params(module, 1), params], final)
    with pytest.raises(TypeError, match="tied must be a bool"):
        module.Stack(LAYERS, D, HEADS, D_FF, tied="yes")


def test_xtransformers_weight_tie_layers_builds_a_tied_stack():
    import x_transformers

    from splitformer.adapters import from_xtransformers

    torch.manual_seed(0)
    source = x_transformers.Encoder(dim=16, depth=3, heads=2, attn_dim_head=8, attn_flash=True,
                                    weight_tie_layers=True).double().eval()
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    adapted = from_xtransformers(source)
    stack = adapted.build(adapted.derivation().torch_module(), dtype=torch.float64)
    # one block's parameters, as x-transformers holds them (plus the zero bias of the generated final LayerNorm)
    assert stack.tied and sum(p.numel() for p in stack.parameters()) == sum(p.numel() for p in source.parameters()) + 16
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        assert (stack(u) - source(u)).abs().max() <= 1e-10


def test_a_tied_stack_refuses_a_state_dict_whose_layers_differ(module):
    """Attack 17: ``load_state_dict`` of an untied Stack's state into a tied one copied layer 0, then layer 1 over the
    same tensors: every step ran layer 1 (0.98 off), while ``load_params`` refuses differing layers. Refused naming the
    entry; control: a state whose layers agree loads."""
    source = module.Stack(2, 8, 2, 16, dtype=torch.float64)
    tied = module.Stack(2, 8, 2, 16, dtype=torch.float64, tied=True)
    with pytest.raises(ValueError, match=r"^'layers\.1\.\w+\.\w+' differs from 'layers\.0\.\w+\.\w+', the same tensor "
                                         r"here \(tied layers\)"):
        tied.load_state_dict(source.state_dict())
    other = module.Stack(2, 8, 2, 16, dtype=torch.float64, tied=True)
    tied.load_state_dict(other.state_dict())
    u = torch.randn(1, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(tied(u), other(u))
