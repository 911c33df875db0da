"""A small tensor IR: the operations the emitted code is made of.

Every tensor has named axes (``b`` is the batch axis, the other labels are the grid index
letters of the derivation). Operations: an einsum ``Contraction`` (with an optional scale
and bias), a row ``Softmax`` restricted to an optional support, a ``Reduction`` (sum or
mean of an elementwise body over one axis) and an ``Elementwise`` map. Elementwise
expressions are SymPy expressions whose arrays appear as ``Indexed`` objects; a printer
broadcasts each one to the output axes.

The operations of networks' reads and writes at patterns of grid indices:

- ``Window``: a field read at shifted points ``S p + r − padding`` along some axes, as a
  view whose shifted axes are replaced by the coarse grid and whose kernel offsets are
  appended (what ``sliding_window_view`` / ``Tensor.unfold`` give);
- ``Interleave``: the inverse of a window view with kernel = stride: a field computed per
  coarse node and offset ``(…, p, …, r)`` written at the fine nodes ``S p + r``;
- ``Point``: a point functional, the state at one node of an axis;
- ``Rows``: a field read at the nodes ``offset + N_2 p + q`` of one axis, as a view with
  that axis unflattened to ``(p, q)`` (the grid nodes of the token domain);
- ``Fold``, ``Place`` and ``PlaceRows``: the adjoints of ``Window``, ``Point`` and ``Rows``
  (values written at the points a view read, summed where windows overlap, zero elsewhere),
  shaped like ``like``;
- ``Join``: token nodes written at patterns of the token axis (a node, the grid rows after
  it), one part after another (a token concatenation);
- ``Convolution`` and ``TransposedConvolution``: a ``Window`` and the contraction that sums
  it against a kernel, or a contraction and the ``Interleave`` of its blocks, recognized as
  one operation (``codegen.passes.convolution``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import sympy as sp
from sympy.printing.precedence import PRECEDENCE

from splitformer.symbolic.domains import Domain
from splitformer.symbolic.inputs import Constant, Input

__all__ = [
    "Operand", "Op", "Contraction", "Softmax", "Reduction", "Elementwise", "MatMul", "Attention", "AttentionAdjoint",
    "Unrolled", "PairTable", "Normalize", "NormalizeAdjoint", "Cache", "Branch", "Memoized", "Shared", "TokenWindow", "LocalKernel", "Gather", "Scatter",
    "TensorInfo", "Module", "readers", "flat", "BATCH", "UNBATCHED_ROLES", "WINDOW_NOTE", "ExactGelu", "TanhGelu", "Silu", "SiluBackward",
    "ExactGeluBackward", "TanhGeluBackward", "Numbers", "Where", "CALLS", "Sigmoid",
    "ConvolutionWeightAdjoint", "ConvolutionInputAdjoint",
    "Window", "Interleave", "Point", "Rows", "Fold", "Place", "PlaceRows", "Join", "Convolution", "TransposedConvolution", "ZerosLike",
]

BATCH = "b"
#: What a window view's comment says after the formula of the field it reads.
WINDOW_NOTE = " at every grid point and kernel offset (a view)"
#: Roles of tensors without a batch axis: learned controls and their gradients.
UNBATCHED_ROLES = ("param", "gradient")


@dataclass(frozen=True)
class Operand:
    """A tensor read with the given axis labels."""

    name: str
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Op:
    out: str
    labels: tuple[str, ...]
    comment: str = ""
    section: str = ""

    def reads(self) -> list[str]:
        raise NotImplementedError

    def writes(self) -> list[str]:
        return [self.out]

    def with_comment(self, comment: str, section: str) -> "Op":
        return replace(self, comment=comment, section=section)


def _indexed_names(expr: sp.Expr) -> list[str]:
    return list(_array_names(expr))


@lru_cache(maxsize=8192)
def _array_names(expr: sp.Expr) -> tuple[str, ...]:
    """The arrays ``expr`` reads, sorted (remembered: the passes ask for an op's reads often); a grid index used
    as a value reads the state ``u0`` too (printed ``_grid(size, u0)``: the coordinates in u0's dtype and device), and
    a bool value cast to numbers (``Numbers``) reads the array whose dtype it takes."""
    arrays = expr.atoms(sp.Indexed)
    grids = expr.xreplace({item: sp.Integer(1) for item in arrays}).atoms(sp.Idx)
    likes = {str(cast.args[1]) for cast in expr.atoms(Numbers)}
    return tuple(sorted({str(item.base.label) for item in arrays} | ({"u0"} if grids else set()) | likes))


class Where(sp.Function):
    """``Where(m, a, b)``: ``a`` where ``m`` is not 0, else ``b`` (``codegen.bool_values`` writes it: a quotient that
    is 0 where a support is empty, and its denominators read as 1 there)."""

    nargs = 3
    is_real = True


class Mask(sp.Function):
    """``Mask(m)``: where ``m`` is not 0, as a bool array (the lowering writes it: what a softmax a plug-in writes
    itself keeps, its steps times the support)."""

    nargs = 1


class Numbers(sp.Function):
    """``Numbers(x, like)``: a bool array (a step, δ or support, or their product) as numbers in the dtype of the array
    named ``like`` (the state ``u0``; ``codegen.bool_values`` writes it where arithmetic other than a floating
    product reads the bools)."""

    nargs = 2
    is_real = True


class ExactGelu(sp.Function):
    """``x (1 + erf(x/√2))/2`` as one call (the ``gelu`` pass writes it; each backend spells it). ``formula``: the
    formula the passes recognize, differentiate, and a backend without a routine prints."""

    nargs = 1

    @staticmethod
    def formula(x: sp.Expr) -> sp.Expr:
        return x * (1 + sp.erf(x / sp.sqrt(2))) / 2


class TanhGelu(sp.Function):
    """``x (1 + tanh(√(2/π) (x + 0.044715 x³)))/2``, GELU's tanh approximation (Hendrycks and Gimpel's 0.044715), as
    one call (the ``gelu-tanh`` pass writes it; each backend spells it). ``formula``: as ``ExactGelu``'s."""

    nargs = 1

    @staticmethod
    def formula(x: sp.Expr) -> sp.Expr:
        return x * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (x + sp.Rational(44715, 10**6) * x**3))) / 2


