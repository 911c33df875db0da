"""The operators of the master equation, written in continuous form.

Each operator lists its learned controls (``Parameter``) and the chain of continuous
definitions that evaluates it on an input field ``u(x, ξ)``; the last definition is the
operator's value. Kernels integrated against a variable are marked, so that the
quadrature weight of that variable is absorbed into the stored array (see ``quadrature``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .activations import Activation
from .domains import (
    ETA, FEATURES, H, HEAD_FEATURES, HIDDEN, X, X_KEY, XI, Y, ZETA, E, Domain, Variable,
)
from .projections import SYMBOLS, derive_layer_norm_projection
from .quadrature import integral

__all__ = [
    "Parameter", "Definition", "Operator", "Attention", "FeedForward", "LayerNorm",
    "EPSILON", "STATE", "SUPPORT", "OPERATOR_KINDS", "register_operator",
]

#: LayerNorm's ε; emitted as the ``eps`` argument.
EPSILON = sp.Symbol("eps", positive=True)
#: Name of the input field of every operator.
STATE = "u"
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

    @property
    def kind(self) -> str:
        """``weight``, ``bias`` or ``gain``: decides initialization and ``bias=False``."""
        return "weight" if self.name.startswith("W") else "gain" if self.name == "gain" else "bias"

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
    #: For a projection: the LaTeX of the constraint set.
    constraint: ClassVar[str] = ""

    def parameters(self) -> tuple[Parameter, ...]:
        raise NotImplementedError

    def definitions(self) -> tuple[Definition, ...]:
        raise NotImplementedError

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

    def uses_support(self) -> bool:
        return False

    def latex_names(self) -> dict[str, str]:
        """LaTeX names of the functions in the continuous definitions."""
        names = {parameter.function: parameter.latex for parameter in self.parameters()}
        names.update({definition.function: definition.latex for definition in self.definitions()})
        names[SUPPORT] = r"\chi"
        return names

    def latex(self) -> str:
        """The operator's continuous definitions, one aligned line each."""
        from .latex import equation

        names = self.latex_names()
        lines = [equation(definition.applied(), definition.rhs, names) for definition in self.definitions()]
        return r"\begin{aligned}" + r" \\ ".join(line.replace(" = ", " &= ", 1) for line in lines) + r"\end{aligned}"

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle {self.latex()}$"


def _kernel(name: str, latex: str, arguments: tuple[Variable, ...], shape: tuple[Domain, ...],
            absorbs: tuple[Variable, ...] = ()) -> Parameter:
    return Parameter(name, name, latex, arguments, shape, absorbs)


