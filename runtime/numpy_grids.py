"""Grid fields and token layouts of the generated NumPy network modules: the windows of a field
(patch embedding, convolutions), their adjoints, the grid rows of the token domain and token nodes
joined. Inlined where used (``codegen.runtime_source``)."""

import math
import threading

import numpy as np


def _windows(field, axes, size, stride, padding):
    """``field`` at ``stride·p + r − padding`` along ``axes`` (zero outside): a view (…, p, …, r)."""
    if padding:
        width = [(0, 0)] * field.ndim
        for axis in axes:
            width[axis] = (padding, padding)
        field = np.pad(field, width)
    view = np.lib.stride_tricks.sliding_window_view(field, (size,) * len(axes), axis=axes)
    index = [slice(None)] * view.ndim
    for axis in axes:
        index[axis] = slice(None, None, stride)
    return view[tuple(index)]


def _phase(a, stride, padding, size, extent):
    """Phase ``a`` along one axis of a field of ``size`` nodes zero-padded by ``padding``: the slice of its
    grid (``extent`` nodes p, the node S p + a − P of the field) the field fills, and the field's slice."""
    first = max(0, (padding - a + stride - 1) // stride)
    start = stride * first + a - padding
    count = max(0, min(extent - first, (size - start + stride - 1) // stride))
    return slice(first, first + count), slice(start, start + stride * count, stride)


def _phases(field, size, stride, padding, dtype):
    """A strided convolution as stride-1 ones over contiguous memory: the zero-padded field split by stride
    phase. Phase (a, b) holds the nodes (S p + a, S q + b) on a grid of the output's size plus the kernel's
    reach e = (size − 1)//S, as (channels, columns): (batch, grid) flattened and followed by e·(grid width + 1)
    zero columns, so kernel offset (S r + a, S s + b) is the slice of columns starting at r·(grid width) + s.
    Its memory keeps the field's: channel-major, or channels last (a token grid's).
    Returns {(a, b): (channels, columns)}, the output's (rows, cols) and the grid's (height, width)."""
    batch, channels, height, width = field.shape
    output = _output_size(field, size, stride, padding)
    reach = (size - 1) // stride
    grid = (output[0] + reach, output[1] + reach)
    count = batch * grid[0] * grid[1]
    order = "F" if field.strides[1] < field.strides[3] else "C"
    nodes = field.transpose(1, 0, 2, 3)
    phases = {}
    for a in range(min(stride, size)):
        for b in range(min(stride, size)):
            flat = _scratch(("phase", a, b), (channels, count + reach * (grid[1] + 1)), dtype, order)
            flat.fill(0)
            (p, i), (q, j) = _phase(a, stride, padding, height, grid[0]), _phase(b, stride, padding, width, grid[1])
            flat[:, :count].reshape(channels, batch, *grid)[:, :, p, q] = nodes[:, :, i, j]
            phases[a, b] = flat
    return phases, output, grid


def _offsets(phases, size, stride, width, count):
    """Each kernel offset (r, s) with its ``count`` columns of its phase (see ``_phases``)."""
    for (a, b), flat in phases.items():
        for r in range(a, size, stride):
            for s in range(b, size, stride):
                shift = (r // stride) * width + s // stride
                yield r, s, flat[:, shift:shift + count]


def _row_stacks(phases, size, stride, width, count):
    """Per phase and kernel row r, the ``count`` columns of the offsets (r, s) of that phase stacked (the columns of
    offset s in rows k·c … (k + 1)·c, k counting that phase's s): the offsets of one row as one GEMM with K = c times
    their number, where one per offset has K = c (resnet-block's nine products with K = 64 take 9.8 ms in OpenBLAS,
    its three with K = 192 6.0 ms). Each phase's s-shifted copies are made once for all its rows (the stack is the
    phase's memory shifted by s, and row r's columns a window of it), in scratch that the next phase reuses.
    Yields (r, the s's as a slice of ``W``'s axis, columns); a phase with one s yields its own columns."""
    reach = (size - 1) // stride
    for (a, b), flat in phases.items():
        kernel_columns = range(b, size, stride)
        if len(kernel_columns) == 1:
            stack = flat
        else:
            channels, span = len(flat), count + reach * width
            stack = _scratch("stack", (channels * len(kernel_columns), span), flat.dtype,
                             "F" if flat.strides[0] < flat.strides[1] else "C")
            for k, s in enumerate(kernel_columns):
                stack[k * channels:(k + 1) * channels] = flat[:, s // stride:s // stride + span]
        for r in range(a, size, stride):
            start = (r // stride) * width
            yield r, slice(b, size, stride), stack[:, start:start + count]


def _product(W, columns, out=None):
    """``Wᵀ columns`` (l, n) in the memory order of ``columns`` (channel-major, or channels last); into ``out`` if
    given (of that order)."""
    if columns.strides[0] < columns.strides[1]:
        return np.matmul(columns.T, W, out=None if out is None else out.T).T
    return np.matmul(W.T, columns, out=out)


#: Per thread, the scratch arrays kept between calls (``_scratch``) and how many holders hold them.
_SCRATCH = threading.local()
#: The largest scratch array kept between calls, in bytes; a larger one is fresh memory, as any was before.
_SCRATCH_LIMIT = 1 << 23
#: The holders nested deepest that keep memory: a program, a convolution inside it. Deeper ones (a signal handler or
#: finalizer running a forward mid-call) get fresh memory.
_SCRATCH_LEVELS = 2


def _scratch(slot, shape, dtype, order, caller=False):
    """An array of ``shape`` for a temporary that no result outlives (a padded phase, a product before it is summed, a
    program's convolution output that it deletes before returning), in memory kept between calls, per thread, level,
    ``slot`` and dtype, as large as the largest asked for up to ``_SCRATCH_LIMIT``: fresh memory of this size is given
    back to the system after each call and faulted in again at the next (744 page faults of the NumPy unet-level
    forward). Its values are left over from earlier calls.

    The memory belongs to the holder (``_holding_scratch``) at the thread's depth, or with ``caller`` to the one that
    called it (a program receiving a convolution's output). Holders on one thread nest: while one holds a level, no
    other runs at that depth, so none writes over what it holds. Outside any holder, or nested deeper than
    ``_SCRATCH_LEVELS``, the array is fresh memory."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    level = getattr(_SCRATCH, "depth", 0) - caller
    if not 1 <= level <= _SCRATCH_LEVELS or size * dtype.itemsize > _SCRATCH_LIMIT:
        return np.empty(shape, dtype, order=order)
    kept = _SCRATCH.__dict__.setdefault("kept", {})
    key = (level, slot, dtype.str)
    buffer = kept.get(key)
    if buffer is None or buffer.size < size:
        buffer = kept[key] = np.empty(size, dtype)
    return buffer[:size].reshape(shape, order=order)


def _holding_scratch(function):
    """``function``, a convolution or a program using ``_scratch``, holding the next level of it on this thread while
    it runs."""
    def holding(*args, **kwargs):
        _SCRATCH.depth = getattr(_SCRATCH, "depth", 0) + 1
        try:
            return function(*args, **kwargs)
        finally:
            _SCRATCH.depth -= 1
    holding.__doc__, holding.__wrapped__ = function.__doc__, function
    return holding


def _on_grid(out, batch, output, grid):
    """Columns over the phase grid (``_phases``) → the output nodes, a (b, l, p, q) view."""
    rows, cols = output
    return out.reshape(len(out), batch, *grid)[:, :, :rows, :cols].transpose(1, 0, 2, 3)


@_holding_scratch
def _conv2d(field, W, stride, padding, bias=None, slot=None):
    """``Σ_{c,r,s} field[b, c, S p + r − P, S q + s − P] W[c, r, s, l] (+ bias[l])``: per kernel row r one
    GEMM of ``W[:, r, s…]ᵀ`` with the contiguous columns of the field's nodes (``_phases``) at the row's offsets
    stacked (``_row_stacks``), summed (few channels: one GEMM over every offset's columns stacked, im2col); a channels-last field (a token grid), one GEMM over
    its output nodes' windows (``_window_rows``). A (b, l, p, q) view, in the field's memory order;
    with ``slot``, of the caller's scratch (``_scratch``): an output that dies inside the calling program."""
    channels, size = W.shape[:2]
    if stride == size and padding == 0:
        return _patches(field, W, bias, slot)
    dtype = np.result_type(field, W)
    if _channels_last_output(field, size, stride, padding) and _window_rows_fit(field, size, stride, padding, dtype):
        return _window_rows(field, W, stride, padding, bias, slot)
    phases, output, grid = _phases(field, size, stride, padding, dtype)
    count = len(field) * grid[0] * grid[1]
    order = "F" if phases[0, 0].strides[0] < phases[0, 0].strides[1] else "C"
    out = None if slot is None else _scratch(slot, (W.shape[-1], count), dtype, order, caller=True)
    if channels < 16:  # K = c·k² of one GEMM keeps BLAS busy; per offset, K = c would not
        offsets = list(_offsets(phases, size, stride, grid[1], count))
        stacked = _scratch("stacked", (channels * len(offsets), count), dtype, order)
        out = _product(np.concatenate([W[:, r, s] for r, s, _ in offsets]),
                       np.concatenate([columns for _, _, columns in offsets], out=stacked), out=out)
    else:
        term = None
        for r, kernel_columns, columns in _row_stacks(phases, size, stride, grid[1], count):
            kernel = W[:, r, kernel_columns].transpose(1, 0, 2).reshape(-1, W.shape[-1])  # rows in the stack's order
            if term is None:
                out = _product(kernel, columns, out=out)
                term = _scratch("term", out.shape, out.dtype, "F" if out.strides[0] < out.strides[1] else "C")
            else:
                out += _product(kernel, columns, out=term)
    if bias is not None:
        out += bias[:, None]
    return _on_grid(out, len(field), output, grid)


def _patches(field, W, bias=None, slot=None):
    """``_conv2d`` of windows that tile the field (stride = kernel size, no padding; rows and columns past the last
    whole window unread): each window's c·k² entries one row, one GEMM with W as (c·k², l). A (b, l, p, q) view of
    channels-last memory (with ``slot``, of ``_conv2d``'s caller's scratch)."""
    batch, channels, height, width = field.shape
    size = W.shape[1]
    rows, cols = height // size, width // size
    windows = field[:, :, :rows * size, :cols * size].reshape(batch, channels, rows, size, cols, size)
    windows = windows.transpose(0, 2, 4, 1, 3, 5).reshape(batch * rows * cols, channels * size * size)
    return _rows_product(windows, W.reshape(channels * size * size, -1), bias, slot, (batch, rows, cols))


def _rows_product(windows, kernel, bias, slot, grid):
    """``windows @ kernel (+ bias)``, one row per output node of ``grid`` (batch, rows, cols): a (b, l, p, q) view of
    channels-last memory (with ``slot``, of ``_conv2d``'s caller's scratch)."""
    shape = (len(windows), kernel.shape[-1])
    out = None if slot is None else _scratch(slot, shape, np.result_type(windows, kernel), "C", caller=True)
    out = np.matmul(windows, kernel, out=out)
    if bias is not None:
        out += bias
    return out.reshape(*grid, shape[1]).transpose(0, 3, 1, 2)


def _output_size(field, size, stride, padding):
    """The (rows, cols) of a convolution of ``field`` (b, c, height, width): none where the kernel reaches past the
    field (not a negative count, whose slices would read the field from its end: a grid of garbage)."""
    return tuple(max(0, (extent + 2 * padding - size) // stride + 1) for extent in field.shape[2:])


def _channels_last_output(field, size, stride, padding):
    """Whether ``field`` is channels last (a token grid) and its convolution has nodes (one that has none is the empty
    output of the phases, as for a channel-major field)."""
    return field.strides[1] < field.strides[3] and min(_output_size(field, size, stride, padding)) > 0


def _window_rows_fit(field, size, stride, padding, dtype):
    """Whether ``_window_rows``' matrix (k² times the output's nodes' values) is within ``_SCRATCH_LIMIT``."""
    rows, cols = _output_size(field, size, stride, padding)
    return len(field) * rows * cols * size * size * field.shape[1] * np.dtype(dtype).itemsize <= _SCRATCH_LIMIT


def _window_rows(field, W, stride, padding, bias, slot):
    """``_conv2d`` of a channels-last field: each output node's window one row (the k² offsets' channels side by
    side, ``_padded_nodes``), one GEMM with W as (k²·c, l): neither products at the nodes past the output that the
    phases' grid adds (CvT's 3 × 3 stride-2 embeddings: a 5 × 5 grid for a 4 × 4 output) nor a sum of products."""
    channels, size = W.shape[:2]
    dtype = np.result_type(field, W)
    padded, (rows, cols) = _padded_nodes(field, size, stride, padding, dtype)
    windows = _scratch("windows", (len(field), rows, cols, size * size * channels), dtype, "C")
    for k, (r, s) in enumerate(np.ndindex(size, size)):
        windows[..., k * channels:(k + 1) * channels] = _offset_nodes(padded, r, s, stride, (rows, cols))
    kernel = _scratch("kernel", (size, size, channels, W.shape[-1]), W.dtype, "C")  # W's rows in the windows' order
    kernel[...] = W.transpose(1, 2, 0, 3)  # (in kept memory: a fresh copy of CvT's last kernel was 650 page faults)
    return _rows_product(windows.reshape(-1, windows.shape[-1]), kernel.reshape(-1, W.shape[-1]), bias, slot,
                         (len(field), rows, cols))


def _padded_nodes(field, size, stride, padding, dtype):
    """A channels-last field's nodes zero-padded by ``padding`` (b, height + 2P, width + 2P, c; of the scratch), and
    the output's (rows, cols)."""
    nodes = field.transpose(0, 2, 3, 1)
    batch, height, width, channels = nodes.shape
    padded = _scratch("padded", (batch, height + 2 * padding, width + 2 * padding, channels), dtype, "C")
    for edge in (np.s_[:, :padding], np.s_[:, height + padding:], np.s_[:, :, :padding], np.s_[:, :, width + padding:]):
        padded[edge] = 0
    padded[:, padding:padding + height, padding:padding + width] = nodes
    return padded, _output_size(field, size, stride, padding)


def _offset_nodes(padded, r, s, stride, output):
    """Kernel offset (r, s)'s nodes of ``padded`` (``_padded_nodes``) for each output node: a strided view."""
    rows, cols = output
    return padded[:, r:r + stride * (rows - 1) + 1:stride, s:s + stride * (cols - 1) + 1:stride]


@_holding_scratch
def _depthwise_conv2d(field, W, stride, padding, bias=None, slot=None):
    """``Σ_{r,s} field[b, l, S p + r − P, S q + s − P] W[r, s, l] (+ bias[l])``: one multiply-add per kernel offset. A
    (b, l, p, q) view, in the field's memory order (with ``slot``, of the caller's scratch, as ``_conv2d``'s). Channels
    last (a token grid), over the strided nodes of the zero-padded field (``_depthwise_channels_last``); channel-major,
    over contiguous columns of the field's nodes (``_phases``)."""
    if _channels_last_output(field, W.shape[0], stride, padding):
        return _depthwise_channels_last(field, W, stride, padding, bias, slot)
    dtype = np.result_type(field, W)
    phases, output, grid = _phases(field, W.shape[0], stride, padding, dtype)
    offsets = _offsets(phases, W.shape[0], stride, grid[1], len(field) * grid[0] * grid[1])
    r, s, columns = next(offsets)
    order = "F" if columns.strides[0] < columns.strides[1] else "C"
    out = None if slot is None else _scratch(slot, columns.shape, dtype, order, caller=True)
    out = np.multiply(columns, W[r, s][:, None], out=out)
    term = _scratch("term", out.shape, out.dtype, "F" if out.strides[0] < out.strides[1] else "C")
    for r, s, columns in offsets:
        out += np.multiply(columns, W[r, s][:, None], out=term)
    if bias is not None:
        out += bias[:, None]
    return _on_grid(out, len(field), output, grid)


def _depthwise_channels_last(field, W, stride, padding, bias, slot):
    """``_depthwise_conv2d`` of a channels-last field: one ``einsum`` over the windows of the zero-padded field at the
    output's nodes (a strided view, channels contiguous), so neither the nodes the phases' grid adds (2.25 times those
    of a 4 × 4 output, CvT's last stage) nor a product per kernel offset is made (CvT's: 0.38 → 0.24 ms at 8 × 8 × 192)."""
    size, dtype = W.shape[0], np.result_type(field, W)
    padded, (rows, cols) = _padded_nodes(field, size, stride, padding, dtype)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(1, 2))
    shape = (len(field), rows, cols, field.shape[1])
    out = np.empty(shape, dtype) if slot is None else _scratch(slot, shape, dtype, "C", caller=True)
    np.einsum("bpqlrs,rsl->bpql", windows[:, ::stride, ::stride][:, :rows, :cols], W, out=out)
    if bias is not None:
        out += bias
    return out.transpose(0, 3, 1, 2)


def _conv_transpose2d(field, W, bias=None):
    """``Σ_k field[b, k, p, q] W[k, r, s, l] (+ bias[l])`` written at the fine nodes ``(S p + r, S q + s)`` (kernel = stride)."""
    batch, _, rows, cols = field.shape
    _, size, _, channels = W.shape
    blocks = field.transpose(0, 2, 3, 1).reshape(batch * rows * cols, W.shape[0]) @ W.reshape(W.shape[0], -1)
    blocks = blocks.reshape(batch, rows, cols, size, size, channels)
    if bias is not None:
        blocks += bias
    return blocks.transpose(0, 5, 1, 3, 2, 4).reshape(batch, channels, rows * size, cols * size)


def _rows(field, axis, offset, sizes):
    """``field`` at the nodes ``offset + N_2 p + q`` of ``axis``, that axis unflattened to ``sizes`` (a view)."""
    index = [slice(None)] * field.ndim
    index[axis] = slice(offset, offset + math.prod(sizes))
    return field[tuple(index)].reshape(field.shape[:axis] + tuple(sizes) + field.shape[axis + 1:])


def _fold(blocks, shape, axes, size, stride, padding):
    """The adjoint of ``_windows``: each window's values added back at its points, zero elsewhere."""
    padded = list(shape)
    for axis in axes:
        padded[axis] += 2 * padding
    out = np.zeros(padded, dtype=blocks.dtype)
    for offsets in np.ndindex(*(size,) * len(axes)):
        index = [slice(None)] * len(shape)
        for axis, offset in zip(axes, offsets):
            index[axis] = slice(offset, offset + stride * (blocks.shape[axis] - 1) + 1, stride)
        out[tuple(index)] += blocks[(Ellipsis, *offsets)]
    crop = [slice(None)] * len(shape)
    for axis in axes:
        crop[axis] = slice(padding, padding + shape[axis])
    return out[tuple(crop)]


def _place_rows(rows, shape, axis, offset):
    """The adjoint of ``_rows``: the rows written back at ``offset``, … of ``axis``, zero elsewhere."""
    count = math.prod(rows.shape[axis:axis + rows.ndim - len(shape) + 1])
    out = np.zeros(shape, dtype=rows.dtype)
    index = [slice(None)] * len(shape)
    index[axis] = slice(offset, offset + count)
    out[tuple(index)] = rows.reshape(shape[:axis] + (count,) + shape[axis + 1:])
    return out


def _join(*parts):
    """Token nodes one after another: a node (batch, d), a node shared by the batch (d,), grid rows (batch, …, d)."""
    batch = next(part.shape[0] for part in parts if part.ndim > 1)
    return np.concatenate([np.broadcast_to(part, (batch, 1, part.shape[0])) if part.ndim == 1
                           else part.reshape(batch, int(np.prod(part.shape[1:-1])), part.shape[-1]) for part in parts],
                          axis=1)


def _interleave(blocks, axes):
    """``blocks[…, p, …, q, …, r, s]`` written at the fine nodes ``(S p + r, S q + s)``."""
    n = blocks.ndim - len(axes)
    order = list(range(n))
    for position, axis in sorted(enumerate(axes), key=lambda pair: -pair[1]):
        order.insert(axis + 1, n + position)
    shape = list(blocks.shape[:n])
    for position, axis in enumerate(axes):
        shape[axis] *= blocks.shape[n + position]
    return blocks.transpose(order).reshape(shape)
