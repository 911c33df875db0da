"""The runtime helpers (``runtime/``), tested as modules against plain NumPy / torch written here in
float64, each check with a control that fails; and the inliner that copies them into generated code
(``codegen.runtime_source``): only what a module uses, transitively, in a stable order. The NumPy
convolutions (``runtime/numpy_grids.py``) are tested against loops in test_network_passes.py."""

from __future__ import annotations

import ast
import itertools
import math
import re
import warnings

import numpy as np
import pytest
import torch

from conftest import ROOT
from splitformer.codegen.runtime_source import RUNTIME_MODULES, definitions, inline_runtime, runtime_mark
from splitformer.runtime import checks, numpy_grids, numpy_helpers, numpy_inputs, numpy_parameters
from splitformer.runtime import torch_grids, torch_helpers, torch_inputs, torch_parameters

TOL = 1e-12


def _agree(actual, expected, control) -> None:
    """``actual`` within TOL of ``expected``; the control (a wrong reference) is not."""
    actual, expected, control = (np.asarray(x, dtype=np.float64) for x in (actual, expected, control))
    assert actual.shape == expected.shape
    assert np.max(np.abs(actual - expected), initial=0.0) <= TOL
    assert np.max(np.abs(actual - control)) > 1e-6


@pytest.fixture
def rng():
    return np.random.default_rng(7)


# -- references --------------------------------------------------------------------------------

def _softmax_reference(scores, support):
    """Row softmax by its definition, row by row; an empty row is 0."""
    out = np.zeros_like(scores)
    for index in np.ndindex(scores.shape[:-1]):
        kept = np.ones(scores.shape[-1], bool) if support is None else support[index]
        if kept.any():
            e = np.exp(scores[index][kept] - scores[index][kept].max())
            out[index][kept] = e / e.sum()
    return out


def _attention_reference(q, k, v, scale, support):
    """(batch, tokens, heads, features) operands, support (batch, tokens, keys) or None."""
    scores = np.einsum("bihe,bjhe->bhij", q, k) * scale
    mask = None if support is None else np.broadcast_to(support[:, None], scores.shape)
    return np.einsum("bhij,bjhf->bihf", _softmax_reference(scores, mask), v)


def _support(rng, batch, n, m):
    support = rng.random((batch, n, m)) > 0.3
    support[0, 0] = False  # an empty row: the kernel vanishes
    return support


def _windows_reference(field, size, stride, padding):
    """(b, c, p, q, r, s) = field[b, c, S p + r − P, S q + s − P], zero outside."""
    b, c, h, w = field.shape
    rows, cols = (h + 2 * padding - size) // stride + 1, (w + 2 * padding - size) // stride + 1
    out = np.zeros((b, c, rows, cols, size, size))
    for p, q, r, s in itertools.product(range(rows), range(cols), range(size), range(size)):
        i, j = stride * p + r - padding, stride * q + s - padding
        if 0 <= i < h and 0 <= j < w:
            out[:, :, p, q, r, s] = field[:, :, i, j]
    return out


# -- numpy_helpers ----------------------------------------------------------------------------

def test_numpy_erf_and_gelu_are_the_error_function(rng):
    x = np.concatenate([rng.normal(0, 3, 200), [0.0, 1.0, -1.0, 8.0, -30.0]])
    erf = np.array([math.erf(value) for value in x])
    _agree(numpy_helpers._erf(x), erf, np.tanh(x))
    gelu = x * (1 + np.array([math.erf(value / math.sqrt(2)) for value in x])) / 2
    _agree(numpy_helpers._gelu(x), gelu, x * (1 + np.tanh(x)) / 2)
    single = numpy_helpers._erf(x.astype(np.float32))
    assert single.dtype == np.float32 and np.max(np.abs(single - erf)) < 2.5e-7


def test_numpy_single_precision_erf_and_gelu_hold_their_bounds_on_a_dense_grid():
    """erf within 2.5e-7 (4 units in the last place near ±1; 2.0e-7 measured, Eigen's rational function before it
    3.8e-7) and the exact GELU within 2e-7·max(1, |x|) (1.4e-7 measured) of float64 references at 240,001 float32
    points of [−12, 12], past where tanh g rounds to ±1 (|x| ≈ 5.55 for GELU's g, 3.9 for erf's); the tanh
    approximation of GELU, 1.8e-4 from it, is the control."""
    x = np.linspace(-12, 12, 240_001).astype(np.float32)
    wide = x.astype(np.float64)
    erf = np.array([math.erf(value) for value in wide])
    gelu = wide * (1 + np.array([math.erf(value / math.sqrt(2)) for value in wide])) / 2
    scale = np.maximum(1, np.abs(wide))
    assert numpy_helpers._erf(x).dtype == np.float32 and np.abs(numpy_helpers._erf(x) - erf).max() < 2.5e-7
    assert numpy_helpers._gelu(x).dtype == np.float32 and (np.abs(numpy_helpers._gelu(x) - gelu) / scale).max() < 2e-7
    assert (np.abs(numpy_helpers._gelu_tanh(x) - gelu) / scale).max() > 1e-4


def test_numpy_single_precision_erf_keeps_its_relative_accuracy_near_zero(monkeypatch):
    """Found by an independent review: R(0) fitted freely missed erf's slope √(2/π) by 4.8e-7 relative (erf of small x
    10 units in the last place off); held exactly, within 2.5e-7 relative (3.2 units measured) down to 1e-30; the
    control: R(0) off by that 4.8e-7."""
    x = np.logspace(-30, -0.3, 20_000).astype(np.float32)
    erf = np.array([math.erf(value) for value in x.astype(np.float64)])
    assert (np.abs(numpy_helpers._erf(x) - erf) / erf).max() < 2.5e-7
    *rest, slope = numpy_helpers._ERF_TANH_R
    monkeypatch.setattr(numpy_helpers, "_ERF_TANH", numpy_helpers._odd_monic((*rest, slope * (1 + 4.8e-7))))
    assert (np.abs(numpy_helpers._erf(x) - erf) / erf).max() > 2.5e-7


def test_numpy_single_precision_gelu_and_erf_saturate_exactly(monkeypatch):
    """Far out erf is ±1 and Φ is 0 or 1 exactly, so x Φ(x) of a huge negative x is 0, not x times a rounding residue,
    of a huge positive one x itself (up to float32's largest: Φ is formed before x multiplies it), the derivative 0 or
    1, without overflow warnings (R̃(y²) y overflows from |x| ≈ 1e3, y² past 8.7e19, the density's x² past 1.8e19;
    found by an independent review); the control: R with its leading coefficient negated (g → −∞ far out: erf(1e13)
    would be −1 and GELU(1e13) 0)."""
    far = np.concatenate([np.logspace(1, 38.5, 400), [3.4e38]]).astype(np.float32)  # R̃(y²) y overflows from ~1e3
    huge = np.concatenate([-far[::-1], far])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(numpy_helpers._gelu(huge), np.where(huge > 0, huge, 0))
        assert np.array_equal(numpy_helpers._erf(huge), np.sign(huge))
        beyond = huge[np.abs(huge) >= 100]  # where the density underflows to 0 (its x² overflows past 1.8e19)
        derivative = numpy_helpers._gelu_backward(np.float32(1), beyond)
        assert np.array_equal(derivative, np.float32(beyond > 0))
    leading, *rest = numpy_helpers._ERF_TANH_R
    monkeypatch.setattr(numpy_helpers, "_ERF_TANH", numpy_helpers._odd_monic((-leading, *rest)))
    assert numpy_helpers._gelu(np.float32([1e13]))[0] == 0 and numpy_helpers._erf(np.float32([1e13]))[0] == -1


