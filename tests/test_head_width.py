"""The attention kinds' head width ``d_head`` independent of ``d / n_heads`` (x-transformers' ``attn_dim_head``).

``W_q, W_k, W_v`` are ``(d, n_heads · d_head)``, ``W_o`` is ``(n_heads · d_head, d)`` and the scores are
scaled by ``d_head^{-1/2}`` (the head domain's measure). x-transformers' ``Encoder``/``Decoder`` (dim 64,
4 heads: ``dim / heads = 16``) with heads of 8 and of 32 features, every parameter perturbed, float64
through its ``scaled_dot_product_attention`` path, read by ``from_xtransformers`` into ``d_head`` and run
through the generated NumPy and torch code (≤ 1e-10); written back by ``to_xtransformers``; the derived
adjoint against autograd; KV-cached decoding against the full pass; ``check``'s evaluator against the
emitted code. Negative controls: the score scale of ``d / n_heads`` is far off, in the parameters and in
the emitted code. Bad values are refused in one line naming the option.
"""

import numpy as np
import pytest
import torch

from splitformer import derive
from splitformer.adapters import from_xtransformers, to_xtransformers
from splitformer.codegen.verification.emitted import compiled, emitted_modules
from splitformer.codegen.verification.scheme_checks import derived_check, emitted_check
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.errors import SplitformerError

import x_transformers  # a test dependency: a broken install fails, never skips

from test_xtransformers import _derived

DIM, HEADS = 64, 4  # dim / heads = 16


