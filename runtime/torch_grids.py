"""Grid fields and token layouts of the generated PyTorch network modules: the windows of a field
(patch embedding, convolutions), their adjoints, the grid rows of the token domain and token nodes
joined. Inlined where used (``codegen.runtime_source``)."""

import math

import torch


def _windows(field, axes, size, stride, padding):
    """``field`` at ``stride·p + r − padding`` along ``axes`` (zero outside): a view (…, p, …, r)."""
    if padding and torch.onnx.is_in_onnx_export():  # the TorchScript exporter cannot size an Unfold after a Pad
        for axis in axes:
            edge = torch.zeros_like(field.narrow(axis, 0, 1))
            field = torch.cat([edge] * padding + [field] + [edge] * padding, dim=axis)
    elif padding:
        pad = [0] * (2 * field.dim())
        for axis in axes:
            pad[2 * (field.dim() - 1 - axis)] = pad[2 * (field.dim() - 1 - axis) + 1] = padding
        field = torch.nn.functional.pad(field, pad)
    for axis in axes:
        field = field.unfold(axis, size, stride)
    return field


def _rows(field, axis: int, offset: int, sizes):
    """``field`` at the nodes ``offset + N_2 p + q`` of ``axis``, that axis unflattened to ``sizes`` (a view)."""
    return field.narrow(axis, offset, math.prod(sizes)).unflatten(axis, sizes)


def _fold(blocks, shape, axes, size, stride, padding):
    """The adjoint of ``_windows``: each window's values added back at its points, zero elsewhere."""
    padded = list(shape)
    for axis in axes:
        padded[axis] += 2 * padding
    out = blocks.new_zeros(padded)
    offsets = [()]
    for _ in axes:
        offsets = [chosen + (offset,) for chosen in offsets for offset in range(size)]
    for chosen in offsets:
        index = [slice(None)] * len(shape)
        for axis, offset in zip(axes, chosen):
            index[axis] = slice(offset, offset + stride * (blocks.shape[axis] - 1) + 1, stride)
        out[tuple(index)] += blocks[(Ellipsis, *chosen)]
    crop = [slice(None)] * len(shape)
    for axis in axes:
        crop[axis] = slice(padding, padding + shape[axis])
    return out[tuple(crop)]


def _place_rows(rows, shape, axis: int, offset: int):
    """The adjoint of ``_rows``: the rows written back at ``offset``, … of ``axis``, zero elsewhere."""
    count = math.prod(rows.shape[axis:axis + rows.dim() - len(shape) + 1])
    out = rows.new_zeros(shape)
    out.narrow(axis, offset, count).copy_(rows.reshape(tuple(shape[:axis]) + (count,) + tuple(shape[axis + 1:])))
    return out


def _join(*parts):
    """Token nodes one after another: a node (batch, d), a node shared by the batch (d,), grid rows (batch, …, d)."""
    batch = next(part.shape[0] for part in parts if part.dim() > 1)
    return torch.cat([part.expand(batch, 1, part.shape[0]) if part.dim() == 1
                      else part.unsqueeze(1) if part.dim() == 2 else part.flatten(1, -2) for part in parts], dim=1)


def _interleave(blocks, axes):
    """``blocks[…, p, …, q, …, r, s]`` written at the fine nodes ``(S p + r, S q + s)``."""
    n = blocks.dim() - len(axes)
    order = list(range(n))
    for position, axis in sorted(enumerate(axes), key=lambda pair: -pair[1]):
        order.insert(axis + 1, n + position)
    shape = list(blocks.shape[:n])
    for position, axis in enumerate(axes):
        shape[axis] *= blocks.shape[n + position]
    return blocks.permute(order).reshape(shape)