class Silu(sp.Function):
    """``x/(1 + e^{−x})`` as one call (the ``silu`` pass writes it; each backend spells it). ``formula``: as
    ``ExactGelu``'s."""

    nargs = 1

    @staticmethod
    def formula(x: sp.Expr) -> sp.Expr:
        return x / (1 + sp.exp(-x))


class Sigmoid(sp.Function):
    """``1/(1 + e^{−x})``, written so by ``codegen.logistic`` wherever a formula divides by ``1 + e^{±x}`` (each
    backend spells it): a value in [0, 1] that no exponential's overflow makes NaN. ``formula``: as ``ExactGelu``'s."""

    nargs = 1

    @staticmethod
    def formula(x: sp.Expr) -> sp.Expr:
        return 1 / (1 + sp.exp(-x))


class SiluBackward(sp.Function):
    """``λ d/dx Silu(x) = λ σ(x) (1 + x (1 − σ(x)))``, ``σ(x) = 1/(1 + e^{−x})``, of a costate ``λ`` and ``x`` as one
    call (the ``silu-adjoint`` pass writes it; each backend spells it)."""

    nargs = 2


class ExactGeluBackward(sp.Function):
    """``λ d/dx ExactGelu(x)`` of a costate ``λ`` and ``x`` as one call (the ``gelu-adjoint`` pass writes it; each
    backend spells it: a library's routine, else the product itself, whose precedence it has)."""

    nargs = 2
    precedence = PRECEDENCE["Mul"]


class TanhGeluBackward(sp.Function):
    """``λ d/dx TanhGelu(x)`` of a costate ``λ`` and ``x`` as one call (the ``gelu-adjoint`` pass writes it; each
    backend spells it: a library's routine, else the product itself, whose precedence it has)."""

    nargs = 2
    precedence = PRECEDENCE["Mul"]


#: The calls the passes (and ``codegen.bool_values``) write into elementwise formulas, each printed by the backends' own
#: method.
CALLS = (ExactGelu, TanhGelu, Silu, Sigmoid, SiluBackward, ExactGeluBackward, TanhGeluBackward, Numbers, Where, Mask)


