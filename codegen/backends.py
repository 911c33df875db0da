"""Backends: how each IR operation is spelled in NumPy and in PyTorch.

A backend is a name, an expression printer and a template folder; the statements it
produces are the body of the emitted ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .ir import Contraction, Elementwise, Module, Op, Reduction, Softmax
from .printers import ArrayPrinter, NumpyPrinter, TorchPrinter

__all__ = ["Backend", "BACKENDS"]


@dataclass(frozen=True)
class Backend:
    name: str
    printer: type[ArrayPrinter]
    einsum: str
    reduce_mean: str
    reduce_sum: str
    axis_keyword: str

    def statement(self, module: Module, op: Op) -> str:
        """One assignment statement for ``op``."""
        printer = self.printer(module, op.labels)
        if isinstance(op, Contraction):
            operands = ", ".join(operand.name for operand in op.operands)
            value = f'{self.einsum}("{op.spec}", {operands})'
            numerator, denominator = sp.fraction(op.scale)
            if numerator != 1:
                value = f"{printer.doprint(numerator)} * {value}"
            if denominator != 1:
                value = f"{value} / {printer.doprint(denominator)}"
            if op.bias is not None:
                value = f"{value} + {printer.operand(op.bias)}"
        elif isinstance(op, Softmax):
            support = "None"
            if op.support is not None:
                reference = printer.operand(op.support)
                support = op.support.name if reference == op.support.name else \
                    f"None if {op.support.name} is None else {reference}"
            value = f"_softmax({printer.operand(op.scores)}, {support})"
        elif isinstance(op, Reduction):
            body = self.printer(module, op.body_labels).doprint(op.body)
            reduce = self.reduce_mean if op.mean else self.reduce_sum
            value = f"{reduce}({body}, {self.axis_keyword}={op.body_labels.index(op.axis)})"
        elif isinstance(op, Elementwise):
            value = printer.doprint(op.expr)
        else:
            raise AssertionError(f"no spelling for {type(op).__name__}")
        return f"{op.out} = {value}"


BACKENDS = {
    "numpy": Backend("numpy", NumpyPrinter, "_einsum", "np.mean", "np.sum", "axis"),
    "torch": Backend("torch", TorchPrinter, "torch.einsum", "torch.mean", "torch.sum", "dim"),
}