def test_numpy_single_precision_gelu_polynomial_is_the_fit_of_its_tool():
    """``_ERF_TANH_R`` is what ``tools/gelu_fit.py`` computes (erf's error 7.8e-8 on its grid, R(0) = √(2/π)); the
    control: degree 5, whose best fit misses erf by 5.8e-7."""
    from gelu_fit import fit  # tools/gelu_fit.py
    coefficients, error = fit()
    assert error < 8e-8 and np.allclose(coefficients, numpy_helpers._ERF_TANH_R, rtol=1e-6, atol=0)
    assert coefficients[-1] == math.sqrt(2 / math.pi)
    assert fit(degree=5, iterations=100)[1] > 4e-7


def test_numpy_single_precision_gelu_keeps_the_sign_of_x_and_never_exceeds_it(monkeypatch):
    """Φ = (1 + tanh g)/2 lies in [0, 1] and erf = tanh g(√2 x) in [−1, 1] by construction, so GELU keeps x's sign and
    never exceeds x, and its derivative's Φ stays in [0, 1] (Eigen's rational erf, used before, overshot 1 by up to 2
    units in the last place near its clamp: GELU of a negative x came out positive until Φ was clipped); the control:
    Φ one unit in the last place above its value, GELU(x) > x where Φ is 1."""
    x = np.linspace(-5.7, 5.7, 400_001).astype(np.float32)
    gelu, erf = numpy_helpers._gelu(x), numpy_helpers._erf(x / np.float32(math.sqrt(2)))
    assert (gelu[x < 0] <= 0).all() and (gelu[x > 0] <= x[x > 0]).all() and (np.abs(erf) <= 1).all()
    with np.errstate(over="ignore"):
        derivative = numpy_helpers._gelu_backward(np.float32(1), x) - x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    assert (derivative >= -1e-7).all() and (derivative <= 1 + 1e-7).all()  # Φ within [0, 1] up to the density's rounding
    phi = numpy_helpers._phi_single
    monkeypatch.setattr(numpy_helpers, "_phi_single", lambda *args: np.nextafter(phi(*args), 2, out=args[1][-1]))
    assert not (numpy_helpers._gelu(x)[x > 0] <= x[x > 0]).all()


