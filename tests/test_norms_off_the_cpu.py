"""LayerNorm and RMSNorm where no value may choose the path (off the CPU): torch's fused kernels on prescaled rows.

On the CPU the generated blocks run torch's fused norm and read one reduction of its statistics to see that no row
overflowed (else the scaled path). Off the CPU that read would make the host wait for the device, so they divide each
row by a power of two read from no value (``_prescaled``: 1 for every row whose squares cannot overflow) and run the
fused kernel on that. Here the off-CPU path runs on CPU values (``_values_choose`` patched to False, as off the CPU),
against torch's kernels on ordinary rows and an exact reference in ``decimal`` on rows past float32's and float64's
squares; and on the meta device, where it is counted in kernels."""

import decimal
import math
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import GENERATED, import_path

MODULE = import_path(GENERATED / "torch" / "post_ln.py", "_norms_post_ln")
LLAMA = import_path(GENERATED / "torch" / "llama.py", "_norms_llama")


def _exact(row, eps, centred=True):
    """(x − mean)/√(var + eps) (``centred``) or x/√(mean x² + eps) of one row, in 60-digit decimal arithmetic."""
    with decimal.localcontext() as context:
        context.prec = 60
        values = [decimal.Decimal(float(value)) for value in row]
        mean = sum(values) / len(values) if centred else decimal.Decimal(0)
        deviations = [value - mean for value in values]
        root = (sum(d * d for d in deviations) / len(values) + decimal.Decimal(eps)).sqrt()
        return [float(d / root) for d in deviations]


def _rows(dtype, peaks, width=16, seed=0):
    """Rows of normal values within each peak."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randn(width, generator=generator, dtype=torch.float64).clamp(-3, 3) * (peak / 3)
                        for peak in peaks]).to(dtype)


def _close_rows(dtype, peaks, width=16, seed=0):
    """Rows at each peak whose values differ by up to two units in the last place."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for peak in peaks:
        base = torch.tensor(peak, dtype=dtype)
        unit = (torch.nextafter(base, torch.tensor(math.inf, dtype=dtype)) - base).to(torch.float64)
        rows.append(base.to(torch.float64) + torch.randint(-2, 3, (width,), generator=generator) * unit)
    return torch.stack(rows).to(dtype)


