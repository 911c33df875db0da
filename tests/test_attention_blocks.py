"""The NumPy ``_attention`` routine's blocks: a short sequence's products small enough for BLAS to compute each
on one thread (no hand-off per product), a long one's kept large; the result is the attention either way."""

import types

import numpy as np
import pytest

from conftest import GENERATED, import_path

MODULE = import_path(GENERATED / "numpy" / "decoder.py")


def _products(batch, n_queries, n_keys, heads, width):
    """The (rows, inner, columns) of every matrix product ``_attention`` computes."""
    shapes = []

    def matmul(a, b, out=None):
        shapes.extend([(a.shape[-2], a.shape[-1], b.shape[-1])] * int(np.prod(a.shape[:-2])))
        return np.matmul(a, b, out=out)

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((batch, tokens, heads, width)) for tokens in (n_queries, n_keys, n_keys))
    original = MODULE.np
    MODULE.np = types.SimpleNamespace(**{**{name: getattr(np, name) for name in dir(np) if not name.startswith("__")},
                                         "matmul": matmul})
    try:
        MODULE._attention(q, k, v, 0.125, None)
    finally:
        MODULE.np = original
    return shapes


def test_a_short_sequences_products_stay_under_blas_one_thread_size():
    """B 8, N 128, 8 heads of 64 (the decoder/gpt2 benchmark rows): 128-row products (2^20 multiply-adds,
    which OpenBLAS splits over its threads) before; 32-row ones of 2^18 now."""
    shapes = _products(2, 128, 128, 8, 64)
    assert shapes and max(m * k * n for m, k, n in shapes) <= MODULE._ONE_THREAD == 1 << 18
    assert min(m for m, _, _ in shapes) >= MODULE._MIN_ROWS


def test_a_long_sequence_keeps_large_blocks():
    """Control: at N 1024 a 16-row product is past the one-thread size: the blocks stay as large as the
    cache allows (512 rows), which threads share well."""
    assert MODULE._blocks(1024, 1024, 8, 64) == (512, 1)
    assert MODULE._blocks(128, 128, 8, 64) == (32, 8)
    assert MODULE._blocks(1, 300, 8, 64) == (1, 8)  # one new token (decoding): one row
    # under a support, at most 128 rows (a causal block's keys stop close to its rows); short sequences unchanged
    assert MODULE._blocks(1024, 1024, 8, 64, True) == (128, 4)
    assert MODULE._blocks(128, 128, 8, 64, True) == (32, 8)


@pytest.mark.parametrize("n_queries, n_keys", [(100, 128), (37, 256), (5, 0)])
def test_blocked_attention_is_the_attention(n_queries, n_keys, rng):
    """Float64 against plain NumPy, with a padding and causal support cut into blocks (partial last
    block, rows with no key left: output 0)."""
    batch, heads, width = 2, 3, 64
    q, k, v = (rng.standard_normal((batch, tokens, heads, width)) for tokens in (n_queries, n_keys, n_keys))
    support = rng.random((batch, 1, n_queries, n_keys)) < 0.8
    support[0, 0, 3] = False
    rows, _ = MODULE._blocks(n_queries, n_keys, heads, width)
    assert n_keys == 0 or rows < n_queries  # more than one block of rows
    scores = np.einsum("bime,bjme->bmij", q, k) / 8
    weights = np.where(support, np.exp(scores - scores.max(-1, keepdims=True, initial=-np.inf)), 0)
    total = weights.sum(-1, keepdims=True)
    expected = np.einsum("bmij,bjme->bime", weights / np.where(total == 0, 1, total), v)
    assert np.abs(MODULE._attention(q, k, v, 0.125, support) - expected).max() <= 1e-12


@pytest.mark.parametrize("rows, group", [(1, 1), (2, 2), (3, 2), (4, 3)])
def test_blocks_of_heads_with_their_own_supports_are_the_attention(rows, group, rng, monkeypatch):
    """A support per head (each block's keys reach its furthest head's last kept key, ``_reaches``), with groups of
    heads that do not divide the heads and blocks of rows that do not divide the tokens, rows with no key left."""
    batch, n_queries, n_keys, heads, width = 2, 7, 9, 5, 4
    q, k, v = (rng.standard_normal((batch, tokens, heads, width)) for tokens in (n_queries, n_keys, n_keys))
    support = rng.random((batch, heads, n_queries, n_keys)) < 0.4
    support[1, 2, 3] = False
    monkeypatch.setattr(MODULE, "_blocks", lambda *arguments: (rows, group))
    scores = np.einsum("bime,bjme->bmij", q, k) / 8
    weights = np.where(support, np.exp(scores - scores.max(-1, keepdims=True)), 0)
    total = weights.sum(-1, keepdims=True)
    expected = np.einsum("bmij,bjme->bime", weights / np.where(total == 0, 1, total), v)
    assert np.abs(MODULE._attention(q, k, v, 0.125, support) - expected).max() <= 1e-12
    # control: every head read with the first head's support
    control = MODULE._attention(q, k, v, 0.125, np.broadcast_to(support[:, :1], support.shape))
    assert np.abs(control - expected).max() > 1e-3