@dataclass(frozen=True)
class Attention(Operator):
    """Multi-head attention: a non-local integral operator over token positions."""

    kind: ClassVar[str] = "attention"
    symbol: ClassVar[str] = r"\mathcal{A}"

    def parameters(self) -> tuple[Parameter, ...]:
        square = (FEATURES, FEATURES)
        return (
            _kernel("W_q", "W^{Q}", (XI, H, E), square, (XI,)),
            _kernel("b_q", "b^{Q}", (H, E), (FEATURES,)),
            _kernel("W_k", "W^{K}", (XI, H, E), square, (XI,)),
            _kernel("b_k", "b^{K}", (H, E), (FEATURES,)),
            _kernel("W_v", "W^{V}", (XI, H, E), square, (XI,)),
            _kernel("b_v", "b^{V}", (H, E), (FEATURES,)),
            _kernel("W_o", "W^{O}", (H, E, Y), square, (H, E)),
            _kernel("b_o", "b^{O}", (Y,), (FEATURES,)),
        )

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        u = apply(STATE, X, XI)

        def projection(name: str, meaning: str) -> Definition:
            lower = name.lower()
            rhs = integral(p[f"W_{lower}"] * u, XI) + p[f"b_{lower}"]
            return Definition(lower, name, (X, H, E), rhs, meaning)

        score = integral(apply("q", X, H, E) * apply("k", X_KEY, H, E), E) / sp.sqrt(HEAD_FEATURES.measure)
        weight = apply(SUPPORT, X, X_KEY) * sp.exp(apply("a", H, X, X_KEY))
        normalizer = integral(apply(SUPPORT, X, ETA) * sp.exp(apply("a", H, X, ETA)), ETA)
        mixed = integral(apply("gamma", H, X, X_KEY) * apply("v", X_KEY, H, E), X_KEY)
        output = integral(integral(p["W_o"] * apply("o", X, H, E), E), H) + p["b_o"]
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
    """Lifting to the hidden domain ``Ω_z``, the activation, restriction back to ``Ω_y``."""

    activation: Activation | None = None
    kind: ClassVar[str] = "feed-forward"
    symbol: ClassVar[str] = r"\mathcal{F}"

    def parameters(self) -> tuple[Parameter, ...]:
        return (
            _kernel("W_1", "W_{1}", (XI, ZETA), (FEATURES, HIDDEN), (XI,)),
            _kernel("b_1", "b_{1}", (ZETA,), (HIDDEN,)),
            _kernel("W_2", "W_{2}", (ZETA, Y), (HIDDEN, FEATURES), (ZETA,)),
            _kernel("b_2", "b_{2}", (Y,), (FEATURES,)),
        )

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        lifted = integral(p["W_1"] * apply(STATE, X, XI), XI) + p["b_1"]
        restricted = integral(p["W_2"] * apply("s", X, ZETA), ZETA) + p["b_2"]
        return (
            Definition("w", "w", (X, ZETA), lifted, r"lifting $\Omega_y \to \Omega_z$, an affine integral transform"),
            Definition("s", "s", (X, ZETA), self.activation(apply("w", X, ZETA)), self.activation.meaning),
            Definition("out", r"\mathcal{F}", (X, Y), restricted, r"restriction $\Omega_z \to \Omega_y$"),
        )


@dataclass(frozen=True)
class LayerNorm(Operator):
    """Projection onto ``S_1(0, 1)`` (ε through the ghost coordinate), then gain and bias."""

    kind: ClassVar[str] = "layer-norm"
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_1}"
    is_projection: ClassVar[bool] = True
    constraint: ClassVar[str] = "S_1"

    def parameters(self) -> tuple[Parameter, ...]:
        return (
            _kernel("gain", "g", (Y,), (FEATURES,)),
            _kernel("bias", "c", (Y,), (FEATURES,)),
        )

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        v = apply(STATE, X, XI)
        mean = integral(v, XI) / FEATURES.measure
        variance = integral((v - apply("alpha", X)) ** 2, XI) / FEATURES.measure
        s = SYMBOLS
        projected = derive_layer_norm_projection().formula.subs({
            s.v: apply(STATE, X, Y), s.alpha: apply("alpha", X), s.beta: apply("beta", X),
            s.sigma_1: 0, s.sigma_2: 1, s.epsilon: EPSILON,
        })
        return (
            Definition("alpha", r"\alpha", (X,), mean, "mean over features"),
            Definition("beta", r"\beta", (X,), variance, "population variance over features"),
            Definition("p", "P", (X, Y), projected,
                       r"projection onto $S_1(0, 1)$ with the ghost coordinate $\sqrt{N_y\varepsilon}$ (Theorem 3.1, derived)"),
            Definition("out", r"\mathrm{LN}", (X, Y), p["gain"] * apply("p", X, Y) + p["bias"],
                       "per-feature gain and bias: an explicit step of a diagonal affine map"),
        )


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
    if not isinstance(kind, str) or not kind:
        raise SplitformerError(f"register_operator: {cls.__name__} has no 'kind' name")
    if OPERATOR_KINDS.get(kind, cls) is not cls:
        raise SplitformerError(f"register_operator: operator kind {kind!r} is already registered")
    OPERATOR_KINDS[kind] = cls
    return cls


for _builtin in (Attention, FeedForward, LayerNorm):
    register_operator(_builtin)

from . import paper_operators  # noqa: E402,F401 - registers the kinds of the paper's own scheme
