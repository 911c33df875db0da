"""The generated torch ``Block``/``Stack`` as drop-ins for ``nn.TransformerEncoderLayer`` code:
dropout, torch's mask keywords and float masks, torch's initialization, repr, TorchScript."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from splitformer.adapters import from_torch
from splitformer.codegen.lowering import lower
from splitformer.symbolic import load_scheme
from splitformer.symbolic.derivation import derive

from conftest import GENERATED, derived_now, import_path, random_encoder_layer

D, HEADS, D_FF = 8, 2, 12
#: The generated block modules (the vision models are whole models with their own API).
TORCH_MODULES = sorted(path for path in (GENERATED / "torch").glob("[!_]*.py") if "class Block(" in path.read_text())


def torch_module(name: str):
    return import_path(GENERATED / "torch" / f"{name}.py", f"_dropin_{name}")


def pair(norm_first=False, dropout=0.0):
    """A random torch layer with ``dropout`` and the generated Block holding its parameters."""
    layer = random_encoder_layer(D, HEADS, D_FF, 1e-5, norm_first=norm_first)
    for module in (layer.dropout, layer.dropout1, layer.dropout2):
        module.p = dropout
    layer.self_attn.dropout = dropout
    block = from_torch(layer).build(torch_module("pre_ln" if norm_first else "post_ln"))
    block.dropout = dropout
    return layer, block


# --- dropout -----------------------------------------------------------------------------------------------------


def test_every_dropout_site_is_emitted():
    """Each site the lowering marks (residual branches, activations) has its dropout line."""
    for path in TORCH_MODULES:
        scheme = path.stem.removesuffix("_gelu").replace("_", "-")
        sites = lower(derive(load_scheme(scheme))).dropout
        source = path.read_text()
        assert sites and all(f"{site} = _dropout({site}, dropout_p)" in source for site in sites), path.name
        # the derived backward's _attention_adjoint recomputes a kernel with no dropout (it refuses dropout)
        source = re.sub(r"\ndef _attention_adjoint\(.*?\n\n\n", "\n", source, flags=re.S)
        kernels = len(re.findall(r"= _(?:attention|softmax)\(", source))
        assert kernels and len(re.findall(r"= _(?:attention|softmax)\(.*, dropout_p\)", source)) == kernels


def test_dropout_is_off_by_default_and_in_eval(rng):
    layer, block = pair(dropout=0.5)
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    assert torch_module("post_ln").Block(D, HEADS, D_FF).dropout == 0.0
    layer.eval(), block.eval()
    assert (block(u) - layer(u)).abs().max() <= 1e-10
    block.train()
    assert (block(u) - layer(u)).abs().max() > 1e-2


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_one_drops_each_residual_branch_as_torch(norm_first, rng):
    layer, block = pair(norm_first, dropout=1.0)
    layer.train(), block.train()
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    assert (block(u) - layer(u)).abs().max() <= 1e-10


def test_dropout_has_torch_distribution(rng):
    """The mean over 20000 dropout draws matches torch's (same places, same scaling) within 6 standard
    errors; without the attention-kernel dropout it misses by far more (negative control)."""
    layer, block = pair(dropout=0.2)
    namespace = block.forward.__globals__  # the generated module the block was built from
    layer.train(), block.train()
    u = torch.tensor(rng.standard_normal((1, 5, D))).expand(20000, 5, D).contiguous()
    with torch.no_grad():
        torch.manual_seed(0)
        reference = layer(u)
        standard_error = reference.std(0) / np.sqrt(len(u))
        ratio = lambda out: ((out.mean(0) - reference.mean(0)).abs() / standard_error).max()  # noqa: E731
        torch.manual_seed(1)
        assert ratio(block(u)) < 6
        attention = namespace["_attention"]
        namespace["_attention"] = lambda q, k, v, scale, support, p: attention(q, k, v, scale, support, 0.0)
        try:
            torch.manual_seed(1)
            assert ratio(block(u)) > 12
        finally:
            namespace["_attention"] = attention


# --- torch's mask keywords and float masks -------------------------------------------------------------------------


def test_torch_keywords_and_masks(rng):
    layer, block = pair(norm_first=True)
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    additive = torch.tensor(rng.standard_normal((5, 5)))  # finite: a kernel weight e^m, not only a support
    padding_float = torch.zeros(2, 5, dtype=torch.float64).masked_fill(padding, float("-inf"))
    cases = [
        (dict(src_key_padding_mask=padding), dict(src_key_padding_mask=padding)),
        (dict(src_key_padding_mask=padding_float), dict(src_key_padding_mask=padding_float)),
        (dict(src_mask=causal.isinf()), dict(src_mask=causal.isinf())),
        (dict(src_mask=causal, is_causal=True), dict(src_mask=causal, is_causal=True)),
        (dict(src_mask=additive, src_key_padding_mask=padding_float),
         dict(src_mask=additive, src_key_padding_mask=padding_float)),
        (dict(causal=True), dict(src_mask=causal, is_causal=True)),
    ]
    # references with autograd on: torch 2.13's inference fast path returns NaN for a float src_mask
    for ours, theirs in cases:
        kept = ~padding if "src_key_padding_mask" in theirs else torch.ones_like(padding)
        assert (block(u, **ours) - layer(u, **theirs))[kept].abs().max() <= 1e-10, ours.keys()
    per_batch = torch.stack([additive, additive.T])
    expected = torch.stack([layer(u[i:i + 1], src_mask=per_batch[i])[0] for i in range(2)])
    assert (block(u, src_mask=per_batch) - expected).abs().max() <= 1e-10


def test_a_nan_in_a_float_mask_reaches_the_output_as_in_torch(rng):
    """Attack s33 L3: a float mask's NaN was read as outside the support (``> −inf``), so an all-NaN mask ran as if
    every key were excluded and gave finite numbers, where torch's layer gives NaN. Now the NaN rows are NaN in both;
    the control: −inf in the same places gives the finite empty-support rows of before."""
    layer, block = pair()
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    column = torch.zeros(5, 5, dtype=torch.float64)
    column[:, 1] = float("nan")
    for mask in (torch.full((5, 5), float("nan"), dtype=torch.float64), column):
        ours, theirs = block(u, src_mask=mask), layer(u, src_mask=mask)  # autograd on: torch's layer, not its fast path
        assert torch.equal(ours.isnan(), theirs.isnan()) and ours.isnan().all()
    assert torch.isfinite(block(u, src_mask=torch.full((5, 5), float("-inf"), dtype=torch.float64))).all()


def test_batch_first_false_takes_tokens_first(rng):
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, batch_first=False, dtype=torch.float64)
    layer = layer.eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.tensor(rng.standard_normal(tuple(parameter.shape))) * 0.5)
    block = torch_module("post_ln").Block(D, HEADS, D_FF, batch_first=False, dtype=torch.float64)
    from_torch(layer).load_into(block)
    u = torch.tensor(rng.standard_normal((5, 2, D)))  # (tokens, batch, d)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        difference = block(u, src_key_padding_mask=padding) - layer(u, src_key_padding_mask=padding)
    assert difference[~padding.T].abs().max() <= 1e-10  # torch's fast path zeroes padded positions


def test_a_source_state_dict_never_loads_partially():
    layer, block = pair()
    with pytest.raises(ValueError, match=r"unexpected key 'linear1.bias'.*splitformer.adapters: from_torch\(layer\) or from_hf"):
        block.load_state_dict(layer.state_dict(), strict=False)  # norm1.bias would match by name
    other = torch_module("post_ln").Block(D, HEADS, D_FF, dtype=torch.float64)
    other.load_state_dict(block.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), block.state_dict().values()))


def test_mask_mistakes_are_named():
    block = torch_module("post_ln").Block(D, HEADS, D_FF)
    u = torch.zeros(2, 5, D)
    with pytest.raises(ValueError, match="key_padding_mask or src_key_padding_mask, not both"):
        block(u, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool), src_key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"src_mask must be bool or float of shape \[5, 5\] or \[2, 5, 5\]"):
        block(u, src_mask=torch.zeros(4, 5, 5))
    with pytest.raises(ValueError, match="key_padding_mask must be bool or float"):
        block(u, src_key_padding_mask=torch.zeros(2, 5, dtype=torch.int64))


# --- initialization and repr --------------------------------------------------------------------------------------


def test_reset_parameters_matches_torch_statistics():
    """Per parameter, pooled over 64 fresh layers: torch's half-width (max |x|) within 3 % and
    standard deviation within 6 % (the standard error of the smallest pool, 2048 biases, is 1 %)."""
    d, heads, d_ff, draws = 32, 4, 64, 64
    torch.manual_seed(0)
    block = derived_now("post-ln").torch_module().Block(d, heads, d_ff)  # generated now: its initialization code
    theirs, ours = {}, {}
    for _ in range(draws):
        for name, value in from_torch(torch.nn.TransformerEncoderLayer(d, heads, d_ff, batch_first=True)).items():
            theirs.setdefault(name, []).append(value.ravel())
        block.reset_parameters()
        for name, value in block.state_dict().items():
            ours.setdefault(name, []).append(value.numpy().ravel().copy())
    for name in theirs:
        reference, value = np.concatenate(theirs[name]), np.concatenate(ours[name])
        if np.all(reference == reference[0]):  # zeros, ones; +0.0 as torch's (uniform_(-0.0, 0.0) drew −0.0)
            assert np.array_equal(value, reference) and not np.signbit(value).any(), name
            continue
        assert abs(np.abs(value).max() / np.abs(reference).max() - 1) < 0.03, name
        assert abs(value.std() / reference.std() - 1) < 0.06, name
    # negative control: xavier_uniform for W_o (the former default) is outside that tolerance
    xavier = np.sqrt(6 / (2 * d)) / np.sqrt(3)
    assert abs(xavier / np.concatenate(theirs["attn.W_o"]).std() - 1) > 0.5


def test_repr_shows_scheme_sizes_and_shapes():
    text = repr(torch_module("pre_ln_gelu").Stack(2, D, HEADS, D_FF, dropout=0.1))
    assert "pre-ln, final_norm=True" in text
    assert "pre-ln, activation=gelu, d_model=8, n_heads=2, d_ff=12, eps=1e-05, bias=True, dropout=0.1, batch_first=True" in text
    assert "(attn): _Group(W_q: (8, 8), b_q: (8,)" in text and "(final_norm): _Group(gain: (8,), bias: (8,))" in text
    # tester s42: bias=False listed its zero biases (buffers no state_dict holds) among the parameters
    text = repr(torch_module("pre_ln_gelu").Stack(2, D, HEADS, D_FF, bias=False))
    assert "(attn): _Group(W_q: (8, 8), W_k: (8, 8), W_v: (8, 8), W_o: (8, 8))" in text
    assert "(final_norm): _Group(gain: (8,))" in text and "b_q" not in text and "bias:" not in text


# --- TorchScript ---------------------------------------------------------------------------------------------------


def _stack_and_block(module):
    return module.Block(D, HEADS, D_FF, dtype=torch.float64), module.Stack(2, D, HEADS, D_FF, dtype=torch.float64)


#: torch 2.13 deprecates TorchScript (it still works); the tracer warns that the shape checks and the
#: head scale 1/√d_head become constants, which they are for one module (other shapes are tested).
IGNORE_DEPRECATION = pytest.mark.filterwarnings("ignore::DeprecationWarning")
IGNORE_TRACER = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")


@pytest.mark.parametrize("path", TORCH_MODULES, ids=lambda path: path.stem)
@IGNORE_DEPRECATION
def test_torchscript_script(path, rng):
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    module = torch_module(path.stem)
    # a decoder's second input: the memory its cross-attention reads
    extra = (torch.tensor(rng.standard_normal((2, 3, D))),) if "memory" in module.Block.forward.__code__.co_varnames else ()
    for eager in _stack_and_block(module):
        scripted = torch.jit.script(eager)
        with torch.no_grad():
            assert (scripted(u, *extra) - eager(u, *extra)).abs().max() <= 1e-12
            assert (scripted(u, *extra, src_key_padding_mask=padding)
                    - eager(u, *extra, key_padding_mask=padding)).abs().max() <= 1e-12
        assert (scripted(u, *extra, causal=True) - eager(u, *extra, causal=True)).abs().max() <= 1e-12


@pytest.mark.parametrize("name", ["post_ln"])
@IGNORE_DEPRECATION
@IGNORE_TRACER
def test_torchscript_trace(name, rng):
    """Traced with autograd on (no in-place branch is recorded), run with and without it, other shapes."""
    u, other = torch.tensor(rng.standard_normal((2, 5, D))), torch.tensor(rng.standard_normal((3, 7, D)))
    for eager in _stack_and_block(torch_module(name)):
        traced = torch.jit.trace(eager, (u,))
        assert (traced(other) - eager(other)).abs().max() <= 1e-12
        with torch.no_grad():
            assert (traced(u) - eager(u)).abs().max() <= 1e-12


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@IGNORE_DEPRECATION
@IGNORE_TRACER
def test_a_causal_block_traced_on_one_token_stays_causal_on_more(name, rng):
    """Attack 15: traced with a one-token example (a decoding step), a causal Block recorded no mask (one token needs
    none) and let every token of a longer input attend to later ones (0.45 off). The trace keeps the mask."""
    one, five = torch.tensor(rng.standard_normal((1, 1, D))), torch.tensor(rng.standard_normal((2, 5, D)))
    eager = torch_module(name).Block(D, 2, 12, dtype=torch.float64).eval()
    traced = torch.jit.trace(eager, (one,))
    with torch.no_grad():
        assert (traced(five) - eager(five)).abs().max() <= 1e-12
        assert (traced(five) - eager(five, causal=False)).abs().max() > 1e-3  # control: the mask matters here


def test_torch_export_with_torch_keywords(rng):
    _, block = pair()
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    exported = torch.export.export(block, (u,), {"src_key_padding_mask": padding}).module()
    with torch.no_grad():
        assert (exported(u, src_key_padding_mask=padding) - block(u, key_padding_mask=padding)).abs().max() <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_row_scale_is_finite_up_to_the_largest_value(dtype):
    """The LayerNorm helper's scale table (TorchScript has no torch.finfo) keeps 2^e finite."""
    module = torch_module("post_ln")
    largest = torch.tensor([[torch.finfo(dtype).max, 1.0]], dtype=dtype)
    scale = module._row_scale(largest)
    assert torch.isfinite(scale).all() and (largest / scale).abs().max() <= 2
    assert module._max_exponent(dtype) == np.frexp(float(torch.finfo(dtype).max))[1] - 1  # log2 rounds up to 1024


