"""``load_params`` checks the whole mapping before it copies anything: a refused load leaves every
parameter as it was (attack2 finding 11), for the Block, the Stack and the network Models."""

import pytest
import torch
from conftest import GENERATED, import_path


def _module(name):
    return import_path(GENERATED / "torch" / f"{name}.py")


def _snapshot(module):
    return {name: value.clone() for name, value in module.state_dict().items()}


def _unchanged(module, before) -> bool:
    return all(torch.equal(value, before[name]) for name, value in module.state_dict().items())


def _fresh(module, fill=7.0):
    """Every parameter of ``module`` under its canonical name, all ``fill`` (differs from any initialization)."""
    return {name: torch.full_like(value, fill) for name, value in module.named_parameters()}


def _spoiled(params, how):
    last = list(params)[-1]
    return {"missing": {name: value for name, value in params.items() if name != last},
            "shape": {**params, last: torch.zeros(2, 3)},
            "text": {**params, last: "x"},
            "bool": {**params, last: torch.ones_like(params[last], dtype=torch.bool)}}[how]


HOW = ["missing", "shape", "text", "bool"]


@pytest.mark.parametrize("how", HOW)
def test_a_block_that_refuses_a_load_keeps_every_parameter(how):
    block = _module("post_ln").Block(8, 2, 12)
    before = _snapshot(block)
    with pytest.raises(ValueError, match="parameter"):
        block.load_params(_spoiled(_fresh(block), how))
    assert _unchanged(block, before)
    block.load_params(_fresh(block))  # control: the sound mapping loads, and changes every parameter
    assert all(not torch.equal(value, before[name]) for name, value in block.state_dict().items())


@pytest.mark.parametrize("spoil_final_norm", [False, True])
def test_a_stack_that_refuses_a_load_keeps_every_layer(spoil_final_norm):
    stack = _module("pre_ln").Stack(2, 8, 2, 12, final_norm=True)
    before = _snapshot(stack)
    layers = [_fresh(block) for block in stack.layers]
    final_norm = {"gain": torch.full((8,), 7.0), "bias": torch.full((8,), 7.0)}
    if spoil_final_norm:
        final_norm["bias"] = torch.zeros(3)
    else:
        layers[-1] = _spoiled(layers[-1], "shape")
    with pytest.raises(ValueError, match="has shape"):
        stack.load_params(layers, final_norm)
    assert _unchanged(stack, before)


def test_a_network_model_that_refuses_a_load_keeps_every_parameter():
    model = _module("vit").Model(n_layers=1, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2,
                                 image_size=(4, 4), n_classes=3)
    before = _snapshot(model)
    for how in HOW:
        with pytest.raises(ValueError, match="parameter"):
            model.load_params(_spoiled(_fresh(model), how))
        assert _unchanged(model, before), how
    model.load_params(_fresh(model))
    assert not _unchanged(model, before)


@pytest.mark.parametrize("name, make", [("post_ln", lambda module: module.Block(8, 2, 12)),
                                        ("pre_ln", lambda module: module.Stack(2, 8, 2, 12, final_norm=True))])
def test_a_state_dict_with_an_entry_of_another_shape_loads_nothing(name, make):
    """Attack s33 L8: torch's ``load_state_dict`` copied 15 of 16 entries before it reported the one of another shape
    (adapters.md: "nothing loads partially"); the Block and Stack check shapes first. Control: the sound dict loads."""
    module = make(_module(name))
    before = _snapshot(module)
    state = {key: torch.full_like(value, 7.0) for key, value in module.state_dict().items()}
    last = list(state)[-1]
    with pytest.raises(ValueError, match=rf"^'{last}' has shape \(3,\), expected .*; nothing was loaded$"):
        module.load_state_dict({**state, last: torch.zeros(3)})
    assert _unchanged(module, before)
    module.load_state_dict(state)
    assert all(torch.equal(value, state[key]) for key, value in module.state_dict().items())