def _module(cls, depth: int, width: int, seed: int = 0, **flags):
    torch.manual_seed(seed)
    module = cls(dim=DIM, depth=depth, heads=HEADS, attn_dim_head=width, attn_flash=True, **flags).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    if module.rotary_pos_emb is not None:  # its inverse frequencies in float64 (as built: float32, θ off by 5e-4)
        rotated = 2 * len(module.rotary_pos_emb.inv_freq)
        module.rotary_pos_emb.inv_freq = 10000.0 ** (-torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    return module.eval()


def _numpy(adapted, u, layers=None, **options):
    return _derived(adapted).numpy_module().forward_stack(u, list(layers or adapted.layers),
                                                          **adapted.forward_kwargs, **options)


def _read(cls, depth: int, width: int, tokens: int = 5, **flags):
    """x-transformers' module, an input, its output and what ``from_xtransformers`` reads."""
    source = _module(cls, depth, width, **flags)
    u = torch.randn(2, tokens, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    return source, u, expected, from_xtransformers(source)


def _stack(adapted, backward="autograd"):
    """A generated torch Stack holding ``adapted``'s parameters, with the given backward."""
    module = _derived(adapted).torch_module()
    stack = module.Stack(len(adapted.layers), DIM, HEADS, adapted.sizes["d_ff"], eps=adapted.eps, bias=adapted.bias,
                         final_norm=adapted.final_norm is not None, dtype=torch.float64, backward=backward,
                         **{key: value for key, value in adapted.options.items() if key == "rope_theta"})
    return stack.load_params(list(adapted.layers), adapted.final_norm)


@pytest.mark.parametrize("width", [8, 32])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("cls", ["Encoder", "Decoder"])
def test_head_width_equals_numpy_and_torch(cls, depth, width):
    _, u, expected, adapted = _read(getattr(x_transformers, cls), depth, width)
    assert f"d_head = {width}" in adapted.scheme_file and len(adapted.layers) == depth
    assert adapted.layers[0]["attn.W_q"].shape == (DIM, HEADS * width)
    assert adapted.layers[0]["attn.W_o"].shape == (HEADS * width, DIM)
    assert np.abs(_numpy(adapted, u.numpy()) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10


@pytest.mark.parametrize("width", [8, 32])
@pytest.mark.parametrize("flags", [{"rotary_pos_emb": True, "attn_kv_heads": 2}, {"attn_qk_norm": True}],
                         ids=["rotary+kv_heads", "qk_norm"])
def test_head_width_with_rotary_grouped_and_scored_attention(flags, width):
    """``rotary-attention`` (its default partial rotation, half the head) and ``scored-attention`` take it too."""
    _, u, expected, adapted = _read(x_transformers.Decoder, 2, width, **flags)
    assert f"d_head = {width}" in adapted.scheme_file
    assert np.abs(_numpy(adapted, u.numpy()) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10


@pytest.mark.parametrize("width", [8, 32])
def test_the_score_scale_of_d_over_heads_is_far_off(width):
    """Negative control: queries scaled for ``(d / n_heads)^{-1/2}`` instead of ``d_head^{-1/2}``."""
    _, u, expected, adapted = _read(x_transformers.Encoder, 1, width)
    wrong = [layer | {"attn.W_q": layer["attn.W_q"] * np.sqrt(width / (DIM // HEADS))} for layer in adapted.layers]
    assert np.abs(_numpy(adapted, u.numpy(), wrong) - expected).max() > 1e-3


@pytest.mark.parametrize("width", [8, 32])
def test_head_width_writes_back_into_x_transformers(width):
    """``to_xtransformers``: a moved Stack written into another module of the same flags computes what it does."""
    source, target = _module(x_transformers.Decoder, 2, width), _module(x_transformers.Decoder, 2, width, seed=1)
    adapted = from_xtransformers(source)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    with torch.no_grad():
        stack.load_params([{key: value * 1.1 + 0.05 for key, value in layer.items()} for layer in adapted.layers],
                          adapted.final_norm)
    target.load_state_dict(to_xtransformers(stack, target), strict=True)
    u = torch.randn(2, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert (target(u) - stack(u)).abs().max() <= 1e-12
        assert (source(u) - stack(u)).abs().max() > 1e-3  # control: the original weights compute something else


@pytest.mark.parametrize("width", [8, 32])
def test_derived_backward_equals_autograd(width):
    """The torch Stack with ``backward="derived"`` and NumPy's ``vjp_stack`` against autograd."""
    adapted = from_xtransformers(_module(x_transformers.Decoder, 2, width))
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    seed = torch.randn(2, 5, DIM, dtype=torch.float64)
    gradients = []
    for backward in ("autograd", "derived"):
        stack, x = _stack(adapted, backward), u.clone().requires_grad_(True)
        stack(x).backward(seed)
        gradients.append([x.grad, *(parameter.grad for parameter in stack.parameters())])
    assert len(gradients[0]) > 2
    for autograd, derived in zip(*gradients):
        assert (autograd - derived).abs().max() <= 1e-10 * max(1.0, autograd.abs().max().item())
    stack, x = _stack(adapted), u.clone().requires_grad_(True)
    stack(x).backward(seed)
    grad_u, grad_layers, _ = _derived(adapted).numpy_module().vjp_stack(
        u.numpy(), list(adapted.layers), seed.numpy(), final_norm=adapted.final_norm,
        **{key: value for key, value in adapted.forward_kwargs.items() if key != "final_norm"})
    assert np.abs(grad_u - x.grad.numpy()).max() <= 1e-10
    for name in ("attn.W_q", "attn.W_o"):
        assert grad_layers[1][name].shape == adapted.layers[1][name].shape
        expected = getattr(stack.layers[1].attn, name.split(".")[1]).grad.numpy()
        assert np.abs(grad_layers[1][name] - expected).max() <= 1e-10 * max(1.0, np.abs(expected).max())


@pytest.mark.parametrize("width", [8, 32])
def test_kv_cached_decoding_equals_the_full_pass(width):
    _, u, expected, adapted = _read(x_transformers.Decoder, 2, width, tokens=6)
    cache = [{} for _ in adapted.layers]
    steps = [_numpy(adapted, u.numpy()[:, i:i + 1], cache=cache) for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    stack, torch_cache = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64), [{} for _ in adapted.layers]
    with torch.no_grad():
        steps = [stack(u[:, i:i + 1], cache=torch_cache).numpy() for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10


def _with_head_width(builtin: str, width: int, kinds: dict[str, str]) -> str:
    """The built-in scheme file ``builtin`` with ``d_head = width`` on its attention operators ``kinds``."""
    from importlib import resources

    text = resources.files("splitformer.symbolic").joinpath("schemes", f"{builtin}.toml").read_text()
    for key, kind in kinds.items():
        assert f'{key} = "{kind}"' in text
        text = text.replace(f'{key} = "{kind}"', f'{key} = {{ kind = "{kind}", d_head = {width} }}')
    return text.replace(f'name = "{builtin}"', f'name = "{builtin}-head{width}"')


@pytest.mark.parametrize("builtin, kinds", [
    ("pre-ln", {"attn": "attention"}),
    ("decoder", {"attn": "attention", "cross": "cross-attention"}),
    ("llama", {"attn": "rotary-attention"}),
])
def test_check_evaluator_agrees_with_the_emitted_code(builtin, kinds):
    """``check``'s evaluator (50 digits, its sizes: 8 features, 2 heads) against the code emitted with heads of
    6 features (wider than 8 / 2); for the decoder also the derived program, symbolically."""
    scheme = parse_scheme(_with_head_width(builtin, 6, kinds))
    program = derive(scheme).program
    check = emitted_check(scheme, program)
    assert check.holds, check.detail
    if builtin == "pre-ln":
        assert derived_check(scheme, program).holds


def test_check_fails_on_code_with_the_score_scale_of_d_over_heads():
    """Negative control: the emitted code with ``1/√(d / n_heads)`` in place of ``1/√d_head``."""
    scheme = parse_scheme(_with_head_width("pre-ln", 6, {"attn": "attention"}))
    program = derive(scheme).program
    source = derive(scheme).source("numpy")
    assert "1 / math.sqrt(d_head)" in source
    wrong = compiled(source.replace("1 / math.sqrt(d_head)", "1 / math.sqrt(d // n_heads)"), "numpy", program.name)
    check = emitted_check(scheme, program, {"numpy": wrong, "torch": emitted_modules(scheme, program)["torch"]})
    assert not check.holds, check.detail


def test_the_cli_check_passes_on_a_scheme_file_with_the_option(tmp_path, capsys):
    from splitformer.codegen.cli import main

    path = tmp_path / "pre-ln-head6.toml"
    path.write_text(_with_head_width("pre-ln", 6, {"attn": "attention"}))
    assert main(["check", str(path), "--only", "semantics,recovery,adjoint,causality,adjoint-test,order,convergence"]) == 0
    assert "0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-4", "2.5", "true", '"8"', "4097"])  # 4097: attack 23, check took 12 GiB
@pytest.mark.parametrize("kind", ["attention", "scored-attention", "rotary-attention", "cross-attention"])
def test_bad_head_widths_are_refused_in_one_line(kind, value):
    text = f'name = "bad"\nsummary = "s"\n[operators]\nattn = {{ kind = "{kind}", d_head = {value} }}\n' \
           '[[steps]]\noperator = "attn"\nsolver = "explicit"\n'
    with pytest.raises(SplitformerError, match="d_head must be an int from 1 to 4096") as error:
        parse_scheme(text).instantiate()
    assert "\n" not in str(error.value)
    parse_scheme(text.replace(f"d_head = {value}", "d_head = 4096")).instantiate()  # control: the widest head


def test_odd_rotary_widths_and_differing_widths_are_refused():
    with pytest.raises(SplitformerError, match="d_head must be even"):
        parse_scheme(_with_head_width("llama", 5, {"attn": "rotary-attention"})).instantiate()
    text = _with_head_width("decoder", 6, {"attn": "attention"})
    with pytest.raises(SplitformerError, match="'attn' and 'cross' set d_head = 6 and None") as error:
        parse_scheme(text).check()
    assert "\n" not in str(error.value)


def test_the_default_is_d_over_heads_and_leaves_the_parameters_square():
    """Without the option the shapes are (d, d) and the emitted code divides d by n_heads (byte-identical
    goldens: test_emission); with it, ``d`` need not be divisible by ``n_heads``."""
    plain = derive(parse_scheme(_with_head_width("pre-ln", 6, {}))).numpy_module()
    assert plain.PARAMETERS["attn.W_q"] == ("d", "d")
    wide = derive(parse_scheme(_with_head_width("pre-ln", 6, {"attn": "attention"}))).numpy_module()
    assert wide.PARAMETERS["attn.W_q"] == ("d", "d_inner") and wide.PARAMETERS["attn.W_o"] == ("d_inner", "d")
    rng = np.random.default_rng(0)
    sizes = {"d": 10, "d_inner": 3 * 6, "d_ff": 7}
    params = {name: rng.standard_normal(tuple(sizes[axis] for axis in axes)) for name, axes in wide.PARAMETERS.items()}
    assert wide.forward(rng.standard_normal((4, 10)), params, n_heads=3).shape == (4, 10)
    with pytest.raises(ValueError, match="attn.W_q"):
        wide.forward(rng.standard_normal((4, 10)), params, n_heads=2)
