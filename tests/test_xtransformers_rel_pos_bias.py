"""``from_xtransformers`` on T5's relative position bias (x-transformers' ``rel_pos_bias``): ``scored-attention``
with ``rel_pos_bias = "causal"`` or ``"bidirectional"``.

x-transformers adds ``√d_head · T[β(j − i), h]`` to the scaled scores, ``T`` an ``Embedding(num_buckets, heads)``
and ``β`` T5's bucket of the relative position (exact near, logarithmic up to ``max_distance``, then the last
bucket; causal attention buckets how far back a key lies, bidirectional gives keys ahead half the buckets).
Its module at depth 1 and 2 (8 buckets, max_distance 20, 24 tokens: every kind of bucket is reached), every
parameter perturbed, float64 (its non-flash path, the only one T5 takes, with a float64 softmax), equals the
code generated from the composed scheme file (NumPy and torch, ≤ 1e-10), decoded token by token through the
KV cache too (key positions cached). ``check``'s evaluator (50 digits, from the kind's continuous definitions)
agrees with the emitted code; the controls (the other bucketing, the table's buckets reversed, shifted cached
positions, a misread table in the check) are far off.
"""

import functools
import types

import numpy as np
import pytest
import torch

from splitformer import derive
from splitformer.adapters import from_xtransformers
from splitformer.codegen.verification.scheme_checks import derived_check, emitted_check
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.errors import SplitformerError

import x_transformers  # a test dependency: a broken install fails, never skips

DIM, HEADS, TOKENS = 16, 4, 24
_DERIVED: dict[str, object] = {}


def _module(cls, depth: int, seed: int = 0):
    torch.manual_seed(seed)
    module = cls(dim=DIM, depth=depth, heads=HEADS, attn_dim_head=DIM // HEADS, attn_flash=False, rel_pos_bias=True,
                 rel_pos_num_buckets=8, rel_pos_max_distance=20).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    for attend in (module for module in module.modules() if type(module).__name__ == "Attend"):
        attend.attn_fn = functools.partial(torch.nn.functional.softmax, dim=-1)  # float64, not its float32
    return module.eval()


def _derived(text: str):
    if text not in _DERIVED:
        _DERIVED[text] = derive(parse_scheme(text))
    return _DERIVED[text]


