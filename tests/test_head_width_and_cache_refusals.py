"""Generated code refuses a head narrower than its rotary embedding, and a cache with ``causal=False``
(issue 25, findings O1 and O2): ValueError naming the arguments, before any work (a cache given stays
as it was).

O1: ``rotary_dim = R`` turns the first ``R/2`` pairs of each head by the angles ``θ^(−2r/R)`` of an
``R``-feature embedding; a head of ``d_head < R`` features has fewer pairs, and rotated them with those
frequencies, silently. O2: a cached call's tokens cannot attend to the tokens of later calls, so chunked
cached decoding with ``causal=False`` differed from the full non-causal pass (3.42 in the attacker's run).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import splitformer
from splitformer.adapters import canonical
from splitformer.symbolic import parse_scheme

from conftest import GENERATED, import_path

PARTIAL_ROTARY = """
name = "partial-rotary"
summary = "pre-norm causal block, rotary positions on the first 8 features of each head"
causal = true
[operators]
norm1 = "layer-norm"
attn = { kind = "rotary-attention", rotary_dim = 8 }
norm2 = "layer-norm"
ffn = "feed-forward"
[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm2"
"""
D, D_FF = 16, 24
NARROW = "attn.rotary_dim = 8 needs heads at least 8 features wide, got d_head = 4"


@pytest.fixture(scope="module")
def partial():
    derivation = splitformer.derive(parse_scheme(PARTIAL_ROTARY))
    return derivation.numpy_module(), derivation.torch_module()


def test_a_head_narrower_than_rotary_dim_is_refused_by_every_entry(partial, rng):
    numpy_module, torch_module = partial
    torch_module.Block(D, 2, D_FF)  # control: heads of 8 features
    torch_module.Stack(2, D, 2, D_FF)
    params = canonical(torch_module.Block(D, 2, D_FF, dtype=torch.float64))[0][0]
    u = rng.standard_normal((2, 5, D))
    numpy_module.forward(u, params, n_heads=2)
    with pytest.raises(ValueError, match=NARROW):
        torch_module.Block(D, 4, D_FF)
    with pytest.raises(ValueError, match=NARROW):
        torch_module.Stack(2, D, 4, D_FF)
    cache = {}
    with pytest.raises(ValueError, match=NARROW):
        numpy_module.forward(u, params, n_heads=4, cache=cache)
    assert cache == {}  # refused before any work
    with pytest.raises(ValueError, match=NARROW):
        numpy_module.forward_stack(u, [params, params], n_heads=4)
    with pytest.raises(ValueError, match=NARROW):
        numpy_module.vjp(u, params, np.ones_like(u), n_heads=4)


def test_a_full_width_rotary_scheme_keeps_refusing_odd_heads_only():
    llama = import_path(GENERATED / "torch" / "llama.py", "_head_width_llama")
    llama.Block(8, 4, 12)  # control: rotary_dim = 0 rotates every pair of any even head, two features wide too
    with pytest.raises(ValueError, match="rotary position embedding needs an even head width, got d_head = 5"):
        llama.Block(15, 3, 12)


CACHED = ["gpt2", "llama"]


@pytest.mark.parametrize("name", CACHED)
def test_a_cache_with_causal_false_is_refused_and_left_as_it_was(name, rng):
    numpy_module = import_path(GENERATED / "numpy" / f"{name}.py", f"_cache_causal_numpy_{name}")
    torch_module = import_path(GENERATED / "torch" / f"{name}.py", f"_cache_causal_torch_{name}")
    torch.manual_seed(0)
    stack = torch_module.Stack(2, D, 4, D_FF, dtype=torch.float64)
    u = torch.tensor(rng.standard_normal((2, 8, D)))
    with torch.no_grad():
        full_causal, full_bidirectional = stack(u, causal=True), stack(u, causal=False)
        cache = [{} for _ in stack.layers]
        chunks = torch.cat([stack(u[:, :3], cache=cache), stack(u[:, 3:], cache=cache)], dim=1)
        assert (chunks - full_causal).abs().max() <= 1e-12  # control: a cache reproduces the causal pass
        assert (chunks - full_bidirectional).abs().max() > 0.1  # and cannot reproduce the non-causal one
        message = r"^cache needs causal=True \(or is_causal=True\): with causal=False each token attends to later ones"
        fresh = [{} for _ in stack.layers]
        with pytest.raises(ValueError, match=message):
            stack(u[:, :3], cache=fresh, causal=False)
        with pytest.raises(ValueError, match=message):
            stack.layers[0](u[:, :3], cache=fresh[0], causal=False)
        assert fresh == [{}, {}]
        stack(u[:, 3:], cache=cache, causal=False, is_causal=True)  # is_causal=True is causal: accepted
    layers, final_norm = canonical(stack)
    arrays = u.numpy()
    kwargs = {"n_heads": 4, "final_norm": final_norm} if final_norm else {"n_heads": 4}
    numpy_cache = [{} for _ in layers]
    with pytest.raises(ValueError, match=r"^cache needs causal=True: with causal=False"):
        numpy_module.forward_stack(arrays, layers, cache=numpy_cache, causal=False, **kwargs)
    with pytest.raises(ValueError, match=r"^cache needs causal=True"):
        numpy_module.forward(arrays, layers[0], n_heads=4, cache=numpy_cache[0], causal=False)
    assert numpy_cache == [{}, {}]


def test_a_head_width_option_must_be_an_integer_option_of_the_kind(monkeypatch):
    """A plug-in's ``head_width_option`` reaches the emitted code: only an int field of the operator is taken."""
    from splitformer.codegen.render import narrowest_head
    from splitformer.symbolic.errors import SplitformerError
    from splitformer.symbolic.rotary_attention import RotaryAttention

    scheme = parse_scheme(PARTIAL_ROTARY)
    assert narrowest_head(scheme) == {"width": 8, "option": "attn.rotary_dim = 8"}
    monkeypatch.setattr(RotaryAttention, "head_width_option", "width\"); import os; (\"")
    with pytest.raises(SplitformerError, match="head_width_option 'width.*is not one of its options"):
        narrowest_head(scheme)
    monkeypatch.setattr(RotaryAttention, "head_width_option", "key")  # a field, but text
    with pytest.raises(SplitformerError, match=r"key must be an int >= 0 to bound the head width, got 'attn'"):
        narrowest_head(scheme)


def test_a_head_width_option_that_is_not_an_identifier_never_reaches_the_f_string(monkeypatch):
    """Attack 19: ``@dataclass`` takes any text as a field name, and the option is printed in an f-string of the
    emitted ``_head_width``: ``w{print(...)}`` ran there. Refused; control: the kind's own option is taken."""
    from dataclasses import dataclass, field

    from splitformer.codegen.render import narrowest_head
    from splitformer.symbolic.errors import SplitformerError
    from splitformer.symbolic.kinds import OPERATOR_KINDS
    from splitformer.symbolic.rotary_attention import RotaryAttention

    name = "w{print('PWNED')}"
    wide = dataclass(frozen=True, eq=False, repr=False, init=False)(type("Wide", (RotaryAttention,), {
        "__module__": __name__, "__annotations__": {name: int}, name: field(default=4, init=False),
        "head_width_option": name}))
    scheme = parse_scheme(PARTIAL_ROTARY)
    assert narrowest_head(scheme)["option"] == "attn.rotary_dim = 8"  # control
    monkeypatch.setitem(OPERATOR_KINDS, "rotary-attention", wide)
    with pytest.raises(SplitformerError, match=r"head_width_option \"w\{print\('PWNED'\)\}\" is not one of its options"):
        narrowest_head(scheme)


@pytest.mark.parametrize("d_head, refused", [(4, True), (6, True), (8, False), (12, False)])
def test_a_set_head_width_narrower_than_the_rotary_dimension_is_refused_when_derived(d_head, refused):
    """``d_head = 4`` with ``rotary_dim = 8``: the emitted code would refuse every size, so the scheme is refused
    (``check`` crashed on it before); heads as wide or wider are the control."""
    from splitformer.codegen.render import narrowest_head
    from splitformer.symbolic.errors import SplitformerError

    scheme = parse_scheme(PARTIAL_ROTARY.replace("rotary_dim = 8", f"rotary_dim = 8, d_head = {d_head}"))
    if refused:
        with pytest.raises(SplitformerError, match=rf"d_head = {d_head}, but attn.rotary_dim = 8 needs heads at least 8"):
            narrowest_head(scheme)
    else:
        assert narrowest_head(scheme) == {"width": 8, "option": "attn.rotary_dim = 8"}


@pytest.mark.parametrize("command", [("show",), ("show", "--format", "latex"), ("derive", "--out", "out"), ("check",)])
def test_every_command_refuses_a_set_head_width_narrower_than_the_rotary_dimension(command, tmp_path):
    """``show`` printed the derivation of a scheme that ``derive`` and ``check`` refuse: now each command gives the
    one line and exit 2, and writes nothing; ``d_head = 8`` is the control."""
    import subprocess
    import sys

    for d_head, code in ((4, 2), (8, 0)):
        path = tmp_path / f"narrow{d_head}.toml"
        path.write_text(PARTIAL_ROTARY.replace("rotary_dim = 8", f"rotary_dim = 8, d_head = {d_head}"))
        if command[0] == "check" and code == 0:
            continue  # the control of `check` is its own tests' (test_check_wide_heads)
        result = subprocess.run([sys.executable, "-m", "splitformer", command[0], str(path), *command[1:]],
                                capture_output=True, text=True, cwd=tmp_path)
        assert result.returncode == code, result.stderr
        if code == 2:
            assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
            assert f"d_head = {d_head}, but attn.rotary_dim = 8 needs heads at least 8" in result.stderr
            assert not (tmp_path / "out").exists()
    if command == ("show",):  # the file's own text shows, derivation or not
        result = subprocess.run([sys.executable, "-m", "splitformer", "show", str(tmp_path / "narrow4.toml"), "--format",
                                 "toml"], capture_output=True, text=True, cwd=tmp_path)
        assert result.returncode == 0 and "d_head = 4" in result.stdout, result.stderr