def test_numpy_erf_of_integers_is_computed_in_double_precision():
    """Found by an adversarial review: ``_erf`` wrote its float results into an array of the input's integer type
    (erf([−3 … 3]) was all 0, erf of booleans booleans)."""
    x = np.array([-3, -1, 0, 1, 2, 3])
    assert numpy_helpers._erf(x).dtype == np.float64 and np.array_equal(numpy_helpers._erf(x), numpy_helpers._erf(x * 1.0))
    assert np.abs(numpy_helpers._erf(np.array([True, False])) - [math.erf(1), 0.0]).max() <= 2e-16


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("routine", ["_gelu", "_gelu_tanh"])
def test_numpy_gelu_into_its_argument_gives_the_same_bits(rng, dtype, routine, monkeypatch):
    function = getattr(numpy_helpers, routine)
    x = rng.normal(0, 3, (3, numpy_helpers._BLOCK + 77)).astype(dtype)  # several blocks, the last one short
    expected = function(x)
    y = x.copy()
    out = function(y, out=y)
    assert np.shares_memory(out, y) and out.dtype == dtype and np.array_equal(out, expected)
    strided = x.copy().T  # not contiguous: computed in a copy, then written into out
    assert np.array_equal(function(strided, out=strided), expected.T) and np.array_equal(strided, expected.T)
    other = np.empty_like(x, order="F")
    assert function(x, out=other) is other and np.array_equal(other, expected)
    with pytest.raises(ValueError, match="out must be x itself or an array that does not overlap it"):
        function(x[:, 1:], out=x[:, :-1])  # overlapping blocks would read results as arguments
    if routine == "_gelu_tanh":  # control: without the copy of each block, its result overwrites the x it still reads
        monkeypatch.setattr(numpy_helpers, "_block_read", lambda flat, start, size, kept: flat[start:start + size])
    else:  # control: _gelu reads each block whole before writing it; one that wrote its output first would not
        blocks_of, erf_block, polynomial, written = numpy_helpers._blocks_of, numpy_helpers._erf_block, \
            numpy_helpers._monic_polynomial, []
        monkeypatch.setattr(numpy_helpers, "_blocks_of", lambda *args: written.append(blocks_of(*args)) or written[-1])
        monkeypatch.setattr(numpy_helpers, "_erf_block", lambda *args: (erf_block(*args), written[-1][1].fill(0))[0])
        monkeypatch.setattr(numpy_helpers, "_monic_polynomial",
                            lambda *args: (polynomial(*args), written[-1][1].fill(0))[0])
    y = x.copy()
    assert not np.array_equal(function(y, out=y), expected)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_numpy_silu_is_its_formula_bit_for_bit_also_into_its_argument(rng, dtype):
    x = rng.normal(0, 30, (3 * numpy_helpers._BLOCK // 1000 + 5, 2000)).astype(dtype)  # rows in several blocks
    with np.errstate(all="ignore"):
        expected = x / (1 + np.exp(-x))
        checks = [(numpy_helpers._silu, True)]

        def written_first(x, out):  # control: e^{−x} into the output, then x (already overwritten) divided by it
            value = np.exp(np.negative(x, out=out), out=out)
            value += 1
            return np.divide(x, value, out=value)

        checks.append((written_first, False))
        for function, right in checks:
            wide = np.concatenate([x, x], axis=1)
            columns = wide[:, :2000]  # a projection's columns: a strided view, written where it lies
            out = function(columns, out=columns)
            assert np.shares_memory(out, wide) and np.array_equal(wide[:, :2000], expected) == right
        assert numpy_helpers._silu(x).dtype == dtype and np.array_equal(numpy_helpers._silu(x), expected)
        transposed = x.copy().T
        assert np.array_equal(numpy_helpers._silu(transposed, out=transposed), expected.T)
        assert np.array_equal(numpy_helpers._silu(np.arange(4)), np.arange(4) / (1 + np.exp(-np.arange(4))))
    with pytest.raises(ValueError, match="out must be x itself or an array that does not overlap it"):
        numpy_helpers._silu(x[:, 1:], out=x[:, :-1])


def test_numpy_silu_takes_empty_transposed_and_misshaped_arrays():
    """Found by an adversarial review: an empty last axis, rows whose entries are strided (the formula itself, in the
    array's own layout) and an ``out`` of another shape (refused)."""
    for shape in [(0,), (3, 0), (0, 5), (2, 0, 4)]:
        assert numpy_helpers._silu(np.empty(shape, np.float32)).shape == shape
    wide = np.random.default_rng(0).normal(0, 3, (64, 96)).astype(np.float32)
    for x in (np.asfortranarray(wide), wide.T, wide[:, ::2]):
        expected = x / (1 + np.exp(-x))
        out = numpy_helpers._silu(x)
        assert np.array_equal(out, expected) and out.flags.f_contiguous == expected.flags.f_contiguous
        y = x.copy(order="K")
        assert numpy_helpers._silu(y, out=y) is y and np.array_equal(y, expected)
    with pytest.raises(ValueError, match=r"out must have x's shape \[64, 96\], got \[96, 64\]"):
        numpy_helpers._silu(wide, out=np.empty((96, 64), np.float32))


def test_numpy_activation_adjoints_compute_half_precision_in_single_and_follow_torch_where_values_overflow():
    """Found by an adversarial review: float16 operands computed in float16 (x² overflows at 256: NaN), float32 ones
    under a float64 costate in float32, the tanh form's NaN past x³'s overflow where torch gives 0 or 1, an unknown
    ``approximate`` taken for the exact GELU, integers wrapped when negated."""
    half = np.array([-1000, -256, -0.7515, 0.5, 255, 256, 1000], np.float16)
    derivatives = {"none": (numpy_helpers._exact_gelu_derivative, 4), "tanh": (numpy_helpers._tanh_gelu_derivative, 3)}
    for approximate in ("none", "tanh"):
        expected = torch.ops.aten.gelu_backward(torch.ones(half.shape), torch.from_numpy(half.astype(np.float32)),
                                                approximate=approximate).numpy().astype(np.float16)
        ulp = np.spacing(np.abs(expected))  # within one float16 spacing of torch's single precision, rounded
        value = numpy_helpers._gelu_backward(np.float16(1), half, approximate)
        assert value.dtype == np.float16 and (np.abs(value - expected) <= ulp).all()
        # control: the float16 block read into the derivative unconverted (float16 loops) misses it
        with np.errstate(all="ignore"):
            derivative, rows = derivatives[approximate]
            unconverted = derivative(half, list(np.empty((rows, half.size), np.float32))).astype(np.float16)
        assert not (np.abs(unconverted - expected) <= ulp).all()
        huge = np.float32([1e13, 1e18, -1e13, -1e18])
        expected = torch.ops.aten.gelu_backward(torch.ones(4), torch.from_numpy(huge), approximate=approximate).numpy()
        with np.errstate(over="ignore"):
            assert np.array_equal(numpy_helpers._gelu_backward(np.float32(1), huge, approximate), expected)
    x = np.float32([-0.7515, 0.3, 2.5])
    wide = numpy_helpers._gelu_backward(np.ones(3), x)  # a float64 costate: computed in float64
    assert wide.dtype == np.float64 and np.abs(wide - numpy_helpers._gelu_backward(1.0, x.astype(np.float64))).max() < 1e-15
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'Tanh'"):
        numpy_helpers._gelu_backward(1.0, x, "Tanh")
    assert numpy_helpers._silu_backward(1.0, np.int8([-128])) == numpy_helpers._silu_backward(1.0, np.float64([-128]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_silu_and_its_derivative_where_the_exponential_overflows_are_torchs_values_without_a_warning(dtype):
    """e^{−x} overflows for x < −88.7 (float32) or −709.8 (float64): the SiLU is x/∞ = −0 and its derivative 0, as
    torch's, and NumPy's overflow warning (an error under ``np.errstate(over="raise")``) is not raised (an adjoint
    auditor's: llama's feed-forward in float32 warned); control: the formula alone warns there."""
    x = np.array([-1e4, -800.0, -100.0, -20.0, 0.5, 1e4], dtype)
    costate = np.arange(1, 7, dtype=dtype)
    expected = torch.nn.functional.silu(torch.from_numpy(x)).numpy()
    gradient = torch.from_numpy(x).requires_grad_()
    torch.nn.functional.silu(gradient).backward(torch.from_numpy(costate))
    with np.errstate(over="raise"):
        with pytest.raises(FloatingPointError):
            np.divide(x, 1 + np.exp(-x))
        value = numpy_helpers._silu(x)
        assert np.array_equal(value[:3], expected[:3]) and np.signbit(value[:3]).all()  # −0, as torch's
        assert np.abs(value - expected).max() <= 2 * np.finfo(dtype).eps * np.abs(expected).max()
        assert np.abs(numpy_helpers._silu_backward(costate, x) - gradient.grad.numpy()).max() <= 4 * np.finfo(dtype).eps
        assert np.array_equal(numpy_helpers._silu(x.reshape(2, 3).T), value.reshape(2, 3).T)  # strided rows


def test_numpy_half_precision_erf_is_single_precisions_rounded(rng):
    x = rng.normal(0, 2, 2 * numpy_helpers._BLOCK + 5).astype(np.float16)
    single = numpy_helpers._erf(x.astype(np.float32))
    assert numpy_helpers._erf(x).dtype == np.float16 and np.array_equal(numpy_helpers._erf(x), single.astype(np.float16))
    assert np.max(np.abs(single - np.array([math.erf(value) for value in x.astype(np.float64)]))) < 2.5e-7


def test_numpy_products_write_each_kernel_into_its_columns(rng):
    rows = rng.normal(size=(7, 5))
    weights, biases = [rng.normal(size=(5, w)) for w in (4, 2, 3)], [rng.normal(size=w) for w in (4, 2, 3)]
    plain = rows @ np.concatenate(weights, axis=1)
    _agree(numpy_helpers._products(rows, weights), plain, plain[:, ::-1])
    _agree(numpy_helpers._products(rows, weights, biases), plain + np.concatenate(biases), plain)


def test_numpy_einsum_softmax_and_attention(rng):
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4, 5))
    _agree(numpy_helpers._einsum("ij,jk->ik", a, b), a @ b, a @ b + 1)
    scores, support = rng.normal(size=(2, 3, 4)), _support(rng, 2, 3, 4)
    _agree(numpy_helpers._softmax(scores, support), _softmax_reference(scores, support),
           _softmax_reference(scores, None))
    q, k, v = rng.normal(size=(2, 3, 2, 4)), rng.normal(size=(2, 5, 2, 4)), rng.normal(size=(2, 5, 2, 4))
    support = _support(rng, 2, 3, 5)
    expected = _attention_reference(q, k, v, 0.5, support)
    _agree(numpy_helpers._attention(q, k, v, 0.5, support[:, None]), expected, _attention_reference(q, k, v, 0.5, None))
    assert not expected[0, 0].any()  # the empty row: the output bias alone


def test_numpy_attention_stops_each_block_at_its_last_kept_key(rng, monkeypatch):
    """A causal support (with cached keys before the queries): each block of query rows multiplies only the keys up
    to its last query's, with the values of the full masked kernel; a support keeping no key gives the zero kernel."""
    n, cached = 9, 3
    q, k, v = rng.normal(size=(2, n, 2, 4)), rng.normal(size=(2, n + cached, 2, 4)), rng.normal(size=(2, n + cached, 2, 4))
    causal = np.broadcast_to(np.tril(np.ones((n, n + cached), dtype=bool), cached), (2, n, n + cached)).copy()
    causal[1, :4] = False  # rows whose support is empty
    monkeypatch.setattr(numpy_helpers, "_blocks", lambda *arguments: (4, 1))  # blocks of 4 rows, one head
    widths = []
    matmul = np.matmul
    monkeypatch.setattr(numpy_helpers.np, "matmul", lambda a, b, **kw: widths.append(b.shape[-1]) or matmul(a, b, **kw))
    actual = numpy_helpers._attention(q, k, v, 0.5, causal[:, None])
    monkeypatch.setattr(numpy_helpers.np, "matmul", matmul)
    _agree(actual, _attention_reference(q, k, v, 0.5, causal), _attention_reference(q, k, v, 0.5, None))
    assert widths[::2] == [7, 11, 12] * 2 + [0, 11, 12] * 2  # per block: keys up to its last query's (batch 1: none)
    assert numpy_helpers._reaches(np.zeros((1, 1, 2, 5), dtype=bool), 2, 1).tolist() == [[[0]]]
    # per head where the support differs between heads: a group of heads reaches its furthest head's key
    per_head = np.zeros((1, 3, 4, 6), dtype=bool)
    per_head[0, 0, 1, 2] = per_head[0, 1, 3, 4] = per_head[0, 2, 0, 5] = True
    assert numpy_helpers._reaches(per_head, 2, 2).tolist() == [[[3, 5], [6, 0]]]
    assert numpy_helpers._reaches(np.ones((2, 1, 3, 0), dtype=bool), 2, 4).tolist() == [[[0, 0]], [[0, 0]]]


@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (1, 1, 64, 16), (2, 4, 9, 3), (1, 2, 1, 4)])
def test_numpy_any_per_block_is_the_blocks_or(rng, shape):
    """``_any_per_block`` (``_reaches``' reductions) against a loop over the blocks, the last one shorter, of sizes 1 to
    past the axis, a broadcast (stride 0) mask too; the control: every block's AND (the wrong reduction) is told apart."""
    def reference(mask, size, axis):
        blocks = [mask.take(range(start, min(start + size, mask.shape[axis])), axis=axis).any(axis=axis)
                  for start in range(0, mask.shape[axis], size)]
        return np.stack(blocks, axis=axis)
    mask = rng.random(shape) < 0.15
    broadcast = np.broadcast_to(mask[:1, :1], shape)
    for axis in (1, 2):
        for size in (1, 2, 3, 4, 7, 128):
            for m in (mask, broadcast):
                assert np.array_equal(numpy_helpers._any_per_block(m, size, axis), reference(m, size, axis))
    every = np.stack([mask.take(range(start, min(start + 2, shape[3])), axis=3).all(axis=3)
                      for start in range(0, shape[3], 2)], axis=3)
    assert not np.array_equal(numpy_helpers._any_per_block(mask, 2, 3), every)


