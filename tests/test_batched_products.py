"""The NumPy runtime's ``_einsum``: a batched matrix product of two operands through ``np.matmul``
(``_batched_product``), every other spec through ``np.einsum``; equal to ``np.einsum`` written plainly for random
specs, shapes, dtypes and memory layouts. NumPy's einsum hands a product to BLAS only where no label is shared by
both operands and the output; with one, its own loops took 1.5–2.8 times the matmul's time (``_batched_product``)."""

import string

import numpy as np
import pytest

from splitformer.runtime import numpy_helpers
from splitformer.runtime.numpy_helpers import _batched_product, _einsum


def _random_spec(rng):
    """Two operands' labels and the output's: some shared by all three (batch), some summed, some each operand's own,
    in random orders."""
    letters = iter(rng.permutation(list(string.ascii_lowercase[:12])))
    batch, summed, own_x, own_y = ([next(letters) for _ in range(rng.integers(0, 3))] for _ in range(4))
    first = list(rng.permutation(batch + summed + own_x))
    second = list(rng.permutation(batch + summed + own_y))
    output = list(rng.permutation(batch + own_x + own_y))
    return "".join(first) + "," + "".join(second) + "->" + "".join(output)


def _operands(rng, spec, dtypes):
    inputs = spec.split("->")[0].split(",")
    sizes = {label: int(rng.integers(0, 5)) if rng.random() < 0.1 else int(rng.integers(1, 6))
             for label in set("".join(inputs))}
    operands = []
    for labels, dtype in zip(inputs, dtypes):
        shape = [sizes[label] for label in labels]
        value = rng.random(shape) < 0.5 if dtype == "bool" else rng.standard_normal(shape).astype(dtype)
        if value.ndim > 1 and rng.random() < 0.5:  # a transposed view of other memory
            value = np.ascontiguousarray(np.swapaxes(value, 0, -1)).swapaxes(0, -1)
        operands.append(value)
    return operands


@pytest.mark.parametrize("dtypes", [("float64", "float64"), ("float32", "float32"), ("bool", "float64"),
                                    ("float32", "bool"), ("float32", "float64"), ("bool", "bool"),
                                    ("int64", "float64")])
def test_einsum_equals_numpys_for_random_specs(dtypes):
    rng = np.random.default_rng(abs(hash(dtypes)) % 2**32)
    taken = 0
    for _ in range(300):
        spec = _random_spec(rng)
        x, y = _operands(rng, spec, dtypes)
        expected = np.einsum(spec, x, y)
        got = _einsum(spec, x, y)
        taken += _batched_product(spec, x, y) is not None
        assert got.shape == expected.shape and got.dtype == expected.dtype, spec
        tolerance = 1e-5 if "float32" in dtypes else 1e-12
        assert np.allclose(got, expected, rtol=tolerance, atol=tolerance), spec
    if set(dtypes) <= {"float32", "float64", "bool"} and set(dtypes) != {"bool"}:
        assert taken > 30  # the matmul path is exercised, not only einsum's
    else:
        assert taken == 0  # bools alone (einsum's "or" of "and"s) and integers stay with einsum


def test_a_batched_product_is_one_matmul(monkeypatch):
    """support-mean's adjoint: ``np.matmul`` once, ``np.einsum`` not at all (control: a spec without a batch label,
    which einsum hands to BLAS itself, stays with einsum)."""
    calls = []
    monkeypatch.setattr(numpy_helpers.np, "einsum", lambda *arguments, **options: calls.append("einsum"))
    chi, values = np.ones((2, 7, 7), dtype=bool), np.ones((2, 7, 3))
    out = _einsum("bji,bjl->bil", chi, values)
    assert not calls and out.shape == (2, 7, 3) and np.all(out == 7)
    _einsum("bik,bil->kl", values, values)
    assert calls == ["einsum"]


@pytest.mark.parametrize("spec, shapes", [("bij,bjk->bik", [(2, 3, 4), (2, 5, 6)]), ("bii,bik->bk", [(2, 3, 3), (2, 3, 4)]),
                                          ("bij,bjk->bik", [(2, 3), (2, 3, 4)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)])])
def test_specs_it_does_not_take_keep_einsums_rule_and_message(spec, shapes):
    x, y = (np.ones(shape) for shape in shapes)
    assert _batched_product(spec, x, y) is None
    try:
        expected = np.einsum(spec, x, y, optimize=True)
    except ValueError as error:
        with pytest.raises(ValueError, match=str(error)[:30].replace("(", r"\(").replace(")", r"\)")):
            _einsum(spec, x, y)
    else:
        assert np.allclose(_einsum(spec, x, y), expected)
