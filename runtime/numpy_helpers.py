"""The numeric routines of the generated NumPy modules: einsum, erf and the exact GELU, the masked
softmax and attention over heads, one-hot reads and writes of a grid (``_gather``, ``_scatter``), a
local kernel (``_window``), LayerNorm and RMSNorm safe from overflow.

Inlined into each generated module that calls them (``codegen.runtime_source``), which then
imports only NumPy and the standard library."""

import math

import numpy as np


def _einsum(spec, *operands):
    """``np.einsum(spec, *operands)``; a batched matrix product of two operands as ``_batched_product``'s
    ``np.matmul``, which NumPy's einsum computes in its own loops (it hands a product to BLAS only without a label
    both operands and the output share)."""
    if len(operands) == 2:
        product = _batched_product(spec, *operands)
        if product is not None:
            return product
    return np.einsum(spec, *operands, optimize=True)


def _batched_product(spec, x, y):
    """``Σ_summed x y`` of ``spec`` (``"bji,bjl->bil"``) where both operands and the output share labels (the batch),
    each operand has labels of its own in the output, and the two share summed ones: ``x`` as (batch, own, summed),
    ``y`` as (batch, summed, own), one ``np.matmul``, viewed in the output's order (float32, one process, the median
    of 7 calls: a plug-in's mixing over 8 heads ``"bmij,bjme->bime"``, 2 × 512 × 512 keys against 64 features, 4.4 →
    2.8 ms; the decoder adjoint's ``"bmit,btme->bime"``, 8 × 8 × 128 × 64, 1.6 → 0.6 ms). None for any other spec (a label twice in one
    operand, one operand's label summed alone, an ellipsis, sizes that differ: einsum's own rule and message) and
    for operands that are not both floating, or a bool and a floating one."""
    if "->" not in spec or "." in spec or spec.count(",") != 1:
        return None
    inputs, output = spec.split("->")
    first, second = inputs.split(",")
    labels = set(first) | set(second)
    if (any(len(set(part)) != len(part) for part in (first, second, output)) or not set(output) <= labels
            or (set(first) ^ set(second)) - set(output) or np.ndim(x) != len(first) or np.ndim(y) != len(second)):
        return None
    sizes = dict(zip(first, np.shape(x)))
    if any(sizes.setdefault(label, size) != size for label, size in zip(second, np.shape(y))):
        return None
    batch = [label for label in output if label in first and label in second]
    summed = [label for label in first if label in second and label not in output]
    own_x = [label for label in output if label not in second]
    own_y = [label for label in output if label not in first]
    kinds = {np.asarray(x).dtype.kind, np.asarray(y).dtype.kind}
    if not (batch and summed and own_x and own_y) or not kinds <= {"f", "b"} or "f" not in kinds:
        return None
    dtype = np.result_type(x, y)
    shape = [math.prod(sizes[label] for label in group) for group in (batch, own_x, summed, own_y)]
    rows = np.transpose(x, [first.index(label) for label in batch + own_x + summed]).astype(dtype, copy=False)
    columns = np.transpose(y, [second.index(label) for label in batch + summed + own_y]).astype(dtype, copy=False)
    product = np.matmul(rows.reshape(shape[0], shape[1], shape[2]), columns.reshape(shape[0], shape[2], shape[3]))
    order = batch + own_x + own_y
    return product.reshape([sizes[label] for label in order]).transpose([order.index(label) for label in output])


def _products(rows, weights, biases=None):
    """``rows @ [W₁ W₂ …] (+ [b₁ b₂ …])`` (fused projections): each product written into its columns of one
    output, so no kernel is concatenated at every call (a copy of every kernel, fresh memory each time)."""
    out = np.empty((rows.shape[0], sum(W.shape[1] for W in weights)), dtype=np.result_type(rows, *weights))
    start = 0
    for W, b in zip(weights, biases or (None,) * len(weights)):
        columns = out[:, start:start + W.shape[1]]
        np.matmul(rows, W, out=columns)
        if b is not None:
            columns += b
        start += W.shape[1]
    return out


# Cephes' rational approximations (S. L. Moshier, public domain): erf on |x| <= 1, erfc beyond.
_ERF_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
          7.00332514112805075473e3, 5.55923013010394962768e4)
_ERF_U = (1.0, 3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
          2.26290000613890934246e4, 4.92673942608635921086e4)
_ERFC_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
           4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
           9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_ERFC_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
           9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
           1.65666309194161350182e3, 5.57535340817727675546e2)
_ERFC_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
           6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0)
_ERFC_S = (1.0, 2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1,
           1.70814450747565897222e1, 9.60896809063285878198e0, 3.36907645100081516050e0)
# Single precision: erf(v) = tanh g(√2 v) and the exact GELU's Φ(x) = (1 + erf(x/√2))/2 = (1 + tanh g(x))/2, with
# g(x) = artanh erf(x/√2) ≈ x R(x²): R of degree 6 fitted by ``tools/gelu_fit.py`` (erf's error at most 7.8e-8 on
# |x| ≤ 5.6, past which tanh g rounds to ±1; R(0) = √(2/π) exactly, so erf's relative error vanishes at 0), highest
# degree first.
_ERF_TANH_R = (1.6371615953342895e-09, -1.2771479088120833e-07, 3.902616705008322e-06, -5.492774289332723e-05,
               -3.364079518414927e-05, 0.03633426017418923, 0.7978845608028654)


