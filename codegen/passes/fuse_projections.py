"""Matrix products that share their input → one product with concatenated kernels.

The query, key and value projections read the same state: ``[q k v] = x [W_q W_k W_v] +
[b_q b_k b_v]`` is one GEMM as wide as the three, split into views afterwards (parts of unequal
widths too: grouped heads' keys and values are narrower than the queries).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import MatMul, Module

__all__ = ["fuse_projections"]


def _compatible(first: MatMul, second: MatMul) -> bool:
    """Products of one input over the same axes, on the same rows, both with a bias or neither (their widths may
    differ: grouped heads' queries and keys)."""
    return (not first.transposed and not second.transposed
            and second.x == first.x and second.contracted == first.contracted
            and len(second.outputs) == 1 and second.outputs[0][1][:2] == first.outputs[0][1][:2]
            and (second.biases[0] is None) == (first.biases[0] is None))


def fuse_projections(module: Module) -> Module:
    ops: list = []
    for op in module.ops:
        previous = ops[-1] if ops else None
        if (isinstance(op, MatMul) and isinstance(previous, MatMul) and len(op.outputs) == 1
                and _compatible(previous, op) and not set(previous.writes()) & set(op.reads())):
            names = [name for name, _ in previous.outputs] + [op.out]
            ops[-1] = replace(
                previous, out=_joined(names), outputs=previous.outputs + op.outputs,
                weights=previous.weights + op.weights, biases=previous.biases + op.biases,
                comment=previous.comment + "\n" + op.comment,
            )
        else:
            ops.append(op)
    return replace(module, ops=ops)


def _joined(names: list[str]) -> str:
    """``attn_q, attn_k, attn_v`` → ``attn_qkv``."""
    prefix = names[0].rsplit("_", 1)[0]
    if all(name.rsplit("_", 1)[0] == prefix for name in names):
        return prefix + "_" + "".join(name.rsplit("_", 1)[1] for name in names)
    return "_".join(names)