@IGNORE_DEPRECATION
def test_a_module_derived_in_memory_scripts_as_its_file_does(rng):
    """Attack 17: ``derive(...).torch_module()`` compiled its source under splitformer's own ``from __future__ import
    annotations``, so every annotation was a string TorchScript could not resolve; the written file scripted."""
    import splitformer

    block = splitformer.derive("post-ln").torch_module().Block(D, HEADS, D_FF, dtype=torch.float64).eval()
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    with torch.no_grad():
        assert (torch.jit.script(block)(u) - block(u)).abs().max() <= 1e-12


@IGNORE_DEPRECATION
def test_a_block_scripts_its_own_code_after_another_scheme_of_its_name_is_derived(tmp_path, rng):
    """Attack 28: in-memory sources were kept for TorchScript under the module name alone, so a scheme file edited
    (ReLU → GELU) and derived again replaced them: scripting the first Block compiled the second's code, 0.19 off its
    eager forward, silently. Kept under their digest now; the control is the second Block, scripted as its own."""
    import splitformer
    from splitformer.symbolic.scheme_file import builtin_text

    path = tmp_path / "mine.toml"
    text = builtin_text("pre-ln").replace('name = "pre-ln"', 'name = "mine"')
    path.write_text(text)
    first = splitformer.derive(path).torch_module().Block(D, HEADS, D_FF, dtype=torch.float64).eval()
    path.write_text(text.replace('activation = "relu"', 'activation = "gelu"'))
    second = splitformer.derive(path).torch_module().Block(D, HEADS, D_FF, dtype=torch.float64).eval()
    second.load_state_dict(first.state_dict())
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    with torch.no_grad():
        assert (second(u) - first(u)).abs().max() > 1e-3  # the two schemes differ
        for block in (first, second):
            assert (torch.jit.script(block)(u) - block(u)).abs().max() <= 1e-12


@pytest.mark.parametrize("scheme", ["llama", "post_ln", "gpt2"])
def test_autocast_gives_one_result_with_and_without_autograd(scheme):
    """A tester's finding: under ``torch.autocast`` the inference path added the float32 residual into the product's
    bfloat16 output in place, so a Block returned bfloat16 without autograd and float32 with it (1.6e-2 apart), and a
    stack's next layer refused its input. No dead temporary is updated in place under autocast; the stack runs, and
    its result equals the one with autograd (control: the same stack outside autocast is float32 and differs)."""
    module = import_path(GENERATED / "torch" / f"{scheme}.py")
    torch.manual_seed(0)
    block, stack, u = module.Block(32, 4, 48), module.Stack(2, 32, 4, 48), torch.randn(2, 5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for model in (block, stack):
            traced = model(u)
            with torch.no_grad():
                inferred = model(u)
            assert inferred.dtype == traced.dtype == torch.float32
            assert torch.equal(inferred, traced.detach())
    with torch.no_grad():
        assert (stack(u) - inferred).abs().max() > 1e-4
