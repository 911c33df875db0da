"""A plug-in's scores written as a sum of maps of one array each (``∫ e^q e^k de``) are a contraction
(``tests/plugins/kernel_attention.py``)."""

import inspect

import splitformer

from conftest import ROOT

SCHEME = '''name = "exp-kernel-pre-ln"
summary = "pre-LN with linear attention, φ = exp"
[operators]
norm1 = "layer-norm"
attn = "exp-kernel-attention"
[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
'''


def test_the_scores_are_one_contraction_of_the_maps_and_every_check_holds(tmp_path):
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "kernel_attention.py")
    (tmp_path / "s.toml").write_text(SCHEME, encoding="utf-8")
    derived = splitformer.derive(str(tmp_path / "s.toml"))
    for backend in ("numpy", "torch"):
        module = derived.numpy_module() if backend == "numpy" else derived.torch_module()
        source = inspect.getsource(module)
        scores = next(line for line in source.splitlines() if line.strip().startswith("attn_a = "))
        assert "einsum" in scores and "exp" not in scores, scores  # before: sum(exp(k)[…]*exp(q)[…], axis=4)
    report = derived.check(only=("semantics", "adjoint", "adjoint-test"))
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]
