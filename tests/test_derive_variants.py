"""``derive --causal`` and ``--name`` (and ``splitformer.derive(causal=, name=)``); a scheme
file's own activation names no module suffix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import splitformer
from splitformer import SplitformerError
from splitformer.codegen.cli import main

from conftest import GENERATED, ROOT, import_path


def _fails(capsys, *arguments: str, message: str) -> None:
    """``main(arguments)`` exits 2 with one ``error:`` line containing ``message``."""
    capsys.readouterr()
    assert main(list(arguments)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: ")
    assert message in captured.err, captured.err


def _random_params(table, d, d_ff, seed=0):
    rng = np.random.default_rng(seed)
    sizes = {"d": d, "d_ff": d_ff}
    return {name: rng.standard_normal(tuple(sizes[axis] for axis in axes)) * 0.5 for name, axes in table.items()}


def test_causal_gives_any_scheme_a_kv_cache(tmp_path, capsys):
    """``pre-ln --causal``: causal by default, and token-by-token with the cache equals the full
    causal forward of the committed ``pre_ln`` module (float64)."""
    assert main(["derive", "pre-ln", "--causal", "--backend", "torch", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"wrote {tmp_path / 'torch' / 'pre_ln_causal.py'}"
    causal = import_path(tmp_path / "torch" / "pre_ln_causal.py")
    plain = import_path(GENERATED / "torch" / "pre_ln.py", "_variants_pre_ln")
    assert "cache" not in plain.Block.forward.__code__.co_varnames
    params = _random_params(causal.PARAMETERS, 8, 12)
    block = causal.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    reference = plain.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    u = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = reference(u, causal=True)
        assert (block(u) - full).abs().max() <= 1e-12  # causal=True is the default
        cache: dict = {}
        steps = torch.cat([block(u[:, i:i + 1], cache=cache) for i in range(6)], dim=1)
        assert cache["attn.k"].shape == (2, 6, 2, 4)
        assert (steps - full).abs().max() <= 1e-10
        assert (reference(u) - full).abs().max() > 1e-3  # negative control: not causal, not equal


def test_name_names_the_module_and_report(tmp_path):
    assert main(["derive", "pre-ln", "--causal", "--activation", "gelu", "--name", "my-lm", "--out", str(tmp_path)]) == 0
    assert sorted(path.name for path in tmp_path.rglob("*") if path.stem != "__init__" and path.is_file()) == \
        ["my_lm.md", "my_lm.py", "my_lm.py"]
    module = import_path(tmp_path / "torch" / "my_lm.py")
    assert (module.SCHEME, module.ACTIVATION) == ("pre-ln", "gelu")
    assert "Regenerate with: splitformer derive pre-ln --activation gelu --causal --name my-lm\n" in \
        (tmp_path / "torch" / "my_lm.py").read_text()


def test_a_files_own_activation_adds_no_suffix(tmp_path):
    source = (ROOT / "symbolic" / "schemes" / "pre-ln.toml").read_text()
    scheme = tmp_path / "mine.toml"
    scheme.write_text(source.replace('"pre-ln"', '"mine"').replace('activation = "relu"', 'activation = "gelu-tanh"'))
    assert main(["derive", str(scheme), "--backend", "numpy", "--out", str(tmp_path / "out")]) == 0
    assert main(["derive", str(scheme), "--backend", "numpy", "--out", str(tmp_path / "out"), "--activation", "relu"]) == 0
    assert sorted(path.name for path in (tmp_path / "out" / "numpy").glob("mine*.py")) == ["mine.py", "mine_relu.py"]


@pytest.mark.parametrize("arguments, message", [
    (["derive", "pre-ln", "--name", "My_LM"], "--name: 'My_LM' is not a scheme name"),
    (["derive", "pre-ln", "--name", "class"], "--name: 'class' is a Python keyword"),
    (["derive", "pre-ln", "--name", ""], "--name: '' is not a scheme name"),
    (["derive", "pre-ln", "post-ln", "--name", "both"], "--name names one module: give one SCHEME, not 2"),
    (["derive", "vit", "--causal"], "--causal applies to schemes, not to the network 'vit'"),
    (["derive", "vit", "--name", "my-vit"], "--name applies to schemes, not to the network 'vit'"),
])
def test_bad_variants_are_refused(arguments, message, tmp_path, capsys):
    _fails(capsys, *arguments, "--out", str(tmp_path / "out"), message=message)
    assert not (tmp_path / "out").exists()


def test_the_python_api_takes_the_same_options():
    assert splitformer.derive("pre-ln", causal=True).name == "pre_ln_causal"
    assert splitformer.derive("gpt2", causal=True).name == "gpt2"  # already causal: unchanged
    derivation = splitformer.derive("pre-ln", activation="gelu", causal=True, name="my-lm")
    assert derivation.name == "my_lm" and derivation.scheme.causal
    assert "cache" in derivation.torch_module().Block.forward.__code__.co_varnames
    with pytest.raises(SplitformerError, match="causal must be True or False, got str"):
        splitformer.derive("pre-ln", causal="yes")
    with pytest.raises(SplitformerError, match="'My LM' is not a scheme name"):
        splitformer.derive("pre-ln", name="My LM")
    with pytest.raises(SplitformerError, match="a module name must be a string, got int"):
        splitformer.derive("pre-ln", name=3)


def test_the_emitted_erf_is_the_error_function():
    """NumPy has no erf: the one the exact GELU's emitted routines evaluate in double precision (``_erf_block``)
    equals ``math.erf`` on every branch of its rational fits."""
    import math

    module = splitformer.derive("pre-ln", activation="gelu").numpy_module()
    x = np.concatenate([np.linspace(-10, 10, 2001), [0.0, 0.4999, 0.5, 3.99, 4.0, 7.99, 8.0, 27.0]])
    assert np.abs(module._erf_block(x) - np.array([math.erf(value) for value in x])).max() <= 1e-15


_OWN_ACTIVATION = """name = "opact"
summary = "pre-LN whose feed-forward names its own activation"
[operators]
norm1 = "layer-norm"
attn = "attention"
norm2 = "layer-norm"
ffn = { kind = "feed-forward", activation = "gelu" }
[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm2"
"""


def test_an_activation_no_operator_takes_is_refused(tmp_path, capsys):
    """Attack 19: ``--activation silu`` on a scheme whose feed-forward names its own GELU gave a module named
    ``opact_silu`` (``ACTIVATION = "silu"``) that computed GELU. Refused in one line; control: a scheme whose
    feed-forward takes the scheme's activation is derived with it."""
    import splitformer
    from splitformer.codegen.cli import main
    from splitformer.symbolic.errors import SplitformerError
    from splitformer.symbolic.scheme_file import parse_scheme

    path = tmp_path / "opact.toml"
    path.write_text(_OWN_ACTIVATION)
    assert main(["derive", str(path), "--activation", "silu", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no operator of scheme 'opact' takes the scheme's activation" in error, error
    assert not (tmp_path / "out").exists()
    with pytest.raises(SplitformerError, match="takes the scheme's activation"):
        splitformer.derive(str(path), activation="tanh")
    scheme = parse_scheme(_OWN_ACTIVATION)
    assert scheme.with_activation(scheme.activation).activation == "relu"  # the activation it has: nothing to refuse
    shared = parse_scheme(_OWN_ACTIVATION.replace('{ kind = "feed-forward", activation = "gelu" }', '"feed-forward"'))
    assert shared.with_activation("silu").instantiate()["ffn"].activation.name == "silu"


def test_a_scheme_whose_operators_take_no_activation_does_not_show_one(capsys):
    """New user, s32: ``show`` and the torch Block's repr said ``activation: relu`` for a scheme none of whose
    operators takes the scheme's activation (paper-lie: its ReLU is a projection substep). Control: post-ln's
    feed-forward takes it, and shows it."""
    for name, shown in (("paper-lie", False), ("post-ln", True)):
        assert main(["show", name]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert ("activation: relu" in lines) == shown
        assert ("activation: none taken (each activated operator names its own, or none has one)" in lines) != shown
        block = import_path(GENERATED / "torch" / f"{name.replace('-', '_')}.py").Block(8, 2, 12)
        assert ("activation=relu" in repr(block)) == shown
