"""``from_xtransformers`` under attributes changed after construction (issue 25): never a silent difference.

Each attack edits an x-transformers module after it was built, in a way the reader's comparisons of
attributes do not see (or did not): ALiBi's cached bias or its slopes after the cache was filled; T5's
``max_distance`` at or below its exact buckets; the softmax's axis (``Attend.attn_fn``'s keywords);
the causal mask's function (``Attend.create_causal_mask``); a ``None`` score scale. Each is refused
in one line, by name or by the probe (``adapters.probe``: the module and the generated forward of what
was read, on one random input, float64); before these changes each was read and differed from the
source (by 1.7 – 3.5 for ALiBi) with no error. Controls: the same modules unedited are read, and equal.
"""

import contextlib
import functools

import numpy as np
import pytest
import torch

from splitformer import derive
from splitformer.adapters import from_xtransformers, to_xtransformers
from splitformer.codegen.adapters.probe import check_probe, randomized
from splitformer.codegen.adapters.xtransformers import _float64_copy, _run, read_attention_layers
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.errors import SplitformerError

import x_transformers  # a test dependency: a broken install fails, never skips

DIM = 16


def _module(cls=x_transformers.Encoder, heads=2, **flags):
    torch.manual_seed(0)
    flags = {"attn_flash": True, "attn_dim_head": DIM // heads} | flags
    module = cls(dim=DIM, depth=1, heads=heads, **flags)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return module.double().eval()


def _refused(module, pattern):
    with pytest.raises(SplitformerError, match=pattern) as error:
        from_xtransformers(module)
    assert "\n" not in str(error.value)


def _equal(module, tokens=7):
    """The control: ``module`` is read, and the generated forward equals it (float64 softmax on its side)."""
    adapted = from_xtransformers(module)
    for attend in (part for part in module.modules() if type(part).__name__ == "Attend"):
        attend.attn_fn = functools.partial(torch.nn.functional.softmax, dim=-1)
    u = torch.randn(2, tokens, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = module(u).numpy()
    got = adapted.derivation().numpy_module().forward_stack(u.numpy(), list(adapted.layers), **adapted.forward_kwargs)
    return np.abs(got - expected).max()


@pytest.mark.parametrize("edit", ["bias", "slopes"])
def test_alibi_cache_that_disagrees_with_the_slopes_is_refused(edit):
    """x-transformers' ALiBi returns its cached bias for inputs no longer than the one that filled it; the reader
    reads the slopes. An edited cache, or slopes edited after it was filled, is refused by name."""
    module = _module(heads=4, alibi_pos_bias=True, alibi_num_heads=2).float()
    with torch.no_grad():
        module(torch.randn(1, 12, DIM))  # fills the cache (float32), as any use of the model does
    module = module.double()
    assert _equal(module, tokens=12) <= 1e-6  # control: the float32 cache agrees with the slopes to its precision
    with torch.no_grad():
        if edit == "bias":
            module.rel_pos.bias[0, 3, 7] += 1.0
        else:
            module.rel_pos.slopes.mul_(2.0)
    _refused(module, r"AlibiPositionalBias\.bias \(4, 12, 12\)")


@pytest.mark.parametrize("cls, buckets, max_distance", [("Encoder", 16, 4), ("Encoder", 16, 3), ("Decoder", 8, 4),
                                                        ("Encoder", 2, 8)])
def test_t5_max_distance_within_the_exact_buckets_is_refused(cls, buckets, max_distance):
    """T5's buckets divide by log(max_distance / e), e the exact buckets per direction: at max_distance <= e (or
    e = 0) x-transformers' own buckets are inf/nan (then out of its table); the reader refuses by name.
    (x-transformers' constructor asks for max_distance > num_buckets: the attribute is set after it.)"""
    module = _module(getattr(x_transformers, cls), heads=4, attn_flash=False, rel_pos_bias=True,
                     rel_pos_num_buckets=buckets, rel_pos_max_distance=20)
    module.rel_pos.max_distance = max_distance
    _refused(module, rf"RelativePositionBias\.max_distance={max_distance} with num_buckets={buckets}")
    control = _module(getattr(x_transformers, cls), heads=4, attn_flash=False, rel_pos_bias=True,
                      rel_pos_num_buckets=8 if cls == "Encoder" else 4, rel_pos_max_distance=9)
    assert _equal(control, tokens=12) <= 1e-10


def test_generated_code_refuses_a_table_within_max_distance():
    """The same condition where the table's length is known: the generated NumPy forward and vjp (a ValueError
    naming n_buckets and max_distance, before any work) and the torch Block's constructor; a scheme file and the
    Python Scheme object alike. Control: 8 buckets (2 exact per direction) run."""
    text = ('name = "t5-near"\nsummary = "T5 bias ending at distance 4"\n[operators]\nattn = { kind = "scored-attention", '
            'rel_pos_bias = "bidirectional", max_distance = 4 }\n[[steps]]\noperator = "attn"\nsolver = "explicit"\n')
    for scheme in (text, parse_scheme(text)):
        derivation = derive(parse_scheme(scheme) if isinstance(scheme, str) else scheme)
        numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
        rng = np.random.default_rng(0)
        params = {name: rng.standard_normal(tuple({"d": DIM, "n_heads": 2, "n_buckets": 8}[axis] for axis in axes))
                  for name, axes in numpy_module.PARAMETERS.items()}
        u = rng.standard_normal((1, 9, DIM))
        assert np.isfinite(numpy_module.forward(u, params, n_heads=2)).all()  # control
        torch_module.Block(DIM, 2, 0, n_buckets=8)
        params["attn.rel_bias"] = rng.standard_normal((16, 2))  # 4 exact buckets per direction: log(4 / 4) = 0
        for run in (lambda: numpy_module.forward(u, params, n_heads=2),
                    lambda: numpy_module.vjp(u, params, u, n_heads=2),
                    lambda: torch_module.Block(DIM, 2, 0, n_buckets=16)):
            with pytest.raises(ValueError, match=r"n_buckets = 16 .*max_distance = 4") as error:
                run()
            assert "\n" not in str(error.value)


def test_softmax_over_another_axis_is_refused_by_name():
    """``Attend.attn_fn`` is compared by its function (softmax) and its keywords: ``dim=-2`` normalizes over the
    queries. Refused by name (the probe refuses it too: ``test_zero_initialized_branches_hide_no_edit_from_the_probe``)."""
    module = _module(attn_flash=False)
    assert _equal(module) <= 1e-10  # control
    module.layers[0][1].attend.attn_fn = functools.partial(torch.nn.functional.softmax, dim=-2)
    _refused(module, r"^Encoder uses Attend\.attn_fn=functools\.partial\(<function softmax.*dim=-2\)")


def test_a_causal_mask_function_that_masks_nothing_is_refused_by_name():
    """``Attend.create_causal_mask`` (a function x-transformers keeps per instance) replaced by a callable that masks
    nothing: the Decoder then attends to later tokens. It must be x-transformers' own function object: refused by
    name, a lambda too, whatever path (grad mode, length, mask) the forward takes (as a method shadowed on the
    instance, ``Attend.flash_attn``, already was). So is a softmax partial with other keywords, or another SDPA
    context manager."""
    module = _module(x_transformers.Decoder, attn_flash=False)
    assert _equal(module) <= 1e-10  # control
    module.layers[0][1].attend.create_causal_mask = _MasksNothing()
    _refused(module, r"^Decoder uses Attend\.create_causal_mask=.*_MasksNothing")
    module = _module(x_transformers.Decoder)
    module.layers[0][1].attend.create_causal_mask = lambda i, j, device: torch.zeros(i, j, dtype=torch.bool,
                                                                                    device=device)
    _refused(module, r"^Decoder uses Attend\.create_causal_mask=<function .*<lambda>")
    module = _module()
    module.layers[0][1].attend.flash_attn = lambda *args, **kwargs: None  # shadows Attend.flash_attn
    _refused(module, r"^Encoder\.layers\.0\.1\.attend has its flash_attn replaced on the instance")
    module = _module(attn_flash=False)
    module.layers[0][1].attend.attn_fn = functools.partial(torch.nn.functional.softmax, dim=-1, dtype=torch.float16)
    _refused(module, r"^Encoder uses Attend\.attn_fn=")
    module = _module()
    module.layers[0][1].attend.sdp_context_manager = functools.partial(contextlib.nullcontext)
    _refused(module, r"^Encoder uses Attend\.sdp_context_manager=")


class _MasksNothing:
    """A causal mask function that masks nothing: a callable object, not a function."""

    def __call__(self, i, j, device):
        return torch.zeros(i, j, dtype=torch.bool, device=device)


def _probe(module, edit=None, random=True):
    """``check_probe`` of what a float64 copy of ``module`` reads (its own or random weights) against that copy
    with ``edit`` applied to each ``Attend`` after the reading (past the reader's checks)."""
    copy = _float64_copy(module)
    if random:
        randomized(copy)
    adapted = read_attention_layers(copy, probe=False)
    for attend in (part for part in copy.modules() if type(part).__name__ == "Attend"):
        edit and edit(attend)
    check_probe(type(module).__name__, adapted, functools.partial(_run, copy))


def _no_causal_mask(attend):
    attend.create_causal_mask = _MasksNothing()


def _softmax_over_queries(attend):
    attend.attn_fn = functools.partial(torch.nn.functional.softmax, dim=-2)


def test_the_flash_path_is_probed_with_a_padding_mask():
    """With ``attn_flash=True`` x-transformers calls ``create_causal_mask`` only under a mask (or a longer key
    set): the probe also runs with a padding mask (a row padded on the left, one on the right), on the valid
    tokens. Before, a mask function that masks nothing passed (no mask: 9e-16) and differed by 1.3 under a mask."""
    module = _module(x_transformers.Decoder, attn_flash=True)
    _probe(module)  # control
    with pytest.raises(SplitformerError, match=r"^Decoder: the generated forward .* differs from the module's by "
                                               r".* with a padding mask;"):
        _probe(module, _no_causal_mask)


@pytest.mark.parametrize("cls, edit", [
    (x_transformers.Encoder, _softmax_over_queries),
    (x_transformers.Decoder, _no_causal_mask),
])
def test_zero_initialized_branches_hide_no_edit_from_the_probe(cls, edit):
    """``zero_init_branch_output=True`` zeroes every branch's output projection: a probe of the module's own
    weights saw no attention at all, and accepted any edit of it (the module then computed otherwise once trained
    weights were loaded: 0.23 and 1.24). The probe runs a copy with random weights (the reader reads that copy).
    Controls: the unedited module is read, and with random weights written into both sides they are equal; the
    module's own weights do miss the edit."""
    module = cls(dim=DIM, depth=2, heads=2, attn_dim_head=DIM // 2, attn_flash=True,
                 zero_init_branch_output=True).double().eval()
    adapted = from_xtransformers(module)
    rng = np.random.default_rng(5)
    trained = adapted.with_params([{key: 0.3 * rng.standard_normal(np.shape(value)) for key, value in layer.items()}
                                   for layer in adapted.layers], adapted.final_norm)
    module.load_state_dict(to_xtransformers(trained, module), strict=True)
    u = np.random.default_rng(6).standard_normal((2, 7, DIM))
    with torch.no_grad():
        expected = module(torch.from_numpy(u)).numpy()
    got = trained.derivation().numpy_module().forward_stack(u, list(trained.layers), **trained.forward_kwargs)
    assert np.abs(got - expected).max() <= 1e-10
    zero = cls(dim=DIM, depth=2, heads=2, attn_dim_head=DIM // 2, attn_flash=False,
               zero_init_branch_output=True).double().eval()
    _probe(zero, edit, random=False)  # its own weights: the edit is invisible
    with pytest.raises(SplitformerError, match=rf"^{cls.__name__}: the generated forward .* differs from the module's"):
        _probe(zero, edit)


def test_a_score_scale_of_none_is_read_as_x_transformers_default():
    """``Attend.scale = None`` is x-transformers' default ``d_head^{-1/2}`` (it read as a TypeError before); a
    scale that is not a number is refused by name."""
    module = _module()
    module.layers[0][1].attend.scale = None
    assert _equal(module) <= 1e-10
    module.layers[0][1].attend.scale = "0.5"
    _refused(module, r"Attend\.scale='0\.5'")


def test_the_probe_leaves_the_module_as_it_was():
    """The probe runs a float64 copy: the source keeps its dtype, its ALiBi cache and its softmax."""
    module = _module(alibi_pos_bias=True, attn_flash=False).float()
    with torch.no_grad():
        module(torch.randn(1, 5, DIM))
    before = {key: value.clone() for key, value in module.state_dict().items()}
    cache, softmax = module.rel_pos.bias.clone(), module.layers[0][1].attend.attn_fn
    from_xtransformers(module)
    assert all(torch.equal(value, module.state_dict()[key]) for key, value in before.items())
    assert torch.equal(module.rel_pos.bias, cache) and module.layers[0][1].attend.attn_fn is softmax
    assert next(module.parameters()).dtype == torch.float32


def test_a_user_class_named_like_the_part_is_refused_by_its_library_class_before_the_probe(monkeypatch):
    """``class Attention(FeedForward)`` put where the attention is: read as the FeedForward it runs, refused by
    name; the probe (which would compare the forwards) is not reached."""
    from splitformer.codegen.adapters import xtransformers as reader

    class Attention(x_transformers.x_transformers.FeedForward):
        pass

    module = _module()
    impostor = Attention(DIM, mult=4).double().eval()
    impostor.load_state_dict(module.layers[1][1].state_dict())
    module.layers[0][1] = impostor
    monkeypatch.setattr(reader, "check_probe", lambda *args: pytest.fail("the probe ran"))
    _refused(module, r"^Encoder's 'a' layer 1 is Attention, running FeedForward, not Attention; ")
