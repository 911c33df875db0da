"""The derived backward and its forward with every pass (the committed goldens) against ``--passes none`` in
float64 (≤ 1e-12): the fused attention adjoint (flash attention's backward without a support, the recomputed kernel
with one), the fused LayerNorm adjoint and the forward LayerNorm keeping what it reads, in torch
(``Block(backward="derived")``) and NumPy (``vjp``)."""

import numpy as np
import pytest
import torch

from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import load_scheme

from conftest import GENERATED, import_path

import reference


@pytest.fixture(scope="module")
def unpassed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("passes-none")
    for name in ("post-ln", "pre-ln"):
        write_files(generate(load_scheme(name), ("numpy", "torch"), folder, passes=()))
    return folder


def _close(got, expected) -> bool:
    return np.abs(got - expected).max() <= 1e-12 * max(1.0, np.abs(expected).max())


def _torch_results(path, params, u, grad_out, options, d, n_heads, d_ff) -> list:
    module = import_path(path)
    block = module.Block(d, n_heads, d_ff, dtype=torch.float64, backward="derived").load_params(params)
    x = torch.tensor(u, requires_grad=True)
    out = block(x, **{k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in options.items()})
    out.backward(torch.tensor(grad_out))
    return [out.detach().numpy(), x.grad.numpy(), *(module._tensor(block, name).grad.numpy() for name in module.PARAMETERS)]


@pytest.mark.parametrize("name", ["post_ln", "pre_ln"])
@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
def test_parity_with_passes_none_in_float64(unpassed, name, mask, rng):
    source = (GENERATED / "torch" / f"{name}.py").read_text()
    assert all(f"{helper}(" in source for helper in ("_attention_adjoint", "_layer_norm_adjoint", "_kept_layer_norm"))
    unpassed_source = (unpassed / "torch" / f"{name}.py").read_text()
    assert "_adjoint(" not in unpassed_source and "_kept_layer_norm(" not in unpassed_source
    d, n_heads, d_ff, batch, tokens = 16, 4, 24, 3, 9
    numpy_passed, numpy_plain = (import_path(folder / "numpy" / f"{name}.py") for folder in (GENERATED, unpassed))
    params = reference.random_params(numpy_passed.PARAMETERS, d, d_ff, rng)
    u, grad_out = rng.standard_normal((batch, tokens, d)) * 3, rng.standard_normal((batch, tokens, d))
    options = {"causal": True} if mask == "causal" else {}
    if mask == "padding":
        options["key_padding_mask"] = np.zeros((batch, tokens), dtype=bool)
        options["key_padding_mask"][-1, tokens - 3:] = True
    passed, plain = (_torch_results(folder / "torch" / f"{name}.py", params, u, grad_out, options, d, n_heads, d_ff)
                     for folder in (GENERATED, unpassed))
    assert all(_close(got, expected) for got, expected in zip(passed, plain))
    grad_u, grads = numpy_passed.vjp(u, params, grad_out, n_heads=n_heads, **options)
    expected_u, expected = numpy_plain.vjp(u, params, grad_out, n_heads=n_heads, **options)
    assert _close(grad_u, expected_u) and all(_close(grads[key], value) for key, value in expected.items())
