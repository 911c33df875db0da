"""torch.export with dynamic sizes: every block and stack exported once with the batch and token counts (and a memory's
tokens) as symbols, strictly (dynamo) and not, then run at other sizes against the eager module (float64, random
parameters); the networks with their batch and image sizes (ViT's image size is fixed: its position table is).

Two exports failed before: grouped-head llama (its support repeated per member as a reshaped expanded view, whose
guards torch.export could not prove for every token count) and, strictly, a llama stack (the text key of what its
layers share fixed the token count to the example's); and a module derived in memory exported strictly not at all
(dynamo imports the module of each function it inlines by name). Each has its control below.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import sys
import types

import pytest
import torch  # test dependencies: a broken install fails, never skips

from conftest import GENERATED

BLOCKS = sorted(path.stem for path in (GENERATED / "torch").glob("*.py")
                if path.stem != "__init__" and "class Block(" in path.read_text(encoding="utf-8"))
D, HEADS, D_FF = 32, 4, 48
#: Sizes of the example and of the calls after the export.
EXAMPLE, OTHERS = (2, 16, 9), [(3, 33, 5), (1, 2, 40)]


def _module(name: str) -> types.ModuleType:
    """The generated torch module ``name``, imported under a name of its own (dynamo imports it by name)."""
    module_name = f"_export_dynamic_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, GENERATED / "torch" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def _randomized(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            values = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.4
            parameter.copy_(values.abs() + 0.5 if name.endswith("var") else values)
    return module.eval()


def _block(module: types.ModuleType, kind: str) -> torch.nn.Module:
    grouped = {"n_kv_heads": 2} if "n_kv_heads" in inspect.signature(module.Block).parameters else {}
    if kind == "Block":
        return _randomized(module.Block(D, HEADS, D_FF, dtype=torch.float64, **grouped))
    return _randomized(module.Stack(2, D, HEADS, D_FF, dtype=torch.float64, **grouped))


def _inputs(block: torch.nn.Module, sizes: tuple[int, int, int], seed: int = 1) -> tuple[torch.Tensor, ...]:
    """The state (batch, tokens, d) and, where the block reads one, the memory (batch, memory tokens, d)."""
    generator = torch.Generator().manual_seed(seed)
    batch, tokens, memory = sizes
    u = torch.randn(batch, tokens, D, generator=generator, dtype=torch.float64)
    if "memory" not in inspect.signature(block.forward).parameters:
        return (u,)
    return u, torch.randn(batch, memory, D, generator=generator, dtype=torch.float64)


def _dynamic(args: tuple[torch.Tensor, ...]) -> tuple[dict, ...]:
    batch = torch.export.Dim("batch", min=1, max=64)
    tokens = ({0: batch, 1: torch.export.Dim("tokens", min=2, max=512)},)
    return tokens + ({0: batch, 1: torch.export.Dim("memory_tokens", min=2, max=512)},) * (len(args) - 1)


def _assert_exports(block: torch.nn.Module, strict: bool) -> None:
    """Exported at the example's sizes, the program equals the eager block at other sizes; control: a copy of the
    block with its parameters changed is far from the program (which reads the block's own parameters)."""
    args = _inputs(block, EXAMPLE)
    program = torch.export.export(block, args, dynamic_shapes=_dynamic(args), strict=strict).module()
    for sizes in OTHERS:
        other = _inputs(block, sizes, seed=sum(sizes))
        with torch.no_grad():
            exported, eager = program(*other), block(*other)
        assert exported.shape == other[0].shape and eager.abs().max() > 0.1
        assert (exported - eager).abs().max() <= 1e-12
    changed = copy.deepcopy(block)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.mul_(1.5)
        assert (program(*other) - changed(*other)).abs().max() > 1e-3


@pytest.mark.parametrize("name", BLOCKS)
def test_every_block_exports_with_symbolic_batch_and_tokens(name):
    _assert_exports(_block(_module(name), "Block"), strict=False)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("name", ["llama", "gpt2", "decoder"])
def test_stacks_export_with_symbolic_sizes(name, strict):
    _assert_exports(_block(_module(name), "Stack"), strict=strict)


def test_a_grouped_block_exports_strictly():
    _assert_exports(_block(_module("llama"), "Block"), strict=True)


def test_control_a_grouped_support_reshaped_from_its_expanded_view_does_not_export(monkeypatch):
    """Control: the member support as it was (``expand`` then ``reshape``) fails the export of grouped llama."""
    module = _module("llama")

    def expanded(support, batch, members, n_queries):
        if support is None:
            return None
        support = support[:, None].expand(batch, members, n_queries, support.shape[-1])
        return support.reshape(batch, 1, members * n_queries, support.shape[-1])

    monkeypatch.setattr(module, "_member_support", expanded)
    with pytest.raises(Exception, match="Constraints violated"):
        _assert_exports(_block(module, "Block"), strict=False)


def test_control_a_stack_sharing_by_text_key_under_dynamo_does_not_export(monkeypatch):
    """Control: sharing the rotary tables while dynamo records (their key's text fixes the token count) fails."""
    module = _module("llama")
    monkeypatch.setattr(module, "_shares", lambda argument: argument is None)
    with pytest.raises(Exception, match="specialized it to be a constant"):
        _assert_exports(_block(module, "Stack"), strict=True)


def _cvt_stage(n_heads: int, cls: bool) -> dict:
    return {"patch_size": 3, "patch_stride": 2, "patch_padding": 1, "n_heads": n_heads, "kernel_qkv": 3,
            "stride_q": 1, "padding_q": 1, "stride_kv": 2, "padding_kv": 1, "cls": cls}


#: The networks, small, and whether their image size may be a symbol (ViT's may not).
NETWORKS = {
    "vit": (lambda module: module.Model(n_layers=2, d_model=8, n_heads=2, d_ff=16, n_channels=3, patch_size=4,
                                        image_size=(16, 16), dtype=torch.float64), False),
    "cvt": (lambda module: module.Model(3, [8, 12], [1, 1], [16, 24], [_cvt_stage(1, False), _cvt_stage(2, True)],
                                        dtype=torch.float64), True),
    "resnet_block": (lambda module: module.Model(3, 6, stride=2, transfer=True, dtype=torch.float64), True),
    "unet_level": (lambda module: module.Model(3, 6, dtype=torch.float64), True),
}


@pytest.mark.parametrize("name", NETWORKS)
def test_networks_export_with_symbolic_batch_and_image_size(name):
    build, any_size = NETWORKS[name]
    network = _randomized(build(_module(name)))
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(2, 3, 16, 16, generator=generator, dtype=torch.float64)
    dynamic = {0: torch.export.Dim("batch", min=1, max=64)}
    if any_size:
        dynamic |= {2: 4 * torch.export.Dim("rows", min=2, max=64), 3: 4 * torch.export.Dim("cols", min=2, max=64)}
    program = torch.export.export(network, (images,), dynamic_shapes=(dynamic,), strict=False).module()
    other = torch.randn(3, 3, *((24, 32) if any_size else (16, 16)), generator=generator, dtype=torch.float64)
    with torch.no_grad():
        exported, eager = program(other), network(other)
    exported, eager = (out[0] if isinstance(out, tuple) else out for out in (exported, eager))
    assert exported.shape == eager.shape and eager.abs().max() > 0.1
    assert (exported - eager).abs().max() <= 1e-12
    changed = copy.deepcopy(network)  # control: a copy with other parameters is far from the program
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.mul_(1.5)
        out = changed(other)
    assert ((out[0] if isinstance(out, tuple) else out) - exported).abs().max() > 1e-3


def test_a_module_derived_in_memory_exports_strictly():
    """``derive(...).torch_module()``: dynamo imports the module of each function it inlines by its name, which the
    in-memory module is registered under. Control: the same text run in a module no import finds does not export."""
    import splitformer

    module = splitformer.derive("pre-ln").torch_module()
    _assert_exports(_randomized(module.Block(D, HEADS, D_FF, dtype=torch.float64)), strict=True)
    unregistered = types.ModuleType(f"{module.__name__}_unregistered")
    exec(compile(inspect.getsource(module), module.__file__, "exec", dont_inherit=True), unregistered.__dict__)
    with pytest.raises(ModuleNotFoundError):
        _assert_exports(_randomized(unregistered.Block(D, HEADS, D_FF, dtype=torch.float64)), strict=True)


def _export_with_positions(module: types.ModuleType) -> None:
    """A llama block exported with given float positions (half steps) as an input of symbolic length, run at another
    length with other positions against the eager block."""
    block = _block(module, "Block")
    generator = torch.Generator().manual_seed(3)
    tokens = torch.export.Dim("tokens", min=2, max=512)
    u = torch.randn(2, 16, D, generator=generator, dtype=torch.float64)
    program = torch.export.export(block, (u,), {"positions": torch.arange(16, dtype=torch.float64) / 2},
                                  dynamic_shapes={"u": {1: tokens}, "positions": {0: tokens}}).module()
    other, positions = (torch.randn(2, 40, D, generator=generator, dtype=torch.float64),
                        torch.rand(40, generator=generator, dtype=torch.float64) * 100)
    with torch.no_grad():
        eager = block(other, positions=positions)
        assert (program(other, positions=positions) - eager).abs().max() <= 1e-12
        assert (eager - block(other)).abs().max() > 1e-3  # the positions matter


def test_given_float_positions_export():
    """Their finiteness is checked in eager calls only (a value check would make the recorded graph's length
    data-dependent; eagerly, NaN is still refused)."""
    module = _module("llama")
    _export_with_positions(module)
    with pytest.raises(ValueError, match="positions must be finite"):
        _block(module, "Block")(torch.zeros(1, 2, D, dtype=torch.float64), positions=torch.tensor([0.0, float("nan")]))


def test_control_positions_checked_while_recorded_do_not_export(monkeypatch):
    module = _module("llama")
    monkeypatch.setattr(module, "_recorded", lambda: False)
    with pytest.raises(Exception, match="data-dependent"):
        _export_with_positions(module)
