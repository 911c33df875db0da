"""Token shift (``shift = "shift"``, kind ``token-shift``): the branch input's feature segments read along the tokens.

``from_xtransformers`` maps ``shift_tokens`` (Encoder and Decoder, ``shift_tokens`` 1 and 2, depth 1 and 2, float64,
SDPA path, random weights) onto the scheme whose generated NumPy and torch code equal x-transformers to ≤ 1e-10; the
Decoder also decodes token by token through its KV cache (which keeps the earlier tokens' branch inputs) equal to its
full pass. Negative control: positions reversed shift every segment the wrong way and are far off. The independent
evaluator's checks hold on a scheme file using it.
"""

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

import splitformer

from splitformer.adapters import from_xtransformers
from splitformer.codegen.verification.scheme_checks import derived_check, emitted_check
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.equation import equation_text
from splitformer.symbolic.errors import SplitformerError

import x_transformers

SCHEME = """
name = "shifted-pre-ln"
summary = "pre-LN fields on the normalized state shifted along the tokens"

[operators]
norm1 = "layer-norm"
shift = { kind = "token-shift", reach = 1 }
attn = "attention"
norm2 = "layer-norm"
ffn = "feed-forward"

[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
shift = "shift"

[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm2"
shift = "shift"
"""


def _xtransformers(cls, depth, reach):
    torch.manual_seed(10 * depth + reach)
    module = cls(dim=16, depth=depth, heads=2, attn_dim_head=8, attn_flash=True, shift_tokens=reach).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return module.eval()


_DERIVED = {}


