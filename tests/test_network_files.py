"""Networks as user files: a copy of a built-in network derives (CLI and ``splitformer.derive``),
computes what the built-in computes, and goes through `check`'s one runner; a vit-like file that
steps another scheme is checked against the independent evaluator with that scheme."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
import torch

import splitformer
from splitformer.codegen.cli import main
from splitformer.codegen.verification import network_semantics
from splitformer.codegen.verification.network_adjoint_tests import random_table
from splitformer.symbolic.network_spec import load_network, network_family

from conftest import ROOT


def _builtin_text(name: str) -> str:
    return (resources.files("splitformer.symbolic") / "networks" / f"{name}.toml").read_text(encoding="utf-8")


def _copy(tmp_path, name: str, new_name: str, *replace: tuple[str, str]):
    text = _builtin_text(name).replace(f'name = "{name}"', f'name = "{new_name}"')
    for old, new in replace:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / f"{new_name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _vit_inputs(module, rng):
    sizes = {"n_channels": 3, "patch_size": 2, "d": 8, "d_ff": 12, "n_tokens": 5, "n_classes": 4}
    params = random_table({**module.PARAMETERS, **module.HEAD_PARAMETERS}, sizes, rng)
    for layer in range(3):  # another depth than the checks use
        params |= random_table(module.LAYER_PARAMETERS, sizes, rng, f"layers.{layer}.")
    return rng.standard_normal((2, 3, 4, 4)), params, {"patch_size": 2, "n_heads": 2, "eps": 1e-6}


def test_a_copy_of_vit_derives_on_the_command_line_and_emits_what_vit_emits(tmp_path, capsys):
    path = _copy(tmp_path, "vit", "my-vit")
    assert main(["derive", str(path), "vit", "--backend", "all", "--out", str(tmp_path / "out")]) == 0
    for backend in ("numpy", "torch"):
        mine = (tmp_path / "out" / backend / "my_vit.py").read_text()
        builtin = (tmp_path / "out" / backend / "vit.py").read_text()
        mine = mine.replace("splitformer derive NETWORK_FILE", "splitformer derive my-vit")  # regenerated from its file
        assert mine.replace("my_vit", "vit").replace("my-vit", "vit") == builtin
    capsys.readouterr()
    assert main(["show", str(path), "--format", "toml"]) == 0
    assert capsys.readouterr().out.strip() == path.read_text().strip()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_api_derives_a_network_file_equal_to_the_builtin(tmp_path, backend):
    mine = splitformer.derive(str(_copy(tmp_path, "vit", "my-vit")))
    builtin = splitformer.derive("vit")
    assert isinstance(mine, splitformer.NetworkDerivation) and mine.name == "my_vit"
    numpy_module = mine.numpy_module()
    images, params, options = _vit_inputs(numpy_module, np.random.default_rng(5))
    expected = builtin.numpy_module().logits(images, params, **options)
    if backend == "numpy":
        got = numpy_module.logits(images, params, **options)
    else:
        import torch

        model = mine.torch_module().Model(n_layers=3, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2,
                                          image_size=(4, 4), n_classes=4, eps=1e-6, dtype=torch.float64)
        model.load_params(params)
        got = model.logits(torch.from_numpy(images)).detach().numpy()
    assert np.max(np.abs(got - expected)) <= 1e-12 * max(1.0, np.max(np.abs(expected)))
    written = mine.write(tmp_path / "out", backend=backend)
    assert sorted(path.relative_to(tmp_path / "out").as_posix() for path in written if path.name != "__init__.py") == \
        sorted([f"{backend}/my_vit.py", "reports/my_vit.md"])


def test_a_vit_stepping_post_ln_is_checked_against_the_evaluator_with_its_scheme(tmp_path):
    spec = load_network(_copy(tmp_path, "vit", "vit-post", ('scheme = "pre-ln"', 'scheme = "post-ln"')))
    assert network_family(spec) == "vit"
    (check,) = network_semantics.network_semantics_checks(spec)
    assert check.id == "semantics/vit-post/emitted" and check.holds, check.detail


def test_a_vit_without_a_final_norm_is_checked_against_the_evaluator_without_one(tmp_path):
    """The evaluator applies the final norm where the file asks for one (it once always did: a KeyError)."""
    spec = load_network(_copy(tmp_path, "vit", "vit-bare", ("final_norm = true", "final_norm = false")))
    (check,) = network_semantics.network_semantics_checks(spec)
    assert check.id == "semantics/vit-bare/emitted" and check.holds, check.detail


def test_negative_control_the_post_ln_module_is_not_what_the_pre_ln_evaluator_defines(tmp_path, monkeypatch):
    post_ln = network_semantics.network_module(
        load_network(_copy(tmp_path, "vit", "vit-post", ('scheme = "pre-ln"', 'scheme = "post-ln"'))))
    monkeypatch.setattr(network_semantics, "network_module", lambda spec: post_ln)
    (check,) = network_semantics.network_semantics_checks("vit")
    assert not check.holds, check.detail


def test_check_runs_a_network_file_through_the_one_runner(tmp_path, capsys):
    path = _copy(tmp_path, "resnet-block", "my-resnet")
    report = splitformer.derive(str(path)).check()
    ids = [check.id for check in report.checks]
    assert "semantics/my-resnet/emitted" in ids and "adjoint-test/my-resnet/dot" in ids
    assert any(i.startswith("network/my-resnet") or "my-resnet" in i for i in ids)
    assert report.holds, [check.detail for check in report.checks if not check.holds]


PREACT_STRIDE_3 = """name = "preact-odd"
summary = "BN and ReLU on the input channels, a 2 x 2 convolution of stride 3, a 3 x 3 one, a x3 transposed ascent"

