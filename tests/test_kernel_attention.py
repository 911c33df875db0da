"""A plug-in's scores written as a sum of maps of one array each (``∫ e^q e^k de``) are a contraction
(``tests/plugins/kernel_attention.py``)."""

import inspect

from conftest import derived_plugin, plugin_scheme


def test_the_scores_are_one_contraction_of_the_maps_and_every_check_holds(tmp_path):
    derived = derived_plugin(tmp_path, "kernel_attention.py", plugin_scheme("exp-kernel-pre-ln", norm1="layer-norm",
                                                                            attn="exp-kernel-attention"))
    for backend in ("numpy", "torch"):
        module = derived.numpy_module() if backend == "numpy" else derived.torch_module()
        source = inspect.getsource(module)
        scores = next(line for line in source.splitlines() if line.strip().startswith("attn_a = "))
        assert "einsum" in scores and "exp" not in scores, scores  # before: sum(exp(k)[…]*exp(q)[…], axis=4)
    report = derived.check(only=("semantics", "adjoint", "adjoint-test"))
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]