@pytest.mark.parametrize("reach", [1, 2])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("cls", ["Encoder", "Decoder"])
def test_xtransformers_shift_tokens_equals_numpy_and_torch(cls, depth, reach):
    source = _xtransformers(getattr(x_transformers, cls), depth, reach)
    u = torch.randn(2, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    assert 'shift = "shift1"' in adapted.scheme_file and f"reach = {reach}" in adapted.scheme_file
    derivation = _DERIVED.setdefault(adapted.scheme_file, adapted.derivation())
    forward_stack = derivation.numpy_module().forward_stack
    assert np.abs(forward_stack(u.numpy(), list(adapted.layers), **adapted.forward_kwargs) - expected).max() <= 1e-10
    stack = adapted.build(derivation.torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10
    if cls == "Decoder":  # the cache keeps the earlier tokens' branch inputs: decoding equals the full pass
        cache = [{} for _ in adapted.layers]
        steps = [forward_stack(u.numpy()[:, t:t + 1], list(adapted.layers), cache=cache, **adapted.forward_kwargs)
                 for t in range(u.shape[1])]
        assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    # negative control: positions reversed, every segment reads its token from the other side
    reversed_positions = -np.arange(u.shape[1], dtype=np.float64)
    wrong = forward_stack(u.numpy(), list(adapted.layers), positions=reversed_positions, **adapted.forward_kwargs)
    assert np.abs(wrong - expected).max() > 1e-3


def test_the_independent_evaluator_holds_on_a_scheme_file():
    scheme = parse_scheme(SCHEME)
    program = splitformer.derive(scheme).program
    for check in (derived_check(scheme, program), emitted_check(scheme, program)):
        assert check.holds, (check.id, check.detail)
    assert equation_text(scheme) == "u_t = attn(shift(Proj[norm1](u))) + ffn(shift(Proj[norm2](u)))"


def test_the_checks_widen_d_until_every_segment_of_a_wide_reach_is_read():
    """A tester's finding: at the checks' d = 8 a shift of reach 4 has 9 segments of ⌊8/9⌋ = 0 features, the
    identity, so every check of a scheme with it held without reading a shift. The checks widen d to 2 features a
    segment and one more (20 over 2 heads): there the shift moves the block's output (the control: at d = 8 it is
    exactly pre-LN's), and the emitted module matches the independent evaluator."""
    from splitformer.codegen.verification.parameters import emitted_sizes, random_parameters
    from splitformer.codegen.verification.scheme_checks import EmittedInputs

    scheme = parse_scheme(SCHEME.replace("reach = 1", "reach = 4"))
    sizes = EmittedInputs.of(splitformer.derive(scheme).numpy_module().forward, 2, 0, scheme).sizes
    assert sizes.features == 20 and emitted_sizes(sizes, scheme) == sizes
    shifted, plain = splitformer.derive(scheme).numpy_module(), splitformer.derive("pre-ln").numpy_module()
    u = np.random.default_rng(3).standard_normal((2, 5, 20))
    for d, moved in ((8, False), (20, True)):
        params = random_parameters(scheme, replace(sizes, features=d), 4)
        gap = np.abs(shifted.forward(u[..., :d], params, n_heads=2) - plain.forward(u[..., :d], params, n_heads=2)).max()
        assert bool(gap > 1e-3) == moved, (d, gap)
    check = emitted_check(scheme, splitformer.derive(scheme).program)
    assert check.holds and "d = 20" in check.statement, check.detail


@pytest.mark.parametrize("edit, message", [
    (('shift = "shift"\n\n[[steps]]\noperator = "ffn"', 'shift = "norm1"\n\n[[steps]]\noperator = "ffn"'),
     "'shift' must name a token map"),
    (('operator = "attn"', 'operator = "shift"'), "'shift' is a token map"),
])
def test_bad_token_maps_are_refused_in_one_line(edit, message):
    with pytest.raises(SplitformerError, match=message):
        parse_scheme(SCHEME.replace(*edit, 1))


class _PosingAs(str):
    """A str equal (and hashing) to the text it poses as, whatever text it holds."""

    def __new__(cls, text, posing_as):
        value = super().__new__(cls, text)
        value.posing_as = posing_as
        return value

    def __eq__(self, other):
        return str.__eq__(self, other) or other == self.posing_as

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(self.posing_as)


@pytest.mark.parametrize("field", ["shift", "on", "step"])
def test_a_substep_field_of_a_str_subclass_is_refused(field):
    """A str subclass equal to a declared name passed ``key in operators`` and printed its own text into
    emitted code (sixth attacker, 01): substep fields are checked by exact type."""
    import dataclasses

    base = parse_scheme(SCHEME)
    first = base.body.steps[0]
    step = dataclasses.replace(first, **{field: _PosingAs("vars()[print('ran')].s", getattr(first, field))})
    scheme = dataclasses.replace(base, body=dataclasses.replace(base.body, steps=(step,) + base.body.steps[1:]))
    with pytest.raises(SplitformerError, match=rf"steps\[0\]\.{field}: expected str"):
        splitformer.derive(scheme)


def _padded_xtransformers(cls, depth, shift_tokens):
    torch.manual_seed(7 + depth)
    module = cls(dim=16, depth=depth, heads=2, attn_dim_head=8, attn_flash=True, shift_tokens=shift_tokens).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return module.eval()


@pytest.mark.parametrize("cls, depth, shift_tokens", [
    ("Encoder", 2, 1), ("Encoder", 1, 2), ("Encoder", 1, (1, 0)), ("Encoder", 1, (0, 1)), ("Decoder", 2, 1),
])
def test_padded_sequences_equal_xtransformers_on_the_valid_tokens(cls, depth, shift_tokens):
    """x-transformers zeroes a padded query's attention rows and its feed-forward shift (given no mask) carries
    the padded rows into their neighbours: ``padded_queries_outside`` (a padded token lies outside Ω_x as a
    query too) gives the same valid tokens, in NumPy, torch, the derived adjoint and (Decoder) cached decoding.
    Negative control: the same scheme with padded tokens kept as queries (torch's convention) is far off where
    the feed-forward is shifted (without that, no valid token reads a padded one: then the mask left out is)."""
    source = _padded_xtransformers(getattr(x_transformers, cls), depth, shift_tokens)
    u = torch.randn(2, 7, 16, dtype=torch.float64)
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[0, [0, 3]] = False  # padded at the start and inside (a Decoder's padded query 3 sees valid keys)
    keep[1, 4:] = False  # and at the end
    with torch.no_grad():
        expected = source(u, mask=keep).numpy()
    valid, padding = keep.numpy(), ~keep.numpy()
    adapted = from_xtransformers(source)
    assert "padded_queries_outside = true" in adapted.scheme_file
    derivation = _DERIVED.setdefault(adapted.scheme_file, adapted.derivation())
    numpy_module = derivation.numpy_module()
    layers, options = list(adapted.layers), dict(adapted.forward_kwargs, key_padding_mask=padding)
    got = numpy_module.forward_stack(u.numpy(), layers, **options)
    assert np.abs(got - expected)[valid].max() <= 1e-10
    stack = adapted.build(derivation.torch_module(), dtype=torch.float64)
    x = u.clone().requires_grad_(True)
    out = stack(x, key_padding_mask=torch.tensor(padding))
    assert np.abs(out.detach().numpy() - expected)[valid].max() <= 1e-10
    grad_out = np.random.default_rng(1).standard_normal(u.shape)
    out.backward(torch.tensor(grad_out))
    grad_u, _, _ = numpy_module.vjp_stack(u.numpy(), layers, grad_out, **options)
    assert np.abs(grad_u - x.grad.numpy()).max() <= 1e-10
    if cls == "Decoder":  # token by token through the KV cache, the mask growing with the keys
        cache = [{} for _ in layers]
        steps = [numpy_module.forward_stack(u.numpy()[:, t:t + 1], layers, cache=cache,
                                            **dict(options, key_padding_mask=padding[:, :t + 1]))
                 for t in range(u.shape[1])]
        assert np.abs(np.concatenate(steps, axis=1) - got).max() <= 1e-10
    if shift_tokens in (1, 2, (0, 1)):  # the feed-forward is shifted
        kept_as_queries = splitformer.derive(parse_scheme(
            adapted.scheme_file.replace("padded_queries_outside = true", "padded_queries_outside = false")))
        plain = [dict(layer) for layer in layers]  # not the reading, which the other scheme's module refuses
        wrong = kept_as_queries.numpy_module().forward_stack(u.numpy(), plain, **options)
    else:
        wrong = numpy_module.forward_stack(u.numpy(), layers, **adapted.forward_kwargs)
    assert np.abs(wrong - expected)[valid].max() > 1e-3


def test_padded_queries_outside_must_be_a_bool():
    with pytest.raises(SplitformerError, match="padded_queries_outside"):
        parse_scheme('padded_queries_outside = "yes"\n' + SCHEME)


def test_padded_rows_equal_xtransformers_with_a_float_mask_too():
    """With ``padded_queries_outside`` a padded row's attention is zero, as x-transformers makes it: all tokens
    equal x-transformers (no token shift), and a float ``key_padding_mask`` (−inf = padded) is read as the bool
    one. Negative control: padded tokens kept as queries (torch's convention) change the padded rows."""
    source = _padded_xtransformers(x_transformers.Encoder, 1, 0)
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, 1] = padding[1, 3:] = True
    with torch.no_grad():
        expected = source(u, mask=~padding).numpy()
    adapted = from_xtransformers(source)
    stack = adapted.build(adapted.derivation().torch_module(), dtype=torch.float64)
    floating = torch.zeros(2, 5, dtype=torch.float64).masked_fill(padding, float("-inf"))
    with torch.no_grad():
        for mask in (padding, floating):
            assert np.abs(stack(u, key_padding_mask=mask).numpy() - expected).max() <= 1e-10
    kept = splitformer.derive(parse_scheme(adapted.scheme_file.replace("padded_queries_outside = true",
                                                                       "padded_queries_outside = false")))
    wrong = kept.numpy_module().forward_stack(u.numpy(), [dict(layer) for layer in adapted.layers],  # not the reading
                                              key_padding_mask=padding.numpy(),
                                              **adapted.forward_kwargs)
    assert np.abs(wrong - expected)[padding.numpy()].max() > 1e-3


_CAUSAL_SHIFTS = {}


def _causal_shift(masked):
    """A causal token-shift scheme (offsets 0, 1, 2; ``masked = false``: no χ on any offset), its NumPy and torch
    modules and random parameters."""
    if masked not in _CAUSAL_SHIFTS:
        text = SCHEME.replace('reach = 1 }', f'reach = 2, causal = true, masked = {str(masked).lower()} }}')
        derivation = splitformer.derive(parse_scheme(text), causal=True)
        numpy_module, torch_module = derivation.numpy_module(), derivation.torch_module()
        rng = np.random.default_rng(7)
        params = {name: 0.3 * rng.standard_normal([{"d": 12, "d_ff": 20}[axis] for axis in axes])
                  for name, axes in numpy_module.PARAMETERS.items()}
        block = torch_module.Block(12, 2, 20, dtype=torch.float64)
        block.load_params({name: torch.from_numpy(value) for name, value in params.items()})
        _CAUSAL_SHIFTS[masked] = numpy_module, block, params
    return _CAUSAL_SHIFTS[masked]


@pytest.mark.parametrize("masked, positions, refused", [
    (True, [0, 1, 2, 3, 4, 5, 6, 7, 8], False),
    (True, [0, 1, 2, 3, 8, 7, 6, 5, 4], False),  # χ (causal by index) keeps the shifted segments off later tokens
    (True, [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4], False),
    (True, [0, 1, 1, 2, 2, 2, 3, 3, 4], True),  # a repeated position across the calls: offset 0 reads it
    (True, [0, 1, 2, 3, 3.4, 4, 5, 6, 7], True),
    (True, [0, 0, 0, 0, 0, 0, 0, 0, 0], True),
    (False, [0, 1, 2, 3, 4, 5, 6, 7, 8], False),
    (False, [0, 1, 2, 5, 4, 3, 6, 7, 8], True),  # no χ on offset 1: token 3 (at 5) reads token 4 (at 4)
])
def test_cached_decoding_equals_the_full_pass_or_refuses_the_positions(masked, positions, refused):
    """A causal token shift reads offset 0 (and, ``masked = false``, every offset) without χ: with repeated or
    decreasing positions the full pass has an earlier token read a later one, which an earlier cached call could
    not. The later call refuses such positions (naming them) before any work and leaves the cache as it was;
    otherwise cached decoding (calls of 4 and 5 tokens) equals the full pass, NumPy and torch."""
    numpy_module, block, params = _causal_shift(masked)
    u = np.random.default_rng(3).standard_normal((2, 9, 12))
    positions = np.array(positions, dtype=np.float64)
    full = numpy_module.forward(u, params, n_heads=2, positions=positions)
    cache, torch_cache = {}, {}
    first = numpy_module.forward(u[:, :4], params, n_heads=2, cache=cache, positions=positions[:4])
    with torch.no_grad():
        torch_first = block(torch.from_numpy(u[:, :4]), cache=torch_cache, positions=torch.from_numpy(positions[:4]))
    kept = {key: value.copy() for key, value in cache.items()}
    if refused:
        # a ValueError of the module's own class (what ``check`` tells from other errors of a cache by)
        with pytest.raises(numpy_module.LateTokenRead, match=r"^positions: new token \d+ at .* is read by a cached token"):
            numpy_module.forward(u[:, 4:], params, n_heads=2, cache=cache, positions=positions[4:])
        with pytest.raises(sys.modules[type(block).__module__].LateTokenRead,
                           match=r"^positions: new token \d+ at .* is read by a cached token"):
            block(torch.from_numpy(u[:, 4:]), cache=torch_cache, positions=torch.from_numpy(positions[4:]))
        assert cache.keys() == kept.keys() and all(np.array_equal(cache[key], kept[key]) for key in kept)
        assert all(value.shape[1] == 4 for key, value in torch_cache.items() if key != "options")
        # the full pass does let an earlier token read a later one: why cached decoding cannot follow
        later = u.copy()
        later[:, 4:] += np.random.default_rng(4).standard_normal(later[:, 4:].shape)
        assert np.abs(numpy_module.forward(later, params, n_heads=2, positions=positions)[:, :4] - full[:, :4]).max() > 1e-3
        return
    second = numpy_module.forward(u[:, 4:], params, n_heads=2, cache=cache, positions=positions[4:])
    assert np.abs(np.concatenate((first, second), axis=1) - full).max() <= 1e-12
    with torch.no_grad():
        torch_second = block(torch.from_numpy(u[:, 4:]), cache=torch_cache, positions=torch.from_numpy(positions[4:]))
    assert np.abs(torch.cat((torch_first, torch_second), dim=1).numpy() - full).max() <= 1e-12


@pytest.mark.parametrize("reach", ["0", "33", "100000000", "true", '"2"', "-1"])
def test_a_reach_beyond_the_bound_is_refused_in_one_line(reach, tmp_path, capsys):
    """Attack 20: the reach was unbounded; the kernel holds 2 reach + 1 terms, so a 250-byte file ran for minutes
    (reach 1000) or filled memory (10⁸). Refused; control: the widest reach allowed is taken."""
    from splitformer.codegen.cli import main
    from splitformer.symbolic.scheme_file import parse_scheme

    path = tmp_path / "wide.toml"
    path.write_text(SCHEME.replace("reach = 1 }", f"reach = {reach} }}"))
    assert main(["show", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and ("reach must be an int from 1 to 32" in error or "expected int" in error), error
    assert parse_scheme(SCHEME.replace("reach = 1 }", "reach = 32 }")).instantiate()["shift"].reach == 32


def test_a_causal_scheme_whose_shift_reads_later_tokens_fails_causality_not_the_check():
    """A tester's finding: an unmasked shift of reach 4 in a causal scheme reads later tokens; its emitted module
    refuses to decode with a cache at the check's positions (1, 3, 5, …), and that refusal crashed every causality
    statement ("emitted/<scheme> crashed"). Now block, stack and next-token fail, saying what moved, and the cached
    decoding is skipped quoting the refusal (the module's ``LateTokenRead``; another ValueError of the cache is a
    failure); control: the masked shift holds all four."""
    from splitformer.codegen.verification.causality import causality_checks

    for masked, holds in (("false", False), ("true", True)):
        scheme = parse_scheme(SCHEME.replace("reach = 1", f"reach = 4, masked = {masked}")
                              .replace('summary = "', 'causal = true\nsummary = "'))
        checks = {check.id.rsplit("/", 1)[1]: check
                  for check in causality_checks(scheme, splitformer.derive(scheme).numpy_module())}
        assert list(checks) == ["block", "stack", "next-token", "cache"]
        assert all(checks[name].holds is holds for name in ("block", "stack", "next-token")), checks
        cache = checks["cache"]
        assert (cache.method == "skipped" and "refuses this cached decoding: positions" in cache.detail) if not holds \
            else (cache.method == "numeric" and cache.holds), cache


def test_widened_heads_stay_even_for_rotary_attention():
    """A reviewer's finding: widening d for a shift of reach 4 gave rotary attention heads of 5 (or 9) features, and
    its semantics, emitted and causality checks crashed (at 199504b they held). The widened heads stay even."""
    from splitformer.codegen.verification.causality import causality_checks

    for causal in ("true", "false"):
        scheme = parse_scheme(SCHEME.replace("reach = 1", f"reach = 4, causal = {causal}")
                              .replace('attn = "attention"', 'attn = "rotary-attention"')
                              .replace('summary = "', 'causal = true\nsummary = "'))
        derivation = splitformer.derive(scheme)
        assert emitted_check(scheme, derivation.program).holds
        assert all(check.method != "crashed" for check in causality_checks(scheme, derivation.numpy_module()))