def _polynomial(x, coefficients, out=None):
    """Horner's rule, highest degree first (its first product, c₀·x, written at once, into ``out`` if given)."""
    result = np.multiply(x, coefficients[0], out=out)
    result += coefficients[1]
    for coefficient in coefficients[2:]:
        result *= x
        result += coefficient
    return result


def _monic(coefficients, scale):
    """(a₁, …, a_n) and c with p(scale·z) = c (zⁿ + a₁ zⁿ⁻¹ + … + a_n), of p's ``coefficients`` highest degree first:
    Horner's rule on a monic polynomial starts with z + a₁, one array pass fewer than c₀·z + c₁."""
    degree = len(coefficients) - 1
    factor = coefficients[0] * scale ** degree
    return tuple(c * scale ** (degree - i) / factor for i, c in enumerate(coefficients) if i), factor


def _monic_polynomial(z, coefficients, out):
    """zⁿ + a₁ zⁿ⁻¹ + … + a_n of ``_monic``'s (a₁, …, a_n), by Horner's rule into ``out``."""
    result = np.add(z, coefficients[0], out=out)
    for coefficient in coefficients[1:]:
        result *= z
        result += coefficient
    return result


def _odd_monic(coefficients):
    """(s, (a₁, …, a_n)) with x R(x²) = y (y²ⁿ + a₁ y²⁽ⁿ⁻¹⁾ + … + a_n) at y = s x, of R's ``coefficients`` highest degree
    first: R's leading coefficient c taken into y by s = c^{1/(2n+1)} (``_monic``)."""
    leading, degree = coefficients[0], len(coefficients) - 1
    scale = math.copysign(abs(leading) ** (1 / (2 * degree + 1)), leading)
    return scale, _monic(coefficients, scale ** -2)[0]


#: g(x) = y R̃(y²) at y = s x: (s, R̃'s coefficients).
_ERF_TANH = _odd_monic(_ERF_TANH_R)


def _artanh_erf(x, factor, rows):
    """g(factor·x), g(x) = artanh erf(x/√2) ≈ y R̃(y²) at y = s·factor·x (``_ERF_TANH``), of a float32 or float16 ``x`` in
    float32 ``rows`` (y, z, g) of its size; returns the g row. Past |factor·x| ≈ 5.55 its tanh rounds to ±1; from about
    3000 on g overflows to ±∞ (y² past 8.7e19; no overflow warning), and tanh g is still ±1."""
    scale, r = _ERF_TANH
    y, z, g = rows
    np.multiply(x, np.float32(scale * factor), out=y)  # a float32 scalar: half precision computed in single
    with np.errstate(over="ignore"):
        np.multiply(y, y, out=z)
        _monic_polynomial(z, r, g)
        g *= y
    return g


def _phi_single(x, rows):
    """Φ(x) = (1 + erf(x/√2))/2 = (1 + tanh g(x))/2 (``_artanh_erf``), in [0, 1] by construction, in the last of the
    float32 ``rows`` (y, z, g), which it returns."""
    phi = np.tanh(_artanh_erf(x, 1.0, rows), out=rows[2])
    phi += 1
    phi *= 0.5
    return phi


#: Elements per block of the elementwise passes: their float32 scratch (3 rows, 384 KB) stays in cache, and the
#: allocator keeps memory this small between calls (1 << 17: 2 MB returned to the system and faulted in again at
#: every call; CvT's NumPy forward 18 % slower, 1100 page faults a call instead of none).
_BLOCK = 1 << 15


def _erf(x):
    """The error function, elementwise, to the precision of ``x``'s dtype (NumPy has none).

    Works through blocks small enough for the polynomial passes to stay in cache; single (and
    half) precision through the shorter approximation in float32, 6–8× faster than double's,
    in the output itself with one scratch per call (see ``_gelu``).
    """
    flat = np.ravel(x)
    if flat.dtype.kind != "f":  # integers and booleans: erf in float64, not truncated into their type
        flat = flat.astype(np.float64)
    out = np.empty_like(flat)
    scratch = _single_scratch(flat)
    for start in range(0, flat.size, _BLOCK):
        block = slice(start, start + _BLOCK)
        if scratch is None:
            out[block] = _erf_block(flat[block])
        else:
            out[block] = flat[block]
            _erf_single(out[block], scratch)
    return out.reshape(np.shape(x))


def _single_scratch(flat):
    """The float32 scratch of ``_erf_single`` for the blocks of ``flat`` (None: double precision). One per
    call, not per block: fresh temporaries per block are memory the allocator may return to the system
    and take back at every block (page faults, a quarter of CvT's NumPy forward)."""
    if flat.dtype not in (np.float32, np.float16):
        return None
    return np.empty((3, min(_BLOCK, flat.size)), dtype=np.float32)


def _erf_single(x, scratch):
    """erf to single precision of a float32 or float16 ``x``, in place, evaluated in float32 in ``scratch`` (3 rows of
    at least x's size): tanh g(√2 x) (``_artanh_erf``), within [−1, 1] by construction."""
    return np.tanh(_artanh_erf(x, math.sqrt(2), scratch[:, :x.size]), out=x)