[operators]
bn0 = { kind = "batch-norm", inputs = "c" }
relu0 = { kind = "relu-projection", inputs = "c" }
down = { kind = "convolution", kernel = 2, stride = 3, inputs = "c" }
conv = { kind = "convolution", kernel = 3, padding = 1 }
bn = { kind = "batch-norm" }
relu = { kind = "relu-projection" }
up = { kind = "transposed-convolution", kernel = 3, outputs = "c" }
shortcut = { kind = "batch-norm", inputs = "c", outputs = "c" }

[step]
field = ["bn0", "relu0", "down", "conv", "bn", "relu", "up"]
transfer = ["shortcut"]
projection = "relu0"
"""


@pytest.mark.parametrize("name", ["two-convs", "preact-odd"])
def test_a_grid_composition_no_builtin_shares_is_checked_against_its_file_read_by_the_evaluator(tmp_path, name,
                                                                                                  monkeypatch):
    """Tester s39 L7: every grid network of its own composition (even unet-level with a 5 × 5 kernel) had its evaluator
    check skipped, so `check` never tested its forward's values. The evaluator now reads the file's operators in order
    (convolutions over their windows, transposed ones spreading each node, BatchNorm, ReLU, the transfer and the
    projection slot). Control: an emitted module off by 1e-6 in one output fails."""
    if name == "two-convs":
        path = _copy(tmp_path, "unet-level", name, ('conv = { kind = "convolution", kernel = 3, padding = 1 }',
                                                    'conv = { kind = "convolution", kernel = 5, padding = 2 }'))
    else:
        path = tmp_path / f"{name}.toml"
        path.write_text(PREACT_STRIDE_3)
    spec = load_network(path)
    assert network_family(spec) is None
    (check,) = network_semantics.network_semantics_checks(spec)
    assert check.holds and check.method == "numeric", check.detail
    assert "kernels flipped" in check.detail and "windows shifted by one node" in check.detail
    module = network_semantics.network_module(spec)

    class Off:  # the module with one output entry moved by 1e-6
        def __getattr__(self, attribute):
            return getattr(module, attribute)

        @staticmethod
        def forward(*args, **kwargs):
            out = module.forward(*args, **kwargs).copy()
            out.flat[5] += 1e-6
            return out

    monkeypatch.setattr(network_semantics, "network_module", lambda spec: Off())
    (control,) = network_semantics.network_semantics_checks(spec)
    assert not control.holds and "max |emitted − evaluator| 1.0e-06" in control.detail


@pytest.mark.parametrize("field, value, message", [
    ("name", '"../escaped"', "name"),
    ("summary", '"two\\nlines"', "summary"),
])
def test_a_network_file_with_a_bad_name_or_summary_is_refused_with_one_line(tmp_path, capsys, field, value, message):
    text = _builtin_text("vit")
    line = next(line for line in text.splitlines() if line.startswith(f"{field} ="))
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(line, f"{field} = {value}"), encoding="utf-8")
    assert main(["derive", str(path), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.py"))


@pytest.mark.parametrize("option", [["--activation", "relu"], ["--causal"], ["--name", "other"]])
def test_scheme_options_are_refused_for_a_network_file(tmp_path, capsys, option):
    path = _copy(tmp_path, "vit", "my-vit")
    assert main(["derive", str(path), *option, "--out", str(tmp_path / "out")]) == 2
    assert f"{option[0]} applies to schemes" in capsys.readouterr().err
    with pytest.raises(splitformer.SplitformerError, match="applies to schemes"):
        splitformer.derive(str(path), **{option[0].strip("-"): option[1] if len(option) > 1 else True})


def test_all_builtins_includes_the_networks(tmp_path, monkeypatch, capsys):
    from splitformer.codegen import pipeline

    def listed(item, backends, out, passes=None, *rest):  # what derive would generate, without the work
        return {out / f"{item.module_name}.txt": "listed"}

    monkeypatch.setattr(pipeline, "generate", listed)
    monkeypatch.setattr(pipeline, "generate_network", listed)
    assert main(["derive", "--all-builtins", "--out", str(tmp_path)]) == 0
    written = {path.stem for path in tmp_path.glob("*.txt")}
    assert {"vit", "cvt", "resnet_block", "unet_level", "post_ln", "llama"} <= written


_UNET = _builtin_text("unet-level")
_VIT = _builtin_text("vit")


@pytest.mark.parametrize("text, message", [
    (_UNET.replace("stride = 2", "stride = \"__import__('os').system('true') or 1\""), "stride: expected an integer"),
    (_UNET.replace("kernel = 3, padding = 1 }", "kernel = 0, padding = 1 }"), "kernel: expected an integer from 1"),
    (_UNET.replace("kernel = 3, padding = 1 }", "kernel = 2.5, padding = 1 }"), "kernel: expected an integer"),
    (_UNET.replace("padding = 1, stride = 2", "padding = -1, stride = 2"), "padding: expected an integer from 0"),
    (_UNET.replace('inputs = "c" }', 'inputs = "c", outputs = [1] }'), 'outputs: expected "c"'),
    (_UNET.replace('inputs = "c" }', 'inputs = "c", outputs = "c" }'), 'operators.down: inputs and outputs are both "c"'),
    (_UNET.replace('"relu", "up"]', '"relu", "up"]\ntransfer = ["rt"]').replace('bn = {', 'rt = { kind = "relu-projection" }\nbn = {'), "step.transfer: no operator of it has "
     "parameters"),  # attack 16: R was silently the identity (2.4 off)
    (_UNET.replace('"relu", "up"]', '"relu", "up"]\ntransfer = ["conv"]'), "step.transfer: 'conv' is in the field too"),
    (_UNET.replace('bn = {', 'bn2 = { kind = "batch-norm" }\nbn = {').replace('"bn", "relu"', '"bn", "bn", "relu"'),
     "application 2 of 'bn' is named 'bn2' in the code"),  # attack 16: the step returned 2·bn2(u)
    (_UNET.replace('field = ["down", "conv", "bn", "relu", "up"]', 'field = ["relu"]'),
     "step.field: no operator of the field has parameters"),  # a traceback before
    (_UNET.replace('conv = { kind = "convolution", kernel = 3, padding = 1 }',
                   'conv = { kind = "convolution", kernel = 3, padding = 1, inputs = "c" }'),
     'step.field: operators.conv reads channels "c" where the field holds "y"'),  # attack 16: a raw NumPy error
    (_UNET.replace('stride = 2, inputs = "c" }', 'stride = 2 }'),
     'step.field: operators.down reads channels "y" where the field holds "c"'),  # attack 16: a traceback
    (_UNET.replace('inputs = "y", outputs = "c"', 'inputs = "c", outputs = "c"'), 'operators.up: inputs and outputs'),
    (_UNET.replace("conv = {", '"conv(1)" = {').replace('"conv",', '"conv(1)",'), "not an operator name"),
    (_UNET.replace('relu = { kind = "relu-projection" }', 'relu = { kind = "attention" }'), "a grid step composes"),
    (_UNET.replace("[step]", "step = 5\n[stepx]"), "unknown field"),
    (_UNET.replace("[step]", 'spare = { kind = "convolution", kernel = 1 }\n[step]'),
     "operator 'spare' is declared but the step never applies it"),  # a tester (s43): accepted, its digest changed
    (_UNET.replace('field = ["down", "conv", "bn", "relu", "up"]', 'field = "down"'), "expected a list of operator names"),
    (_VIT.replace('operator = "embed"', 'operator = "embed\\" in params or 1 or \\""'), "not an operator name"),
    (_VIT.replace('operator = "head"', 'operator = "embed"'), "both named 'embed'"),
    (_VIT.replace('operator = "head"', 'operator = "layers"'), "clashes with the attribute 'layers'"),
    (_VIT.replace('kind = "class-token-head"', 'kind = "attention"'), "readout.kind: expected class-token-head"),
    (_VIT.replace('scheme = "pre-ln"', 'scheme = "no-such"'), "bad.toml: steps.scheme: unknown scheme 'no-such'"),
    (_VIT.replace('scheme = "pre-ln"', 'scheme = "vit"'), "bad.toml: steps.scheme: 'vit' is a built-in network"),
    # a new user (s45): read as the folder "." and as "expected the name of a block scheme"
    (_VIT.replace('scheme = "pre-ln"', 'scheme = ""'), "bad.toml: steps.scheme: empty; give a block scheme's name"),
    (_VIT.replace('[steps]', '[[steps]]'), "bad.toml: steps: a network file's [steps] is one table"),
])
def test_a_bad_network_file_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    assert main(["derive", str(path), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert not (tmp_path / "out").exists()


def test_a_network_file_with_too_many_operators_is_refused(tmp_path, capsys):
    operators = "\n".join(f'c{i} = {{ kind = "batch-norm" }}' for i in range(40))
    path = tmp_path / "big.toml"
    path.write_text(f'name = "big"\nsummary = "many"\n[operators]\n{operators}\n[step]\nfield = ["c0"]\n', encoding="utf-8")
    assert main(["derive", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "more than 32 operators" in capsys.readouterr().err


def test_a_scheme_file_a_network_names_is_read_beside_the_network_file(tmp_path, monkeypatch):
    (tmp_path / "nets").mkdir()
    block = (resources.files("splitformer.symbolic") / "schemes" / "post-ln.toml").read_text(encoding="utf-8")
    (tmp_path / "nets" / "block.toml").write_text(block.replace('name = "post-ln"', 'name = "my-block"'), encoding="utf-8")
    path = _copy(tmp_path / "nets", "vit", "vit-mine", ('scheme = "pre-ln"', 'scheme = "block.toml"'))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "block.toml").write_text("not a scheme", encoding="utf-8")
    monkeypatch.chdir(tmp_path / "elsewhere")  # a block.toml here must not be the one read
    assert load_network(path).scheme.name == "my-block"


def test_show_toml_of_a_network_naming_a_scheme_file_names_it_so_that_a_copy_elsewhere_reads_it(tmp_path, capsys):
    """``show --format toml`` gives a text to copy and change: the scheme file a network names beside itself is named by
    its absolute path there (a researcher's copy in another folder failed: "cannot read scheme file copy/block.toml");
    a built-in scheme's name stays as written. Control: the file's own text, copied, fails where the shown text works."""
    (tmp_path / "nets").mkdir()
    block = (resources.files("splitformer.symbolic") / "schemes" / "post-ln.toml").read_text(encoding="utf-8")
    (tmp_path / "nets" / "block.toml").write_text(block.replace('name = "post-ln"', 'name = "my-block"'), encoding="utf-8")
    path = _copy(tmp_path / "nets", "vit", "vit-mine", ('scheme = "pre-ln"', 'scheme = "block.toml"'))
    assert main(["show", str(path), "--format", "toml"]) == 0
    shown = capsys.readouterr().out
    absolute = str((tmp_path / "nets" / "block.toml").resolve())
    assert shown.strip() == path.read_text(encoding="utf-8").replace('"block.toml"', f'"{absolute}"').strip()
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "shown.toml").write_text(shown, encoding="utf-8")
    (tmp_path / "copy" / "own.toml").write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert load_network(tmp_path / "copy" / "shown.toml").scheme.name == "my-block"
    with pytest.raises(splitformer.SplitformerError, match="cannot read scheme file"):
        load_network(tmp_path / "copy" / "own.toml")
    builtin_steps = _copy(tmp_path, "vit", "vit-named")
    assert main(["show", str(builtin_steps), "--format", "toml"]) == 0
    assert capsys.readouterr().out.strip() == builtin_steps.read_text(encoding="utf-8").strip()


class _Spoof(str):
    """Equal to and hashed as ``"y"``, but printing other text."""

    def __eq__(self, other):
        return other == "y" or str.__eq__(self, other)

    __hash__ = lambda self: hash("y")  # noqa: E731


def _edits():
    from dataclasses import replace

    vit, grid = load_network("vit"), load_network("resnet-block")
    first = next(iter(grid.operators))
    extra = replace(vit.embedding)
    object.__setattr__(extra, "symbol", "x\nimport os")
    return {
        "embedding-key": replace(vit, embedding=replace(vit.embedding, key="open('x','w').closed")),
        "readout-key": replace(vit, readout=replace(vit.readout, key="a\nimport os")),
        "readout-kind": replace(vit, readout=replace(vit.embedding, key="head")),
        "same-keys": replace(vit, readout=replace(vit.readout, key=vit.embedding.key)),
        "extra-attribute": replace(vit, embedding=extra),
        "name": replace(vit, name='x"""\nimport os'),
        "summary": replace(grid, summary='s"""\nimport os'),
        "grid-key": replace(grid, operators={**{"x\nimport os": grid.operators[first]},
                                             **{k: o for k, o in grid.operators.items() if k != first}}),
        "grid-option-spoof": replace(grid, operators={**grid.operators,
                                                      first: replace(grid.operators[first], inputs=_Spoof("y\n#"))}),
        "grid-option-float": replace(grid, operators={**grid.operators, first: replace(grid.operators[first], outputs=2.0)}),
        "final-norm": replace(vit, final_norm=1),
    }