def test_numpy_grouped_attention_reads_its_groups_keys(rng):
    q = rng.normal(size=(2, 3, 2, 3, 4))  # (batch, tokens, groups, members, features)
    k, v, support = rng.normal(size=(2, 5, 2, 4)), rng.normal(size=(2, 5, 2, 4)), _support(rng, 2, 3, 5)
    repeated = np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2)  # each member its group's keys
    expected = _attention_reference(q.reshape(2, 3, 6, 4), *repeated, 0.3, support).reshape(2, 3, 2, 3, 4)
    control = _attention_reference(q.reshape(2, 3, 6, 4), np.tile(k, (1, 1, 3, 1)), np.tile(v, (1, 1, 3, 1)), 0.3,
                                   support).reshape(2, 3, 2, 3, 4)
    _agree(numpy_helpers._grouped_attention(q, k, v, 0.3, support), expected, control)


def _one_hot_reference(table, index, values, size):
    gathered = np.zeros(table.shape[:-1] + index.shape)
    scattered = np.zeros((size,) + values.shape[:1])
    for position in np.ndindex(index.shape):
        row = index[position]
        if row == int(row) and 0 <= row < table.shape[-1]:
            gathered[(...,) + position] = table[..., int(row)]
        if row == int(row) and 0 <= row < size:
            scattered[int(row)] += values[(slice(None),) + position]
    return gathered, scattered


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_gather_and_scatter_are_one_hot_sums(rng, backend):
    table, index, values = rng.normal(size=(2, 4)), np.array([[0.0, 3.0, 1.5], [4.0, -1.0, 2.0]]), rng.normal(size=(2, 2, 3))
    gathered, scattered = _one_hot_reference(table, index, values, 4)
    helpers, wrap = (numpy_helpers, np.asarray) if backend == "numpy" else (torch_helpers, torch.from_numpy)
    _agree(np.asarray(helpers._gather(wrap(table), wrap(index))), gathered, np.take(table, np.clip(index, 0, 3).astype(int), axis=-1))
    _agree(np.asarray(helpers._scatter(wrap(values), wrap(index), 4, 1)), scattered, scattered + (index == 1.5).any())


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_window_is_a_local_kernel(rng, backend):
    values, pos_out, pos_in = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 4)) * 3, rng.normal(size=(2, 5)) * 3
    support = rng.random((2, 4, 5)) > 0.3
    near = (pos_out[:, :, None] - pos_in[:, None, :] > -1) & (pos_out[:, :, None] - pos_in[:, None, :] < 2)
    expected = np.einsum("bac,bcd->bad", near & support, values)
    helpers, wrap = (numpy_helpers, np.asarray) if backend == "numpy" else (torch_helpers, torch.from_numpy)
    actual = helpers._window(*map(wrap, (values, pos_out, pos_in)), -1.0, 2.0, wrap(support))
    _agree(np.asarray(actual), expected, np.einsum("bac,bcd->bad", near, values))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_norms_by_their_formulas_also_where_squares_overflow(rng, backend):
    x, gain, bias = rng.normal(size=(3, 6)) + 5, rng.normal(size=6), rng.normal(size=6)
    centred = x - x.mean(-1, keepdims=True)
    layer = gain * centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) + bias
    rms = gain * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5)
    helpers, wrap = (numpy_helpers, np.asarray) if backend == "numpy" else (torch_helpers, torch.from_numpy)
    _agree(np.asarray(helpers._layer_norm(*map(wrap, (x, gain, bias)), 1e-5)), layer, rms + bias)
    _agree(np.asarray(helpers._rms_norm(wrap(x), wrap(gain), 1e-5)), rms, layer - bias)
    huge = x * 1e300  # squares overflow: the scaled statistics give the same normalized rows
    _agree(np.asarray(helpers._layer_norm(*map(wrap, (huge, gain, bias)), 0.0)),
           gain * centred / np.sqrt((centred ** 2).mean(-1, keepdims=True)) + bias, layer + 1)



@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_kept_layer_norm_gives_the_norm_its_normalized_rows_and_their_variance(rng, backend):
    """What the derived adjoint reads (``kept-layer-norm``), by its formulas in float64, on rows away from zero."""
    x, gain, bias = rng.normal(size=(4, 8)) + 100, rng.normal(size=8), rng.normal(size=8)
    centred = x - x.mean(-1, keepdims=True)
    variance = (centred ** 2).mean(-1)
    normalized = centred / np.sqrt(variance + 1e-5)[:, None]
    helpers, wrap = (numpy_helpers, np.asarray) if backend == "numpy" else (torch_helpers, torch.from_numpy)
    out, p, kept = (np.asarray(value) for value in helpers._kept_layer_norm(*map(wrap, (x, gain, bias)), 1e-5))
    _agree(p, normalized, normalized + 1e-6)
    _agree(out, gain * normalized + bias, gain * normalized)
    _agree(kept, variance, variance * 1.0001)


# -- grids ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("size, stride, padding", [(3, 1, 1), (2, 2, 0), (3, 2, 1)])
def test_windows_and_their_adjoint_fold(rng, size, stride, padding):
    field = rng.normal(size=(2, 3, 5, 6))
    expected = _windows_reference(field, size, stride, padding)
    windows = numpy_grids._windows(field, (2, 3), size, stride, padding)
    _agree(windows, expected, _windows_reference(field, size, stride, padding + 1)[:, :, :expected.shape[2],
                                                                                   :expected.shape[3]])
    _agree(torch_grids._windows(torch.from_numpy(field), (2, 3), size, stride, padding).numpy(), expected,
           expected + 1)
    blocks = rng.normal(size=expected.shape)  # <fold(blocks), field> = <blocks, windows(field)>
    for grids, wrap in ((numpy_grids, np.asarray), (torch_grids, torch.from_numpy)):
        folded = np.asarray(grids._fold(wrap(blocks), field.shape, (2, 3), size, stride, padding))
        _agree(np.sum(folded * field), np.sum(blocks * expected), np.sum(blocks * expected) + 1)