def _erf_block(x):
    z = x * x
    inner = x * _polynomial(z, _ERF_T) / _polynomial(z, _ERF_U)
    a = np.clip(np.abs(x), 1, 27)  # erfc(27) underflows to 0 in double precision
    ratio = np.where(a < 8, _polynomial(a, _ERFC_P) / _polynomial(a, _ERFC_Q),
                     _polynomial(a, _ERFC_R) / _polynomial(a, _ERFC_S))
    outer = np.copysign(1 - np.exp(-a * a) * ratio, x)
    return np.where(np.abs(x) <= 1, inner, outer)


def _gelu(x, out=None):
    """x (1 + erf(√2 x/2))/2 elementwise (the exact GELU), in blocks that stay in cache, each read whole before its
    result is written, so ``out`` may be ``x`` itself (the ``reuse-buffers`` pass: no fresh output): in double
    precision the formula's operations in its order; in single (and half) x Φ(x) by ``_phi_single``, in float32
    scratch allocated once per call (``_single_scratch``): 17 array passes and a tanh a block, where Eigen's rational
    erf took 26 and two clips (0.5 M float32: 1.21 → 1.01 ms; 2.4e-7·max(1, |x|) from the exact GELU, 1.4e-7 now)."""
    flat, result = _blocks_of(x, out)
    scratch = _single_scratch(flat)
    for start in range(0, flat.size, _BLOCK):
        block, written = flat[start:start + _BLOCK], result[start:start + _BLOCK]
        if scratch is not None:  # Φ(x) before x multiplies it: (1 + tanh g) x would overflow past 1.7e38
            np.multiply(_phi_single(block, scratch[:, :block.size]), block, out=written)
            continue
        value = np.multiply(block, math.sqrt(2))
        value /= 2
        value = _erf_block(value)
        value += 1
        value *= block
        np.divide(value, 2, out=written)
    return _written(result, x, out)


def _silu(x, out=None):
    """x/(1 + e^{−x}) elementwise (the ``silu`` pass's call), in blocks of rows whose e^{−x} stays in cache: the formula's
    operations in its order, into one scratch block and the output, without a fresh temporary per operation (llama's
    feed-forward, 1024 × 2048 float32: 7.1 → 3.2 ms). Rows, not flat blocks: a projection's output columns (a strided
    view) are read, and written, where they lie; an array whose rows' entries are strided (a transposed one) takes the
    formula itself. ``out``: as ``_gelu``'s, ``x`` itself allowed. e^{−x} past the type's range is ∞ and the value
    x/∞ = 0 exactly, as torch's: that overflow is not warned about."""
    with np.errstate(over="ignore"):
        return _silu_rows(x, out)


def _silu_rows(x, out):
    shape = np.shape(x)
    rows = np.reshape(x, (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1))
    if out is not None:
        _checked_out(out, x)
    if rows.strides[1] != rows.itemsize:
        return np.divide(x, 1 + np.exp(-x), out=out)
    work = rows.dtype if rows.dtype.kind == "f" else np.dtype(np.float64)  # the formula's type
    out = np.empty(shape, work) if out is None else out
    written = out.reshape(rows.shape)
    in_place = np.may_share_memory(written, out) and written.strides[1] == written.itemsize
    if not in_place:  # out's rows are no view of it, or strided: computed in a fresh array, then put there
        written = np.empty(rows.shape, out.dtype)
    step = max(1, _BLOCK // max(1, rows.shape[1]))
    scratch = np.empty((min(step, rows.shape[0]), rows.shape[1]), work)
    for start in range(0, rows.shape[0], step):
        block = rows[start:start + step]
        value = np.negative(block, out=scratch[:block.shape[0]])
        np.exp(value, out=value)
        value += 1
        np.divide(block, value, out=written[start:start + step])
    if not in_place:
        out[...] = written.reshape(shape)
    return out


def _unmasked(name, value):
    """A TypeError naming ``name`` where ``value`` is a masked array: ``np.asarray`` drops its mask, and the entries it
    hides would be computed with as numbers."""
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array, whose mask would be ignored: pass a plain array "
                        "(its .filled(value), or .data where the masked entries are numbers to use)")


def _checked_out(out, x):
    """A ValueError unless ``out``, which a routine of ``x`` writes, has x's shape and is x itself or does not overlap
    it."""
    if np.shape(out) != np.shape(x):
        raise ValueError(f"out must have x's shape {list(np.shape(x))}, got {list(np.shape(out))}")
    if out is not x and np.may_share_memory(out, x):
        raise ValueError("out must be x itself or an array that does not overlap it")


def _silu_backward(costate, x):
    """λ d/dx (x σ(x)) = λ σ(x) (1 + x (1 − σ(x))), σ(x) = 1/(1 + e^{−x}) elementwise, of a costate λ (the ``silu-adjoint``
    pass; torch's ``silu_backward``), by ``_costate_blocks``: e^{−x} once, and σ(x) → 0 where it overflows, never ∞/∞
    (1024 × 2048 float32, with the gate's product: 14.5 → 7.4 ms); that overflow is exact and not warned about."""
    with np.errstate(over="ignore"):
        return _costate_blocks(costate, x, _silu_derivative, 2)


