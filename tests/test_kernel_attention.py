"""A plug-in's scores written as a sum of maps of one array each (``∫ e^q e^k de``) are a contraction
(``tests/plugins/kernel_attention.py``)."""

import inspect

import pytest

from conftest import derived_plugin, plugin_scheme


@pytest.mark.parametrize("kind", ["exp-kernel-attention", "elu-kernel-attention"])
def test_the_scores_are_one_contraction_of_the_maps_and_every_check_holds(tmp_path, kind):
    """elu + 1 (``Max(z, 0) + e^{Min(z, 0)}``, a sum of calls, not one call) was a product broadcast over (batch, head,
    query, key, feature) and summed (a tester's linear attention); hoisted like a call now."""
    derived = derived_plugin(tmp_path, "kernel_attention.py", plugin_scheme(f"{kind}-pre-ln", norm1="layer-norm",
                                                                            attn=kind))
    for backend in ("numpy", "torch"):
        module = derived.numpy_module() if backend == "numpy" else derived.torch_module()
        source = inspect.getsource(module)
        scores = next(line for line in source.splitlines() if line.strip().startswith("attn_a = "))
        assert "einsum" in scores and "exp" not in scores and "max" not in scores, scores  # before: sum(…, axis=4)
    report = derived.check(only=("semantics", "adjoint", "adjoint-test"))
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]