@pytest.mark.parametrize("grids, wrap", [(numpy_grids, np.asarray), (torch_grids, torch.from_numpy)])
def test_rows_place_rows_and_join(rng, grids, wrap):
    field = rng.normal(size=(2, 7, 3))
    rows = np.asarray(grids._rows(wrap(field), 1, 1, (2, 3)))
    _agree(rows, field[:, 1:7].reshape(2, 2, 3, 3), field[:, 0:6].reshape(2, 2, 3, 3))
    placed = np.asarray(grids._place_rows(wrap(rows.copy()), (2, 7, 3), 1, 1))
    _agree(placed, np.concatenate([np.zeros((2, 1, 3)), field[:, 1:7]], axis=1), field)
    node, shared = rng.normal(size=(2, 3)), rng.normal(size=3)
    joined = np.asarray(grids._join(wrap(node)[:, None] if wrap is np.asarray else wrap(node)[:, None],
                                    wrap(shared), wrap(rows.copy())))
    expected = np.concatenate([node[:, None], np.broadcast_to(shared, (2, 1, 3)), rows.reshape(2, 6, 3)], axis=1)
    _agree(joined, expected, expected[:, ::-1])


# -- parameters and checks -------------------------------------------------------------------------

def test_numpy_tables_inputs_and_costates_are_checked_then_cast():
    table = {"W": ("d", 2)}
    arrays = numpy_parameters._table({"p.W": np.ones((3, 2), np.int64)}, table, {"d": 3}, np.float64, "p.")
    assert arrays["W"].dtype == np.float64 and arrays["W"].shape == (3, 2)
    for params, message in (({}, "missing parameter 'p.W'"), ({"p.W": np.ones((2, 2))}, "has shape (2, 2)"),
                            ({"p.W": np.ones((3, 2), bool)}, "has dtype bool")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            numpy_parameters._table(params, table, {"d": 3}, np.float64, "p.")
    with pytest.raises(ValueError, match="pixel_values must be float32 or float64"):
        numpy_parameters._input("pixel_values", np.ones((1, 1, 2, 2), np.int32))
    with pytest.raises(ValueError, match="grad_out must have shape"):
        numpy_parameters._costate("grad_out", np.ones(3), (2,), np.float64)
    assert numpy_parameters._costate("grad_out", [1, 2], (2,), np.float32).dtype == np.float32


def test_argument_checks_name_the_argument():
    """Review s33: ``_finite`` widened a Fraction past float's range with float() and raised OverflowError; and a
    NumPy float32 eps is compared widened (its old comparison with the largest float64 overflowed float32)."""
    from fractions import Fraction

    assert checks._integer("n", 3, 1) == 3 and checks._epsilon(1e-5) == 1e-5 and checks._flag("cls", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checks._epsilon(np.float32(1e-5)) == float(np.float32(1e-5))
    assert checks._integers("sizes", [1, 2], 1) == [1, 2] and checks._pair("image_size", (4, 5), 1) == (4, 5)
    assert checks._choice("mode", "a", ("a", "b")) == "a" and checks._mapping("params", {}) == {}
    for call, error, message in ((lambda: checks._integer("n", True, 1), TypeError, "n must be an int"),
                                 (lambda: checks._integer("n", 0, 1), ValueError, "n must be >= 1"),
                                 (lambda: checks._epsilon(-1.0), ValueError, "eps must be finite"),
                                 (lambda: checks._epsilon(Fraction(10 ** 400)), ValueError, "eps must be finite"),
                                 (lambda: checks._integers("sizes", [1, 0], 1), ValueError, r"sizes\[1\] must be >= 1"),
                                 (lambda: checks._pair("image_size", 4, 1), TypeError, "image_size must be"),
                                 (lambda: checks._flag("cls", 1), TypeError, "cls must be a bool"),
                                 (lambda: checks._choice("mode", "c", ("a", "b")), ValueError, "mode must be 'a' or 'b'"),
                                 (lambda: checks._mapping("params", [1]), TypeError, "params must be a mapping"),
                                 (lambda: checks._buckets(4, 1, True), ValueError, "n_buckets = 4")):
        with pytest.raises(error, match=message):
            call()
    checks._buckets(32, 128, True)  # T5's default: accepted


def test_torch_parameters_register_check_and_load_all_or_nothing():
    class Net(torch_parameters._Network):
        def __init__(self):
            super().__init__()
            torch_parameters._group(self, {"embed.W": ("d", 2), "embed.b": (2,)}, {"d": 3}, {"dtype": torch.float64})
            torch_parameters._initialize(self, {"W": torch.nn.init.ones_}, torch.nn.init.zeros_)

    net = Net()
    params, table = dict(net.named_parameters()), {"W": ("d", 2), "b": (2,)}
    assert torch_parameters._table(params, table, {"d": 3}, torch.float64, "embed.")["W"] is net.embed.W
    for sizes, dtype, prefix, message in (({"d": 3}, torch.float64, "head.", "missing parameter 'head.W'"),
                                          ({"d": 4}, torch.float64, "embed.", r"has shape \(3, 2\), expected \(4, 2\)"),
                                          ({"d": 3}, torch.float32, "embed.", "has dtype torch.float64")):
        with pytest.raises(ValueError, match=message):
            torch_parameters._table(params, table, sizes, dtype, prefix)
    assert net.embed.W.shape == (3, 2) and bool((net.embed.W == 1).all()) and bool((net.embed.b == 0).all())
    with pytest.raises(ValueError, match="has shape"):  # the second is wrong: the first is not copied
        net.load_params({"embed.W": np.full((3, 2), 2.0), "embed.b": np.ones(3)})
    assert bool((net.embed.W == 1).all())
    net.load_params({"embed.W": np.full((3, 2), 2.0), "embed.b": np.ones(2)})
    assert bool((net.embed.W == 2).all()) and bool((net.embed.b == 1).all())
    x = torch.zeros(2, 3, 4, dtype=torch.float64)
    cpu = torch.device("cpu")
    assert torch_parameters._input("x", x, (3, "n"), torch.float64, cpu) is x
    with pytest.raises(ValueError, match=r"x must have shape \(batch, 4, n\)"):
        torch_parameters._input("x", x, (4, "n"), torch.float64, cpu)
    with pytest.raises(ValueError, match=r"^x is on cpu, the model's parameters on meta$"):
        torch_parameters._input("x", x, (3, "n"), torch.float64, torch.device("meta"))


# -- torch_helpers -------------------------------------------------------------------------------

def test_torch_softmax_and_attention_with_bool_and_float_supports(rng):
    q, k, v = (torch.from_numpy(rng.normal(size=shape)) for shape in ((2, 3, 2, 4), (2, 5, 2, 4), (2, 5, 2, 4)))
    support = _support(rng, 2, 3, 5)
    expected = _attention_reference(q.numpy(), k.numpy(), v.numpy(), 0.5, support)
    control = _attention_reference(q.numpy(), k.numpy(), v.numpy(), 0.5, None)
    boolean = torch.from_numpy(support)[:, None]
    log_weight = torch.zeros(boolean.shape, dtype=torch.float64).masked_fill(~boolean, float("-inf"))
    for mask in (boolean, log_weight):
        _agree(torch_helpers._attention(q, k, v, 0.5, mask).numpy(), expected, control)
    scores = torch.from_numpy(rng.normal(size=(2, 3, 5)))
    _agree(torch_helpers._softmax(scores, torch.from_numpy(support)).numpy(),
           _softmax_reference(scores.numpy(), support), _softmax_reference(scores.numpy(), None))
    grouped_q = torch.from_numpy(rng.normal(size=(2, 3, 2, 3, 4)))
    _agree(torch_helpers._grouped_attention(grouped_q, k, v, 0.5, torch.from_numpy(support)).numpy(),
           numpy_helpers._grouped_attention(grouped_q.numpy(), k.numpy(), v.numpy(), 0.5, support),
           numpy_helpers._grouped_attention(grouped_q.numpy(), k.numpy(), v.numpy(), 0.5, None))


@pytest.mark.parametrize("grouped", [False, True], ids=["heads", "grouped-heads"])
def test_a_causal_support_takes_flash_attentions_is_causal_and_equals_the_masked_kernel(rng, grouped, monkeypatch):
    """Each query's own and earlier keys: the same values as the masked kernel (NumPy reference) through SDPA's
    ``is_causal``; a support one key off causal (the control) takes the mask."""
    n = 6
    q = torch.from_numpy(rng.normal(size=(2, n, 2, 3, 4) if grouped else (2, n, 2, 4)))
    k, v = (torch.from_numpy(rng.normal(size=(2, n, 2, 4))) for _ in range(2))
    causal = np.broadcast_to(np.tril(np.ones((n, n), dtype=bool)), (2, n, n))
    off = causal.copy()
    off[1, 4, 2] = False
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(kwargs.get("is_causal", False)) or sdpa(*args, **kwargs))
    for support, flash in ((causal, True), (off, False)):
        calls.clear()
        if grouped:
            actual = torch_helpers._grouped_attention(q, k, v, 0.5, torch.from_numpy(support.copy()))
            expected = numpy_helpers._grouped_attention(q.numpy(), k.numpy(), v.numpy(), 0.5, support)
        else:
            actual = torch_helpers._attention(q, k, v, 0.5, torch.from_numpy(support.copy())[:, None])
            expected = _attention_reference(q.numpy(), k.numpy(), v.numpy(), 0.5, support)
        assert calls == [flash]
        assert np.max(np.abs(actual.numpy() - expected)) <= TOL
    assert not torch_helpers._causal(torch.from_numpy(causal.copy()).double())  # a float log-weight: the mask


def test_a_causal_support_keeps_flash_attentions_normalizer_and_its_backward_is_autograds(rng):
    """The derived path: a causal support keeps the row normalizers (flash attention's forward and backward with
    ``is_causal``); (q̄, k̄, v̄) equal autograd through the masked kernel. Control: a support one key off causal keeps
    none (the adjoint recomputes the kernel), with the same equality."""
    n = 7
    q, k, v, o_bar = (torch.from_numpy(rng.normal(size=(2, n, 2, 4))) for _ in range(4))
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(2, n, n)
    off = causal.clone()
    off[0, 5, 1] = False
    for support, kept in ((causal, True), (off, False)):
        o, log_total = torch_helpers._attention_normalized(q, k, v, 0.5, support[:, None])
        assert (log_total is not None) == kept
        grads = torch_helpers._attention_adjoint(o_bar, q, k, v, o, log_total, 0.5, support[:, None])
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        scores = torch.einsum("bihe,bjhe->bhij", leaves[0], leaves[1]) * 0.5
        kernel = torch.softmax(scores.masked_fill(~support[:, None], float("-inf")), dim=-1)
        expected = torch.einsum("bhij,bjhf->bihf", kernel, leaves[2])
        torch.testing.assert_close(o, expected.detach(), rtol=0, atol=TOL)
        expected.backward(o_bar)
        for grad, leaf in zip(grads, leaves):
            torch.testing.assert_close(grad, leaf.grad, rtol=0, atol=TOL)


def test_torch_masks_restrict_a_support_and_are_checked():
    support = torch.ones(1, 2, 2, dtype=torch.bool)
    mask = torch.tensor([[False, True]])
    assert torch_helpers._restrict(support, mask).tolist() == [[[True, False], [True, False]]]
    floating = torch_helpers._restrict(torch.zeros(1, 2, 2, dtype=torch.float64), mask)
    assert floating[0, :, 1].tolist() == [float("-inf")] * 2 and floating[0, :, 0].tolist() == [0.0, 0.0]
    torch_helpers._check_mask("src_mask", mask, [[1, 2]])
    with pytest.raises(ValueError, match="src_mask must be bool or float of shape"):
        torch_helpers._check_mask("src_mask", mask, [[2, 2]])
    x = torch.ones(3)
    assert torch_helpers._dropout(x, 0.0) is x
    with torch.enable_grad(), pytest.raises(RuntimeError, match="first-order gradients only"):
        torch_helpers._first_order_only()


@pytest.mark.parametrize("widths", [(2, 2, 2), (4, 1, 1)], ids=["equal", "grouped-heads"])
def test_torch_cat_reads_parts_side_by_side_without_a_copy(widths):
    module = torch.nn.Module()
    module.add_module("attn", torch.nn.Module())
    names = ("W_q", "W_k", "W_v")
    for name, width in zip(names, widths):
        module.attn.register_parameter(name, torch.nn.Parameter(torch.randn(3, width, dtype=torch.float64)))
    parts = lambda: [getattr(module.attn, name) for name in names]  # noqa: E731
    expected = torch.cat([part.detach() for part in parts()], 1)
    torch_helpers._side_by_side(module, [(tuple(f"attn.{name}" for name in names), 1)])
    with torch.no_grad():
        joined = torch_helpers._cat(parts(), 1)
        separate = torch_helpers._cat([part.clone() for part in parts()], 1)
        swapped = torch_helpers._joined_view(parts()[::-1], 1)
    _agree(joined.numpy(), expected.numpy(), expected.numpy() + 1)
    assert [part.shape[1] for part in parts()] == list(widths)
    assert joined.untyped_storage().data_ptr() == module.attn.W_q.untyped_storage().data_ptr()
    assert separate.untyped_storage().data_ptr() != module.attn.W_q.untyped_storage().data_ptr()  # control
    assert swapped is None  # control: the parts out of their order are no view of one tensor


def test_torch_cat_reuses_its_view_only_while_the_parts_lie_where_they_lay():
    """The joined view is built once and read again: edits of a part reach it, a part moved elsewhere
    (``.data`` replaced) or another inference mode gets a view built anew; the entry goes with its first part."""
    module = torch.nn.Module()
    names = ("W_q", "W_k")
    for name in names:
        module.register_parameter(name, torch.nn.Parameter(torch.randn(2, 3, dtype=torch.float64)))
    parts = lambda: [getattr(module, name) for name in names]  # noqa: E731
    torch_helpers._side_by_side(module, [(names, 1)])
    with torch.no_grad():
        first = torch_helpers._cat(parts(), 1)
        assert torch_helpers._cat(parts(), 1) is first
        module.W_k.mul_(2.0)
        _agree(first.numpy(), torch.cat([part.detach() for part in parts()], 1).numpy(), first.numpy() * 0)
        module.W_q.data = module.W_q.detach().clone()  # no longer beside W_k: torch.cat, a copy
        copied = torch_helpers._cat(parts(), 1)
        assert copied is not first and copied.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
        torch_helpers._side_by_side(module, [(names, 1)])
        again = torch_helpers._cat(parts(), 1)
        assert again.untyped_storage().data_ptr() == module.W_q.untyped_storage().data_ptr()
    with torch.inference_mode():
        inference = torch_helpers._cat(parts(), 1)
    assert inference is not again  # built in inference mode, kept apart from views built outside it
    whole = torch.arange(12.0).reshape(4, 3)
    upper, lower = whole[:2], whole[2:]  # side by side along axis 0 only
    assert torch_helpers._cat([upper, lower], 0).untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    torch.testing.assert_close(torch_helpers._cat([upper, lower], 1), torch.cat([upper, lower], 1))  # not the view
    module.double()  # parts moved (a copy): the view of their old storage is dropped as they are joined again
    stale = [entry[2] for entry in torch_helpers._JOINED.values() if entry[0]() is module.W_q]
    assert all(view.untyped_storage().data_ptr() == module.W_q.untyped_storage().data_ptr() for view in stale)
    key = id(module.W_q)
    assert key in torch_helpers._JOINED
    del module, parts
    assert key not in torch_helpers._JOINED  # control above: the entry existed while its part did


# -- block inputs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("inputs, wrap", [(numpy_inputs, np.asarray), (torch_inputs, torch.from_numpy)])
def test_block_inputs_memory_positions_grid_and_cache(rng, inputs, wrap):
    memory, like = rng.normal(size=(2, 4, 3)), wrap(np.zeros(1))
    third, device = (like, (torch.device("cpu"),)) if inputs is torch_inputs else (np.float64, ())
    _agree(np.asarray(inputs._memory(wrap(memory), 2, 3, third)), memory, memory + 1)
    with pytest.raises(ValueError, match="memory must be"):
        inputs._memory(wrap(memory), 2, 4, third)
    mask = np.array([[False, True, False, False], [True, False, False, False]])
    support = np.asarray(inputs._memory_support(wrap(mask), 2, 3, 4, *device))
    assert support.shape == (2, 3, 4) and (support == ~mask[:, None]).all()
    assert inputs._memory_support(None, 2, 3, 4, *device) is None
    _agree(np.asarray(inputs._positions(None, 2, 3, 5, third)), np.broadcast_to(np.arange(5, 8), (2, 3)),
           np.broadcast_to(np.arange(3), (2, 3)))
    with pytest.raises(ValueError, match="positions must be finite"):
        inputs._positions(wrap(np.array([0.0, np.inf, 1.0])), 2, 3, 0, third)
    _agree(np.asarray(inputs._grid(4, like)), np.arange(4.0), np.arange(1.0, 5.0))
    cache, first, second = {}, wrap(rng.normal(size=(2, 2, 3))), wrap(rng.normal(size=(2, 1, 3)))
    inputs._cache(cache, "k", first)
    joined = np.asarray(inputs._cache(cache, "k", second))
    _agree(joined, np.concatenate([np.asarray(first), np.asarray(second)], 1), np.asarray(first).repeat(2, 1)[:, :3])
    with pytest.raises(ValueError, match=r"cache\['k'\] holds"):
        inputs._cache(cache, "k", wrap(np.zeros((3, 1, 3))))
    positions = {"k": wrap(np.array([[0.0, 1.0], [0.0, 1.0]]))}
    inputs._late_reads(positions, "k", wrap(np.array([[5.0], [5.0]])), [(-2.0, 0.0)])  # control: out of reach
    with pytest.raises(ValueError, match="positions: new token 0 at 1.5 is read by a cached token"):
        inputs._late_reads(positions, "k", wrap(np.array([[1.5], [5.0]])), [(-2.0, 0.0)])


def test_numpy_array_names_what_numpy_cannot_read():
    assert numpy_inputs._array("u", [1.0, 2.0]).dtype == np.float64
    with pytest.raises(TypeError, match="u must be an array of numbers"):
        numpy_inputs._array("u", [object()])


# -- the inliner ---------------------------------------------------------------------------------

def _module(body: str, backend: str = "numpy", marks=("numpy_helpers",)) -> str:
    imports = "import math\n\nimport numpy as np\n" if backend == "numpy" else "import math\nfrom collections.abc import Mapping\n\nimport torch\n"
    return imports + "".join(runtime_mark(mark) + "\n" for mark in marks) + body


def _defined(source: str) -> list[str]:
    return [node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]


def test_the_inliner_copies_what_a_module_uses_transitively_in_the_runtime_order():
    source = inline_runtime(_module("def f(x, g, b):\n    return _layer_norm(_gelu(x), g, b, 1e-5)\n"), "numpy")
    assert _defined(source) == ["_polynomial", "_monic", "_monic_polynomial", "_odd_monic", "_artanh_erf",
                                "_phi_single", "_single_scratch", "_erf_block", "_gelu", "_checked_out", "_blocks_of",
                                "_written", "_row_scale", "_layer_norm", "f"]
    assert "_ERF_TANH_R = " in source and "_ERF_T = " in source and "# Cephes'" in source  # the constants' paragraph
    assert "#@runtime" not in source and "_attention" not in source and "def _erf(" not in source
    namespace = {}
    exec(compile(source, "generated", "exec"), namespace)  # runs with NumPy and the standard library alone
    x = np.linspace(-2, 2, 6)[None]
    assert np.isfinite(namespace["f"](x, np.ones(6), np.zeros(6))).all()
    unused = inline_runtime(_module("def f(x):\n    return x\n"), "numpy")
    assert _defined(unused) == ["f"]  # control: nothing used, nothing copied, the mark vanishes


def test_the_inliner_keeps_a_modules_own_definition_and_places_each_runtime_module_at_its_mark():
    own = inline_runtime(_module("def _einsum(*a):\n    return a\n\n\ndef f():\n    return _einsum(1)\n"), "numpy")
    assert _defined(own) == ["_einsum", "f"]
    body = "class Model(_Network):\n    pass\n\n\ndef f(m):\n    return _softmax(m, None)\n"
    source = inline_runtime(_module(body, "torch", ("torch_helpers", "checks", "torch_parameters")), "torch")
    assert _defined(source) == ["_allowed", "_softmax", "_dropout", "_loads_finite", "_as_tensor", "_as_read",
                                "_mapping", "f"]  # each at its mark
    assert source.index("def _mapping") < source.index("class _Network") < source.index("class Model")


def test_the_inliner_imports_the_plain_modules_its_helpers_use_and_no_others():
    uses = inline_runtime(_module("def f(cache, k, v):\n    return _cache(cache, k, v)\n", "numpy",
                                  ("numpy_inputs",)), "numpy")
    assert uses.startswith("import math\nimport threading\nimport weakref\n\nimport numpy as np\n")
    exec(compile(uses, "generated", "exec"), {})
    unused = inline_runtime(_module("def f(x):\n    return _grid(3, x)\n", "numpy", ("numpy_inputs",)), "numpy")
    assert "import threading" not in unused and "import weakref" not in unused  # control: nothing needs them
    first = inline_runtime(runtime_mark("numpy_inputs") + "\nimport numpy as np\n\n\ndef f(c, k, v):\n"
                           "    return _cache(c, k, v)\n", "numpy")
    assert "import threading\nimport weakref\n\nimport numpy as np\n" in first  # no plain block: one of its own


def test_the_inliner_refuses_a_module_without_the_mark_or_the_import_a_helper_needs():
    with pytest.raises(ValueError, match=r"\['_gather'\] of runtime/numpy_helpers.py .* no '#@runtime numpy_helpers'"):
        inline_runtime("import numpy as np\n\n\ndef f(t, i):\n    return _gather(t, i)\n", "numpy")
    with pytest.raises(ValueError, match="need import numpy as np, which the module lacks"):
        inline_runtime(runtime_mark("numpy_helpers") + "\nimport math\n\n\ndef f(v, i):\n"
                       "    return _scatter(v, i, 3, 1)\n", "numpy")
    with pytest.raises(ValueError, match="marked twice"):
        inline_runtime(_module("", marks=("checks", "checks")), "numpy")
    with pytest.raises(ValueError, match="no runtime module 'helpers'"):
        runtime_mark("helpers")


@pytest.mark.parametrize("backend", sorted(RUNTIME_MODULES))
def test_every_runtime_name_has_one_definition(backend):
    table = definitions(backend)
    assert {"_integer", "_mapping"} <= set(table) and len({d.module for d in table.values()}) == 5
    assert ("_attention" in table) and (("_Network" in table) == (backend == "torch"))


def test_generated_modules_import_only_the_standard_library_and_their_backend():
    statement = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.MULTILINE)
    for path in sorted((ROOT / "generated").glob("*/*.py")):
        imported = set(statement.findall(path.read_text(encoding="utf-8")))
        assert imported <= {"math", "numbers", "threading", "warnings", "weakref", "collections", path.parent.name}, (path, imported)
        assert path.name == "__init__.py" or path.parent.name in imported  # control: the backend's import is seen


