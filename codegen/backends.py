"""Backends: how each IR operation is spelled in NumPy and in PyTorch.

A backend is an expression printer plus one method per IR operation (``codegen.ir``, a
block's and a network's alike); the statements it returns are the body of the emitted
functions, in order. Each spelling records, through its printer, the names
its statements read besides arrays (runtime helpers such as ``_softmax``, sizes, flags):
what a template defines and binds comes from that record, never from reading the code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy as sp
from sympy.printing.precedence import PRECEDENCE

from splitformer.symbolic.domains import VARIABLES
from .bool_values import SUPPORTS
from .ir import (BATCH, Attention, AttentionAdjoint, Cache, Contraction, Convolution, ConvolutionInputAdjoint,
                 ConvolutionWeightAdjoint, Elementwise, ExactGelu, Fold, Gather, Interleave, Join,
                 LocalKernel, MatMul, Memoized, Module, Normalize, NormalizeAdjoint, Op, Operand, Place, PlaceRows, Point, Reduction, Rows, Scatter,
                 PairTable, Shared, Silu, Softmax, TanhGelu, TransposedConvolution, Unrolled, Window, ZerosLike)
from .passes.reuse_buffers import called
from .printers import ArrayPrinter, NumpyPrinter, TorchPrinter, broadcast, plain_name

__all__ = ["Backend", "BACKENDS", "Spelled", "INFERENCE", "DROPOUT"]

#: The flag the PyTorch template sets when autograd is off (``torch.is_grad_enabled()``).
INFERENCE = "inference"
#: The dropout probability the PyTorch template sets (the module's ``dropout`` in training, else 0).
DROPOUT = "dropout_p"
#: Axis label → the name of its size in emitted code.
SIZES = {str(variable.index): variable.domain.code_name for variable in VARIABLES.values()} | {BATCH: "batch"}


@dataclass(frozen=True)
class Spelled:
    """The statements of one operation and the names they read besides arrays."""

    lines: list[str]
    used: frozenset[str]


def _shape(labels: tuple[str, ...], printer: ArrayPrinter) -> str:
    return ", ".join(printer.use(SIZES[label]) for label in labels)


def _read_labels(expr: sp.Expr, printer: ArrayPrinter) -> set[str]:
    """The axes along which ``expr``'s arrays (and grid indices used as values) vary, outside its sums."""
    batched = any(printer.module.batched(plain_name(entry.base.label)) for entry in expr.atoms(sp.Indexed))
    return {plain_name(index) for index in expr.free_symbols if isinstance(index, sp.Idx)} | ({BATCH} if batched else set())


def _width(labels: tuple[str, ...], printer: ArrayPrinter) -> str:
    return " * ".join(printer.use(SIZES[label]) for label in labels)


def _widths(op: MatMul, printer: ArrayPrinter) -> list[sp.Expr]:
    """The widths of a fused product's outputs (their axes after the rows), as products of size names."""
    return [sp.Mul(*(sp.Symbol(printer.use(SIZES[label])) for label in labels[2:])) for _, labels in op.outputs]


def _addend(op: MatMul, printer: ArrayPrinter) -> str | None:
    """The bias of a one-output product, a batched addend (an adjoint's other terms) as rows."""
    bias = op.biases[0]
    if bias is None or not printer.module.batched(bias):
        return bias
    return f"{bias}.reshape(-1, {_width(op.labels[2:], printer)})"


def _value(lines: list[str], name: str) -> str:
    """The value of the one statement ``name = value`` that ``lines`` hold."""
    (line,) = lines
    prefix = f"{name} = "
    if not line.startswith(prefix):
        raise AssertionError(f"not one assignment to {name}: {line[:80]}")
    return line[len(prefix):]


def _torch_kernel(weight: str, depthwise: bool) -> str:
    """A canonical kernel (``W[c, r, s, l]``; depth-wise ``W[r, s, l]``) in torch's layout (l, c, r, s)."""
    return f"{weight}.permute(2, 0, 1).unsqueeze(1)" if depthwise else f"{weight}.permute(3, 0, 1, 2)"


def _convolution_backward(costate: str, x: str, kernel: str, geometry: Window | Fold, depthwise: bool, mask: str,
                          printer: ArrayPrinter) -> str:
    """torch's convolution backward of the convolution of ``x`` with ``kernel`` (torch's layout) of the stride and
    padding ``geometry`` holds, for ``costate``: what ``mask`` (input, kernel) asks for."""
    stride, padding = printer.code(geometry.stride), printer.code(geometry.padding)
    groups = f"{x}.shape[1]" if depthwise else "1"
    return (f"torch.ops.aten.convolution_backward({costate}, {x}, {kernel}, None, [{stride}, {stride}], "
            f"[{padding}, {padding}], [1, 1], False, [0, 0], {groups}, [{mask}, False])")


