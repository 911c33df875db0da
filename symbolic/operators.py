"""The operators of the master equation, written in continuous form; the public operator API.

Each operator lists its learned controls (``Parameter``) and the chain of continuous
definitions that evaluates it on an input field ``u(x, ξ)``; the last definition is the
operator's value. Kernels integrated against a variable are marked, so that the
quadrature weight of that variable is absorbed into the stored array (see ``quadrature``).

A new kind is a subclass registered by name (``@register_operator``), from the package or
from a user's own module alike:

- a vector field subclasses ``Operator``: ``kind``, ``symbol``, ``parameters()`` (built
  with ``kernel``: names, continuous arguments, shapes in domains) and ``definitions()``
  (SymPy expressions over the domains, ``integral`` for the integral transforms);
- a projection subclasses ``ProjectionOperator`` and gives only its ``ConstraintSet``
  (``constraints``): the closed form comes from ``projections.derive_projection``, followed
  by the diagonal affine substep of its ``affine`` parameters (``gain``, ``bias``).

Dataclass fields after ``key`` are the kind's options: ``activation`` receives the scheme's
activation, others come from the scheme file (``ffn = { kind = "…", bias = false }``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .activations import Activation
from .domains import (
    ATTENTION_FEATURES, ETA, FEATURES, H, HEAD_FEATURES, HIDDEN, X, X_KEY, XI, Y, ZETA, E, Domain, Variable, stores,
)
from .constraints import S_1, ConstraintSet
from .inputs import Constant, Input
from .projections import SYMBOLS, Projection, derive_layer_norm_projection, derive_projection
from .quadrature import integral

__all__ = [
    "Parameter", "Definition", "Operator", "ProjectionOperator", "Attention", "FeedForward", "LayerNorm",
    "EPSILON", "STATE", "BRANCH", "SUPPORT", "OPERATOR_KINDS", "register_operator", "kernel", "apply", "integral",
    "Input", "Constant", "check_head_width", "heads_domain",
]

#: LayerNorm's ε; emitted as the ``eps`` argument.
EPSILON = sp.Symbol("eps", positive=True)
#: Name of the input field of every operator.
STATE = "u"
#: The second input field of a residual combiner (``Operator.is_combiner``): the output of the branch it
#: combines with the state.
BRANCH = "v"
#: The support indicator ``χ(x, x̃)`` of the token integral (masks); emitted from the
#: ``key_padding_mask`` and ``causal`` arguments.
SUPPORT = "chi"


def apply(name: str, *variables: Variable) -> sp.Expr:
    """The applied function ``name(v_1, …)`` of continuous variables."""
    return sp.Function(name)(*(variable.symbol for variable in variables))


@dataclass(frozen=True)
class Parameter:
    """A learned control: its canonical name, its continuous kernel and array layout."""

    name: str
    function: str
    latex: str
    arguments: tuple[Variable, ...]
    shape: tuple[Domain, ...]
    absorbs: tuple[Variable, ...] = ()

    def __post_init__(self) -> None:
        from .errors import SplitformerError

        domains = tuple(variable.domain for variable in self.arguments)
        if not stores(self.shape, domains):
            def sizes(axes: tuple[Domain, ...]) -> str:
                return f"({', '.join(domain.code_name for domain in axes)})"
            raise SplitformerError(
                f"parameter {self.name}: stored as {sizes(self.shape)}, but its arguments run over {sizes(domains)}: "
                f"each stored axis is the next argument's domain, or the next several as one axis that holds them "
                f"(d holds n_heads × d_head)")
        if not {variable.domain for variable in self.absorbs} <= set(domains):  # read at another variable of a domain
            raise SplitformerError(f"parameter {self.name}: absorbs the spacing of a domain none of its arguments is on")

    @property
    def kind(self) -> str:
        """Decides initialization and what ``bias=False`` drops: ``weight`` (``W…``), ``gain`` (``gain``, ``…_gain``;
        ones), ``bias`` (``b``, ``bias``, ``b_…``; zeros, dropped), ``step`` (a learned time step; zeros, kept),
        else ``control`` (zeros, never dropped: ALiBi's slopes, a head-mixing kernel)."""
        if self.name == "step":
            return "step"
        if self.name.startswith("W"):
            return "weight"
        if self.name.split("_")[-1] == "gain":
            return "gain"
        return "bias" if self.name in ("b", "bias") or self.name.startswith("b_") else "control"

    def applied(self) -> sp.Expr:
        return apply(self.function, *self.arguments)


@dataclass(frozen=True)
class Definition:
    """``function(arguments) = rhs`` in continuous form, one stage of an operator."""

    function: str
    latex: str
    arguments: tuple[Variable, ...]
    rhs: sp.Expr
    meaning: str
    absorbs: tuple[Variable, ...] = ()

    def applied(self) -> sp.Expr:
        return apply(self.function, *self.arguments)


@dataclass(frozen=True)
class Operator:
    """Base of the operators; ``key`` prefixes parameter names (``attn.W_q``)."""

    key: str
    kind: ClassVar[str]
    symbol: ClassVar[str]
    is_projection: ClassVar[bool] = False
    #: A residual combiner: a field of the state ``u`` and a branch output ``v`` (``BRANCH``), named by a
    #: substep's ``combine`` (the GRU gate).
    is_combiner: ClassVar[bool] = False
    #: A token map: a linear map along the tokens of a branch's input, named by a substep's ``shift``
    #: (token shift).
    is_token_map: ClassVar[bool] = False
    #: For a projection: the LaTeX of the constraint set.
    constraint: ClassVar[str] = ""
    #: Definitions (besides the output) a training-mode torch forward applies dropout to.
    dropout_sites: ClassVar[tuple[str, ...]] = ()
    #: Fields the definitions read besides the state and ``χ`` (``symbolic.inputs``: positions, a memory …).
    input_fields: ClassVar[tuple[Input, ...]] = ()
    #: Free symbols of the definitions, emitted as keyword arguments (RoPE's θ).
    constants: ClassVar[tuple[Constant, ...]] = ()
    #: An integer option (a field) that a head must be at least as wide as, in features (``rotary_dim``: the
    #: angles are an ``R``-feature embedding's); emitted code refuses narrower heads. ``""``: none.
    head_width_option: ClassVar[str] = ""
    #: How the kind is discretized on a network's grids (Markdown; a network's report writes it once).
    discretization: ClassVar[str] = ""

    def parameters(self) -> tuple[Parameter, ...]:
        raise NotImplementedError(f"{type(self).__name__} defines no parameters() (return () for none)")

    def definitions(self) -> tuple[Definition, ...]:
        raise NotImplementedError(f"{type(self).__name__} defines no definitions() (the last is its output)")

    def key_latex(self) -> str:
        escaped = self.key.replace("_", r"\_")
        return rf"\mathrm{{{escaped}}}"

    def labelled(self) -> str:
        r"""The operator's symbol, marked with its key: ``\mathcal{A}_{attn}``."""
        label = self.key_latex()
        if self.is_projection:
            return rf"\mathrm{{Proj}}_{{{self.constraint}^{{{label}}}}}"
        return rf"{self.symbol}_{{{label}}}"

    def term_latex(self, argument: str = "u") -> str:
        """The operator's term on the right-hand side of the master equation."""
        if self.is_projection:
            label = self.key_latex()
            return rf"- \partial I_{{{self.constraint}^{{{label}}}}}({argument})"
        return rf"+ {self.labelled()}({argument})"

    def checked_features(self) -> int:
        """The fewest features at which the checks of emitted code exercise every term of its formulas (a token
        shift's segments of ⌊d/n⌋ features are empty below n): they widen d to it. 0: any."""
        return 0

    def uses_support(self) -> bool:
        """Whether the masks reach the operator: its definitions read the support χ (a kind may say so itself; one
        that read χ and said False was emitted with χ never computed, and failed at every call)."""
        return self.reads_input(SUPPORT)

    def reads_input(self, name: str) -> bool:
        """Whether the continuous definitions read the input field ``name`` (one of ``input_fields``)."""
        return any(applied.func.__name__ == name for definition in self.definitions()
                   for applied in definition.rhs.atoms(sp.core.function.AppliedUndef))

    def places_tokens(self) -> bool:
        """Whether the tokens' positions reach what the operator computes (rotary attention, ALiBi, relative buckets,
        a plug-in's positional kernel): a token map (token shift) reads them only to find its neighbours."""
        return not self.is_token_map and any(field.role == "positions" and self.reads_input(field.name)
                                             for field in self.input_fields)

    def latex_names(self) -> dict[str, str]:
        """LaTeX names of the functions in the continuous definitions."""
        names = {parameter.function: parameter.latex for parameter in self.parameters()}
        names.update({definition.function: definition.latex for definition in self.definitions()})
        names[SUPPORT] = r"\chi"
        names.update({field.name: field.latex for field in self.input_fields})
        return names

    def latex(self) -> str:
        """The operator's continuous definitions, one aligned line each."""
        from .latex import equation

        names = self.latex_names()
        lines = [equation(definition.applied(), definition.rhs, names) for definition in self.definitions()]
        return r"\begin{aligned}" + r" \\ ".join(line.replace(" = ", " &= ", 1) for line in lines) + r"\end{aligned}"

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle {self.latex()}$"


def kernel(name: str, latex: str, arguments: tuple[Variable, ...], shape: tuple[Domain, ...],
           absorbs: tuple[Variable, ...] = ()) -> Parameter:
    """A learned control ``name(arguments)`` stored with ``shape``; ``absorbs`` are the variables
    it is integrated against (their quadrature weights live in the stored array)."""
    return Parameter(name, name, latex, arguments, shape, absorbs)


_kernel = kernel  # the former private name, for modules written against it


#: The widest head a scheme may fix (published models use 64 to 256): ``check`` evaluates blocks of that width.
WIDEST_HEAD = 4096


def check_head_width(key: str, d_head: object) -> None:
    """``d_head``, an attention kind's head width, is ``None`` (``d / n_heads``) or an int in 1 … ``WIDEST_HEAD``."""
    from .errors import SplitformerError

    if d_head is not None and (type(d_head) is not int or not 1 <= d_head <= WIDEST_HEAD):  # exact: printed into code
        raise SplitformerError(f"{key}: d_head must be an int from 1 to {WIDEST_HEAD} (the features of one head; "
                               f"absent: d / n_heads), got {str(d_head)[:40]}")


def heads_domain(d_head: int | None) -> Domain:
    """The stored axis of all heads' features: ``Ω_y`` (``d``) by default, ``n_heads · d_head`` with ``d_head``."""
    return FEATURES if d_head is None else ATTENTION_FEATURES


@dataclass(frozen=True)
class Attention(Operator):
    """Multi-head attention: a non-local integral operator over token positions; ``bias=False``
    drops the biases of the query, key, value and output transforms. ``d_head`` sets the head width
    ``|Ω_e|`` (default ``d / n_heads``): the transforms then map ``d`` to ``n_heads · d_head`` features and back."""

    bias: bool = True
    d_head: int | None = None
    kind: ClassVar[str] = "attention"
    symbol: ClassVar[str] = r"\mathcal{A}"

    def __post_init__(self) -> None:
        check_head_width(self.key, self.d_head)

    def parameters(self) -> tuple[Parameter, ...]:
        heads = heads_domain(self.d_head)
        parameters = (
            kernel("W_q", "W^{Q}", (XI, H, E), (FEATURES, heads), (XI,)),
            kernel("b_q", "b^{Q}", (H, E), (heads,)),
            kernel("W_k", "W^{K}", (XI, H, E), (FEATURES, heads), (XI,)),
            kernel("b_k", "b^{K}", (H, E), (heads,)),
            kernel("W_v", "W^{V}", (XI, H, E), (FEATURES, heads), (XI,)),
            kernel("b_v", "b^{V}", (H, E), (heads,)),
            kernel("W_o", "W^{O}", (H, E, Y), (heads, FEATURES), (H, E)),
            kernel("b_o", "b^{O}", (Y,), (FEATURES,)),
        )
        return tuple(p for p in parameters if self.bias or p.kind != "bias")

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        u = apply(STATE, X, XI)

        def projection(name: str, meaning: str) -> Definition:
            lower = name.lower()
            rhs = integral(p[f"W_{lower}"] * u, XI) + p.get(f"b_{lower}", 0)
            return Definition(lower, name, (X, H, E), rhs, meaning)

        score = integral(apply("q", X, H, E) * apply("k", X_KEY, H, E), E) / sp.sqrt(HEAD_FEATURES.measure)
        weight = apply(SUPPORT, X, X_KEY) * sp.exp(apply("a", H, X, X_KEY))
        normalizer = integral(apply(SUPPORT, X, ETA) * sp.exp(apply("a", H, X, ETA)), ETA)
        mixed = integral(apply("gamma", H, X, X_KEY) * apply("v", X_KEY, H, E), X_KEY)
        output = integral(integral(p["W_o"] * apply("o", X, H, E), E), H) + p.get("b_o", 0)
        return (
            projection("Q", "queries: an affine integral transform over features, per head"),
            projection("K", "keys"),
            projection("V", "values"),
            Definition("a", "a", (H, X, X_KEY), score, r"scores, scaled by $|\Omega_e|^{-1/2}$"),
            Definition("gamma", r"\gamma", (H, X, X_KEY), weight / normalizer,
                       r"attention kernel $\mathrm{Softmax}_2$, restricted to the support $\chi$",
                       absorbs=(X_KEY,)),
            Definition("o", "O", (X, H, E), mixed, "the non-local integral over token positions"),
            Definition("out", r"\mathcal{A}", (X, Y), output, "heads combined by the output kernel"),
        )

    def uses_support(self) -> bool:
        return True


@dataclass(frozen=True)
class FeedForward(Operator):
    """Lifting to the hidden domain ``Ω_z``, the activation, restriction back to ``Ω_y``;
    ``bias=False`` drops ``b_1`` and ``b_2``."""

    activation: Activation | None = None
    bias: bool = True
    kind: ClassVar[str] = "feed-forward"
    symbol: ClassVar[str] = r"\mathcal{F}"
    dropout_sites: ClassVar[tuple[str, ...]] = ("s",)  # torch's dropout after the activation

    def parameters(self) -> tuple[Parameter, ...]:
        parameters = (
            kernel("W_1", "W_{1}", (XI, ZETA), (FEATURES, HIDDEN), (XI,)),
            kernel("b_1", "b_{1}", (ZETA,), (HIDDEN,)),
            kernel("W_2", "W_{2}", (ZETA, Y), (HIDDEN, FEATURES), (ZETA,)),
            kernel("b_2", "b_{2}", (Y,), (FEATURES,)),
        )
        return tuple(p for p in parameters if self.bias or p.kind != "bias")

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        lifted = integral(p["W_1"] * apply(STATE, X, XI), XI) + p.get("b_1", 0)
        restricted = integral(p["W_2"] * apply("s", X, ZETA), ZETA) + p.get("b_2", 0)
        return (
            Definition("w", "w", (X, ZETA), lifted, r"lifting $\Omega_y \to \Omega_z$, an affine integral transform"),
            Definition("s", "s", (X, ZETA), self.activation(apply("w", X, ZETA)), self.activation.meaning),
            Definition("out", r"\mathcal{F}", (X, Y), restricted, r"restriction $\Omega_z \to \Omega_y$"),
        )


@dataclass(frozen=True)
class ProjectionOperator(Operator):
    """A projection given only by its constraint set, then a diagonal affine substep.

    Subclasses set ``constraints`` (a ``ConstraintSet``), ``values`` (the set's parameters,
    e.g. ``σ_1 = 0, σ_2 = 1``) and ``affine`` (``("gain", "bias")``, ``("gain",)`` or ``()``);
    the statistics, the derived projection and the affine map become the definitions.
    """

    is_projection: ClassVar[bool] = True
    constraints: ClassVar[ConstraintSet]
    values: ClassVar[dict] = {}
    affine: ClassVar[tuple[str, ...]] = ("gain", "bias")
    #: LaTeX name of the operator's value and what the projection and affine stages mean.
    output_latex: ClassVar[str] = r"\mathrm{Proj}"
    projection_meaning: ClassVar[str] = "the derived projection"
    affine_meaning: ClassVar[str] = "per-feature gain and bias: an explicit step of a diagonal affine map"

    @classmethod
    def projection(cls) -> Projection:
        """The closed form derived from ``constraints`` (cached)."""
        return derive_projection(cls.constraints)

    def parameters(self) -> tuple[Parameter, ...]:
        latex = {"gain": "g", "bias": "c"}
        return tuple(kernel(name, latex[name], (Y,), (FEATURES,)) for name in self.affine)

    def definitions(self) -> tuple[Definition, ...]:
        s = SYMBOLS
        statistics = self.constraints.statistics
        at_token = {statistic.symbol: apply(statistic.name, X) for statistic in statistics}
        definitions = []
        for statistic in statistics:
            body = statistic.mean_of.subs({s.v: apply(STATE, X, XI), **at_token})
            definitions.append(Definition(statistic.name, statistic.latex, (X,),
                                          integral(body, XI) / FEATURES.measure, statistic.meaning))
        projected = self.projection().formula.subs(
            {s.v: apply(STATE, X, Y), **at_token, **self.values, s.epsilon: EPSILON})
        definitions.append(Definition("p", "P", (X, Y), projected, self.projection_meaning))
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        out = p.get("gain", 1) * apply("p", X, Y) + p.get("bias", 0)
        if self.affine:
            definitions.append(Definition("out", self.output_latex, (X, Y), out, self.affine_meaning))
        return tuple(definitions)


@dataclass(frozen=True)
class LayerNorm(ProjectionOperator):
    """Projection onto ``S_1(0, 1)`` (ε through the ghost coordinate), then gain and bias;
    ``bias=False`` drops the bias (the diagonal affine substep is then linear: the gain alone)."""

    bias: bool = True
    kind: ClassVar[str] = "layer-norm"
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_1}"
    constraint: ClassVar[str] = "S_1"
    constraints: ClassVar[ConstraintSet] = S_1
    values: ClassVar[dict] = {SYMBOLS.sigma_1: 0, SYMBOLS.sigma_2: 1}
    output_latex: ClassVar[str] = r"\mathrm{LN}"
    projection_meaning: ClassVar[str] = (
        r"projection onto $S_1(0, 1)$ with the ghost coordinate $\sqrt{N_y\varepsilon}$ (Theorem 3.1, derived)")

    @classmethod
    def projection(cls) -> Projection:
        return derive_layer_norm_projection()  # cached on disk

    def parameters(self) -> tuple[Parameter, ...]:
        return tuple(p for p in super().parameters() if self.bias or p.kind != "bias")


