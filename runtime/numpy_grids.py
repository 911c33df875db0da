"""Grid fields and token layouts of the generated NumPy network modules: the windows of a field
(patch embedding, convolutions), their adjoints, the grid rows of the token domain and token nodes
joined. Inlined where used (``codegen.runtime_source``)."""

import math

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


def _channels_last(field, size, stride, padding, dtype):
    """``field`` (b, c, rows, cols) copied once, zero-padded and channels last, with the output grid's size."""
    batch, channels, height, width = field.shape
    nodes = np.zeros((batch, height + 2 * padding, width + 2 * padding, channels), dtype=dtype)
    nodes[:, padding:padding + height, padding:padding + width] = field.transpose(0, 2, 3, 1)
    return nodes, (height + 2 * padding - size) // stride + 1, (width + 2 * padding - size) // stride + 1


def _offset(nodes, r, s, stride, rows, cols):
    """The channels-last nodes ``(S p + r, S q + s)`` of every output node ``(p, q)`` (a view)."""
    return nodes[:, r:r + stride * (rows - 1) + 1:stride, s:s + stride * (cols - 1) + 1:stride]


def _conv2d(field, W, stride, padding, bias=None):
    """``Σ_{c,r,s} field[b, c, S p + r − P, S q + s − P] W[c, r, s, l] (+ bias[l])``: the field channels last,
    then per kernel offset one GEMM of its strided nodes with ``W[:, r, s]``, summed (few channels: one GEMM
    over the gathered windows, im2col). A (b, l, p, q) view of channels-last memory."""
    channels, size = W.shape[:2]
    nodes, rows, cols = _channels_last(field, size, stride, padding, np.result_type(field, W))
    if channels < 16:  # K = c·k² of one GEMM keeps BLAS busy; per offset, K = c would not
        windows = np.lib.stride_tricks.sliding_window_view(nodes, (size, size), axis=(1, 2))
        columns = _offset(windows, 0, 0, stride, rows, cols).transpose(0, 1, 2, 4, 5, 3).reshape(-1, size * size * channels)
        out = (columns @ W.transpose(1, 2, 0, 3).reshape(-1, W.shape[-1])).reshape(len(nodes), rows, cols, W.shape[-1])
        if bias is not None:
            out += bias
    else:
        out = np.empty((len(nodes), rows, cols, W.shape[-1]), dtype=nodes.dtype)
        out[...] = 0 if bias is None else bias
        for r in range(size):
            for s in range(size):
                out += _offset(nodes, r, s, stride, rows, cols) @ W[:, r, s]
    return out.transpose(0, 3, 1, 2)


def _depthwise_conv2d(field, W, stride, padding, bias=None):
    """``Σ_{r,s} field[b, l, S p + r − P, S q + s − P] W[r, s, l] (+ bias[l])``: the field channels last, then
    one multiply-add per kernel offset. A (b, l, p, q) view of channels-last memory."""
    nodes, rows, cols = _channels_last(field, W.shape[0], stride, padding, np.result_type(field, W))
    out = np.empty((len(nodes), rows, cols, W.shape[-1]), dtype=nodes.dtype)
    out[...] = 0 if bias is None else bias
    term = np.empty_like(out)
    for r in range(W.shape[0]):
        for s in range(W.shape[1]):
            out += np.multiply(_offset(nodes, r, s, stride, rows, cols), W[r, s], out=term)
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
