"""Own printers for NumPy and PyTorch: SymPy expressions over named axes → code.

An array ``alpha[i]`` read in a statement whose output has axes ``(b, i, l)`` is printed
``alpha[:, :, None]``: every operand is broadcast to the output axes explicitly.
Expressions without arrays are scalars and use ``math``, so that float32 stays float32.
"""

from __future__ import annotations

import sympy as sp
from sympy.core import numbers, relational
from sympy.functions.elementary import piecewise
from sympy.logic import boolalg
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

from splitformer.symbolic.domains import (
    ATTENTION_FEATURES, BUCKETS, FEATURES, FREQUENCIES, GROUP, HEAD_FEATURES, HEADS, HIDDEN, KV_FEATURES, KV_HEADS,
    MEMORY, TOKENS,
)

from splitformer.symbolic.cnn_operators import STRIDE
from splitformer.symbolic.cvt_pieces import KEY_COLS, KEY_ROWS
from splitformer.symbolic.image import CHANNELS, CLASSES, COLS, KERNEL_ROWS, ROWS
from splitformer.symbolic.vision_operators import PATCH

from splitformer.symbolic.program import Number
from splitformer.symbolic.trusted_expressions import plain_function_class

from .bool_values import SUPPORTS, is_bool
from .ir import (BATCH, CALLS, ExactGelu, ExactGeluBackward, Mask, Module, Numbers, Operand, Sigmoid, Silu, SiluBackward,
                 TanhGelu, TanhGeluBackward, Where)

__all__ = ["ArrayPrinter", "NumpyPrinter", "TorchPrinter", "broadcast", "SIZE_NAMES", "CODE_NAMES", "code",
           "printable_class", "plain_name"]

#: Size symbols of the derivation and their names in emitted code.
SIZE_NAMES = {domain.size: domain.code_name for domain in (TOKENS, FEATURES, HEADS, HEAD_FEATURES, HIDDEN, KV_HEADS,
                                                           GROUP, FREQUENCIES, KV_FEATURES, ATTENTION_FEATURES, MEMORY,
                                                           BUCKETS)}
#: Symbols of the network derivations (sizes, kernels, strides) and their names in emitted code.
CODE_NAMES = {**SIZE_NAMES, PATCH: "patch_size", STRIDE: "stride", KERNEL_ROWS.size: "kernel_size",
              CHANNELS.size: "n_channels", ROWS.size: "n_rows", COLS.size: "n_cols", CLASSES.size: "n_classes",
              KEY_ROWS: "n_rows_kv", KEY_COLS: "n_cols_kv"}


def code(expr: sp.Expr) -> str:
    """A size or configuration expression (``P``, ``2``) as code."""
    expr = sp.sympify(expr)
    return str(expr.xreplace({symbol: sp.Symbol(CODE_NAMES.get(symbol, symbol.name)) for symbol in expr.free_symbols}))


#: Where SymPy defines the classes a printer dispatches on (by class name: ``_print_Add``).
_SYMPY_NAMESPACES = (sp, numbers, boolalg, piecewise, relational)


def printable_class(cls: type) -> bool:
    """``cls`` is the SymPy class of its name, splitformer's ``Number`` or ``sympy.Function(name)``: no
    user class reaches a ``_print_<name>`` method by borrowing a name."""
    name = cls.__name__
    return (cls is Number or cls in CALLS or plain_function_class(cls)
            or type(name) is str and any(getattr(namespace, name, None) is cls for namespace in _SYMPY_NAMESPACES))


def plain_name(symbol: sp.Basic) -> str:
    """The name of a ``Symbol`` (an ``Idx`` by its label) as printed: an exact ``str`` on one line (an
    array's name may be a view, ``attn_q[..., 0, :]``), never what a subclass of ``str`` or of ``Symbol``
    would print."""
    if type(symbol) is sp.Idx:
        symbol = symbol.label
    name = symbol.name if type(symbol) is sp.Symbol else None
    if type(name) is not str or not name.isprintable():
        raise AssertionError(f"not a name the printers print: {type(symbol).__name__} {str.__str__(name)[:64]!r}"
                             if isinstance(name, str) else f"not a name the printers print: {type(symbol).__name__}")
    return name