def _convolved(rng, channels=16):
    field = rng.standard_normal((2, channels, 9, 9))
    W = rng.standard_normal((channels, 3, 3, 8))
    return field, W, numpy_grids._conv2d(field, W, 1, 1)


def _loop_conv2d(field, W, padding=1):
    padded = np.pad(field, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    size = W.shape[1]
    rows, cols = padded.shape[2] - size + 1, padded.shape[3] - size + 1
    return sum(np.einsum("bcpq,cl->blpq", padded[:, :, r:r + rows, s:s + cols], W[:, r, s])
               for r in range(size) for s in range(size))


def _phase_memory():
    return numpy_grids._SCRATCH.kept[1, ("phase", 0, 0), "<f8"].__array_interface__["data"][0]


def test_convolution_scratch_is_kept_per_thread_and_never_in_a_result(rng):
    """The padded phases and the product being summed live in per-thread memory kept between calls (no fresh pages
    at each call); a result stays the caller's: the next call leaves it as it was."""
    import threading
    field, W, first = _convolved(rng)
    kept, pointer = first.copy(), _phase_memory()
    other_field, other_W, second = _convolved(rng)
    assert _phase_memory() == pointer
    assert np.array_equal(first, kept)
    assert np.abs(first - _loop_conv2d(field, W)).max() <= 1e-12
    assert np.abs(second - _loop_conv2d(other_field, other_W)).max() <= 1e-12
    seen = []
    thread = threading.Thread(target=lambda: (_convolved(rng), seen.append(_phase_memory())))
    thread.start()
    thread.join()
    assert seen[0] != pointer


def test_a_result_in_the_scratch_would_change_with_the_next_call(rng, monkeypatch):
    """Negative control: a product written into the scratch (as a result must never be) is overwritten by the next
    call's."""
    product = numpy_grids._product

    def into_scratch(W, columns, out=None):
        if out is None:
            out = numpy_grids._scratch("result", (W.shape[1], columns.shape[1]), columns.dtype, "C")
        return product(W, columns, out=out)
    monkeypatch.setattr(numpy_grids, "_product", into_scratch)
    _, _, first = _convolved(rng)
    kept = first.copy()
    _convolved(rng)
    assert not np.array_equal(first, kept)


def _nested_convolution_error(rng, monkeypatch, inner=None):
    """The outer convolution's error when another (``inner``: as ``_conv2d`` runs it) runs inside it on the same thread,
    after the phases are filled (as a signal handler or finalizer calling a forward would)."""
    stacks, entered, convolution = numpy_grids._row_stacks, [], numpy_grids._conv2d

    def interrupted(*args):
        if not entered:
            entered.append(True)
            (inner or convolution)(rng.standard_normal((2, 16, 9, 9)), rng.standard_normal((16, 3, 3, 8)), 1, 1)
        return stacks(*args)
    monkeypatch.setattr(numpy_grids, "_row_stacks", interrupted)
    field, W, out = _convolved(rng)
    return np.abs(out - _loop_conv2d(field, W)).max()


def test_a_convolution_inside_another_takes_its_own_memory(rng, monkeypatch):
    assert _nested_convolution_error(rng, monkeypatch) <= 1e-12


def test_without_the_count_of_holders_a_nested_convolution_overwrites_the_outer(rng, monkeypatch):
    """Negative control: the inner call counting itself as no holder runs at the outer's level and refills its phases."""
    inner = numpy_grids._conv2d.__wrapped__
    assert _nested_convolution_error(rng, monkeypatch, inner) > 1e-3


def test_a_scratch_past_its_limit_is_fresh_memory(monkeypatch, rng):
    monkeypatch.setattr(numpy_grids, "_SCRATCH_LIMIT", 1024)
    numpy_grids._SCRATCH.__dict__.pop("kept", None)
    field, W, out = _convolved(rng)
    assert not numpy_grids._SCRATCH.__dict__.get("kept")  # every phase and product here is over 1 KB
    assert np.abs(out - _loop_conv2d(field, W)).max() <= 1e-12


def _scratch_twice(depth, caller=False):
    """Two scratch arrays of one slot asked for by a holder ``depth`` deep on this thread (then the depth restored)."""
    held = getattr(numpy_grids._SCRATCH, "depth", 0)
    numpy_grids._SCRATCH.depth = depth
    try:
        return [numpy_grids._scratch("probe", (4, 8), np.float64, "C", caller) for _ in range(2)]
    finally:
        numpy_grids._SCRATCH.depth = held


@pytest.mark.parametrize("depth, caller, kept", [(1, False, True), (2, False, True), (2, True, True),
                                                 (3, False, False), (0, False, False), (1, True, False)])
def test_scratch_is_kept_at_the_levels_held_and_fresh_past_them(depth, caller, kept):
    """A program holds level 1, a convolution inside it level 2 (its output slot its caller's, ``caller``); outside
    any holder (level 0) and deeper than ``_SCRATCH_LEVELS`` (a forward inside a running convolution) the memory is
    fresh, so no nested holder keeps more than the two levels."""
    first, second = _scratch_twice(depth, caller)
    assert np.shares_memory(first, second) == kept


@pytest.mark.parametrize("helper, size, stride, padding, channels_last", [
    ("_conv2d", 3, 1, 1, False), ("_conv2d", 3, 2, 1, False), ("_conv2d", 2, 2, 0, False),
    ("_conv2d", 3, 2, 1, True), ("_depthwise_conv2d", 3, 2, 1, False), ("_depthwise_conv2d", 3, 2, 1, True)],
    ids=["per-offset", "strided", "tiling-windows", "window-rows", "depthwise", "depthwise-channels-last"])
def test_a_convolution_output_slot_is_its_callers_scratch(helper, size, stride, padding, channels_last, rng):
    """``slot=``: the output in the calling holder's scratch (level 1 for a program), the same values as a fresh
    output; the control, called outside any holder, gets fresh memory."""
    convolution = getattr(numpy_grids, helper)
    field = rng.standard_normal((2, 9, 9, 16)).transpose(0, 3, 1, 2) if channels_last else rng.standard_normal(
        (2, 16, 9, 9))
    W = rng.standard_normal((size, size, 16) if helper == "_depthwise_conv2d" else (16, size, size, 8))
    expected = convolution(field, W, stride, padding)

    @numpy_grids._holding_scratch
    def program():
        return convolution(field, W, stride, padding, slot="probe_out")
    out = program()
    assert np.array_equal(out, expected)
    assert np.shares_memory(out, numpy_grids._SCRATCH.kept[1, "probe_out", "<f8"])
    outside = convolution(field, W, stride, padding, slot="probe_out")
    assert np.array_equal(outside, expected)
    assert not np.shares_memory(outside, numpy_grids._SCRATCH.kept[1, "probe_out", "<f8"])
