"""The ``one-hot`` pass: T5's ``Σ_v T[v, m] δ(v, β[i, j])`` read as a gather, its adjoint as a scatter-add.

Structure: with the pass no statement of the block, its derived adjoint or its cached decoding holds an
array over the buckets and two token axes (a ``B × N_b × H × N × N`` temporary); without it one does.
Values: the code with the pass equals the code without it (the dense one-hot sum, the reference) to
≤ 1e-12: the NumPy forward, ``vjp`` and cached decoding, the torch forward, derived backward and
autograd, for causal and bidirectional buckets. Control: the gather and the scatter read one bucket
further, and are far off. The helpers read an index that is no bucket (negative, past the last,
not an integer) as 0, as the sum does. (x-transformers' ``RelativePositionBias`` against the code with the
pass: tests/test_xtransformers_rel_pos_bias.py.)
"""

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from splitformer import derive
from splitformer.codegen.passes import PASSES
from splitformer.symbolic import parse_scheme

from reference import random_params

DIM, HEADS, BUCKETS, TOKENS, D_FF = 8, 2, 8, 13, 12
DENSE = ",".join(name for name in PASSES if name != "one-hot")


def _scheme(bucketing: str) -> str:
    text = (Path(__file__).parent / "schemes" / "t5-pre-ln.toml").read_text()
    return text if bucketing == "causal" else text.replace('"causal"', f'"{bucketing}"').replace("causal = true", "")


@functools.cache
def _derived(bucketing: str, passes: str = "all"):
    return derive(parse_scheme(_scheme(bucketing)), passes=passes)


def _params(module, seed=0):
    return random_params(module.PARAMETERS, DIM, D_FF, np.random.default_rng(seed), n_buckets=BUCKETS, n_heads=HEADS)


def _bucket_token_arrays(ops) -> list[str]:
    return [op.out for op in ops if {"v", "i", "j"} <= set(getattr(op, "body_labels", ()) or op.labels)]


@pytest.mark.parametrize("bucketing", ["causal", "bidirectional"])
def test_no_statement_holds_an_array_over_the_buckets_and_two_token_axes(bucketing):
    for passes, dense in (("all", False), (DENSE, True)):
        derivation = _derived(bucketing, passes)
        backward = derivation.backward[0]
        found = _bucket_token_arrays([*derivation.lowered[0].ops, *backward.forward.ops, *backward.adjoint.ops])
        assert bool(found) == dense, (passes, found)
        source = derivation.source("numpy") + derivation.source("torch")
        assert ("_gather(" in source and "_scatter(" in source) != dense
        assert ("_grid(n_buckets, u0)" in source) == dense


def _numpy_parts(bucketing, passes, params, u, seed, module=None):
    module = module or _derived(bucketing, passes).numpy_module()
    causal = bucketing == "causal"
    forward = module.forward(u, params, n_heads=HEADS, causal=causal)
    grad_u, grads = module.vjp(u, params, seed, n_heads=HEADS, causal=causal)
    parts = [forward, grad_u, grads.pop("attn.rel_bias"), *(grads[name] for name in sorted(grads))]
    if causal:
        cache = {}
        parts.append(np.concatenate([module.forward(u[:, i:i + 1], params, n_heads=HEADS, causal=True, cache=cache)
                                     for i in range(u.shape[1])], axis=1))
    return parts


def _torch_parts(bucketing, passes, params, u, seed):
    module = _derived(bucketing, passes).torch_module()
    parts = []
    for backward in ("autograd", "derived"):
        block = module.Block(DIM, HEADS, D_FF, n_buckets=BUCKETS, dtype=torch.float64,
                             backward=backward).load_params(params)
        state = torch.tensor(u, requires_grad=True)
        out = block(state, causal=bucketing == "causal")
        (out * torch.tensor(seed)).sum().backward()
        parts += [out.detach().numpy(), state.grad.numpy(),
                  *(p.grad.numpy() for _, p in sorted(block.named_parameters()))]
    return parts


@pytest.mark.parametrize("bucketing", ["causal", "bidirectional"])
def test_the_gather_and_scatter_equal_the_dense_one_hot_sum(bucketing):
    rng = np.random.default_rng(1)
    u, seed = rng.standard_normal((2, TOKENS, DIM)), rng.standard_normal((2, TOKENS, DIM))
    params = _params(_derived(bucketing).numpy_module())
    for parts in (_numpy_parts, _torch_parts):
        lowered, dense = parts(bucketing, "all", params, u, seed), parts(bucketing, DENSE, params, u, seed)
        assert len(lowered) == len(dense)
        for got, expected in zip(lowered, dense):
            assert np.abs(got - expected).max() <= 1e-12
    table_grad = _numpy_parts(bucketing, DENSE, params, u, seed)[2]
    assert np.abs(table_grad).max() > 1e-2  # the table's gradient is compared, and is not all zeros


def test_a_bucket_read_one_further_is_far_off(monkeypatch):
    """Control: ``_gather`` and ``_scatter`` read ``β + 1``; the forward and the table's gradient differ."""
    rng = np.random.default_rng(3)
    u, seed = rng.standard_normal((2, TOKENS, DIM)), rng.standard_normal((2, TOKENS, DIM))
    params = _params(_derived("causal").numpy_module())
    dense = _numpy_parts("causal", DENSE, params, u, seed)
    module = _derived("causal").numpy_module()
    gather, scatter = module._gather, module._scatter
    monkeypatch.setattr(module, "_gather", lambda table, index: gather(table, index + 1))
    monkeypatch.setattr(module, "_scatter", lambda values, index, size, kept: scatter(values, index + 1, size, kept))
    shifted = _numpy_parts("causal", "all", params, u, seed, module)
    assert np.abs(shifted[0] - dense[0]).max() > 1e-3
    assert np.abs(shifted[2] - dense[2]).max() > 1e-3


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_an_index_that_is_no_bucket_reads_zero(backend):
    """``Σ_v T[v] δ(v, β)`` is 0 where β is no grid point; its adjoint adds such a value to no row."""
    module = getattr(_derived("causal"), f"{backend}_module")()
    table = np.arange(1.0, 9.0).reshape(2, 4)
    index = np.array([[0.0, 3.0, -1.0], [4.0, 2.5, 1.0]])
    values = np.arange(12.0).reshape(2, 2, 3)
    dense_gather = np.einsum("mv,ijv->mij", table, index[..., None] == np.arange(4))
    dense_scatter = np.einsum("mij,ijv->vm", values, index[..., None] == np.arange(4))
    if backend == "torch":
        table, index, values = map(torch.tensor, (table, index, values))
    gathered = np.asarray(module._gather(table, index))
    scattered = np.asarray(module._scatter(values, index, 4, 1))
    assert np.array_equal(gathered, dense_gather) and np.array_equal(scattered, dense_scatter)