def broadcast(name: str, labels: tuple[str, ...], out: tuple[str, ...], library: str = "") -> str:
    """``name`` indexed so that its axes ``labels`` line up with the axes ``out`` (its axes
    permuted first where they come in another order, e.g. a depth-wise kernel ``W[r, s, l]``
    read at ``(b, l, p, q, r, s)``)."""
    if labels == out[len(out) - len(labels):]:
        return name
    positions = [out.index(label) for label in labels]
    if positions != sorted(positions):
        if not library:
            raise AssertionError(f"{name}{labels} is not ordered like {out}")
        order = tuple(sorted(range(len(labels)), key=positions.__getitem__))
        name = f"np.transpose({name}, {order})" if library == "np" else f"{name}.permute{order}"
        labels = tuple(labels[axis] for axis in order)
        positions = sorted(positions)
    index = [":" if label in labels else "None" for label in out]
    while index and index[-1] == ":":
        index.pop()
    return f"{name}[{', '.join(index)}]" if index else name  # a permutation alone: the transposed array


class ArrayPrinter(StrPrinter):
    """Prints an elementwise expression for the statement whose output axes are ``out``."""

    library = ""
    functions: dict[str, str] = {}
    #: The routines of the recognized activations and their adjoints (each backend's: its library's, else its runtime's):
    #: ``exact_gelu``; ``tanh_gelu`` with its extra arguments; ``silu``; ``silu_backward`` (λ d/dx Silu(x));
    #: ``gelu_backward`` (λ d/dx of either GELU, torch's signature: the approximation an option).
    exact_gelu: str
    tanh_gelu: tuple[str, str]
    silu: str
    #: σ(x) = 1/(1 + e^{−x}): the library's routine, or "" for the formula itself.
    sigmoid: str
    silu_backward: str
    gelu_backward: str
    #: The array method call that casts to the dtype of the array ``like`` (no copy where it has that dtype: a support
    #: read as a factor has).
    cast: str
    #: No object prints itself: SymPy would call any expression's method of this name (a user's class too).
    printmethod = None

    def __init__(self, module: Module, out: tuple[str, ...] = (), used: set[str] | None = None):
        super().__init__({"order": "none"})
        self.module = module
        self.out = out
        #: The names the printed code reads besides arrays (helpers, sizes, flags), as they are printed.
        self.used = set() if used is None else used

    def at(self, out: tuple[str, ...]) -> "ArrayPrinter":
        """A printer for the axes ``out`` that records into the same ``used``."""
        return type(self)(self.module, out, self.used)

    def use(self, name: str) -> str:
        """``name`` (a helper, a size, a flag), recorded as read by the printed code."""
        self.used.add(name)
        return name

    def code(self, expr: sp.Expr) -> str:
        """A size or configuration expression (``P``, ``2``) as code, its names recorded."""
        self.used.update(CODE_NAMES.get(symbol, symbol.name) for symbol in sp.sympify(expr).free_symbols)
        return code(expr)

    def _print(self, expr: object, **kwargs) -> str:
        """Only SymPy's own classes (and splitformer's, and ``sympy.Function(name)``) are dispatched:
        SymPy picks a ``_print_<class name>`` method by name, which a user's class could borrow."""
        if isinstance(expr, sp.Basic) and not printable_class(type(expr)):
            raise AssertionError(f"{self.library or 'the'} printer does not print a {type(expr).__name__}")
        return super()._print(expr, **kwargs)

    def emptyPrinter(self, expr: object) -> str:
        raise AssertionError(f"no {self.library} spelling for a {type(expr).__name__}")

    def _print_Indexed(self, expr: sp.Indexed) -> str:
        name = plain_name(expr.base.label)
        labels = tuple(plain_name(index) for index in expr.indices)
        if self.module.batched(name):
            labels = (BATCH,) + labels
        return broadcast(name, labels, self.out, self.library)

    def _print_Idx(self, expr: sp.Idx) -> str:
        """A grid index used as a value: the grid's coordinates ``0, 1, …`` along its axis."""
        size = self._print(expr.upper + 1)
        return broadcast(f"{self.use('_grid')}({size}, u0)", (plain_name(expr),), self.out)

    def _print_Symbol(self, expr: sp.Symbol) -> str:
        return self.use(SIZE_NAMES.get(expr) or plain_name(expr))

    def call(self, function: str, *args: sp.Expr) -> str:
        if function not in self.functions:
            raise AssertionError(f"no {self.library} spelling for {function}")
        name = self.use(self.functions[function]) if any(arg.has(sp.Indexed) for arg in args) else f"math.{function}"
        return f"{name}({', '.join(self._print(arg) for arg in args)})"

    def _print_Function(self, expr: sp.Function) -> str:
        return self.call(type(expr).__name__, *expr.args)

    def _print_ExactGelu(self, expr: ExactGelu) -> str:
        """The ``gelu`` pass's call (``exact_gelu``: the library's routine); a user's function of that
        name is no GELU and has no spelling."""
        if type(expr) is not ExactGelu:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        return f"{self.use(self.exact_gelu)}({self._print(expr.args[0])})"

    def _print_TanhGelu(self, expr: TanhGelu) -> str:
        """The ``gelu-tanh`` pass's call (``tanh_gelu``: the library's routine and its extra arguments); a
        user's function of that name has no spelling."""
        if type(expr) is not TanhGelu:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        function, options = self.tanh_gelu
        return f"{self.use(function)}({self._print(expr.args[0])}{options})"

    def _print_Silu(self, expr: Silu) -> str:
        """The ``silu`` pass's call (``silu``); a user's function of that name is no SiLU and has no spelling."""
        if type(expr) is not Silu:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        return f"{self.use(self.silu)}({self._print(expr.args[0])})"

    def _print_Sigmoid(self, expr: Sigmoid) -> str:
        """``codegen.logistic``'s σ (``sigmoid``: the library's routine, else its formula); a user's function of that
        name has no spelling."""
        if type(expr) is not Sigmoid:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        if self.sigmoid:
            return f"{self.use(self.sigmoid)}({self._print(expr.args[0])})"
        return f"({self._print(Sigmoid.formula(expr.args[0]))})"

    def _print_SiluBackward(self, expr: SiluBackward) -> str:
        """The ``silu-adjoint`` pass's call; a user's function of that name has no spelling."""
        if type(expr) is not SiluBackward:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        return f"{self.use(self.silu_backward)}({self.backward_operands(*expr.args)})"

    def backward_operands(self, costate: sp.Expr, x: sp.Expr) -> str:
        """The operands of a backward routine, ``costate, x`` (broadcast against each other by the routine)."""
        return f"{self._print(costate)}, {self._print(x)}"

    def _print_ExactGeluBackward(self, expr: ExactGeluBackward) -> str:
        """The ``gelu-adjoint`` pass's call for the exact GELU."""
        return self._gelu_backward(expr, ExactGeluBackward, "")

    def _print_TanhGeluBackward(self, expr: TanhGeluBackward) -> str:
        """The ``gelu-adjoint`` pass's call for GELU's tanh approximation."""
        return self._gelu_backward(expr, TanhGeluBackward, ', approximate="tanh"')

    def _gelu_backward(self, expr: sp.Expr, call: type, option: str) -> str:
        """``λ`` times the GELU's derivative (``gelu_backward``, with ``option``); a user's function of that name has no
        spelling."""
        if type(expr) is not call:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        return f"{self.use(self.gelu_backward)}({self.backward_operands(*expr.args)}{option})"

    def _print_Abs(self, expr: sp.Abs) -> str:
        """``|v|``: the library's ``abs`` on arrays, Python's on numbers."""
        argument = expr.args[0]
        function = self.functions["Abs"] if argument.has(sp.Indexed) else "abs"
        return f"{function}({self._print(argument)})"

    def _print_Pow(self, expr: sp.Pow, rational: bool = False) -> str:
        base, exponent = expr.args
        if exponent == sp.Rational(1, 2):
            return self.call("sqrt", base)
        if exponent == -sp.Rational(1, 2):
            return f"1 / {self.call('sqrt', base)}"
        return super()._print_Pow(expr, rational)

    def _print_Pi(self, expr: sp.Expr) -> str:
        return "math.pi"

    def _print_Rational(self, expr: sp.Rational) -> str:
        return f"{expr.p}/{expr.q}" if expr.q != 1 else str(expr.p)

    def _print_Heaviside(self, expr: sp.Heaviside) -> str:
        """The step function with value 0 at 0 (the subgradient of ``max(0, v)`` torch uses) or 1 (``v ≥ 0``);
        ``codegen.bool_values`` writes any other as a step and a δ."""
        argument, *at_zero = expr.args
        if at_zero not in ([0], [1]):
            raise AssertionError(f"no spelling for {expr}: the step function's value at 0 must be 0 or 1")
        return f"({self._print(argument)} {'>' if at_zero == [0] else '>='} 0)"

    def _print_Where(self, expr: Where) -> str:
        """``a`` where ``m`` is not 0 (``condition``), else ``b``; a user's function of that name has no spelling."""
        if type(expr) is not Where:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        mask, value, otherwise = expr.args
        return f"{self.library}.where({self.condition(mask)}, {self._print(value)}, {self._print(otherwise)})"

    def _print_Mask(self, expr: Mask) -> str:
        """Where ``m`` is not 0, as bools; a user's function of that name has no spelling."""
        if type(expr) is not Mask:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        return self.condition(expr.args[0])

    def condition(self, mask: sp.Expr) -> str:
        """Where ``mask`` is not 0, as bools: a step or δ is its own condition; anything else (a count, a support read
        as a factor: in the state's dtype) is compared with 0."""
        if not is_bool(mask) or any(str(item.base.label) in SUPPORTS for item in mask.atoms(sp.Indexed)):
            return f"{self.parenthesize(mask, PRECEDENCE['Func'], strict=True)} != 0"
        return self._print(mask)

    def _print_Numbers(self, expr: Numbers) -> str:
        """A bool array as numbers in the dtype of the array ``like``; a user's function of that name has no
        spelling."""
        if type(expr) is not Numbers:
            raise AssertionError(f"no {self.library} spelling for {type(expr).__name__}")
        value, like = expr.args
        return f"{self.parenthesize(value, PRECEDENCE['Func'], strict=True)}.{self.cast.format(like=like)}"

    def _print_KroneckerDelta(self, expr: sp.KroneckerDelta) -> str:
        """``δ(i, j)``: 1 where the two are equal, else 0 (a boolean array, or a Python bool, multiplies as 1/0)."""
        return f"({self._print(expr.args[0])} == {self._print(expr.args[1])})"

    def _scalars_last(self, expr: sp.Expr) -> tuple[list[sp.Expr], list[sp.Expr]]:
        """The arguments of ``Min``/``Max`` that hold arrays, and the others (numbers and sizes)."""
        return ([arg for arg in expr.args if arg.has(sp.Indexed)],
                [arg for arg in expr.args if not arg.has(sp.Indexed)])

    def operand(self, operand: Operand) -> str:
        return broadcast(operand.name, operand.labels, self.out)