#: Operator kinds by the name scheme files use (``attn = "attention"``).
OPERATOR_KINDS: dict[str, type[Operator]] = {}


def register_operator(cls: type[Operator]) -> type[Operator]:
    """Make an ``Operator`` subclass usable by name in schemes; built-ins register the same way.

    Usable as a class decorator. A kind name is registered once: registering another class
    under a taken name raises ``SplitformerError``.
    """
    from .errors import SplitformerError

    if not (isinstance(cls, type) and issubclass(cls, Operator)):
        raise SplitformerError(f"register_operator: {cls!r} is not an Operator subclass")
    kind = getattr(cls, "kind", None)
    if type(kind) is not str or not kind:  # exact: a str subclass can print other text
        raise SplitformerError(f"register_operator: {cls.__name__} has no 'kind' name")
    if "kind" not in vars(cls):  # a subclass of a registered kind that forgot its own name
        raise SplitformerError(f"register_operator: {cls.__name__} sets no kind of its own (it inherits {kind!r}); "
                               "give it one: kind = \"my-kind\"")
    if issubclass(cls, ProjectionOperator) and not isinstance(getattr(cls, "constraints", None), ConstraintSet):
        raise SplitformerError(f"register_operator: {cls.__name__} is a ProjectionOperator without its constraint set "
                               "(constraints = ConstraintSet(...): the projection is derived from it)")
    if len(kind) > 64 or not re.fullmatch(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", kind):
        raise SplitformerError(f"register_operator: {cls.__name__}.kind {kind[:64]!r} is not a kind name "
                               "(lower-case words joined by '-', at most 64 characters)")
    if OPERATOR_KINDS.get(kind, cls) is not cls:
        raise SplitformerError(f"register_operator: operator kind {kind!r} is already registered")
    OPERATOR_KINDS[kind] = cls
    return cls


for _builtin in (Attention, FeedForward, LayerNorm):
    register_operator(_builtin)