def test_scores_bounded_by_their_norms_skip_the_row_max_and_large_ones_keep_it(rng, monkeypatch):
    """``_bounded``: |q·k| ≤ |q| |k| under half the exponent range less log(keys) lets the softmax skip its row max
    (the same kernel); scores past it (±2000 here) keep it; NaN, ∞ and empty operands are not bounded. Control: the
    large scores without the row max overflow."""
    batch, n_queries, n_keys, heads, width = 2, 6, 9, 3, 4
    q, k, v = (rng.standard_normal((batch, tokens, heads, width)) for tokens in (n_queries, n_keys, n_keys))
    support = rng.random((batch, 1, n_queries, n_keys)) < 0.7

    def expected(scale):
        scores = np.einsum("bime,bjme->bmij", q, k) * scale
        peak = np.where(support, scores, -np.inf).max(-1, keepdims=True, initial=-np.inf)
        with np.errstate(over="ignore", invalid="ignore"):  # the entries outside the support: dropped below
            weights = np.nan_to_num(np.where(support, np.exp(scores - peak), 0))
        total = weights.sum(-1, keepdims=True)
        return np.einsum("bmij,bjme->bime", weights / np.where(total == 0, 1, total), v)

    assert MODULE._bounded(q * 0.5, k).all() and not MODULE._bounded(q * 500, k).any()
    one = np.float32([[[[1.0]]]])  # float32, one key: the limit is log(max float32)/2 = 44.4
    assert MODULE._bounded(30 * one, one).all() and not MODULE._bounded(60 * one, one).any()
    for bad in (np.nan, np.inf):  # only the entry and head that hold it
        poisoned = q.copy()
        poisoned[1, 2, 0, 3] = bad
        assert MODULE._bounded(poisoned, k).tolist() == [[True] * heads, [False] + [True] * (heads - 1)]
    assert MODULE._bounded(q[:, :0], k).all() and MODULE._bounded(q, k[:, :0]).all()  # no scores to bound
    for scale in (0.5, 500.0):
        assert np.abs(MODULE._attention(q, k, v, scale, support) - expected(scale)).max() <= 1e-12
    monkeypatch.setattr(MODULE, "_bounded", lambda q, k: np.ones((batch, heads), bool))  # control: no row max
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.isfinite(MODULE._attention(q, k, v, 500.0, support)).all()


def _attention_calls(q, k, v, support):
    """``_attention``'s result and how many matrix products it called."""
    calls = []

    def matmul(a, b, out=None):
        calls.append(a.shape)
        return np.matmul(a, b, out=out)

    original = MODULE.np
    MODULE.np = types.SimpleNamespace(**{**{name: getattr(np, name) for name in dir(np) if not name.startswith("__")},
                                         "matmul": matmul})
    try:
        return MODULE._attention(q, k, v, 0.125, support), len(calls)
    finally:
        MODULE.np = original


@pytest.mark.parametrize("masked", [False, True], ids=["no support", "padding"])
def test_a_decoding_steps_attention_is_one_block_for_every_entry(masked, rng, monkeypatch):
    """A decoding step's shapes (4 query rows, a group's members, against 300 cached keys; 2 heads of 64): twice the
    rows are fewer than a key's features, so no score is bounded (the row max is subtracted) and every entry's
    scores are one block: two products for all 8 entries, not two per entry. The attention (plain NumPy), and bit for
    bit the blockwise loop's (control: 16 products, the whole block over every entry no longer fitting)."""
    batch, n_queries, n_keys, heads, width = 8, 4, 300, 2, 64
    q, k, v = (rng.standard_normal((batch, tokens, heads, width)) for tokens in (n_queries, n_keys, n_keys))
    support = (rng.random((batch, 1, n_queries, n_keys)) < 0.8) if masked else None
    scores = np.einsum("bime,bjme->bmij", q, k) / 8
    kept = np.ones(scores.shape, bool) if support is None else support
    weights = np.where(kept, np.exp(scores - scores.max(-1, keepdims=True)), 0)
    expected = np.einsum("bmij,bjme->bime", weights / weights.sum(-1, keepdims=True), v)
    one_block, products = _attention_calls(q, k, v, support)
    assert products == 2 and np.abs(one_block - expected).max() <= 1e-12
    monkeypatch.setattr(MODULE, "_SCORES", heads * n_queries * n_keys)  # one entry's block fits, not all entries'
    blockwise, products = _attention_calls(q, k, v, support)
    assert products == 2 * batch and np.array_equal(blockwise, one_block)