class NumpyPrinter(ArrayPrinter):
    library = "np"
    exact_gelu = "_gelu"
    tanh_gelu = ("_gelu_tanh", "")
    silu = "_silu"
    sigmoid = ""  # the formula: 1/(1 + e^{−x}) is 0 where e^{−x} overflows, never NaN
    silu_backward = "_silu_backward"
    gelu_backward = "_gelu_backward"
    cast = "astype({like}.dtype, copy=False)"
    functions = {"exp": "np.exp", "sqrt": "np.sqrt", "erf": "_erf", "tanh": "np.tanh", "cos": "np.cos", "sin": "np.sin",
                 "Abs": "np.abs", "log": "np.log", "floor": "np.floor", "sign": "np.sign"}

    def _print_Pow(self, expr: sp.Pow, rational: bool = False) -> str:
        """An array to a small integer power above 2 as a product: NumPy squares an array itself but raises it to the
        third power through ``pow`` per element (90 ms against 0.34 for x·x·x, 2 M float32 values)."""
        base, exponent = expr.args
        if exponent.is_Integer and 3 <= exponent <= 4 and base.has(sp.Indexed):
            factor = self.parenthesize(base, PRECEDENCE["Mul"])
            return f"({'*'.join([factor] * int(exponent))})"
        return super()._print_Pow(expr, rational)

    def _print_Max(self, expr: sp.Max) -> str:
        return self._pairwise("np.maximum", "max", expr)

    def _print_Min(self, expr: sp.Min) -> str:
        return self._pairwise("np.minimum", "min", expr)

    def _pairwise(self, function: str, builtin: str, expr: sp.Expr) -> str:
        """``function`` takes two operands (a third would be its ``out``): nest for more; Python's own
        ``min``/``max`` where no operand is an array."""
        arrays, scalars = self._scalars_last(expr)
        if not arrays:
            return f"{builtin}({', '.join(self._print(arg) for arg in scalars)})"
        operands = [self._print(arg) for arg in arrays + scalars]
        text = operands[0]
        for operand in operands[1:]:
            text = f"{function}({text}, {operand})"
        return text


