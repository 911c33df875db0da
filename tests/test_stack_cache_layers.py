"""A stack's caches are one per layer and must hold the same tokens: a tester cut one layer's entry back alone (as a
rollback for speculative decoding might), and both backends decoded on, each layer placing the new token at its own
position and attending to its own history (0.51 off the full pass). Now refused before any work, naming the layer; the
control: every layer cut back alike decodes the full pass."""

import numpy as np
import pytest
import torch

from conftest import derived_now

D, HEADS, KV_HEADS, D_FF, LAYERS = 16, 4, 2, 24, 3


@pytest.fixture(scope="module")
def llama():
    derivation = derived_now("llama")
    return derivation.numpy_module(), derivation.torch_module()


def _setup(numpy_module):
    rng = np.random.default_rng(0)
    sizes = {"d": D, "d_ff": D_FF, "d_kv": D // HEADS * KV_HEADS}
    layers = [{name: rng.standard_normal(tuple(sizes[axis] for axis in axes)) * 0.3 + name.endswith("gain")
               for name, axes in numpy_module.PARAMETERS.items()} for _ in range(LAYERS)]
    return layers, {"gain": np.ones(D)}, rng.standard_normal((2, 7, D))


def _cut(cache, index, tokens):
    cache[index] = {key: value if key == "options" else value[:, :tokens] for key, value in cache[index].items()}


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_layers_holding_different_tokens_are_refused(llama, backend):
    numpy_module, torch_module = llama
    layers, final_norm, u = _setup(numpy_module)
    options = {"n_heads": HEADS, "n_kv_heads": KV_HEADS, "final_norm": final_norm}
    if backend == "numpy":
        def run(v, cache):
            return numpy_module.forward_stack(v, layers, cache=cache, **options)
    else:
        stack = torch_module.Stack(LAYERS, D, HEADS, D_FF, n_kv_heads=KV_HEADS, dtype=torch.float64)
        stack.load_params(layers, final_norm)

        def run(v, cache):
            with torch.no_grad():
                return stack(torch.tensor(v), cache=cache).numpy()
    cache = [{} for _ in range(LAYERS)]
    run(u[:, :6], cache)
    _cut(cache, 1, 4)
    kept = [dict(entry) for entry in cache]
    with pytest.raises(ValueError, match=r"^cache\[1\] holds 4 tokens, cache\[0\] 6: every layer of a stack caches"):
        run(u[:, 6:7], cache)
    assert all(entry.keys() == before.keys() and all(entry[key] is before[key] for key in entry)
               for entry, before in zip(cache, kept))  # no layer extended
    for index in (0, 2):  # the control: every layer cut back alike
        _cut(cache, index, 4)
    full = numpy_module.forward_stack(u[:, :5], layers, **options)[:, -1:]
    np.testing.assert_allclose(run(u[:, 4:5], cache), full, rtol=0, atol=1e-12)