@pytest.mark.parametrize("edit", list(_edits()))
def test_a_network_spec_object_is_checked_as_its_file_is(edit):
    """attack5 12/13: a spec object given to ``splitformer.derive`` goes through the network file's checks
    (identifiers, options, kinds, name, summary) by exact type; the built-ins pass unchanged (control)."""
    from splitformer.symbolic.errors import SplitformerError
    from splitformer.symbolic.network_spec import check_network, network_names

    with pytest.raises(SplitformerError, match="^network "):
        splitformer.derive(_edits()[edit])
    for name in network_names():
        check_network(load_network(name))


_ATTENTION_ONLY = """name = "attn-only"
summary = "attention only, pre-LN"
final_norm = true
[operators]
norm1 = "layer-norm"
attn = "attention"
[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
"""
_TALKING_HEADS = """name = "scored"
summary = "pre-LN scored attention with qk-norm and talking heads, a GRU gate, a scalar step"
final_norm = true
[operators]
norm1 = "layer-norm"
attn = { kind = "scored-attention", qk_norm = true, pre_talking_heads = true, post_talking_heads = true }
norm2 = "layer-norm"
ffn = "feed-forward"
gate = "gru-gate"
[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
combine = "gate"
[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm2"
step = "scalar"
"""


@pytest.mark.parametrize("scheme", ["paper-lie", _ATTENTION_ONLY, _TALKING_HEADS, "rms"],
                         ids=["paper-lie", "attention-only", "talking-heads", "rms-norm"])