@dataclass(frozen=True)
class Contraction(Op):
    operands: tuple[Operand, ...] = ()
    scale: sp.Expr = sp.Integer(1)
    bias: Operand | None = None

    def reads(self) -> list[str]:
        return [operand.name for operand in self.operands] + ([self.bias.name] if self.bias else [])

    @property
    def spec(self) -> str:
        return ",".join("".join(operand.labels) for operand in self.operands) + "->" + "".join(self.labels)


@dataclass(frozen=True)
class Softmax(Op):
    scores: Operand | None = None
    support: Operand | None = None
    #: Whether torch drops kernel entries in training: an attention's kernel γ, not another kind's weights.
    dropout: bool = True

    def reads(self) -> list[str]:
        return [self.scores.name] + ([self.support.name] if self.support else [])


@dataclass(frozen=True)
class Reduction(Op):
    body: sp.Expr = sp.Integer(0)
    body_labels: tuple[str, ...] = ()
    axis: str = ""
    mean: bool = True

    def reads(self) -> list[str]:
        return _indexed_names(self.body)


@dataclass(frozen=True)
class Elementwise(Op):
    expr: sp.Expr = sp.Integer(0)
    #: A dead temporary that may hold the result (set by the ``reuse-buffers`` pass).
    reuse: str | None = None

    def reads(self) -> list[str]:
        return _indexed_names(self.expr)


@dataclass(frozen=True)
class ZerosLike(Op):
    """``out = 0``, shaped and typed like ``like``: the gradient of a parameter that no assignment reaches (its
    operator only in branches of weight 0)."""

    like: str = ""

    def reads(self) -> list[str]:
        return [self.like]


@dataclass(frozen=True)
class TensorInfo:
    """What the emitter needs to know of a tensor that is not computed by an op."""

    name: str
    role: str
    labels: tuple[str, ...]
    parameter: str | None = None
    shape: tuple[Domain, ...] | None = None
    view: tuple[Domain, ...] | None = None
    kind: str = ""


@dataclass
class Module:
    """A lowered program: inputs, parameters, ops in order, the output tensor."""

    name: str
    tensors: dict[str, TensorInfo]
    ops: list[Op]
    output: str
    comments: dict[str, str] = field(default_factory=dict)
    #: Tensors a training-mode torch forward drops out (torch's places: residual branches,
    #: the feed-forward activation); attention kernels always are. Set by ``lower``.
    dropout: tuple[str, ...] = ()
    #: What the program reads besides the state and ``χ``, as its operators declare it (``symbolic.inputs``).
    inputs: tuple[Input, ...] = ()
    constants: tuple[Constant, ...] = ()
    #: The increment of the second state (``Program.stream``), a second result; ``None``: one state.
    stream: str | None = None
    #: The kinds that read the support with a key in the query's place (``Program.uncached``): no cache.
    uncached: tuple[str, ...] = ()

    def parameters(self) -> list[TensorInfo]:
        """The parameters the module reads (not the values it computes from parameters alone, unbatched like them)."""
        return [info for info in self.tensors.values() if info.role == "param" and info.parameter is not None]

    def batched(self, name: str) -> bool:
        info = self.tensors.get(name)
        return info is None or info.role not in UNBATCHED_ROLES


def readers(ops: list[Op]) -> dict[str, list[Op]]:
    """Array name → the ops that read it, in order (each op once)."""
    found: dict[str, list[Op]] = {}
    for op in ops:
        for name in dict.fromkeys(op.reads()):
            found.setdefault(name, []).append(op)
    return found


@dataclass(frozen=True)
class MatMul(Op):
    """``out = x @ W (+ bias)`` on contiguous 2-D blocks: rows are ``(b, i)``, ``W`` canonical.

    ``x`` is read with the labels of the contraction; ``contracted`` are the axes of ``x``
    that ``W`` sums over (flattened), the output axes after the row axes are ``W``'s.
    ``transposed``: ``out = x @ Wᵀ`` (the kernel's output axes are contracted: an adjoint).
    """

    x: Operand | None = None
    weights: tuple[str, ...] = ()
    biases: tuple[str | None, ...] = ()
    contracted: tuple[str, ...] = ()
    outputs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    transposed: bool = False

    def reads(self) -> list[str]:
        return [self.x.name, *self.weights, *(bias for bias in self.biases if bias)]

    def writes(self) -> list[str]:
        return [name for name, _ in self.outputs]