def _read(cls, depth):
    source = _module(getattr(x_transformers, cls), depth)
    u = torch.randn(2, TOKENS, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    return source, from_xtransformers(source), u, expected


def _numpy(adapted, u, text=None, layers=None, **options):
    module = _derived(text or adapted.scheme_file).numpy_module()
    return module.forward_stack(u, list(layers or adapted.layers), **adapted.forward_kwargs, **options)


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("cls", ["Encoder", "Decoder"])
def test_rel_pos_bias_equals_numpy_and_torch(cls, depth):
    _, adapted, u, expected = _read(cls, depth)
    bucketing = "causal" if cls == "Decoder" else "bidirectional"
    assert f'rel_pos_bias = "{bucketing}", max_distance = 20' in adapted.scheme_file
    assert adapted.layers[0]["attn.rel_bias"].shape == (8, HEADS) and len(adapted.layers) == depth
    assert np.abs(_numpy(adapted, u.numpy()) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted.scheme_file).torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10
    other = "bidirectional" if cls == "Decoder" else "causal"  # negative controls: the other bucketing, reversed buckets
    swapped = adapted.scheme_file.replace(f'"{bucketing}"', f'"{other}"')
    plain = [dict(layer) for layer in adapted.layers]  # not the reading, which the other scheme's module refuses
    assert np.abs(_numpy(adapted, u.numpy(), swapped, plain) - expected).max() > 1e-3
    reversed_table = [layer | {"attn.rel_bias": layer["attn.rel_bias"][::-1]} for layer in adapted.layers]
    assert np.abs(_numpy(adapted, u.numpy(), layers=reversed_table) - expected).max() > 1e-3


def test_kv_cached_decoding_equals_the_full_pass():
    """Token by token through the KV cache (the key positions the bucket reads are cached) = the full pass;
    control: the cached key positions shifted by one token."""
    _, adapted, u, expected = _read("Decoder", 2)
    cache = [{} for _ in adapted.layers]
    steps = [_numpy(adapted, u.numpy()[:, i:i + 1], cache=cache) for i in range(TOKENS)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted.scheme_file).torch_module(), dtype=torch.float64)
    torch_cache = [{} for _ in adapted.layers]
    with torch.no_grad():
        steps = [stack(u[:, i:i + 1], cache=torch_cache).numpy() for i in range(TOKENS)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    for entry in cache:
        entry["attn.pos_k"] = entry["attn.pos_k"] + 1.0
    shifted = _numpy(adapted, u.numpy()[:, -1:], cache=cache)
    assert np.abs(shifted - expected[:, -1:]).max() > 1e-6


@pytest.mark.parametrize("cls", ["Encoder", "Decoder"])
def test_check_evaluator_agrees_and_its_control_fails(cls):
    """``check``'s comparisons of the derived program (symbolic) and the emitted code (50 digits, 4 buckets,
    token distances up to 7) with the evaluator hold; with the table read one bucket further they fail."""
    _, adapted, _, _ = _read(cls, 1)
    scheme = parse_scheme(adapted.scheme_file)
    derivation = _derived(adapted.scheme_file)
    for check in (derived_check(scheme, derivation.program), emitted_check(scheme, derivation.program)):
        assert check.holds, check.detail
    numpy_module = derivation.numpy_module()

    @functools.wraps(numpy_module.forward)
    def misread(u, params, **options):
        return numpy_module.forward(u, {**params, "attn.rel_bias": np.roll(params["attn.rel_bias"], 1, axis=0)},
                                    **options)

    control = emitted_check(scheme, derivation.program, {"numpy": types.SimpleNamespace(forward=misread)})
    assert not control.holds, control.detail


def test_the_derived_adjoint_equals_autograd():
    """The emitted NumPy ``vjp`` of the causal block equals torch's autograd through the generated Block, the
    table's gradient included; the gradient of the table with its buckets reversed does not."""
    _, adapted, _, _ = _read("Decoder", 1)
    derivation, params = _derived(adapted.scheme_file), dict(adapted.layers[0])
    rng = np.random.default_rng(2)
    u, seed = rng.standard_normal((2, 9, DIM)), rng.standard_normal((2, 9, DIM))
    options = {key: value for key, value in adapted.forward_kwargs.items() if key != "final_norm"}
    grad_u, grads = derivation.numpy_module().vjp(u, params, seed, **options)
    block = derivation.torch_module().Block(DIM, HEADS, adapted.sizes["d_ff"], n_buckets=8, eps=adapted.eps,
                                            dtype=torch.float64).load_params(params)
    state = torch.tensor(u, requires_grad=True)
    (block(state, causal=True) * torch.tensor(seed)).sum().backward()
    assert np.abs(grad_u - state.grad.numpy()).max() <= 1e-10
    assert np.abs(grads["attn.rel_bias"] - block.attn.rel_bias.grad.numpy()).max() <= 1e-10
    assert np.abs(grads["attn.rel_bias"][::-1] - block.attn.rel_bias.grad.numpy()).max() > 1e-3


@pytest.mark.parametrize("option, value", [("rel_pos_bias", '"both"'), ("max_distance", "1")])
def test_bad_options_are_refused_in_one_line(option, value):
    text = 'name = "t5"\nsummary = "a bad option"\n[operators]\nattn = { kind = "scored-attention", ' + f"{option} = {value} }}\n" \
           '[[steps]]\noperator = "attn"\nsolver = "explicit"\n'
    with pytest.raises(SplitformerError, match=option) as error:
        parse_scheme(text).instantiate()
    assert "\n" not in str(error.value)


def test_an_attribute_of_the_bias_module_the_reader_does_not_know_is_refused():
    """``RelativePositionBias`` is read through an allowlist of its attributes, as every x-transformers module."""
    source = _module(x_transformers.Encoder, 1)
    from_xtransformers(source)  # control
    source.rel_pos.future_flag = True
    with pytest.raises(SplitformerError, match=r"RelativePositionBias\.future_flag=True") as error:
        from_xtransformers(source)
    assert "\n" not in str(error.value)


def test_a_bucket_count_other_than_the_tables_rows_is_refused():
    """Sixth attacker, 03: x-transformers buckets by ``num_buckets``, the generated code by the table's rows;
    ``num_buckets = 4`` on a table of 8 was read and differed by 2.99."""
    source = _module(x_transformers.Encoder, 1)
    from_xtransformers(source)  # control
    source.rel_pos.num_buckets = 4
    with pytest.raises(SplitformerError, match=r"RelativePositionBias\.num_buckets=4.*8 rows"):
        from_xtransformers(source)


@pytest.mark.parametrize("buckets", [4, 16])
def test_a_stacks_bucket_count_other_than_the_tables_rows_is_refused_on_load_and_write(buckets):
    """Ninth attacker, F1/F2: a generated Stack's ``n_buckets`` set after construction was not compared, so
    ``load_into`` loaded the 8-row table into layers bucketing by another count (3.7–4.2 off) and
    ``to_xtransformers`` wrote such a Stack into an 8-bucket module (3.2–3.5 off); the unedited Stack is the control."""
    source, adapted, u, expected = _read("Encoder", 2)
    stack = adapted.build(_derived(adapted.scheme_file).torch_module(), dtype=torch.float64)
    adapted.load_into(stack)  # control
    x_transformers_module = _module(x_transformers.Encoder, 2, seed=1)
    from splitformer.adapters import to_xtransformers
    to_xtransformers(stack, x_transformers_module)
    stack.layers[1].n_buckets = buckets
    with pytest.raises(SplitformerError, match=rf"^the source has n_buckets=8, the Stack layers\[1\] n_buckets={buckets}$"):
        adapted.load_into(stack)
    with pytest.raises(SplitformerError, match=rf"n_buckets={buckets}"):
        to_xtransformers(stack, x_transformers_module)


@pytest.mark.parametrize("max_distance, refused", [(10**400, True), (2**31 + 1, True), (1, True), (2**31, False)])
def test_max_distance_is_an_int_from_2_to_2_to_the_31(max_distance, refused):
    """Attack 23: a 401-digit max_distance derived, then every call of the emitted module was an OverflowError."""
    text = ('name = "t5ish"\nsummary = "s"\n[operators]\n'
            f'attn = {{ kind = "scored-attention", rel_pos_bias = "causal", max_distance = {max_distance} }}\n'
            '[[steps]]\noperator = "attn"\nsolver = "explicit"\n')
    if refused:
        message = r"^<scheme>: attn: max_distance must be an int from 2 to 2\*\*31, got \d{1,40}$"
        with pytest.raises(SplitformerError, match=message):
            parse_scheme(text).instantiate()
    else:
        parse_scheme(text).instantiate()