def test_a_vit_stepping_another_encoder_scheme_runs_and_is_checked(tmp_path, scheme):
    """Steps without a hidden layer, with per-head parameters, a gate and a scalar step: the NumPy module passes the
    semantics check against the evaluator with its scheme, and the torch Model computes what it does (float64)."""
    import torch

    if scheme == "rms":  # attack 16: the network's final projection was a LayerNorm, the scheme's stack's an RMSNorm
        scheme = (ROOT / "tests" / "schemes" / "pre-rms-glu.toml").read_text()
    if "\n" in scheme:
        (tmp_path / "steps.toml").write_text(scheme)
        scheme = "steps.toml"
    # vit's activation = "gelu" goes: attention-only and paper-lie have no activated operator (refused)
    spec = load_network(_copy(tmp_path, "vit", "vit-other",
                              ('scheme = "pre-ln"\nactivation = "gelu"', f'scheme = "{scheme}"')))
    final = {name for name in splitformer.derive(spec).numpy_module().PARAMETERS if name.startswith("final_norm.")}
    assert final == ({"final_norm.gain"} if "rms" in spec.scheme.name else {"final_norm.gain", "final_norm.bias"})
    (check,) = network_semantics.network_semantics_checks(spec)
    assert check.holds, check.detail
    assert "vit-other (a vit network: vit-other (final hidden" in check.statement  # it said vit-other-other
    derivation = splitformer.derive(spec)
    module = derivation.numpy_module()
    sizes = {"n_channels": 3, "patch_size": 2, "d": 8, "d_ff": 12, "n_tokens": 5, "n_classes": 4, "n_heads": 2, "d_head": 4}
    rng = np.random.default_rng(3)
    params = random_table({**module.PARAMETERS, **module.HEAD_PARAMETERS}, sizes, rng)
    for layer in range(2):
        params |= random_table(module.LAYER_PARAMETERS, sizes, rng, f"layers.{layer}.")
    images = rng.standard_normal((2, 3, 4, 4))
    expected = module.logits(images, params, patch_size=2, n_heads=2, eps=1e-6)
    model = derivation.torch_module().Model(n_layers=2, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2,
                                            image_size=(4, 4), n_classes=4, eps=1e-6, dtype=torch.float64)
    got = model.load_params(params).logits(torch.from_numpy(images)).detach().numpy()
    assert np.max(np.abs(got - expected)) <= 1e-12 * max(1.0, np.max(np.abs(expected)))