@dataclass(frozen=True)
class Attention(Op):
    """``out = Σ_j softmax_j(scale · Σ_e q k, χ) v``: scores, kernel and mixing in one operation."""

    q: Operand | None = None
    k: Operand | None = None
    v: Operand | None = None
    scale: sp.Expr = sp.Integer(1)
    support: Operand | None = None
    #: A second output: the log of each row's normalizer ``Σ_j exp(a) χ`` where the backend's kernel
    #: gives it (``None`` otherwise), read by an ``AttentionAdjoint``.
    normalizer: str | None = None
    #: As ``Softmax.dropout``.
    dropout: bool = True

    def reads(self) -> list[str]:
        return [self.q.name, self.k.name, self.v.name] + ([self.support.name] if self.support else [])

    def writes(self) -> list[str]:
        return [self.out] + ([self.normalizer] if self.normalizer else [])


@dataclass(frozen=True)
class AttentionAdjoint(Op):
    """The adjoint of ``o = Attention(q, k, v)`` for the costate ``o_bar``: with ``γ`` the kernel,
    ``ā = γ ∘ (ō vᵀ − Σ_e ō o)`` (the softmax adjoint, since ``Σ_j γ_ij (ō vᵀ)_ij = Σ_e ō_ie o_ie``),
    ``q̄ = scale ā k``, ``k̄ = scale āᵀ q``, ``v̄ = γᵀ ō``: the three costates ``outputs`` (q̄, k̄, v̄) in one
    operation, reading ``normalizer`` (the forward ``Attention``'s) to recompute ``γ`` without its scores' maxima.
    """

    q: Operand | None = None
    k: Operand | None = None
    v: Operand | None = None
    o: str = ""
    o_bar: str = ""
    normalizer: str = ""
    scale: sp.Expr = sp.Integer(1)
    support: Operand | None = None
    outputs: tuple[str, str, str] = ("", "", "")

    def reads(self) -> list[str]:
        return ([self.o_bar, self.q.name, self.k.name, self.v.name, self.o, self.normalizer]
                + ([self.support.name] if self.support else []))

    def writes(self) -> list[str]:
        return list(self.outputs)


@dataclass(frozen=True)
class Unrolled(Op):
    """A sum over a small fixed axis written out: ``out[.., c, ..] = Σ_c̃ entries[c][c̃] x[.., c̃, ..]``.

    ``x`` is read with ``summed`` where ``out`` has ``axis``; each entry is an elementwise
    expression (the rotation of a pair: ``cos φ``, ``−sin φ``, …) broadcast to ``out`` without ``axis``.
    """

    x: Operand | None = None
    axis: str = ""
    summed: str = ""
    entries: tuple[tuple[sp.Expr, ...], ...] = ()
    #: On a two-point axis, the tables (``PairTable``) of the diagonal ``M[c][c]`` and the crossed entries
    #: ``M[c][1 − c]``: then ``out[c] = D[c] x[c] + X[c] x[1 − c]`` reads them instead of the entries.
    tables: tuple[Operand, Operand] | None = None

    def reads(self) -> list[str]:
        if self.tables is not None:
            return [self.x.name, *(table.name for table in self.tables)]
        return [self.x.name, *sorted({name for row in self.entries for entry in row for name in _indexed_names(entry)})]


@dataclass(frozen=True)
class PairTable(Op):
    """``out[.., c, ..] = entries[c]``: one elementwise expression per point of the two-point axis ``axis``,
    side by side (the diagonal or the crossed entries of an ``Unrolled`` sum's matrix)."""

    axis: str = ""
    entries: tuple[sp.Expr, ...] = ()

    def reads(self) -> list[str]:
        return sorted({name for entry in self.entries for name in _indexed_names(entry)})


