"""``from_xtransformers`` on a partial rotary embedding (x-transformers' ``rotary_emb_dim`` below the head
width, its default ``dim_head // 2``; GPT-J's partial rotation): ``rotary-attention`` with ``rotary_dim``.

x-transformers rotates the first ``rotary_emb_dim`` features of each head (interleaved pairs) and leaves
the rest; the kind turns its first ``rotary_dim / 2`` pairs by ``p θ^{−2r/R}`` and the others by the angle
zero. x-transformers' module at depth 1 and 2, every parameter perturbed, its inverse frequencies in
float64, equals the code generated from the composed scheme file (NumPy and torch, ≤ 1e-10), decoded
token by token through the KV cache too. ``check``'s evaluator agrees with the emitted code on the scheme;
the code of the full rotation does not (negative control), nor do kernels read without the permutation.
"""

import numpy as np
import pytest
import torch

from splitformer import derive
from splitformer.adapters import from_xtransformers
from splitformer.codegen.verification.scheme_checks import emitted_check
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.errors import SplitformerError

import x_transformers  # a test dependency: a broken install fails, never skips

DIM, HEADS = 16, 2  # head width 8
_DERIVED: dict[str, object] = {}


def _module(cls, depth: int, rotary_emb_dim: int | None, seed: int = 0):
    torch.manual_seed(seed)
    flags = {} if rotary_emb_dim is None else {"rotary_emb_dim": rotary_emb_dim}
    module = cls(dim=DIM, depth=depth, heads=HEADS, attn_dim_head=DIM // HEADS, attn_flash=True, rotary_pos_emb=True,
                 **flags).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    rotated = 2 * len(module.rotary_pos_emb.inv_freq)
    module.rotary_pos_emb.inv_freq = 10000.0 ** (-torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    return module.eval()


def _derived(adapted):
    if adapted.scheme_file not in _DERIVED:
        _DERIVED[adapted.scheme_file] = adapted.derivation()
    return _DERIVED[adapted.scheme_file]


def _numpy(adapted, u, layers=None, **options):
    return _derived(adapted).numpy_module().forward_stack(u, list(layers or adapted.layers),
                                                          **adapted.forward_kwargs, **options)


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("cls, rotary_emb_dim", [("Encoder", None), ("Decoder", None), ("Encoder", 6)])
def test_partial_rotary_equals_numpy_and_torch(cls, rotary_emb_dim, depth):
    source = _module(getattr(x_transformers, cls), depth, rotary_emb_dim)
    u = torch.randn(2, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    assert f"rotary_dim = {rotary_emb_dim or 4}" in adapted.scheme_file and len(adapted.layers) == depth
    assert np.abs(_numpy(adapted, u.numpy()) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10


def test_partial_rotary_decodes_token_by_token_and_its_controls_fail():
    """KV-cached decoding equals the full pass; negative controls: the same kernels through the full
    rotation's code (every pair turned), and without the pair permutation, are far off."""
    source = _module(x_transformers.Decoder, 2, None)
    u = torch.randn(2, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    cache = [{} for _ in adapted.layers]
    steps = [_numpy(adapted, u.numpy()[:, i:i + 1], cache=cache) for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    torch_cache = [{} for _ in adapted.layers]
    with torch.no_grad():
        steps = [stack(u[:, i:i + 1], cache=torch_cache).numpy() for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    full = parse_scheme(adapted.scheme_file.replace(", rotary_dim = 4", "").replace('name = "', 'name = "full-'))
    plain = [dict(layer) for layer in adapted.layers]  # not the reading, which the other scheme's module refuses
    rotated = derive(full).numpy_module().forward_stack(u.numpy(), plain, **adapted.forward_kwargs)
    assert np.abs(rotated - expected).max() > 1e-3
    attention = [layer[1] for layer in source.layers if type(layer[1]).__name__ == "Attention"]
    unpermuted = [layer | {f"attn.W_{part}": getattr(attention[index], f"to_{part}").weight.detach().numpy().T
                           for part in "qk"} for index, layer in enumerate(adapted.layers)]
    assert np.abs(_numpy(adapted, u.numpy(), unpermuted) - expected).max() > 1e-3


def test_check_evaluator_agrees_on_a_partial_rotation_and_its_control_fails():
    """``check``'s emitted-code comparison (50 digits; its sizes give heads of 4 features, 2 pairs) holds on
    a scheme rotating 2 features of each head, and fails for the code of the full rotation."""
    adapted = from_xtransformers(_module(x_transformers.Decoder, 1, None))
    scheme = parse_scheme(adapted.scheme_file.replace("rotary_dim = 4", "rotary_dim = 2"))
    program = derive(scheme).program
    assert emitted_check(scheme, program).holds
    full = parse_scheme(adapted.scheme_file.replace(", rotary_dim = 4", ""))
    control = emitted_check(scheme, program, {"numpy": derive(full).numpy_module()})
    assert not control.holds, control.detail


@pytest.mark.parametrize("rotary_dim", [3, -2, True])
def test_a_rotary_dim_that_is_not_an_even_count_is_refused(rotary_dim):
    text = from_xtransformers(_module(x_transformers.Encoder, 1, None)).scheme_file
    with pytest.raises(SplitformerError, match="rotary_dim") as error:
        parse_scheme(text.replace("rotary_dim = 4", f"rotary_dim = {str(rotary_dim).lower()}")).instantiate()
    assert "\n" not in str(error.value)