class TorchPrinter(ArrayPrinter):
    library = "torch"
    exact_gelu = "torch.nn.functional.gelu"
    tanh_gelu = ("torch.nn.functional.gelu", ', approximate="tanh"')
    silu = "torch.nn.functional.silu"  # one kernel; torch.exp is MKL's, which threads even a row of 688 (ms under load)
    sigmoid = "torch.sigmoid"  # its autograd is σ(1 − σ): the formula's, (e^{−x})′/(1 + e^{−x})², is ∞/∞ past 88 in float32
    silu_backward = "torch.ops.aten.silu_backward"  # one kernel, what autograd runs for torch's silu
    gelu_backward = "torch.ops.aten.gelu_backward"  # one kernel, what autograd runs for torch's gelu
    cast = "to({like}.dtype)"
    functions = {"exp": "torch.exp", "sqrt": "torch.sqrt", "erf": "torch.erf", "tanh": "torch.tanh",
                 "cos": "torch.cos", "sin": "torch.sin", "Abs": "torch.abs", "log": "torch.log", "floor": "torch.floor",
                 "sign": "torch.sign"}

    def backward_operands(self, costate: sp.Expr, x: sp.Expr) -> str:
        """``costate, x``; broadcast to one shape first unless both have the statement's: ``x`` read over all its axes
        and the costate reading an array where ``x`` is. torch's backward kernels take operands of one shape
        (float32 ``gelu_backward`` fails on others)."""
        operands = super().backward_operands(costate, x)
        if self._print(x).isidentifier() and any(item.indices == x.indices for item in costate.atoms(sp.Indexed)):
            return operands
        return f"*torch.broadcast_tensors({operands})"

    def _print_Max(self, expr: sp.Max) -> str:
        numbers = [arg for arg in expr.args if arg.is_number]
        tensors = [arg for arg in expr.args if not arg.is_number]
        if numbers == [0] and len(tensors) == 1:
            return f"torch.relu({self._print(tensors[0])})"
        return self._bound(expr, "clamp_min", "torch.maximum", "max")

    def _print_Min(self, expr: sp.Min) -> str:
        return self._bound(expr, "clamp_max", "torch.minimum", "min")

    def _print_Mul(self, expr: sp.Mul) -> str:
        """``θ(s, 0) g`` (ReLU's adjoint) over the statement's axes as torch's own ReLU backward,
        ``threshold_backward(g, s, 0)`` (g where s > 0, else 0): one pass, no mask array."""
        steps = [factor for factor in expr.args if isinstance(factor, sp.Heaviside)]
        others = [factor for factor in expr.args if not isinstance(factor, sp.Heaviside)]
        if len(steps) == 1 and len(others) == 1 and steps[0].args[1:] == (0,):
            argument, gradient = steps[0].args[0], others[0]
            names = [self._print(value) for value in (gradient, argument)]
            if all(isinstance(value, sp.Indexed) and plain_name(value.base.label) == name
                   for value, name in zip((gradient, argument), names)):
                return f"torch.ops.aten.threshold_backward({names[0]}, {names[1]}, 0)"
        return super()._print_Mul(expr)

    def _bound(self, expr: sp.Expr, clamp: str, function: str, builtin: str) -> str:
        """Tensors folded pairwise with ``function``, then each number or size through ``torch.clamp_*``;
        Python's own ``min``/``max`` where no operand is a tensor."""
        tensors, numbers = self._scalars_last(expr)
        if not tensors:
            return f"{builtin}({', '.join(self._print(arg) for arg in numbers)})"
        text = self._print(tensors[0])
        for tensor in tensors[1:]:
            text = f"{function}({text}, {self._print(tensor)})"
        for number in numbers:
            text = f"torch.{clamp}({text}, {self._print(number)})"
        return text
