"""What a stack's layers compute alike from the positions alone (rotary's angle tables), computed by its first layer
only (``Shared``): the same outputs as every layer computing its own, and computed again where a layer differs."""

from __future__ import annotations

import pytest
import torch

from splitformer.codegen.ir import Shared
from splitformer.codegen.lowering import lower
from splitformer.symbolic import derive, load_scheme

from conftest import GENERATED, import_path

LAYERS, D, HEADS, D_FF = 3, 16, 4, 24


@pytest.fixture(scope="module")
def llama():
    return import_path(GENERATED / "torch" / "llama.py")


class _Cosines(torch.overrides.TorchFunctionMode):
    """Counts the calls of ``torch.cos`` (one per computation of the angle tables)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.cos
        return func(*args, **(kwargs or {}))


def _stack(llama, seed=0):
    torch.manual_seed(seed)
    stack = llama.Stack(LAYERS, D, HEADS, D_FF, n_kv_heads=2, dtype=torch.float64).eval()
    with torch.no_grad():
        for parameter in stack.parameters():
            parameter.normal_(0.0, 0.4)
    return stack


def _layer_by_layer(stack, u, **kwargs):
    """Each block called alone (computing its own tables), then the final norm."""
    for index, block in enumerate(stack.layers):
        cache = kwargs.get("cache")
        u = block(u, positions=kwargs.get("positions"), cache=None if cache is None else cache[index])
    return stack._final_norm(u)


def test_the_lowering_shares_the_angle_tables_and_nothing_that_reads_the_state():
    module = lower(derive(load_scheme("llama")))
    (shared,) = [op for op in module.ops if isinstance(op, Shared)]
    assert [operand.name for operand in shared.outputs] == ["attn_pair_diagonal", "attn_pair_crossed"]
    assert {op.out for op in shared.ops} == {"attn_phi", "attn_phi_cos", "attn_phi_sin", "attn_pair_diagonal",
                                            "attn_pair_crossed"}
    assert set(shared.reads()) == {"pos", "u0"}  # u0: the grid coordinates' dtype and device only
    network = lower(derive(load_scheme("llama")), network=True)
    assert not any(isinstance(op, Shared) for op in network.ops)  # control: a network program shares nothing


@pytest.mark.parametrize("positions", [None, "given"])
def test_a_stack_computes_the_tables_once_with_the_outputs_of_each_layer_alone(llama, rng, positions):
    stack = _stack(llama)
    u = torch.from_numpy(rng.normal(size=(2, 5, D)))
    given = torch.tensor([3.0, 1.0, 4.0, 1.5, 9.0], dtype=torch.float64) if positions else None
    with torch.no_grad():
        with _Cosines() as counted:
            together = stack(u, positions=given)
        with _Cosines() as alone:
            expected = _layer_by_layer(stack, u, positions=given)
    # given positions are the caller's (a layer's hook may change them): each layer computes its own tables
    assert counted.calls == (LAYERS if positions else 1) and alone.calls == LAYERS  # control: each block alone
    torch.testing.assert_close(together, expected, rtol=0, atol=1e-13)


def test_cached_decoding_shares_the_tables_of_each_step(llama, rng):
    stack = _stack(llama)
    u = torch.from_numpy(rng.normal(size=(2, 7, D)))
    caches, separate = [{} for _ in stack.layers], [{} for _ in stack.layers]
    with torch.no_grad(), _Cosines() as counted:
        steps = [stack(u[:, :4], cache=caches)] + [stack(u[:, i:i + 1], cache=caches) for i in range(4, 7)]
    with torch.no_grad():
        alone = [_layer_by_layer(stack, u[:, :4], cache=separate)] + [
            _layer_by_layer(stack, u[:, i:i + 1], cache=separate) for i in range(4, 7)]
        full = stack(u)
    assert counted.calls == 4  # one per call of the stack, not one per layer
    for step, expected in zip(steps, alone):
        torch.testing.assert_close(step, expected, rtol=0, atol=1e-13)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-12)


def test_a_layer_with_other_options_computes_its_own_tables(llama, rng):
    stack = _stack(llama)
    stack.layers[1].rope_theta = 500.0  # the key holds the options: this layer's tables differ
    u = torch.from_numpy(rng.normal(size=(1, 6, D)))
    with torch.no_grad(), _Cosines() as counted:
        together = stack(u)
    with torch.no_grad():
        expected = _layer_by_layer(stack, u)
        stack.layers[1].rope_theta = 10000.0
        other = stack(u)
    assert counted.calls == 2
    torch.testing.assert_close(together, expected, rtol=0, atol=1e-13)
    assert (together - other).abs().max() > 1e-3  # control: the option changes the outputs


def test_training_through_shared_tables_matches_each_layer_alone(llama, rng):
    stack = _stack(llama).train()
    copy = _stack(llama).train()
    u = torch.from_numpy(rng.normal(size=(2, 5, D)))
    stack(u).square().sum().backward()
    _layer_by_layer(copy, u).square().sum().backward()
    for (name, shared), (_, alone) in zip(stack.named_parameters(), copy.named_parameters()):
        torch.testing.assert_close(shared.grad, alone.grad, rtol=0, atol=1e-12, msg=name)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch 2.13; still works
def test_a_scripted_stack_shares_the_tables_too(llama, rng):
    stack = _stack(llama)
    u = torch.from_numpy(rng.normal(size=(2, 5, D)))
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(stack)(u), _layer_by_layer(stack, u), rtol=0, atol=1e-13)


def test_a_hook_that_changes_a_layers_positions_is_followed(llama, rng):
    """A forward pre-hook giving the second layer other positions: that layer reads them, not the first's tables."""
    stack = _stack(llama)
    u = torch.from_numpy(rng.normal(size=(1, 5, D)))
    moved = torch.arange(5, dtype=torch.float64) * 3.0
    with torch.no_grad():
        state = stack.layers[0](u)  # the reference: each layer alone, the second at the moved positions
        state = stack.layers[1](state, positions=moved)
        state = stack.layers[2](state)
        expected = stack._final_norm(state)
        handle = stack.layers[1].register_forward_pre_hook(lambda block, args, kwargs: (args, {**kwargs, "positions": moved}),
                                                           with_kwargs=True)
        hooked = stack(u)
        handle.remove()
        plain = stack(u)
    torch.testing.assert_close(hooked, expected, rtol=0, atol=1e-13)
    assert (hooked - plain).abs().max() > 1e-3  # control: the moved positions change the output


def test_one_dict_reused_across_calls_of_other_lengths_is_keyed_by_them(llama, rng):
    block = _stack(llama).layers[0]
    shared: dict = {}
    with torch.no_grad():
        for tokens in (6, 4, 6):
            u = torch.from_numpy(rng.normal(size=(2, tokens, D)))
            torch.testing.assert_close(block(u, shared=shared), block(u), rtol=0, atol=0)
    # one entry of tables and one of positions per (batch, tokens): the second call of 6 tokens read the first's
    assert len(shared) == 4 and sum(key.startswith("positions ") for key in shared) == 2