@dataclass(frozen=True)
class Normalize(Op):
    """``out = gain (x − mean x)/√(var x + ε) + bias`` over the last axis (a derived LayerNorm);
    with ``centred=False``, ``out = gain x/√(mean x² + ε)`` (a derived RMSNorm, no bias)."""

    x: Operand | None = None
    gain: str = ""
    bias: str = ""
    eps: sp.Expr = sp.Integer(0)
    centred: bool = True
    #: Further outputs a derived adjoint reads: ``(P, var x)``, ``P = (x − mean x)/√(var x + ε)`` (``kept-layer-norm``).
    kept: tuple[str, str] | None = None

    def reads(self) -> list[str]:
        return [self.x.name, self.gain] + ([self.bias] if self.bias else [])

    def writes(self) -> list[str]:
        return [self.out, *(self.kept or ())]


@dataclass(frozen=True)
class NormalizeAdjoint(Op):
    """The costate of the input of a derived LayerNorm ``P = (x − mean x)/√(var x + ε)``, ``gain P + bias``, for
    the costate ``costate`` of its output: ``(P̄ − mean P̄ − P mean(P̄ P))/√(var x + ε)`` with ``P̄ = gain · costate``,
    read from the kept ``p`` and ``variance`` (``var x``) over the last axis; with ``gradients``, those of the gain
    and bias too."""

    costate: str = ""
    p: str = ""
    variance: str = ""
    gain: str = ""
    eps: sp.Expr = sp.Integer(0)
    #: Further outputs: the gradients of gain and bias, ``Σ P λ`` and ``Σ λ`` over all but the last axis.
    gradients: tuple[str, str] | None = None

    def reads(self) -> list[str]:
        return [self.costate, self.p, self.variance, self.gain]

    def writes(self) -> list[str]:
        return [self.out, *(self.gradients or ())]


@dataclass(frozen=True)
class TokenWindow:
    """One term of a ``LocalKernel``: ``channels`` (an expression over the feature axis) times the sum over
    the tokens ``c`` with ``low < p_out(a) − p_in(c) < high``, each weighted by ``χ`` where ``masked``."""

    channels: sp.Expr
    low: sp.Expr
    high: sp.Expr
    masked: bool


@dataclass(frozen=True)
class LocalKernel(Op):
    """``out[a, l] = Σ_c κ(a, c, l) values[c, l]`` for a relative kernel of local support along the tokens
    (a token shift): a sum of ``windows``, each reading the few tokens within a bounded distance.

    ``positions`` are the token positions of ``out`` and of ``values``; ``support`` is ``χ`` read as
    ``χ[a, c]``, or as ``χ[c, a]`` when ``transposed`` (the kernel's adjoint).
    """

    values: Operand | None = None
    positions: tuple[str, str] = ("", "")
    windows: tuple[TokenWindow, ...] = ()
    support: str | None = None
    transposed: bool = False

    def reads(self) -> list[str]:
        channels = sorted({name for window in self.windows for name in _indexed_names(window.channels)})
        return [self.values.name, *self.positions, *([self.support] if self.support else []), *channels]


@dataclass(frozen=True)
class Gather(Op):
    """``out = Σ_v table[.., v, ..] δ(v, index)``, a one-hot contraction, as the table read at ``index`` along
    ``axis`` (over ``index_labels``; 0 where the index is no grid point of ``axis``), then moved to ``labels``."""

    table: Operand | None = None
    axis: str = ""
    index: sp.Expr = sp.Integer(0)
    index_labels: tuple[str, ...] = ()

    def reads(self) -> list[str]:
        return [self.table.name, *_indexed_names(self.index)]


@dataclass(frozen=True)
class Scatter(Op):
    """``out[v, r…] = scale Σ_s δ(v, index[s…]) values[r…, s…]`` (``labels`` = ``(axis, r…)``, ``values_labels`` =
    ``(r…, s…)``, ``index_labels`` = ``(s…)``), the adjoint of a ``Gather``: each value added to its index's row."""

    values: sp.Expr = sp.Integer(0)
    values_labels: tuple[str, ...] = ()
    index: sp.Expr = sp.Integer(0)
    index_labels: tuple[str, ...] = ()
    axis: str = ""
    scale: sp.Expr = sp.Integer(1)

    def reads(self) -> list[str]:
        return sorted(set(_indexed_names(self.values)) | set(_indexed_names(self.index)))


