"""The emitted NumPy forward frees each local array after its last reader.

Its peak memory then stays low enough that the C allocator reuses it call after call instead
of returning it to the system and faulting every page in again (README, Performance).
"""

from __future__ import annotations

import tracemalloc
from types import ModuleType

import numpy as np
import pytest

from splitformer.codegen.backends import BACKENDS
from splitformer.codegen.lowering import lower
from splitformer.codegen.render import render_module
from splitformer.symbolic import load_scheme
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.stack import final_norm_scheme


def _forward_module() -> ModuleType:
    scheme = load_scheme("post-ln")
    module = ModuleType("post_ln_memory")
    module.source = render_module(scheme, lower(derive(scheme)), lower(derive(final_norm_scheme())), "numpy")
    exec(compile(module.source, "<post-ln numpy>", "exec"), module.__dict__)  # noqa: S102 - our own output
    return module


def _peak_bytes(module, u, params) -> tuple[int, np.ndarray]:
    tracemalloc.start()
    try:
        out = module.forward(u, params, n_heads=4)
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def modules():
    freeing = _forward_module()
    backend = type(BACKENDS["numpy"])
    backend.frees_dead_arrays = False  # the negative control: the same module keeping every local
    try:
        keeping = _forward_module()
    finally:
        backend.frees_dead_arrays = True
    return freeing, keeping


def test_forward_frees_dead_arrays_and_lowers_its_peak_memory(modules):
    freeing, keeping = modules
    rng = np.random.default_rng(0)
    sizes = {"d": 64, "d_ff": 256}
    params = {name: rng.standard_normal(tuple(sizes[axis] for axis in axes))
              for name, axes in freeing.PARAMETERS.items()}
    u = rng.standard_normal((4, 32, 64))
    peak, out = _peak_bytes(freeing, u, params)
    kept_peak, kept_out = _peak_bytes(keeping, u, params)
    np.testing.assert_array_equal(out, kept_out)
    assert "del attn_qkv" in freeing.source and "del attn_qkv" not in keeping.source
    # Q, K, V (3 × 64 KiB) are freed before the hidden layer (256 KiB) is allocated: 464 against 857 KiB
    assert peak <= kept_peak - 4 * u.nbytes, (peak, kept_peak)