@pytest.mark.parametrize("scheme, message", [
    ("gpt2", "steps.scheme: 'gpt2' is causal"),
    ("llama", "steps.scheme: 'llama' is causal"),
    ("decoder", "steps.scheme: 'decoder' is causal"),
    (_ATTENTION_ONLY.replace('attn = "attention"', 'attn = "rotary-attention"'), "reads token positions"),
    (_ATTENTION_ONLY.replace('attn = "attention"', 'attn = { kind = "attention", d_head = 3 }'),
     "sizes a parameter of operator 'attn' by d_inner, set by its d_head = 3"),
    (_ATTENTION_ONLY.replace('attn = "attention"', 'attn = { kind = "scored-attention", rel_pos_bias = "bidirectional",'
                                                   ' max_distance = 16 }'), "reads token positions"),
    (_ATTENTION_ONLY.replace('on = "norm1"', 'on = "norm1"\nstream = true'), "a second state across layers"),
])
def test_a_vit_stepping_a_scheme_that_reads_more_than_its_tokens_is_refused_in_one_line(tmp_path, capsys, scheme,
                                                                                         message):
    if "\n" in scheme:
        (tmp_path / "steps.toml").write_text(scheme)
        scheme = "steps.toml"
    path = _copy(tmp_path, "vit", "vit-other", ('scheme = "pre-ln"', f'scheme = "{scheme}"'))
    assert main(["derive", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "a token network feeds each step all its tokens" in err, err
    assert "is causal" not in message or err.startswith(f"error: {path}: "), err  # new user L4: the file is named
    assert not (tmp_path / "out").exists()
    for form in ("markdown", "text", "latex"):  # nothing shown of a module that cannot be emitted
        assert main(["show", str(path), "--format", form]) == 2
        shown = capsys.readouterr()
        assert message in shown.err and not shown.out


@pytest.mark.parametrize("field", ['activaton = "gelu"', "causal = true", "layers = 12"])
def test_an_unknown_field_of_the_steps_is_refused(tmp_path, capsys, field):
    """Attack 16: ``[steps]`` ignored what it did not know (a misspelt ``activaton``: GELU silently ReLU)."""
    path = _copy(tmp_path, "vit", "vit-typo", ('scheme = "pre-ln"', f'scheme = "pre-ln"\n{field}'))
    assert main(["derive", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"steps: unknown field '{field.split(' ')[0]}'" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("activation, refused", [("gelu", True), ("relu", False)])
def test_an_activation_for_a_step_scheme_without_activated_operators_is_refused(tmp_path, capsys, activation, refused):
    """``activation = "gelu"`` in ``[steps]`` of a scheme no operator of which is activated was ignored (the network
    computed no GELU); refused as ``derive --activation`` refuses it. Control: the scheme's own activation (its
    default, relu) is no change, and derives."""
    (tmp_path / "mixer.toml").write_text(
        'name = "mixer"\nsummary = "attention and LayerNorm only"\n[operators]\nattn = "attention"\n'
        'norm = "layer-norm"\n[[steps]]\noperator = "attn"\nsolver = "explicit"\n'
        '[[steps]]\noperator = "norm"\nsolver = "projection"\n', encoding="utf-8")
    path = _copy(tmp_path, "vit", "vit-mixer", ('scheme = "pre-ln"\nactivation = "gelu"',
                                                f'scheme = "mixer.toml"\nactivation = "{activation}"'))
    code = main(["derive", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    if not refused:
        assert code == 0, err
        return
    assert code == 2 and err.count("\n") == 1, err
    assert ("steps.activation: activation 'gelu': no operator of scheme 'mixer' takes the scheme's activation (it has "
            "no activated operator)") in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("table, anchor", [("embedding", 'kind = "patch-embedding"'),
                                           ("readout", 'kind = "class-token-head"')])
def test_an_unknown_field_of_the_embedding_or_readout_is_named(tmp_path, capsys, table, anchor):
    """Round 37 F2: an extra key there was reported as a missing 'operator' or 'kind'."""
    path = _copy(tmp_path, "vit", "vit-extra", (anchor, f"{anchor}\npatch = 8"))
    assert main(["derive", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{table}: unknown field 'patch' (expected 'operator' and 'kind')" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_check_on_a_network_file_that_is_no_published_network_skips_the_recovery_and_holds(tmp_path, monkeypatch):
    """Attack 16: the docs' own ``vit-post.toml`` failed ``check``: the recovery checks compared it with the published
    pre-LN ViT; a grid step without a convolution failed translation-equivariance with no reason. Both are skipped,
    saying why; the rest holds."""
    monkeypatch.chdir(tmp_path)
    post = _copy(tmp_path, "vit", "vit-post", ('scheme = "pre-ln"', 'scheme = "post-ln"'))
    bn_only = tmp_path / "bn-only.toml"
    bn_only.write_text('name = "bn-only"\nsummary = "one BatchNorm"\n[operators]\n'
                       'bn = { kind = "batch-norm", inputs = "c", outputs = "c" }\n[step]\nfield = ["bn"]\n')
    checks = {}
    for path, skipped in ((post, ("recovery/vit-post/symbolic", "recovery/vit-post/numeric")),
                          (bn_only, ("bn-only/translation-equivariance",))):
        report = splitformer.derive(str(path)).check()
        assert report.holds, [check.detail for check in report.checks if not check.holds]
        shown = checks[path.stem] = {check.id: check for check in report.checks}
        assert all(shown[name].method == "skipped" and shown[name].detail.startswith("skipped: ") for name in skipped)
    # attack 24: the statements named ViT's pre-LN GELU steps whatever the file's were
    assert "steps of 'post-ln' (gelu)" in checks["vit-post"]["recovery/vit-post/symbolic"].statement
    builtin = {check.id: check for check in splitformer.derive("vit").check(only="recovery").checks}
    assert builtin["recovery/vit/numeric"].method == "numeric" and builtin["recovery/vit/numeric"].holds  # control
    assert "steps of 'pre-ln' (gelu), the final projection, class-token head" in builtin["recovery/vit/numeric"].statement
    # a tester (s43): the statement named a final projection for a file without one
    bare = _copy(tmp_path, "vit", "vit-bare", ("final_norm = true", "final_norm = false"))
    statement = {check.id: check for check in splitformer.derive(str(bare)).check(only="recovery").checks}[
        "recovery/vit-bare/symbolic"].statement
    assert "steps of 'pre-ln' (gelu), class-token head" in statement


@pytest.mark.parametrize("name, replace", [
    ("vit", ()), ("vit", (("final_norm = true", "final_norm = false"),)), ("cvt", ()), ("resnet-block", ()),
    ("unet-level", ())], ids=["vit", "vit-without-final-norm", "cvt", "resnet-block", "unet-level"])
def test_emitted_network_modules_keep_pep8_spacing_whatever_pieces_they_lack(tmp_path, name, replace):
    """The templates leave no gap where a network lacks a piece (a final projection, a transfer, a head): at most
    two blank lines in a row, two before each top-level function and class."""
    derivation = splitformer.derive(str(_copy(tmp_path, name, f"my-{name}", *replace)))
    for backend in ("numpy", "torch"):
        assert not pep8_spacing_faults(derivation.source(backend)), backend


def pep8_spacing_faults(source: str) -> list[int]:
    """Lines after a run of three or more blank lines, and top-level defs and classes without two blank lines above
    (a decorator or comment line may stand between)."""
    lines = source.split("\n")
    gaps = [number + 3 for number in range(len(lines) - 2) if not any(lines[number:number + 3])]
    crowded = []
    for number, line in enumerate(lines):
        if line.startswith(("def ", "class ")):
            above = number - 1
            while above >= 0 and lines[above].startswith(("@", "#")):
                above -= 1
            if lines[max(above - 1, 0):above + 1] != ["", ""] or (above >= 2 and lines[above - 2] == ""):
                crowded.append(number + 1)
    return gaps + crowded


def test_every_generated_module_keeps_pep8_spacing():
    """Blocks and networks alike: the templates place their blank lines (nothing squeezes them afterwards)."""
    faults = {f"{path.parent.name}/{path.name}": pep8_spacing_faults(path.read_text())
              for path in (ROOT / "generated").glob("*/*.py")
              if path.name != "__init__.py"}
    assert len(faults) > 30 and not any(faults.values()), {name: lines for name, lines in faults.items() if lines}
    assert pep8_spacing_faults("x = 1\n\n\n\ndef f():\n    pass\n") and pep8_spacing_faults("x = 1\n\ndef f():\n")


def test_a_module_derived_from_a_file_says_to_regenerate_it_from_that_file(tmp_path):
    """A built-in's module names the built-in; a file's names its file (a placeholder: the spec has no path), never a
    name `derive` would refuse or read as another computation; the report path is beside the module's folder."""
    mine = splitformer.derive(str(_copy(tmp_path, "vit", "my-vit")))
    assert "Regenerate with: splitformer derive NETWORK_FILE\n" in mine.source("numpy")
    assert "(`splitformer derive NETWORK_FILE` regenerates it)" in mine.report
    assert "Regenerate with: splitformer derive vit\n" in splitformer.derive("vit").source("torch")
    scheme = tmp_path / "my-block.toml"
    scheme.write_text((ROOT / "symbolic" / "schemes" / "post-ln.toml").read_text().replace('name = "post-ln"',
                                                                                            'name = "my-block"'))
    source = splitformer.derive(str(scheme)).source("numpy")
    assert "Regenerate with: splitformer derive SCHEME_FILE\n" in source and "../reports/my_block.md" in source


def test_a_vit_stepping_a_scheme_without_parameters_is_refused_in_one_line(tmp_path, capsys):
    """A token network counts its layers by their parameters (``layers.N.…``): a step without one (a plug-in's
    sum over the support) ended in a jinja traceback. Control: the same step on a LayerNorm-projected state derives."""
    plugin = str(ROOT / "tests" / "plugins" / "support_mean.py")
    step = ('name = "mean-step"\nsummary = "s"\n[operators]\nf = "support-sum"\n'
            '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    (tmp_path / "steps.toml").write_text(step)
    path = _copy(tmp_path, "vit", "vit-mean", ('scheme = "pre-ln"\nactivation = "gelu"', 'scheme = "steps.toml"'))
    assert main(["derive", "--load", plugin, str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "steps.scheme: 'mean-step' has no parameter" in err, err
    assert not (tmp_path / "out").exists()
    (tmp_path / "steps.toml").write_text(step.replace('[operators]\n', '[operators]\nnorm1 = "layer-norm"\n')
                                         + 'on = "norm1"\n')
    assert main(["derive", "--load", plugin, str(path), "--out", str(tmp_path / "out")]) == 0


GRID_FILES = {
    "xfer3": ('conv1 = { kind = "convolution", kernel = 1, inputs = "c" }\n'
              't = { kind = "convolution", kernel = 3, padding = 1, inputs = "c" }\ntb = { kind = "batch-norm" }\n',
              'field = ["conv1"]\ntransfer = ["t", "tb"]\n'),
    "tconv3": ('down = { kind = "convolution", kernel = 3, stride = 3, inputs = "c" }\n'
               'relu = { kind = "relu-projection" }\n'
               'up = { kind = "transposed-convolution", kernel = 3, inputs = "y", outputs = "c" }\n',
               'field = ["down", "relu", "up"]\n'),
    "side1": ('conv1 = { kind = "convolution", kernel = 3, padding = 1, stride = 2, inputs = "c" }\n'
              'back = { kind = "convolution", kernel = 1, outputs = "c" }\n', 'field = ["conv1", "back"]\n')}


def _grid_file(tmp_path, name):
    operators, step = GRID_FILES[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nsummary = "x"\n[operators]\n{operators}[step]\n{step}')
    return load_network(path)


def test_the_file_evaluator_sizes_and_controls_show_what_they_claim(tmp_path, monkeypatch):
    """Reviewer s39: the controls changed the field alone, so a file whose only 3 × 3 kernel is in its transfer failed a
    correct module (M1); the first size that ran could leave one coarse node, where a module reading the coarse grid in
    reverse before a transposed convolution held (H1). Now the controls reach every operator, one that changes nothing
    at the sizes (a flipped kernel read at its centre alone, on 1 × 1 images) is left out saying so, and the sizes
    give each grid at least 3 nodes per axis where the file allows; the reversed module fails."""
    (holds,) = network_semantics.network_semantics_checks(_grid_file(tmp_path, "xfer3"))
    assert holds.holds and "kernels flipped" in holds.detail and "no change" not in holds.detail, holds.detail
    (degenerate,) = network_semantics.network_semantics_checks(_grid_file(tmp_path, "side1"))
    assert degenerate.holds and "on 1 × 1" in degenerate.statement
    assert "(kernels flipped: no change at these sizes, left out)" in degenerate.detail
    spec = _grid_file(tmp_path, "tconv3")
    (right,) = network_semantics.network_semantics_checks(spec)
    assert right.holds and "on 9 × 9" in right.statement  # three coarse nodes per axis
    module = network_semantics.network_module(spec)

    class Reversed:  # the coarse grid read in reverse before the ascent
        def __getattr__(self, attribute):
            return getattr(module, attribute)

        @staticmethod
        def forward(u, params, eps=1e-5):
            x = torch.tensor(u)
            p = {key: torch.tensor(value) for key, value in params.items()}
            z = torch.relu(torch.nn.functional.conv2d(x, p["down.W"].permute(3, 0, 1, 2), p["down.b"], stride=3))
            if min(z.shape[-2:]) < 1 or 3 * z.shape[-1] != x.shape[-1] or 3 * z.shape[-2] != x.shape[-2]:
                raise ValueError("u is too small for stride 1")
            up = torch.nn.functional.conv_transpose2d(z.flip(-1, -2), p["up.W"].permute(0, 3, 1, 2), p["up.b"], stride=3)
            return (x + up).numpy()

    monkeypatch.setattr(network_semantics, "network_module", lambda spec: Reversed())
    (wrong,) = network_semantics.network_semantics_checks(spec)
    assert not wrong.holds, wrong.detail