def _method(op: Op) -> str:
    """The backend method spelling ``op``: its class name in snake case (``PlaceRows`` → ``place_rows``)."""
    name = type(op).__name__
    return "".join(f"_{letter.lower()}" if letter.isupper() and position else letter.lower()
                   for position, letter in enumerate(name))


class Backend:
    name = ""
    printer: type[ArrayPrinter] = ArrayPrinter
    einsum = ""
    library = ""  # module prefix of reductions
    transposed_support = ""  # χ[b, i, j] read as χ[b, j, i]
    axis = ""  # keyword naming the reduced axis
    move_axis, permute = "", ""  # the library's moveaxis, an array's transpose to a given order
    kernel_flags: tuple[str, ...] = ()  # further arguments of the attention-kernel helpers (_softmax, _attention)
    #: Emit ``del`` after each local array's last reader. This keeps a call's peak
    #: memory low enough that the C allocator reuses it on the next call instead of returning
    #: it to the system and taking a page fault per 4 KiB page again (about 3800 faults, 12 %
    #: of a post-ln forward at B·N = 1024, d = 512).
    frees_dead_arrays = False
    #: A stack's layers read what its first computed from the positions alone (``Shared``), from the dict it hands
    #: them; else every layer computes it.
    shares_across_layers = False
    #: Also within a branch (a ``Memoized`` op's), its own arrays: TorchScript refuses ``del`` there.
    frees_in_branches = True
    #: Write a convolution output that dies inside its program (``Convolution.scratch``) into memory kept between
    #: calls: the program holds that memory while it runs (``_holding_scratch``).
    scratch_outputs = False
    #: The adjoint computes the input's costate last, apart (autograd asks for it only where the input needs it).
    input_costate_last = False
    #: The flags a derived backward's functions bind where their statements read them: name → value (and comment).
    adjoint_flags: dict[str, str] = {}

    def spell(self, module: Module, op: Op) -> Spelled:
        """The statements computing ``op`` and the names they read besides arrays."""
        printer = self.printer(module, op.labels)
        lines = self.lines(op, printer)
        return Spelled(lines, frozenset(printer.used))

    def spell_store(self, module: Module, op: Memoized | Shared) -> Spelled:
        """The statement storing what a branch op computed (after its own statements)."""
        printer = self.printer(module, op.labels)
        store = self.memoize if isinstance(op, Memoized) else self.share
        return Spelled(store(op, printer), frozenset(printer.used))

    def statements(self, module: Module, op: Op) -> list[str]:
        """The statements computing ``op``."""
        return self.spell(module, op).lines

    def lines(self, op: Op, printer: ArrayPrinter) -> list[str]:
        return getattr(self, _method(op))(op, printer)

    def kernel_extra(self, printer: ArrayPrinter, op: Softmax | Attention) -> str:
        """The further arguments of a kernel helper: none where the kernel takes no dropout."""
        return "".join(f", {printer.use(flag)}" for flag in self.kernel_flags) if op.dropout else ""

    def scaled(self, value: str, scale: sp.Expr, printer: ArrayPrinter) -> str:
        """``value`` times ``scale``'s numerator, over its denominator, each parenthesized where its operators bind less
        (a plug-in's scale ``1/(1 + e^{−τ})`` was printed ``value / 1 + math.exp(-tau)``)."""
        numerator, denominator = sp.fraction(scale)
        if numerator != 1:
            value = f"{printer.parenthesize(numerator, PRECEDENCE['Mul'], strict=True)} * {value}"
        if denominator != 1:
            value = f"{value} / {printer.parenthesize(denominator, PRECEDENCE['Mul'])}"
        return value

    def support(self, operand: Operand | None, printer: ArrayPrinter) -> str:
        """A softmax's support as code: a mask given to the call (None where none is) or one the statements computed."""
        if operand is None:
            return "None"
        reference = printer.operand(operand)
        if reference == operand.name or operand.name not in SUPPORTS:
            return reference
        return f"None if {operand.name} is None else {reference}"

    def contraction(self, op: Contraction, printer: ArrayPrinter) -> list[str]:
        """einsum; an output axis no operand has (a plug-in's ``y[i, l] = Σ_k W[k, l] r[k]``, the same at every ``i``):
        einsum without it, then made whole along it, as ``elementwise`` does."""
        operands = ", ".join(self.einsum_operand(operand.name, op) for operand in op.operands)
        inputs, output = op.spec.split("->")
        kept = "".join(letter for letter in output if letter in inputs)
        value = self.scaled(f'{printer.use(self.einsum)}("{inputs}->{kept}", {operands})', op.scale, printer)
        if kept != output:
            axes = ", ".join(":" if letter in kept else "None" for letter in output)
            value = self.whole(f"({value})[{axes}]", self.sizes(op.labels, printer))
        return self.assigned(op, value, printer)

    def einsum_operand(self, name: str, op: Contraction) -> str:
        """How an operand of ``op`` is handed to einsum."""
        return name

    @staticmethod
    def assigned(op: Contraction, value: str, printer: ArrayPrinter) -> list[str]:
        """``out = value`` with the contraction's bias added."""
        return [f"{op.out} = {value}" + ("" if op.bias is None else f" + {printer.operand(op.bias)}")]

    def zeros_like(self, op: ZerosLike, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {self.library}.zeros_like({op.like})"]

    def reduction(self, op: Reduction, printer: ArrayPrinter) -> list[str]:
        """``out = mean`` (or ``sum``) of the body along the summed axis; made whole along an axis of ``out`` the body
        does not read (a plug-in's mean over every token, ``m[i, l] = Σ_j u[j, l] / N``: the same at every ``i``), as
        ``elementwise`` does."""
        body = printer.at(op.body_labels).doprint(op.body)
        reduce = f"{self.library}.{'mean' if op.mean else 'sum'}"
        value = f"{reduce}({body}, {self.axis}={op.body_labels.index(op.axis)})"
        read = _read_labels(op.body, printer) - {op.axis}
        if read and not set(op.labels) <= read:
            value = self.whole(value, self.sizes(op.labels, printer))
        return [f"{op.out} = {value}"]

    def softmax(self, op: Softmax, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {printer.use('_softmax')}({printer.operand(op.scores)}, {self.support(op.support, printer)}"
                f"{self.kernel_extra(printer, op)})"]

    def attention(self, op: Attention, printer: ArrayPrinter) -> list[str]:
        grouped = self.grouped(op)
        arguments = (f"{op.q.name}, {op.k.name}, {op.v.name}, {printer.doprint(op.scale)}, "
                     f"{self.attention_support(op, printer)}{self.kernel_extra(printer, op)}")
        helper = "_grouped_attention" if grouped else "_attention"
        printer.use("_attention")  # the grouped and normalized helpers call it
        if op.normalizer:  # where the backend's kernel gives no normalizer, None
            if grouped:
                printer.use("_grouped_attention")
            return [f"{op.out}, {op.normalizer} = {printer.use(helper + '_normalized')}({arguments})"]
        return [f"{op.out} = {printer.use(helper)}({arguments})"]

    @staticmethod
    def grouped(op: Attention | AttentionAdjoint) -> bool:
        """Grouped heads: queries (b, i, g, s, features…), keys and values on g (the passes checked the layout)."""
        return len(op.q.labels) > 4

    def attention_support(self, op: Attention | AttentionAdjoint, printer: ArrayPrinter) -> str:
        """The support of ``op`` as code: at the scores' axes, or at its own for grouped heads (their helpers expand
        it over the members)."""
        if self.grouped(op):
            return self.support(op.support, printer.at(op.support.labels if op.support else ()))
        return self.support(op.support, printer.at(self.scores(op)))

    @staticmethod
    def scores(op: Attention | AttentionAdjoint) -> tuple[str, ...]:
        """The axes of the scores of (plain-head) attention: batch, head, row, column."""
        _, row, head, _ = op.q.labels
        return (BATCH, head, row, op.k.labels[1])

    def attention_adjoint(self, op: AttentionAdjoint, printer: ArrayPrinter) -> list[str]:
        printer.use("_softmax")  # the helper recomputes the kernel where no normalizer was kept
        support = self.attention_support(op, printer)
        helper = printer.use("_attention_adjoint")
        if self.grouped(op):  # the grouped helper calls the plain one where no normalizer was kept
            helper = printer.use("_grouped_attention_adjoint")
        return [f"{', '.join(op.outputs)} = {helper}({op.o_bar}, {op.q.name}, {op.k.name}, "
                f"{op.v.name}, {op.o}, {op.normalizer}, {printer.doprint(op.scale)}, {support})"]

    def normalize(self, op: Normalize, printer: ArrayPrinter) -> list[str]:
        """Each template defines ``_layer_norm`` and ``_rms_norm`` (statistics that cannot overflow)."""
        if not op.centred:
            return [f"{op.out} = {printer.use('_rms_norm')}({op.x.name}, {op.gain}, {printer.doprint(op.eps)})"]
        arguments = f"{op.x.name}, {op.gain}, {op.bias}, {printer.doprint(op.eps)}"
        if op.kept:
            return [f"{op.out}, {', '.join(op.kept)} = {printer.use('_kept_layer_norm')}({arguments})"]
        return [f"{op.out} = {printer.use('_layer_norm')}({arguments})"]

    def normalize_adjoint(self, op: NormalizeAdjoint, printer: ArrayPrinter) -> list[str]:
        call = f"{printer.use('_layer_norm_adjoint')}({op.costate}, {op.p}, {op.variance}, {op.gain}, {printer.doprint(op.eps)})"
        if op.gradients:
            return [f"{op.out}, {', '.join(op.gradients)} = {call}"]
        return [f"{op.out}, _, _ = {call}"]

    def elementwise(self, op: Elementwise, printer: ArrayPrinter) -> list[str]:
        """``out = expr``; where ``expr`` reads arrays but none along one of ``out``'s axes (a plug-in's
        ``y[i, l] = Σ_j u[j, l]``: the same at every ``i``), the value is made whole along it, as every later
        statement (a product's rows) takes ``out`` to be."""
        value = printer.doprint(op.expr)
        read = _read_labels(op.expr, printer)
        if read and not set(op.labels) <= read:
            value = self.whole(value, self.sizes(op.labels, printer))
        return [f"{op.out} = {value}"]

    def whole(self, value: str, shape: str) -> str:
        """``value`` broadcast to ``shape`` as an array of its own."""
        raise NotImplementedError

    def pair_table(self, op: PairTable, printer: ArrayPrinter) -> list[str]:
        """``out[.., c, ..] = entries[c]``: the entries side by side along ``c``."""
        rows = printer.at(tuple(label for label in op.labels if label != op.axis))
        entries = ", ".join(rows.doprint(entry) for entry in op.entries)
        return [f"{op.out} = {self.library}.stack(({entries}), {self.axis}={op.labels.index(op.axis)})"]

    def paired(self, out: str, x: str, diagonal: str, swapped: str, crossed: str) -> list[str]:
        """``out = x ∘ diagonal + swapped ∘ crossed``, the sum in place (one array fewer allocated)."""
        return [f"{out} = {x}*{diagonal}", f"{out} += {swapped}*{crossed}"]

    def swapped(self, x: str, axis: int) -> str:
        """``x`` with its axis ``axis`` (of two points) reversed."""
        return f"np.flip({x}, {axis})"

    def unrolled(self, op: Unrolled, printer: ArrayPrinter) -> list[str]:
        """``out[.., c, ..] = Σ_c̃ M[c][c̃] x[.., c̃, ..]``. With the pair's tables (``pair_tables``): ``D[c] x[c] +
        X[c] x[1 − c]``, the tables broadcast to ``out``. Else one elementwise row per point ``c``, stacked. A point of
        ``x`` or an array the entries read (broadcast to the rows) that more than one product reads is bound once
        (``out_<point>``, ``out_<array>``: one view, not one per product) and released after."""
        position = op.x.labels.index(op.summed)
        if op.tables is not None:
            diagonal, crossed = (broadcast(table.name, table.labels, op.labels) for table in op.tables)
            return self.paired(op.out, op.x.name, diagonal, self.swapped(op.x.name, position), crossed)
        trailing = ", :" * (len(op.x.labels) - 1 - position)
        rows = printer.at(tuple(label for label in op.labels if label != op.axis))
        reads = [part for row in op.entries for part, entry in enumerate(row) if entry != 0]
        parts = [f"{op.x.name}[..., {point}{trailing}]" for point in range(len(op.entries))]
        bound = {f"{op.out}_{point}": part for point, part in enumerate(parts) if reads.count(point) > 1}
        parts = [sp.Symbol(f"{op.out}_{point}" if f"{op.out}_{point}" in bound else part)
                 for point, part in enumerate(parts)]
        arrays = [array for row in op.entries for entry in row for array in sorted(entry.atoms(sp.Indexed), key=str)]
        shared = {array: sp.Symbol(f"{op.out}_{plain_name(array.base.label)}") for array in dict.fromkeys(arrays)
                  if arrays.count(array) > 1}
        bound.update({symbol.name: rows.doprint(array) for array, symbol in shared.items()})
        terms = ", ".join(rows.doprint(sum(entry.xreplace(shared) * part for entry, part in zip(row, parts)))
                          for row in op.entries)
        stacked = f"{op.out} = {self.library}.stack(({terms}), {self.axis}={op.labels.index(op.axis)})"
        if not bound:
            return [stacked]
        return [f"{', '.join(bound)} = {', '.join(bound.values())}", stacked, f"del {', '.join(bound)}"]

    def local_kernel(self, op: LocalKernel, printer: ArrayPrinter) -> list[str]:
        """Each window's channels times ``_window`` (the sum over the tokens within its distances)."""
        support = "None"
        if op.support:
            support = op.support if not op.transposed else \
                f"None if {op.support} is None else {op.support}.{self.transposed_support}"
        terms = []
        for window in op.windows:
            call = (f"{printer.use('_window')}({op.values.name}, {', '.join(op.positions)}, {float(window.low)!r}, "
                    f"{float(window.high)!r}, {support if window.masked else 'None'})")
            terms.append(call if window.channels == 1 else f"{printer.doprint(window.channels)} * {call}")
        return [f"{op.out} = {' + '.join(terms)}"]

    def gather(self, op: Gather, printer: ArrayPrinter) -> list[str]:
        """``_gather`` of the table with the summed axis last, its axes (the table's others, then the index's)
        moved to the output's."""
        table = op.table.name
        position = op.table.labels.index(op.axis)
        if position != len(op.table.labels) - 1:
            table = f"{self.library}.{self.move_axis}({table}, {position}, -1)"
        index = printer.at(op.index_labels).doprint(op.index)
        read = tuple(label for label in op.table.labels if label != op.axis) + op.index_labels
        order = tuple(read.index(label) for label in op.labels)
        moved = "" if order == tuple(range(len(order))) else f".{self.permute}{order}"
        return [f"{op.out} = {printer.use('_gather')}({table}, {index}){moved}"]

    def scatter(self, op: Scatter, printer: ArrayPrinter) -> list[str]:
        """``_scatter`` of the values (kept axes first) at their index, into the index's grid of ``op.axis``."""
        values = printer.at(op.values_labels).doprint(op.values)
        index = printer.at(op.index_labels).doprint(op.index)
        size = printer.use(SIZES[op.axis])
        call = f"{printer.use('_scatter')}({values}, {index}, {size}, {len(op.labels) - 1})"
        return [f"{op.out} = {self.scaled(call, op.scale, printer)}"]

    def cache(self, op: Cache, printer: ArrayPrinter) -> list[str]:
        return [f'{op.out} = {printer.use("_cache")}(cache, "{op.key}", {op.source.name})']

    def memoized(self, op: Memoized, printer: ArrayPrinter) -> list[str]:
        """The head of a ``Memoized`` op: its outputs read from the cache when it holds them for an equal memory,
        else (``else:``, the op's own statements follow) computed."""
        field = printer.use("_memoized_field")
        reads = [f'    {operand.name} = {field}(cache, "{key}", {self.sizes(operand.labels, printer)})'
                 for operand, key in zip(op.outputs, op.keys)]
        return [f'if {printer.use("_memoized")}(cache, "{op.key}", {op.source}{self.memoized_extra(printer)}):', *reads,
                "else:"]

    def shared(self, op: Shared, printer: ArrayPrinter) -> list[str]:
        """The head of a ``Shared`` op: its outputs read from ``shared`` where an earlier layer of the stack stored
        them under the same sizes, constants and cached tokens (``op.key``), else (``else:``, the op's own statements
        follow) computed."""
        key = " ".join("{%s}" % printer.use(name) for name in op.key)
        names = ", ".join(operand.name for operand in op.outputs)
        read = "shared[shared_key]" if len(op.outputs) > 1 else "shared[shared_key][0]"
        shares = f'{printer.use("_shares")}({printer.use(op.argument)})'
        return [f'shared_key = f"{key}" if shared is not None and {shares} else ""',
                "if shared is not None and shared_key in shared:", f"    {names} = {read}", "else:"]

    def share(self, op: Shared, printer: ArrayPrinter) -> list[str]:
        """The last statement of a ``Shared`` op's own: its outputs stored for the stack's later layers (computed
        from the default positions: given positions are the caller's, which a layer's hooks may change)."""
        names = ", ".join(operand.name for operand in op.outputs)
        return ["if shared is not None and shared_key:", f"    shared[shared_key] = [{names}]"]

    def memoized_extra(self, printer: ArrayPrinter) -> str:
        """Further arguments of ``_memoized``."""
        return ""

    def sizes(self, labels: tuple[str, ...], printer: ArrayPrinter) -> str:
        """The sizes of ``labels`` as a literal (a shape)."""
        return f"({_shape(labels, printer)})"

    def memoize(self, op: Memoized, printer: ArrayPrinter) -> list[str]:
        """The last statement of a ``Memoized`` op's own: its outputs stored with a copy of the memory."""
        fields = ", ".join(f'"{key}": {operand.name}' for operand, key in zip(op.outputs, op.keys))
        return [f'{printer.use("_memoize")}(cache, "{op.key}", {op.source}, {{{fields}}})']

    def window(self, op: Window, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {printer.use('_windows')}({op.source}, {op.axes}, {printer.code(op.size)}, "
                f"{printer.code(op.stride)}, {printer.code(op.padding)})"]

    def convolution_weight_adjoint(self, op: ConvolutionWeightAdjoint, printer: ArrayPrinter) -> list[str]:
        """The contraction the ``convolution-adjoint`` pass recognized, reading the windows where it read their
        array: one statement, under the contraction's formula."""
        read = {op.window.out: _value(self.window(op.window, printer), op.window.out)}
        operands = tuple(replace(operand, name=read.get(operand.name, operand.name)) for operand in op.product.operands)
        return self.contraction(replace(op.product, operands=operands), printer)

    def convolution_input_adjoint(self, op: ConvolutionInputAdjoint, printer: ArrayPrinter) -> list[str]:
        """The blocks and their fold the ``convolution-adjoint`` pass recognized: the fold reading the blocks' value
        where it read their array, one statement under the fold's formula."""
        blocks = _value(self.lines(op.blocks, printer.at(op.blocks.labels)), op.blocks.out)
        return self.fold(replace(op.fold, source=blocks), printer)

    def interleave(self, op: Interleave, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {printer.use('_interleave')}({op.source}, {op.axes})"]

    def point(self, op: Point, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {op.source}[{', '.join(str(i) for i in op.index)}]"]

    def rows(self, op: Rows, printer: ArrayPrinter) -> list[str]:
        sizes = ", ".join(printer.code(size) for size in op.sizes) + ("," if len(op.sizes) == 1 else "")
        return [f"{op.out} = {printer.use('_rows')}({op.source}, {op.axis}, {op.offset}, ({sizes}))"]

    def fold(self, op: Fold, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {printer.use('_fold')}({op.source}, {op.like}.shape, {op.axes}, {printer.code(op.size)}, "
                f"{printer.code(op.stride)}, {printer.code(op.padding)})"]

    def place(self, op: Place, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {self.zeros(op.source, op.like)}",
                f"{op.out}[{', '.join(str(i) for i in op.index)}] = {op.source}"]

    def place_rows(self, op: PlaceRows, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {printer.use('_place_rows')}({op.source}, {op.like}.shape, {op.axis}, {op.offset})"]

    def join(self, op: Join, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = {printer.use('_join')}({', '.join(op.parts)})"]

    def zeros(self, source: str, like: str) -> str:
        """Zeros shaped like ``like``, of ``source``'s type."""
        raise NotImplementedError

    def bound(self, argument: sp.Expr, buffer: str, printer: ArrayPrinter) -> str:
        """The other argument of ``max(buffer, argument)`` computed in place."""
        return printer.doprint(argument)

    def in_place(self, op: Elementwise, printer: ArrayPrinter, maximum: str, add: str) -> list[str]:
        """``op`` written into its dead operand ``op.reuse`` (see the ``reuse-buffers`` pass); ``maximum`` and
        ``add`` spell an in-place update of ``{value}`` (``{buffer}`` itself or an update of it) by ``{other}``."""
        if op.reuse is None:
            return Backend.elementwise(self, op, printer)
        target = next(a for a in op.expr.atoms(sp.Indexed) if str(a.base.label) == op.reuse)
        if isinstance(op.expr, sp.Max):
            (argument,) = (a for a in op.expr.args if not a.is_number)
            value = op.reuse  # max(buffer, number), or max(buffer + other, number): the sum in place first
            if argument != target:
                value = add.format(value=value, buffer=op.reuse, other=printer.doprint(argument - target))
            others = ", ".join(self.bound(a, op.reuse, printer) for a in op.expr.args if a != argument)
            return [f"{op.out} = {maximum.format(value=value, buffer=op.reuse, other=others)}"]
        return [f"{op.out} = {add.format(value=op.reuse, buffer=op.reuse, other=printer.doprint(op.expr - target))}"]


class NumpyBackend(Backend):
    name = "numpy"
    printer = NumpyPrinter
    einsum = "_einsum"
    library, axis = "np", "axis"
    move_axis, permute = "moveaxis", "transpose"
    transposed_support = "transpose(0, 2, 1)"
    frees_dead_arrays = True
    scratch_outputs = True

    def whole(self, value: str, shape: str) -> str:
        return f"np.broadcast_to({value}, {shape}).copy()"

    def mat_mul(self, op: MatMul, printer: ArrayPrinter) -> list[str]:
        rows = f"{op.x.name}.reshape(-1, {_width(op.contracted, printer)})"
        if len(op.outputs) == 1:
            lines = [f"{op.out} = {rows} @ {op.weights[0]}{'.T' if op.transposed else ''}"]
            if op.biases[0]:
                lines.append(f"{op.out} += {_addend(op, printer)}")
            return lines + [f"{op.out} = {op.out}.reshape({_shape(op.labels, printer)})"]
        biases = f", ({', '.join(op.biases)})" if op.biases[0] else ""
        lines = [f"{op.out} = {printer.use('_products')}({rows}, ({', '.join(op.weights)}){biases})"]
        names = ", ".join(name for name, _ in op.outputs)
        widths = _widths(op, printer)
        ends = ", ".join(str(sum(widths[:count])) for count in range(1, len(widths)))
        return lines + [f"{names} = np.split({op.out}, [{ends}], axis=1)"] + [
            f"{name} = {name}.reshape({_shape(labels, printer)})" for name, labels in op.outputs]

    def zeros(self, source: str, like: str) -> str:
        return f"np.zeros({like}.shape, dtype={source}.dtype)"

    def convolution(self, op: Convolution, printer: ArrayPrinter) -> list[str]:
        helper = printer.use("_depthwise_conv2d" if op.depthwise else "_conv2d")
        bias = f", {op.bias}" if op.bias else ""  # the helpers write the bias into their output
        slot = f', slot="{op.out}"' if op.scratch else ""  # memory the program holds (``_holding_scratch``)
        last = ".transpose(0, 2, 3, 1)" if op.channels_last else ""
        return [f"{op.out} = {helper}({op.x}, {op.weight}, {printer.code(op.stride)}, {printer.code(op.padding)}{bias}"
                f"{slot}){last}"]

    def transposed_convolution(self, op: TransposedConvolution, printer: ArrayPrinter) -> list[str]:
        bias = f", {op.bias}" if op.bias else ""
        return [f"{op.out} = {printer.use('_conv_transpose2d')}({op.x}, {op.weight}{bias})"]

    def bound(self, argument: sp.Expr, buffer: str, printer: ArrayPrinter) -> str:
        """A number as a row of ``buffer``: NumPy's maximum runs its vectorized loop for a row
        broadcast over the rows, a scalar operand takes a loop about 3× slower."""
        if not argument.is_number:
            return printer.doprint(argument)
        return f"np.full({buffer}.shape[-1:], {printer.doprint(argument)}, {buffer}.dtype)"

    def elementwise(self, op: Elementwise, printer: ArrayPrinter) -> list[str]:
        """In place into a dead product (``reuse-buffers``): a sum or ReLU by ``out=``, GELU and SiLU by their routines'
        ``out=``, then the other factors (SwiGLU's gate) multiplied in (llama at N 128: the statement 7.4 → 5.1 ms, the
        forward 66 → 60 ms, 3900 → 330 page faults a call)."""
        call = None if op.reuse is None else called(op.expr)
        if call is None:
            return self.in_place(op, printer, "np.maximum({value}, {other}, out={buffer})",
                                 "np.add({value}, {other}, out={buffer})")
        routine = {ExactGelu: printer.exact_gelu, TanhGelu: printer.tanh_gelu[0], Silu: printer.silu}[type(call)]
        lines = [f"{op.out} = {printer.use(routine)}({op.reuse}, out={op.reuse})"]
        if op.expr != call:
            lines.append(f"{op.out} *= {printer.doprint(op.expr / call)}")
        return lines


def _laid_out(op: Contraction) -> Contraction:
    """``op`` with its two operands in the order their own axes take in the output. torch's einsum lays a product of
    two out as (the axes both keep, the first operand's own, the second's) and permutes that to the output's order: a
    weight's gradient ``W̄[k, z] = Σ_i w̄[i, z] x[i, k]`` came out transposed, and autograd copied it into the
    parameter's layout (1.3 ms for each feed-forward kernel at B·N = 1024, float32)."""
    if len(op.operands) != 2:
        return op
    first, second = (set(operand.labels) for operand in op.operands)
    own = [label for label in op.labels if (label in first) != (label in second)]
    return replace(op, operands=op.operands[::-1]) if own and own[0] in second else op


class TorchBackend(Backend):
    name = "torch"
    printer = TorchPrinter
    einsum = "torch.einsum"
    library, axis = "torch", "dim"
    move_axis, permute = "movedim", "permute"
    transposed_support = "transpose(1, 2)"
    kernel_flags = (DROPOUT,)
    frees_dead_arrays = True  # the same page faults with torch's CPU allocator (4576 a call at N = 128)
    frees_in_branches = False
    shares_across_layers = True
    input_costate_last = True
    adjoint_flags = {"inference": "True  # no autograd inside: in-place updates are safe", "dropout_p": "0.0  # no dropout"}

    def whole(self, value: str, shape: str) -> str:
        return f"({value}).expand({shape}).contiguous()"

    def paired(self, out: str, x: str, diagonal: str, swapped: str, crossed: str) -> list[str]:
        """In place on the fresh product (autograd keeps the inputs of a product, not its result)."""
        return [f"{out} = ({x}*{diagonal}).addcmul_({swapped}, {crossed})"]

    def swapped(self, x: str, axis: int) -> str:
        return f"{x}.flip({axis})"

    def memoized_extra(self, printer: ArrayPrinter) -> str:
        """With autograd on, never reused: recomputed, so that gradients reach this call's memory and parameters."""
        return f", {printer.use(INFERENCE)}"

    def sizes(self, labels: tuple[str, ...], printer: ArrayPrinter) -> str:
        return f"[{_shape(labels, printer)}]"

    def lines(self, op: Op, printer: ArrayPrinter) -> list[str]:
        """``op``, then dropout of what it writes where torch has dropout (``Module.dropout``)."""
        dropped = [name for name in op.writes() if name in printer.module.dropout]
        return super().lines(op, printer) + [f"{name} = {printer.use('_dropout')}({name}, {printer.use(DROPOUT)})"
                                             for name in dropped]

    def elementwise(self, op: Elementwise, printer: ArrayPrinter) -> list[str]:
        """In place only without autograd: an in-place update of a view costs more in backward."""
        if op.reuse is None:
            return super().elementwise(op, printer)
        call = called(op.expr)
        if call is None:
            (line,) = self.in_place(op, printer, "{value}.clamp_min_({other})", "{value}.add_({other})")
        else:  # GELU or SiLU in place, then the gate's product
            options = {ExactGelu: "", TanhGelu: ', approximate="tanh"'}
            line = (f"{op.out} = torch.ops.aten.gelu_({op.reuse}{options[type(call)]})" if type(call) in options
                    else f"{op.out} = torch.nn.functional.silu({op.reuse}, inplace=True)")
            if op.expr != call:
                line += f".mul_({printer.doprint(op.expr / call)})"
        return [f"{line} if {printer.use(INFERENCE)} else {printer.doprint(op.expr)}"]

    def contraction(self, op: Contraction, printer: ArrayPrinter) -> list[str]:
        """A product of operands over the same axes, summed over some of them (a gain's gradient,
        ``Σ_bi P λ``), as ``torch.sum(a * b, dim=…)``: einsum spells it as a batch of
        matrix–vector products, about 50 times slower on CPU. Any other contraction: einsum."""
        labels = op.operands[0].labels
        summed = tuple(position for position, label in enumerate(labels) if label not in op.labels)
        if (len(op.operands) < 2 or any(operand.labels != labels for operand in op.operands[1:]) or not summed
                or tuple(label for label in labels if label in op.labels) != op.labels):
            return super().contraction(_laid_out(op), printer)
        product = " * ".join(operand.name for operand in op.operands)
        dim = summed if len(summed) > 1 else summed[0]
        return self.assigned(op, self.scaled(f"torch.sum({product}, dim={dim})", op.scale, printer), printer)

    def einsum_operand(self, name: str, op: Contraction) -> str:
        """A bool support, χ or the memory's χ_m (a plug-in's formula reading it as a factor), cast to the dtype of an
        operand that is none: torch's einsum has no bool."""
        other = next((operand.name for operand in op.operands if operand.name not in SUPPORTS), None)
        return f"{name}.to({other}.dtype)" if name in SUPPORTS and other is not None else name

    def mat_mul(self, op: MatMul, printer: ArrayPrinter) -> list[str]:
        rows = f"{op.x.name}.reshape(-1, {_width(op.contracted, printer)})"
        if len(op.outputs) == 1:
            weight, bias = op.weights[0] + (".t()" if op.transposed else ""), _addend(op, printer)
        else:
            weight = f"{printer.use('_cat')}([{', '.join(op.weights)}], 1)"
            bias = f"_cat([{', '.join(op.biases)}], 0)" if op.biases[0] else None
        product = f"torch.addmm({bias}, {rows}, {weight})" if bias else f"torch.mm({rows}, {weight})"
        if len(op.outputs) == 1:
            return [f"{op.out} = {product}.view({_shape(op.labels, printer)})"]
        names = ", ".join(name for name, _ in op.outputs)
        widths = ", ".join(str(width) for width in _widths(op, printer))
        return [f"{op.out} = {product}", f"{names} = {op.out}.split_with_sizes([{widths}], dim=1)"] + [
            f"{name} = {name}.view({_shape(labels, printer)})" for name, labels in op.outputs]

    def zeros(self, source: str, like: str) -> str:
        return f"{source}.new_zeros({like}.shape)"

    def convolution(self, op: Convolution, printer: ArrayPrinter) -> list[str]:
        weight = _torch_kernel(op.weight, op.depthwise)
        groups = f", groups={op.x}.shape[1]" if op.depthwise else ""
        last = ".permute(0, 2, 3, 1)" if op.channels_last else ""
        return [f"{op.out} = torch.nn.functional.conv2d({op.x}, {weight}, {op.bias}, {printer.code(op.stride)}, "
                f"{printer.code(op.padding)}{groups}){last}"]

    def convolution_weight_adjoint(self, op: ConvolutionWeightAdjoint, printer: ArrayPrinter) -> list[str]:
        """torch's convolution backward for the kernel alone (the weight it is handed only gives the kernel's shape),
        its (l, c, r, s) gradient in canonical order."""
        x, size = op.window.source, printer.code(op.window.size)
        shape = (f"{x}.shape[1], 1, {size}, {size}" if op.depthwise
                 else f"{op.costate}.shape[1], {x}.shape[1], {size}, {size}")
        order = ".squeeze(1).permute(1, 2, 0)" if op.depthwise else ".permute(1, 2, 3, 0)"
        call = _convolution_backward(op.costate, x, f"{x}.new_empty(({shape}))", op.window, op.depthwise, "False, True",
                                     printer)
        return [f"{op.out} = {call}[1]{order}"]

    def convolution_input_adjoint(self, op: ConvolutionInputAdjoint, printer: ArrayPrinter) -> list[str]:
        """torch's convolution backward for the input alone, one per convolution (the input it is handed gives the
        costate's shape), summed."""
        terms = [_convolution_backward(costate, op.fold.like, _torch_kernel(weight, op.depthwise), op.fold, op.depthwise,
                                       "True, False", printer) + "[0]" for costate, weight in op.terms]
        return [f"{op.out} = {' + '.join(terms)}"]

    def transposed_convolution(self, op: TransposedConvolution, printer: ArrayPrinter) -> list[str]:
        return [f"{op.out} = torch.nn.functional.conv_transpose2d({op.x}, {op.weight}.permute(0, 3, 1, 2), {op.bias}, "
                f"{op.weight}.shape[1])"]


BACKENDS = {"numpy": NumpyBackend(), "torch": TorchBackend()}