@dataclass(frozen=True)
class Cache(Op):
    """``out`` = the cached values of a key-side field for earlier tokens, then ``source`` (stored back).

    Incremental decoding: the token integral of causal attention at the new tokens needs the
    keys and values of every earlier token; ``key`` names the field in the cache (``attn.k``).
    """

    source: Operand | None = None
    key: str = ""

    def reads(self) -> list[str]:
        return [self.source.name]


@dataclass(frozen=True)
class Branch(Op):
    """``ops``, computing ``outputs``, in a branch of the emitted code: computed, or read from where an earlier
    call or layer kept them (``Memoized``, ``Shared``)."""

    ops: tuple[Op, ...] = ()
    outputs: tuple[Operand, ...] = ()

    def inner(self) -> set[str]:
        """The arrays ``ops`` write (their fused buffers too)."""
        return {name for op in self.ops for name in (*op.writes(), op.out)}

    def reads(self) -> list[str]:
        inner = self.inner()
        return list(dict.fromkeys([*self.sources(), *(name for op in self.ops for name in op.reads() if name not in inner)]))

    def sources(self) -> tuple[str, ...]:
        """What the branch's test reads besides the ops' inputs."""
        return ()

    def writes(self) -> list[str]:
        return [operand.name for operand in self.outputs]


@dataclass(frozen=True)
class Memoized(Branch):
    """``ops``, which compute ``outputs`` from the memory ``source`` alone (and parameters), run only when the
    cache holds no results for a memory equal to ``source``; else ``outputs`` are read from the cache.

    Incremental decoding with cross-attention: the keys and values of the memory (``cross.k``, ``cross.v``: the
    ``keys`` of ``outputs`` in the cache) do not change while the memory does not, so they are computed once per
    memory, not at every step. ``key`` names the cache's copy of the memory they were computed from
    (``cross.memory``): a later call reuses them only if its memory equals that copy (the same values), otherwise
    ``ops`` run again and their results replace the cached ones.
    """

    source: str = ""
    key: str = ""
    keys: tuple[str, ...] = ()

    def sources(self) -> tuple[str, ...]:
        return (self.source,)


@dataclass(frozen=True)
class Shared(Branch):
    """``ops``, which compute ``outputs`` from the token positions alone (with the sizes and constants named in
    ``key``): every layer of a stack computes them alike, so the stack's first layer computes them and stores them
    in ``shared`` (a dict the stack hands each layer, under the values of ``key``), and the others read them.

    Rotary embedding: the angles' cosines and sines (their tables) at the new tokens' positions, once per stack
    call rather than once per layer. A block called alone (``shared`` None) computes them.
    """

    key: tuple[str, ...] = ()
    #: The keyword the positions come from: shared only where it is None (the positions then follow from the key).
    argument: str = "positions"


def flat(ops) -> list[Op]:
    """``ops`` with each branch op's own ops after it (what each statement computes, once each)."""
    return [item for op in ops for item in ([op, *op.ops] if isinstance(op, Branch) else [op])]


@dataclass(frozen=True)
class _View(Op):
    """An operation on the one array ``source`` (a view of it, or its blocks written out)."""

    source: str = ""

    def reads(self) -> list[str]:
        return [self.source]


@dataclass(frozen=True)
class _Scatter(_View):
    """The adjoint of a view: ``source`` written at the points the view read, shaped like ``like``."""

    like: str = ""

    def reads(self) -> list[str]:
        return [self.source, self.like]


@dataclass(frozen=True)
class Window(_View):
    axes: tuple[int, ...] = ()
    size: sp.Expr = sp.Integer(1)
    stride: sp.Expr = sp.Integer(1)
    padding: sp.Expr = sp.Integer(0)

    def read_in(self, comment: str) -> str:
        """``comment`` (the formula of an operation that absorbed this view, which is then never made) reading the
        field at the window's points (``u[c, S*p + r - 1, …]``, what this view's own comment states) where it read
        the view."""
        field = self.comment.removesuffix(WINDOW_NOTE)
        return comment.replace(f"{self.out}[{', '.join(self.labels[1:])}]", field) if field != self.comment else comment