def _silu_derivative(x, rows):
    sigma, out = rows
    np.negative(x, out=sigma)
    np.exp(sigma, out=sigma)
    sigma += 1
    np.reciprocal(sigma, out=sigma)
    np.subtract(1, sigma, out=out)
    out *= x
    out += 1
    out *= sigma
    return out


def _gelu_backward(costate, x, approximate="none"):
    """λ d/dx GELU(x) elementwise, of a costate λ (the ``gelu-adjoint`` pass; torch's ``gelu_backward``, its
    ``approximate`` too), by ``_costate_blocks``: the exact GELU's Φ(x) + x φ(x), its tanh approximation's
    (1 + t)/2 + (1 − t²) x √(2/π) (1 + 3·0.044715 x²)/2 with t = tanh(√(2/π) (x + 0.044715 x³)): one tanh, where the
    derivative as SymPy writes it takes two (2 M float32: exact 20.6 → 8.7 ms, tanh 17.1 → 4.4)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    with np.errstate(over="ignore"):  # x² past 1.8e19 is ∞, as the GELU's: e^{−∞} = 0, t = ±1
        if approximate == "tanh":
            return _costate_blocks(costate, x, _tanh_gelu_derivative, 3)
        return _costate_blocks(costate, x, _exact_gelu_derivative, 4)


def _tanh_gelu_derivative(x, rows):
    """(1 + t)/2 + (1 − t²) x √(2/π)/2 · (1 + 3·0.044715 x²), torch's order: (1 − t²) x first, 0 where t rounds to ±1
    (x past the cube's overflow) until x² overflows."""
    t, square, out = rows
    np.multiply(x, x, out=square)
    np.multiply(square, 0.044715, out=t)
    t += 1
    t *= x
    t *= math.sqrt(2 / math.pi)
    np.tanh(t, out=t)
    square *= 3 * 0.044715
    square += 1
    np.multiply(t, t, out=out)
    np.subtract(1, out, out=out)
    out *= x
    out *= math.sqrt(2 / math.pi) / 2
    out *= square
    t += 1
    t *= 0.5
    out += t
    return out


def _exact_gelu_derivative(x, rows):
    density, out, *scratch = rows
    np.multiply(x, x, out=density)
    density *= -0.5
    np.exp(density, out=density)
    density *= x
    density *= 1 / math.sqrt(2 * math.pi)
    if out.dtype != np.float32:
        np.multiply(x, 1 / math.sqrt(2), out=out)
        out[...] = _erf_block(out)
        out += 1
        out *= 0.5
    else:  # Φ(x) in out, as in ``_gelu``
        _phi_single(x, (*scratch, out))
    out += density
    return out


def _costate_blocks(costate, x, derivative, rows):
    """``costate · derivative(x)`` elementwise, the operands broadcast: per block of ``_BLOCK`` entries,
    ``derivative(block of x, scratch rows)`` returns one of its ``rows`` scratch rows (which stay in cache) holding the
    derivative, multiplied by the costate into the output. The output in the operands' type (an integer one's:
    float64), computed in it, half precision in single; a block of x of another type is converted first."""
    dtype = np.result_type(costate, x)  # before broadcasting: a Python number takes the array's type
    dtype = dtype if dtype.kind == "f" else np.dtype(np.float64)
    work = np.promote_types(dtype, np.float32)
    costate, x = np.broadcast_arrays(costate, x)
    flat_costate, flat_x = np.ravel(costate), np.ravel(x)
    out = np.empty(flat_x.size, dtype)
    scratch = np.empty((rows + 1, min(_BLOCK, flat_x.size)), work)
    for start in range(0, flat_x.size, _BLOCK):
        block = slice(start, start + _BLOCK)
        values = flat_x[block]
        if values.dtype != work:
            converted = scratch[0, :values.size]
            converted[...] = values
            values = converted
        values = derivative(values, [row[:values.size] for row in scratch[1:]])
        np.multiply(values, flat_costate[block], out=out[block])
    return out.reshape(x.shape)


def _blocks_of(x, out):
    """``x`` flat and the flat array a blockwise routine writes: fresh, or ``out``'s memory where it is contiguous, else
    a copy that ``_written`` puts into ``out``. ``out`` must be x itself or not overlap it."""
    flat = np.ravel(x)
    if out is None:
        return flat, np.empty_like(flat)
    _checked_out(out, x)
    return flat, np.reshape(out, -1)


def _kept_block(flat, x, out):
    """Where ``_block_read`` copies a block of ``flat`` first when ``out`` is x itself (a routine that writes its result
    block before it has read it all); None otherwise."""
    return np.empty(min(_BLOCK, flat.size), dtype=flat.dtype) if out is x else None


def _written(result, x, out):
    """A blockwise routine's ``result`` in ``x``'s shape: ``out`` itself, filled where the result was computed in a
    copy of it (an ``out`` that is not contiguous)."""
    result = result.reshape(np.shape(x))
    if out is None or np.may_share_memory(result, out):
        return result
    out[...] = result
    return out


def _block_read(flat, start, size, kept):
    """The block of ``flat`` from ``start``: itself, or its copy in ``kept`` (see ``_kept_block``)."""
    block = flat[start:start + size]
    if kept is None:
        return block
    copy = kept[:block.size]
    copy[...] = block
    return copy


def _gelu_tanh(x, out=None):
    """x (1 + tanh(√(2/π) (x + 0.044715 x³)))/2 elementwise (GELU's tanh approximation), in blocks
    that stay in cache, each evaluated in place: the operations of the formula in its order, without
    its temporaries, x³ as x·x·x (NumPy's power with exponent 3 calls pow per element). ``out``: as
    ``_gelu``'s."""
    flat, result = _blocks_of(x, out)
    kept = _kept_block(flat, x, out)
    for start in range(0, flat.size, 1 << 14):
        block = _block_read(flat, start, 1 << 14, kept)
        value = np.multiply(block, block, out=result[start:start + (1 << 14)])
        value *= block
        value *= 0.044715
        value += block
        value *= math.sqrt(2 / math.pi)
        np.tanh(value, out=value)
        value += 1
        value *= block
        value /= 2
    return _written(result, x, out)


def _exponentials(scores, support, shift=True):
    """``exp(scores − row max)`` in place where ``support`` holds (0 elsewhere), and the row sums; without ``shift``,
    ``exp(scores)`` (the caller knows the scores small enough, ``_bounded``: the row max cancels from the softmax).

    A row with empty support sums to 0 and gets total 1: its kernel is zero, since the token
    integral over an empty set vanishes (never NaN), so that query's attention term is the
    output bias alone. So does every row when there are no keys at all (a memory of 0 tokens).
    """
    if not scores.shape[-1]:
        return scores, np.ones(scores.shape[:-1] + (1,), dtype=scores.dtype)
    if support is not None:
        np.copyto(scores, -np.inf, where=~support)
    if shift:
        peak = np.fmax.reduce(scores, axis=-1, keepdims=True)  # the row max (fmax reduces faster; NaN rows stay NaN)
        if support is not None:
            peak[~np.isfinite(peak)] = 0
        scores -= peak
    np.exp(scores, out=scores)
    total = np.einsum("...k->...", scores)[..., None]  # the row sums (einsum sums faster than np.sum)
    if support is not None:
        total[total == 0] = 1
    return scores, total


def _softmax(scores, support):
    """Row softmax over the last axis, restricted to ``support`` (True = kept)."""
    weights, total = _exponentials(np.array(scores, copy=True), support)
    weights /= total
    return weights


def _attention(q, k, v, scale, support):
    """Σ_j softmax_j(scale Σ_e q k, support) v for (batch, tokens, heads, features) operands.

    Heads are strided views of the operands, never copied; per batch entry, a group of heads
    and a block of query rows (``_blocks``) go through one reused buffer, against the keys up to
    the last one the block's support keeps (``_reaches``). A decoding step's few rows, where one entry's scores are
    one block and every entry's fit one (``_SCORES``), go through one product over all entries instead: the same
    operations per row, without a loop's Python calls per entry. The scale is applied
    to a copy of the queries, the normalization to the output rows, which overwrite their (used)
    scaled queries: the copy is the output, in (batch, tokens, heads, features) order.
    """
    batch, n_queries, n_heads, _ = q.shape
    n_keys = k.shape[1]
    out = q * scale
    # the keys' norms cost more than the row max where a key has more features than twice the queries (a decoding step)
    few_rows = 2 * n_queries < k.shape[-1]
    bounded = np.zeros((batch, n_heads), dtype=bool) if few_rows else _bounded(out, k)
    heads_out = out.transpose(0, 2, 1, 3)
    keys, values = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
    if support is not None:
        support = np.broadcast_to(support, (batch, n_heads, n_queries, n_keys))
    rows, group = _blocks(n_queries, n_keys, n_heads, max(q.shape[-1], v.shape[-1]), support is not None)
    if few_rows and (rows, group) == (n_queries, n_heads) and batch * n_heads * n_queries * n_keys <= _SCORES:
        weights, total = _exponentials(np.matmul(heads_out, keys), support)
        np.matmul(weights, values, out=heads_out)
        heads_out /= total
        return out
    reaches = None if support is None else _reaches(support, rows, group)
    buffer = np.empty((group, rows, n_keys), dtype=out.dtype)
    for b in range(batch):
        for first in range(0, n_heads, group):
            heads = slice(first, first + group)
            for start in range(0, n_queries, rows):
                block = slice(start, start + rows)
                kept = None if support is None else support[b, heads, block]
                reach = n_keys if kept is None else int(reaches[b, first // group, start // rows])
                queries = heads_out[b, heads, block]
                scores = np.matmul(queries, keys[b, heads, :, :reach],
                                   out=buffer[:queries.shape[0], :queries.shape[1], :reach])
                weights, total = _exponentials(scores, None if kept is None else kept[..., :reach],
                                               not bounded[b, heads].all())
                np.matmul(weights, values[b, heads, :reach], out=queries)
                queries /= total
    return out


def _bounded(q, k):
    """Per batch entry and head, whether every score ``q·k`` (``q`` scaled; both (batch, tokens, heads, features)) is at
    most half the dtype's exponent range less the log of the keys' count, by Cauchy–Schwarz (|q·k| ≤ |q| |k|): then no
    e^score overflows, nor their sum over the keys, none underflows, and the softmax needs no row max subtracted (two
    passes over every score fewer: llama's grouped attention alone 9.4–9.9 → 8.0–8.4 ms at N = 128, 34.5–35.1 →
    32.1–32.2 at 1024). Per entry and head, so that one's values never choose another's path (a NaN: not bounded)."""
    limit = math.log(np.finfo(q.dtype).max) / 2 - math.log(max(1, k.shape[1]))
    largest = [np.max(np.einsum("bthe,bthe->bth", x, x), axis=1, initial=0.0) for x in (q, k)]
    return np.sqrt(largest[0] * largest[1]) <= limit


def _reaches(support, rows, group):
    """1 + the last key that any row of each block of ``_attention`` keeps (0: none), per batch entry, group of
    ``group`` heads and block of ``rows`` query rows: the keys after it have weight 0, so a causal block's products
    stop at its last query's key. One reduction over the support (per head only where it differs between heads), not
    one per block (llama at N = 128: 128 blocks, 1.38 → 0.31 ms in the forward's profile)."""
    batch, n_heads, n_queries, n_keys = support.shape
    if support.strides[1] == 0:
        support = support[:, :1]  # one support for every head
    kept = _any_per_block(support, rows, 2) if n_queries else support
    if kept.shape[1] > 1:
        kept = _any_per_block(kept, group, 1)
    reach = n_keys - np.argmax(kept[..., ::-1], axis=-1) if n_keys else np.zeros(kept.shape[:-1], int)
    reach = np.where(kept.any(axis=-1), reach, 0)
    return np.broadcast_to(reach, (batch, -(-n_heads // group), reach.shape[2]))


def _any_per_block(mask, size, axis):
    """Whether any entry holds per block of ``size`` along ``axis`` of a boolean ``mask`` (the last block shorter):
    the whole blocks as one reduction over a reshaped axis, for ``logical_or.reduceat`` over booleans runs 15 times
    slower (llama's 4096 member rows × 1024 keys: 2.5 against 0.17 ms)."""
    whole = mask.shape[axis] // size * size
    index = (slice(None),) * axis
    parts = [np.logical_or.reduce(mask[index + (slice(0, whole),)].reshape(
        mask.shape[:axis] + (whole // size, size) + mask.shape[axis + 1:]), axis=axis + 1)] if whole else []
    if whole < mask.shape[axis]:
        parts.append(np.logical_or.reduce(mask[index + (slice(whole, None),)], axis=axis, keepdims=True))
    return np.concatenate(parts, axis=axis)


def _blocks(n_queries, n_keys, n_heads, width, masked=False):
    """Query rows and heads per block of ``_attention``: its scores (``_SCORES`` entries) stay in
    cache; where products of ``_MIN_ROWS`` rows are small enough, fewer rows, so that BLAS computes
    each product (rows × ``width`` × keys multiply-adds) on one thread (``_ONE_THREAD``); under a support
    (``masked``), at most ``_MASKED_ROWS``, so that a causal block's keys stop close to its own rows (``_reaches``)."""
    n_keys = max(1, n_keys)
    rows = max(1, min(n_queries, _SCORES // n_keys))
    one_thread = _ONE_THREAD // (max(1, width) * n_keys)
    if one_thread >= _MIN_ROWS:
        rows = min(rows, one_thread)
    if masked:
        rows = min(rows, _MASKED_ROWS)
    return rows, max(1, min(n_heads, _SCORES // (rows * n_keys)))


#: Score entries per block of ``_attention``: 2 MB in float32, which stay in cache.
_SCORES = 1 << 19
#: Multiply-adds of a product that OpenBLAS computes on one thread (its threshold, 65536 · 4). A
#: short sequence's products stay under it: handing each small product to a second thread costs
#: more than it gains, and on a loaded machine every hand-off waits for a descheduled thread
#: (B 8, N 128, d 512, 8 heads: 2 BLAS threads, load 13 on 2 cores, 810 → 49 ms per attention).
_ONE_THREAD = 1 << 18
#: The most query rows per block under a support: a causal block of 128 rows multiplies (1 + 2 + … + 8)/64 = 56 % of
#: a 1024-token kernel, one of 512 rows 75 % (llama at N 1024, 8 heads over 2: the attention 20.8 → 18.8 ms, the
#: forward 70 → 67).
_MASKED_ROWS = 128
#: The fewest query rows per product (fewer run far below the GEMM kernel's speed): a long
#: sequence keeps its large blocks, whose products threads share well.
_MIN_ROWS = 16


def _kept_layer_norm(x, gain, bias, eps):
    """gain P + bias over the last axis, and what its derived adjoint reads: P = (x − mean x)/√(var x + eps), var x."""
    p = x - x.mean(axis=-1, keepdims=True)
    variance = np.einsum("...l,...l->...", p, p) / x.shape[-1]
    p /= np.sqrt(eps + variance)[..., None]
    return gain * p + bias, p, variance


def _layer_norm_adjoint(costate, p, variance, gain, eps):
    """x̄ of ``gain P + bias``, ``P = (x − mean x)/√(variance + eps)`` over the last axis, for its ``costate``:
    (P̄ − mean P̄ − P mean(P̄ P))/√(variance + eps) with P̄ = gain · costate; and the gradients of gain and bias,
    Σ P costate and Σ costate over the other axes."""
    p_bar = gain * costate
    x_bar = p_bar - p_bar.mean(axis=-1, keepdims=True)
    x_bar -= p * (np.einsum("...l,...l->...", p_bar, p)[..., None] / p.shape[-1])
    x_bar /= np.sqrt(eps + variance)[..., None]
    rows = costate.reshape(-1, costate.shape[-1])
    return x_bar, np.einsum("rl,rl->l", p.reshape(rows.shape), rows), rows.sum(axis=0)


def _attention_normalized(q, k, v, scale, support):
    """``_attention`` and its rows' normalizers for ``_attention_adjoint``: None, as ``_attention`` keeps none
    (the adjoint recomputes the kernel)."""
    return _attention(q, k, v, scale, support), None


def _attention_adjoint(o_bar, q, k, v, o, log_total, scale, support):
    """(q̄, k̄, v̄) of ``o = _attention(q, k, v, scale, support)`` for the costate ``o_bar``, all (batch, tokens,
    heads, features), the kernel γ recomputed (``log_total`` is None): ā = γ ∘ (ō vᵀ − Σ_e ō o), q̄ = scale ā k,
    k̄ = scale āᵀ q, v̄ = γᵀ ō."""
    q, k, v, o, o_bar = (x.transpose(0, 2, 1, 3) for x in (q, k, v, o, o_bar))
    kernel = _softmax(np.matmul(q, k.transpose(0, 1, 3, 2)) * scale, support)
    scores_bar = np.matmul(o_bar, v.transpose(0, 1, 3, 2))
    scores_bar -= np.einsum("bmie,bmie->bmi", o_bar, o)[..., None]
    scores_bar *= kernel
    grads = (np.matmul(scores_bar, k) * scale, np.matmul(scores_bar.transpose(0, 1, 3, 2), q) * scale,
             np.matmul(kernel.transpose(0, 1, 3, 2), o_bar))
    return tuple(grad.transpose(0, 2, 1, 3) for grad in grads)


def _grouped_attention(q, k, v, scale, support):
    """``_attention`` of query head (g, s) against the keys and values of head g (grouped heads):
    q (batch, tokens, groups, members, features…), k (batch, keys, groups, features…), v (batch,
    keys, groups, value features), support (batch, tokens, keys) or None. The members of a group
    are further query rows of its head (batched products over the groups, no key or value is
    repeated); the result is (batch, tokens, groups, members, value features).
    """
    batch, n_queries, groups, members = q.shape[:4]
    rows = _member_rows(q, batch, n_queries, groups, members)
    keys = k.reshape(k.shape[:3] + (np.prod(k.shape[3:], dtype=int),))
    out = _attention(rows, keys, v, scale, _member_support(support, batch, members, n_queries))
    return out.reshape(batch, members, n_queries, groups, out.shape[-1]).transpose(0, 2, 3, 1, 4)


def _member_rows(x, batch, n_queries, groups, members):
    """A grouped query-side array (batch, tokens, groups, members, features…) as ``_attention``'s operand: the members
    of a group further query rows of its head, (batch, members·tokens, groups, features)."""
    rows = x.reshape(x.shape[:4] + (np.prod(x.shape[4:], dtype=int),)).transpose(0, 3, 1, 2, 4)  # sizes, not -1
    return rows.reshape(batch, members * n_queries, groups, rows.shape[-1])


def _full_support(u0, dtype=bool):
    """χ ≡ 1 over the tokens of a state (batch, n_tokens, d): the indicator a formula reads as a factor (a view), bool or
    of ``dtype``."""
    return np.broadcast_to(np.ones((), dtype), (u0.shape[0], u0.shape[1], u0.shape[1]))


def _member_support(support, batch, members, n_queries):
    """A support (batch, tokens, keys) for ``_member_rows``: (batch, 1, members·tokens, keys), or None."""
    if support is None:
        return None
    support = np.broadcast_to(support[:, None], (batch, members) + support.shape[1:])
    return support.reshape(batch, 1, members * n_queries, support.shape[-1])


def _grouped_attention_normalized(q, k, v, scale, support):
    """``_grouped_attention`` and its rows' normalizers for ``_grouped_attention_adjoint``: None, as ``_attention``
    keeps none (the adjoint recomputes the kernel)."""
    return _grouped_attention(q, k, v, scale, support), None


def _grouped_attention_adjoint(o_bar, q, k, v, o, log_total, scale, support):
    """(q̄, k̄, v̄) of ``o = _grouped_attention(q, k, v, scale, support)`` for the costate ``o_bar``, each shaped as its
    array: ``_attention_adjoint`` of the members as further query rows of their group's head (k̄, v̄ summed over
    them; ``log_total`` is None)."""
    batch, n_queries, groups, members = q.shape[:4]
    rows = [_member_rows(x, batch, n_queries, groups, members) for x in (o_bar, q, o)]
    keys = k.reshape(k.shape[:3] + (np.prod(k.shape[3:], dtype=int),))
    q_bar, k_bar, v_bar = _attention_adjoint(rows[0], rows[1], keys, v, rows[2], None, scale,
                                             _member_support(support, batch, members, n_queries))
    q_bar = q_bar.reshape(batch, members, n_queries, groups, q_bar.shape[-1]).transpose(0, 2, 3, 1, 4)
    return q_bar.reshape(q.shape), k_bar.reshape(k.shape), v_bar


def _grid_rows(index, size):
    """``index`` as row numbers; a value that is no grid point 0 … size − 1 (δ(v, index) = 0 for every v) → ``size``."""
    rows = index.astype(np.intp)
    return np.where((rows == index) & (rows >= 0) & (rows < size), rows, size)


def _gather(table, index):
    """Σ_v table[…, v] δ(v, index): ``table`` (its last axis) read at ``index``, 0 where the index is no grid point;
    the table's other axes first."""
    padded = np.concatenate((table, np.zeros_like(table[..., :1])), axis=-1)
    return np.take(padded, _grid_rows(index, table.shape[-1]), axis=-1)


def _scatter(values, index, size, kept):
    """out[v, r…] = Σ_s δ(v, index[s…]) values[r…, s…] for v < size (the first ``kept`` axes of ``values`` are r…):
    one weighted bincount, each row r its own ``size + 1`` bins (the last takes the indices that are no row)."""
    values, index = np.broadcast_arrays(values, index)
    shape = values.shape[:kept]
    values = values.reshape(math.prod(shape), -1)
    bins = _grid_rows(index[(0,) * kept].reshape(-1), size) + (size + 1) * np.arange(len(values))[:, None]
    out = np.bincount(bins.reshape(-1), weights=values.reshape(-1), minlength=len(values) * (size + 1))
    return out.reshape(len(values), size + 1)[:, :size].T.reshape((size,) + shape).astype(values.dtype, copy=False)


def _window(values, pos_out, pos_in, low, high, support):
    """Σ_c 1[low < p_out[a] − p_in[c] < high] χ[a, c] values[c] for (batch, tokens, d) ``values``: a relative
    kernel of local support. Per sequence, the tokens sorted by position and each window's first one
    found by bisection: O(N m) reads for m tokens in a window (``support`` None: χ = 1).
    """
    batch, n_out = pos_out.shape
    out = np.zeros((batch, n_out) + values.shape[2:], dtype=values.dtype)
    rows = np.arange(n_out)
    for b in range(batch):
        order = np.argsort(pos_in[b], kind="stable")
        ranked = pos_in[b][order]
        first = np.searchsorted(ranked, pos_out[b] - high, side="left")
        last = np.searchsorted(ranked, pos_out[b] - low, side="right")  # a superset: the bounds are checked below
        for step in range(int(np.max(last - first, initial=0))):
            token = order[np.minimum(first + step, len(order) - 1)]
            distance = pos_out[b] - pos_in[b][token]
            weight = (first + step < last) & (distance > low) & (distance < high)
            if support is not None:
                weight &= support[b, rows, token]
            out[b] += weight[:, None] * values[b, token]
    return out


def _row_scale(x):
    """Per row, a power of two s ≥ max|x| (at least 1): x/s is exact and its squares cannot overflow."""
    peak = np.maximum(np.max(x, axis=-1, keepdims=True), -np.min(x, axis=-1, keepdims=True))
    exponent = np.clip(np.frexp(peak)[1], 0, np.finfo(x.dtype).maxexp - 1)
    return np.ldexp(np.ones_like(peak), exponent)


def _layer_norm(x, gain, bias, eps, scaled=False):
    """gain (x − mean)/√(var + eps) + bias over the last axis, with one full-size temporary.

    The row's first value is subtracted before the mean (shifted data), so rows far from zero
    keep their deviations. Where squares overflow (a variance that is not finite), ``scaled``
    recomputes the statistics from x/s, s a power of two ≥ max|x| per row (at least 1): the
    division is exact, squares cannot overflow, and eps/s² keeps the formula unchanged. Every
    row whose LayerNorm is representable gets it, up to the dtype's largest values.
    """
    scale = _row_scale(x) if scaled else 1
    shifted = x / scale if scaled else x
    with np.errstate(over="ignore", invalid="ignore"):  # squares that overflow send the rows to ``scaled``
        out = shifted - shifted[..., :1]
        out -= np.einsum("...k->...", out)[..., None] / x.shape[-1]  # the row mean (einsum sums faster than np.mean)
        variance = np.einsum("...k,...k->...", out, out)[..., None]
        variance /= x.shape[-1]
    variance += eps / scale / scale
    if not (scaled or np.isfinite(variance).all()):
        return _layer_norm(x, gain, bias, eps, scaled=True)
    np.sqrt(variance, out=variance)
    variance[variance == 0] = 1  # a constant row (eps = 0 or eps/s² underflowed): its centred values are 0
    out /= variance
    out *= gain
    out += bias
    return out


def _rms_norm(x, gain, eps, scaled=False):
    """gain x/√(mean x² + eps) over the last axis; where squares overflow, ``scaled`` takes the
    statistics of x/s (``_row_scale``, as ``_layer_norm``)."""
    scale = _row_scale(x) if scaled else 1
    out = x / scale
    with np.errstate(over="ignore", invalid="ignore"):  # squares that overflow send the rows to ``scaled``
        root = np.einsum("...k,...k->...", out, out)[..., None]
        root /= x.shape[-1]
    root += eps / scale / scale
    if not (scaled or np.isfinite(root).all()):
        return _rms_norm(x, gain, eps, scaled=True)
    np.sqrt(root, out=root)
    root[root == 0] = 1  # a zero row (eps = 0 or eps/s² underflowed): its values are 0
    out /= root
    out *= gain
    return out
