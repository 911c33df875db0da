"""The ``local-kernel`` pass: a token shift's relative kernel of local support is summed over the few tokens
within its distances (``_window``), never as a dense N × N kernel.

Its emitted NumPy and torch code (forward, adjoint, cached decoding) holds no token-by-token array and equals
the code emitted without the pass (the dense kernel contracted by einsum) to 1e-12 in float64: positions on
the grid, with uneven gaps, repeated and fractional ones, reversed; padding and causal masks. Negative
control: the pass with each window moved by one token is far off.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

import splitformer

from splitformer.codegen.ir import LocalKernel
from splitformer.codegen.passes import DEFAULT, local_kernel
from splitformer.symbolic import parse_scheme

from test_token_shift import SCHEME

CAUSAL = SCHEME.replace('summary = "', 'causal = true\nsummary = "', 1)
WITHOUT = tuple(rewrite for rewrite in DEFAULT if rewrite is not local_kernel)
#: Positions of the 7 tokens of two sequences: uneven gaps, a repeated one, fractional ones; reversed.
POSITIONS = {"grid": None, "uneven": np.array([[0, 1, 1, 2.5, 3, 5, 4], [2, 3, 5, 8, 9, 10, 11]], dtype=float),
             "reversed": -np.arange(7, dtype=float)}


def _moved(module):
    """The pass with every window one token further: a wrong shift."""
    module = local_kernel(module)
    return replace(module, ops=[replace(op, windows=tuple(replace(w, low=w.low + 1, high=w.high + 1) for w in op.windows))
                                if isinstance(op, LocalKernel) else op for op in module.ops])


_MODULES = {}


def _modules(text, passes):
    key = (text, passes)
    if key not in _MODULES:
        derivation = splitformer.derive(parse_scheme(text), passes=passes)
        _MODULES[key] = (derivation.numpy_module(), derivation.torch_module())
    return _MODULES[key]


def _params(numpy_module, rng):
    sizes = {"d": 12, "d_ff": 10}
    return {name: rng.standard_normal(tuple(sizes[axis] for axis in axes)) for name, axes in numpy_module.PARAMETERS.items()}


def _run(text, passes, u, params, grad_out, options):
    """NumPy forward and adjoint, torch forward and autograd gradient of u."""
    numpy_module, torch_module = _modules(text, passes)
    out = numpy_module.forward(u, params, n_heads=2, **options)
    grad_u, _ = numpy_module.vjp(u, params, grad_out, n_heads=2, **options)
    block = torch_module.Block(12, 2, 10, dtype=torch.float64).load_params(params)
    x = torch.tensor(u, requires_grad=True)
    torch_options = {key: None if value is None else torch.tensor(value) for key, value in options.items()}
    torch_out = block(x, causal=options.get("causal", False), **{k: v for k, v in torch_options.items() if k != "causal"})
    torch_out.backward(torch.tensor(grad_out))
    return out, grad_u, torch_out.detach().numpy(), x.grad.numpy()


def test_a_shift_is_emitted_without_a_token_by_token_kernel():
    derivation = splitformer.derive(parse_scheme(CAUSAL))
    for backend in ("numpy", "torch"):
        lines = derivation.source(backend).splitlines()
        assert not any("kappa" in line or "bijl" in line or "bjil" in line for line in lines if not line.lstrip().startswith("#"))
        calls = [number for number, line in enumerate(lines) if " = " in line and "_window(" in line]
        assert len(calls) >= 6  # two shifts, forward and adjoint (NumPy: vjp; torch: the derived backward)
        for number in calls:  # under the kernel's formula and the sum it enters
            assert lines[number - 2].lstrip().startswith(("# κ^shift", "# κ^{shift"))
            assert "Σ_" in lines[number - 1] and "κ^" in lines[number - 1]


@pytest.mark.parametrize("positions", list(POSITIONS))
@pytest.mark.parametrize("masks", ["none", "padding", "causal"])
def test_the_local_kernel_equals_the_dense_kernel(positions, masks):
    rng = np.random.default_rng(3)
    numpy_module, _ = _modules(SCHEME, None)
    params = _params(numpy_module, rng)
    u, grad_out = rng.standard_normal((2, 7, 12)), rng.standard_normal((2, 7, 12))
    padding = np.zeros((2, 7), dtype=bool)
    padding[0, [1, 4]] = padding[1, 6] = True
    options = {"positions": POSITIONS[positions], "key_padding_mask": padding if masks == "padding" else None,
               "causal": masks == "causal"}
    local = _run(SCHEME, None, u, params, grad_out, options)
    dense = _run(SCHEME, WITHOUT, u, params, grad_out, options)
    for got, expected in zip(local, dense):  # relative: gradients reach |60| (the fused LayerNorm adjoints round apart)
        assert np.abs(got - expected).max() <= 1e-12 * max(1.0, np.abs(expected).max())
    moved = _run(SCHEME, (_moved,) + WITHOUT, u, params, grad_out, options)
    assert min(np.abs(got - expected).max() for got, expected in zip(moved, dense)) > 1e-3


def test_cached_decoding_with_the_local_kernel_equals_the_dense_full_pass():
    rng = np.random.default_rng(4)
    local, _ = _modules(CAUSAL, None)
    dense, _ = _modules(CAUSAL, WITHOUT)
    params = _params(local, rng)
    u = rng.standard_normal((2, 6, 12))
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, 2] = True
    expected = dense.forward(u, params, n_heads=2, key_padding_mask=padding)
    cache = {}
    steps = [local.forward(u[:, t:t + 1], params, n_heads=2, key_padding_mask=padding[:, :t + 1], cache=cache)
             for t in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-12
    assert np.abs(local.forward(u, params, n_heads=2) - expected).max() > 1e-3  # the mask matters