@dataclass(frozen=True)
class Interleave(_View):
    axes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Point(_View):
    index: tuple[str | int, ...] = ()


@dataclass(frozen=True)
class Rows(_View):
    axis: int = 1
    offset: int = 0
    sizes: tuple[sp.Expr, ...] = ()


@dataclass(frozen=True)
class Fold(_Scatter):
    axes: tuple[int, ...] = ()
    size: sp.Expr = sp.Integer(1)
    stride: sp.Expr = sp.Integer(1)
    padding: sp.Expr = sp.Integer(0)


@dataclass(frozen=True)
class Place(_Scatter):
    index: tuple[str | int, ...] = ()


@dataclass(frozen=True)
class PlaceRows(_Scatter):
    axis: int = 1
    offset: int = 0


@dataclass(frozen=True)
class Join(Op):
    parts: tuple[str, ...] = ()

    def reads(self) -> list[str]:
        return list(self.parts)


@dataclass(frozen=True)
class _Kernel(Op):
    """A contraction of ``x`` with a kernel ``weight`` (and a ``bias``)."""

    x: str = ""
    weight: str = ""
    bias: str | None = None

    def reads(self) -> list[str]:
        return [self.x, self.weight] + ([self.bias] if self.bias else [])


@dataclass(frozen=True)
class Convolution(_Kernel):
    """``out[b, l, p, q] = Σ_{c,r,s} x[b, c, S p + r − P, S q + s − P] W[c, r, s, l] (+ bias[l])``.

    ``depthwise``: ``W[r, s, l]`` and ``c = l`` (each channel convolved with its own kernel);
    ``channels_last``: ``out[b, p, q, l]`` (the patches of a patch embedding, as tokens);
    ``scratch``: no result of the program outlives ``out`` (set by the ``scratch-outputs`` pass).
    """

    size: sp.Expr = sp.Integer(1)
    stride: sp.Expr = sp.Integer(1)
    padding: sp.Expr = sp.Integer(0)
    depthwise: bool = False
    channels_last: bool = False
    scratch: bool = False


@dataclass(frozen=True)
class ConvolutionWeightAdjoint(Op):
    """``W̄[c, r, s, l] = Σ_{b,p,q} x[b, c, S p + r − P, S q + s − P] K̄[b, l, p, q]``: the kernel's gradient of a
    ``Convolution`` of ``x`` from the costate ``K̄`` of its output (``depthwise``: ``W̄[r, s, l]``, c = l). Written by
    the ``convolution-adjoint`` pass in place of the two statements it recognized, ``window`` (the windows of ``x``)
    and ``product`` (their contraction with ``K̄``), which a backend without a routine spells as one."""

    window: Window | None = None
    product: Contraction | None = None

    @property
    def depthwise(self) -> bool:
        return len(self.labels) == 3

    @property
    def costate(self) -> str:
        return next(operand.name for operand in self.product.operands if operand.name != self.window.out)

    def reads(self) -> list[str]:
        return [self.window.source, self.costate]


@dataclass(frozen=True)
class ConvolutionInputAdjoint(Op):
    """``x̄[b, c, S p + r − P, S q + s − P] += Σ_l W[c, r, s, l] K̄[b, l, p, q]`` summed over the ``terms`` (costate
    ``K̄``, kernel ``W``): the input's costate of convolutions of one input ``like`` (``depthwise``: ``W[r, s, l]``,
    c = l), a transposed convolution per term. Written by the ``convolution-adjoint`` pass in place of the two
    statements it recognized, ``blocks`` (each window's values) and ``fold`` (added back at the window's points),
    which a backend without a routine spells as one."""

    terms: tuple[tuple[str, str], ...] = ()
    depthwise: bool = False
    blocks: Op | None = None
    fold: Fold | None = None

    def reads(self) -> list[str]:
        return [name for term in self.terms for name in term] + [self.fold.like]


@dataclass(frozen=True)
class TransposedConvolution(_Kernel):
    """``out[b, l, S p + r, S q + s] = Σ_k x[b, k, p, q] W[k, r, s, l] (+ bias[l])``, kernel = stride ``S``."""