def _off_the_cpu(monkeypatch, module):
    monkeypatch.setattr(module, "_values_choose", lambda x: False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ordinary_rows_get_torchs_fused_norms_bit_for_bit(monkeypatch, dtype):
    """Rows whose squares cannot overflow are divided by 1: the result is torch's fused kernel's, bit for bit."""
    _off_the_cpu(monkeypatch, MODULE)
    _off_the_cpu(monkeypatch, LLAMA)
    x = _rows(dtype, [1e-3, 1.0, 1e6, 1e15], width=64)
    gain, bias = torch.randn(64, dtype=dtype), torch.randn(64, dtype=dtype)
    expected = torch.native_layer_norm(x, [64], gain, bias, 1e-5)[0]
    assert torch.equal(MODULE._layer_norm(x, gain, bias, 1e-5), expected)
    assert torch.equal(LLAMA._rms_norm(x, gain, 1e-5), torch.ops.aten._fused_rms_norm(x, [64], gain, 1e-5)[0])
    # control: the scaled path, which off the CPU ran before, differs in the last bits
    assert not torch.equal(MODULE._scaled_layer_norm(x, gain, bias, 1e-5), expected)


@pytest.mark.parametrize("dtype, peaks", [(torch.float32, [1e-30, 1.0, 1e18, 1e25, 1e30, 3e38]),
                                          (torch.float64, [1e-300, 1.0, 1e160, 1e200, 1e300, 1.7e308])])
def test_rows_past_the_squares_range_keep_their_norms(monkeypatch, dtype, peaks):
    """Rows whose squares overflow the dtype, against the exact norms: within a few units in the last place."""
    _off_the_cpu(monkeypatch, MODULE)
    _off_the_cpu(monkeypatch, LLAMA)
    x = _rows(dtype, peaks)
    ones, zeros = torch.ones(16, dtype=dtype), torch.zeros(16, dtype=dtype)
    tolerance = 8 * torch.finfo(dtype).eps
    for centred, got in ((True, MODULE._layer_norm(x, ones, zeros, 1e-5)), (False, LLAMA._rms_norm(x, ones, 1e-5))):
        exact = torch.tensor([_exact(row, 1e-5, centred) for row in x.tolist()], dtype=torch.float64)
        assert (got.to(torch.float64) - exact).abs().max() <= tolerance
    # control: torch's fused kernel alone overflows on them
    assert not torch.isfinite(torch.native_layer_norm(x, [16], ones, zeros, 1e-5)[0]).all()


@pytest.mark.parametrize("dtype, peaks", [(torch.float32, [1.5, 1e30, 3e38]), (torch.float64, [1.5, 1e300])])
def test_rows_far_from_zero_get_the_fused_kernels_result_at_any_magnitude(monkeypatch, dtype, peaks):
    """Rows whose values differ in their last bits: the fused kernel's float mean does not resolve their deviations
    (on the CPU as off it), and the prescaled path gives what it gives for the same row at an ordinary magnitude, the
    scaling being exact (the scaled path, which subtracts each row's first value first, resolves them: the control)."""
    _off_the_cpu(monkeypatch, MODULE)
    x = _close_rows(dtype, peaks)
    ones, zeros = torch.ones(16, dtype=dtype), torch.zeros(16, dtype=dtype)
    eps = 1e-30 if dtype == torch.float32 else 1e-300  # below the variance of every row at either magnitude
    ordinary = torch.stack([row * 2.0 ** -math.frexp(float(row.abs().max()))[1] for row in x.double()]).to(dtype)
    expected = torch.native_layer_norm(ordinary, [16], ones, zeros, eps)[0]
    assert torch.equal(MODULE._layer_norm(x, ones, zeros, eps), expected)
    exact = torch.tensor([_exact(row, eps) for row in x.tolist()], dtype=torch.float64)
    assert (MODULE._scaled_layer_norm(x, ones, zeros, eps).double() - exact).abs().max() <= 1e-6
    assert (expected.double() - exact).abs().max() > 0.1


def test_the_prescaling_is_refused_where_eps_would_show(monkeypatch):
    """eps·s² stands for eps in a prescaled row: for an eps so large that it would show (or eps = 0, a constant row's
    0/0), ``_prescaled`` gives None and the scaled path runs. Control: forcing the prescaled rows with that eps is off
    by far more than rounding."""
    x = torch.tensor([[1e20, -1e20, 3e19, 0.0] * 4], dtype=torch.float32)
    ones, zeros = torch.ones(16), torch.zeros(16)
    assert MODULE._prescaled(x, 1e30) is None and MODULE._prescaled(x, 0.0) is None
    assert MODULE._prescaled(x, 1e-5) is not None
    wide = torch.ones(1, 512)  # eps 1 at 512 features needs E = 42, whose cube 2^-126 the derivatives would not keep
    assert MODULE._prescaled(wide, 1.0) is None and MODULE._prescaled(wide, 0.25) is not None
    exact = torch.tensor([_exact(x[0].tolist(), 1e30)], dtype=torch.float64)
    _off_the_cpu(monkeypatch, MODULE)
    assert (MODULE._layer_norm(x, ones, zeros, 1e30).double() - exact).abs().max() < 1e-6
    forced = x * 2.0 ** -(math.frexp(1e20)[1] - 57)  # prescaled into [2^56, 2^57)
    assert (torch.native_layer_norm(forced, [16], ones, zeros, 1e30)[0].double() - exact).abs().max() > 1e-5  # 1000 times float32 rounding
    constant = torch.full((1, 16), 7.0)
    assert torch.equal(MODULE._layer_norm(constant, ones, zeros, 0.0), torch.zeros(1, 16))  # not NaN


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_keeps_its_dtype(monkeypatch, dtype):
    """float16 never needs a scale (its squares fit float32's accumulation); bfloat16 rows past 1e19 do: the result
    stays in the input's dtype, within its rounding of the exact norm."""
    _off_the_cpu(monkeypatch, MODULE)
    x = _rows(dtype, [1.0, 1e4] if dtype == torch.float16 else [1.0, 1e30])  # float16's largest: 65504
    ones, zeros = torch.ones(16, dtype=dtype), torch.zeros(16, dtype=dtype)
    got = MODULE._layer_norm(x, ones, zeros, 1e-5)
    assert got.dtype == dtype
    exact = torch.tensor([_exact(row, 1e-5) for row in x.tolist()], dtype=torch.float64)
    assert (got.double() - exact).abs().max() <= 8 * torch.finfo(dtype).eps * 4


@pytest.mark.parametrize("dtype, peaks", [(torch.float32, [1.0, 1e20, 1e30, 3e38]),
                                          (torch.float64, [1.0, 1e200, 1e300])])
def test_derivatives_through_prescaled_rows_are_the_norms(monkeypatch, dtype, peaks):
    """Reverse mode (autograd; the scale carries no derivative) through the prescaled path, and forward mode
    (``torch.func.jvp``), which takes the scaled path, equal the scaled path's derivatives on rows past the squares'
    range, to rounding relative to each row's scale, for both norms. Controls: the rows prescaled to 2^57 (float64:
    2^505) instead, the largest exponent the kernels' sums allow, where 1/√(statistic)³, which the kernels' derivatives take, underflows,
    are off by far more in forward mode, and in reverse mode for RMSNorm (on the CPU)."""
    x = torch.stack([_rows(dtype, peaks, width=512, seed=seed)[index] for seed in range(2) for index in range(len(peaks))])
    gain, bias = torch.randn(512, dtype=dtype), torch.randn(512, dtype=dtype)
    weights, tangent = torch.randn(x.shape, dtype=dtype), torch.randn(x.shape, dtype=dtype)
    tolerance = 64 * torch.finfo(dtype).eps
    norms = ((MODULE, lambda rows: MODULE._layer_norm(rows, gain, bias, 1e-5),
              lambda rows: MODULE._scaled_layer_norm(rows, gain, bias, 1e-5),
              lambda rows: torch.native_layer_norm(rows, [512], gain, bias, 1e-5)[0]),
             (LLAMA, lambda rows: LLAMA._rms_norm(rows, gain, 1e-5), lambda rows: LLAMA._scaled_rms_norm(rows, gain, 1e-5),
              lambda rows: torch.ops.aten._fused_rms_norm(rows, [512], gain, 1e-5)[0]))
    top = 57 if dtype == torch.float32 else 505  # (log₂ of the largest accumulated value − 3 − log₂ 512)/2, less 1
    factor = 2.0 ** (top - torch.frexp(x.abs().amax(dim=-1, keepdim=True)).exponent.clamp_min(top).to(dtype))

    def error(value, reference):
        return ((value - reference).abs() / reference.abs().amax(dim=-1, keepdim=True)).max()

    for index, (module, norm, scaled, kernel) in enumerate(norms):
        expected = (torch.func.vjp(scaled, x)[1](weights)[0], torch.func.jvp(scaled, (x,), (tangent,))[1])
        _off_the_cpu(monkeypatch, module)
        rows = x.clone().requires_grad_()
        reverse, = torch.autograd.grad((norm(rows) * weights).sum(), rows)
        assert error(reverse, expected[0]) <= tolerance
        assert error(torch.func.jvp(norm, (x,), (tangent,))[1], expected[1]) <= tolerance
        assert error(torch.func.jvp(lambda rows: kernel(rows * factor), (x,), (tangent,))[1], expected[1]) > 1e-3
        if index == 1:
            assert error(torch.func.vjp(lambda rows: kernel(rows * factor), x)[1](weights)[0], expected[0]) > 1e-4


def test_the_prescaled_path_runs_under_vmap_without_a_fallback(monkeypatch):
    """torch.func.vmap over rows past float64's squares: every operation has a batching rule (an in-place clamp had
    none: a warning and a slow loop), and the result is the unbatched call's."""
    _off_the_cpu(monkeypatch, MODULE)
    _off_the_cpu(monkeypatch, LLAMA)
    x = torch.stack([_rows(torch.float64, [1.0, 1e200, 1e300], seed=seed) for seed in range(3)])
    gain, bias = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batched = torch.func.vmap(lambda rows: MODULE._layer_norm(rows, gain, bias, 1e-5))(x)
        batched_rms = torch.func.vmap(lambda rows: LLAMA._rms_norm(rows, gain, 1e-5))(x)
    assert torch.equal(batched, MODULE._layer_norm(x, gain, bias, 1e-5))
    assert torch.equal(batched_rms, LLAMA._rms_norm(x, gain, 1e-5))


@pytest.mark.parametrize("shape", [(0, 5, 16), (2, 0, 16), (2, 5, 0)])
def test_empty_tensors_pass_through(monkeypatch, shape):
    """No rows, or rows of no features (whose largest value does not exist): the fused kernel's empty result."""
    _off_the_cpu(monkeypatch, MODULE)
    x, gain, bias = torch.randn(shape), torch.ones(shape[-1]), torch.zeros(shape[-1])
    assert MODULE._layer_norm(x, gain, bias, 1e-5).shape == shape


class Kernels(TorchDispatchMode):
    """The operations that launch work (views and dtype queries left out)."""

    VIEWS = {"view", "reshape", "transpose", "unsqueeze", "expand", "slice", "select", "detach", "alias", "t"}

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if name not in self.VIEWS:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def test_a_norm_off_the_cpu_is_a_few_kernels():
    """On meta (off the CPU) a LayerNorm is one reduction, four operations over the rows and two over x: 7 kernels,
    where the scaled path takes 23 (control)."""
    x, gain, bias = (torch.empty(shape, device="meta") for shape in ((8, 128, 512), (512,), (512,)))
    with Kernels() as fused:
        MODULE._layer_norm(x, gain, bias, 1e-5)
    with Kernels() as scaled:
        MODULE._scaled_layer_norm(x, gain, bias, 1e-5)
    assert "native_layer_norm" in fused.names and len(fused.names) <= 7
    assert len(scaled.names) >= 20
