"""Cross-attention's ``bias = false`` drops the biases of its query, key, value and output transforms, as
attention's does (it failed to derive: ``KeyError: 'b_o'``)."""

from __future__ import annotations

import numpy as np

import splitformer

SCHEME = """\
name = "{name}"
summary = "cross-attention on the normalized state"
[operators]
norm = "layer-norm"
cross = {{ kind = "cross-attention", bias = {bias} }}
[[steps]]
operator = "cross"
solver = "explicit"
on = "norm"
"""


def _module(tmp_path, bias: bool):
    name = f"cross-bias-{str(bias).lower()}"
    path = tmp_path / f"{name}.toml"
    path.write_text(SCHEME.format(name=name, bias=str(bias).lower()), encoding="utf-8")
    return splitformer.derive(str(path)).numpy_module()


def test_cross_attention_without_biases_equals_the_biased_one_at_zero_biases(tmp_path, rng):
    plain, biased = _module(tmp_path, False), _module(tmp_path, True)
    dropped = set(biased.PARAMETERS) - set(plain.PARAMETERS)
    assert dropped == {"cross.b_q", "cross.b_k", "cross.b_v", "cross.b_o"}
    params = {name: rng.standard_normal(tuple(8 for _ in axes)) for name, axes in plain.PARAMETERS.items()}
    u, memory = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 3, 8))
    mask = np.array([[False, False, True], [True, False, False]])
    zero = {**params, **{name: np.zeros(8) for name in dropped}}
    options = dict(n_heads=2, memory_key_padding_mask=mask)
    out = plain.forward(u, memory, params, **options)
    np.testing.assert_array_equal(out, biased.forward(u, memory, zero, **options))
    other = {**params, **{name: rng.standard_normal(8) for name in dropped}}  # control: biases change the result
    assert np.abs(out - biased.forward(u, memory, other, **options)).max() > 1e-3
