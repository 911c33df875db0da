"""A user's own module: a new vector field, a new projection and a new solver, outside the package.

Loaded explicitly (``splitformer derive --load tests/plugins/my_kinds.py …`` or
``splitformer.load_plugin(path)``); its registrations make the names usable in scheme files.
"""

from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.constraints import SYMBOLS, U, Bound, ConstraintSet, Moment, Statistic
from splitformer.symbolic.domains import FEATURES, XI, X, Y
from splitformer.symbolic.operators import (
    STATE, Definition, Operator, ProjectionOperator, apply, integral, kernel, register_operator,
)
from splitformer.symbolic.tableaux import make_tableau, register_tableau


@register_operator
@dataclass(frozen=True)
class AffineField(Operator):
    """``u ↦ ∫ W(ξ, y) u(x, ξ) dξ + b(y)``: a local affine integral transform over the features."""

    kind: ClassVar[str] = "affine-field"
    symbol: ClassVar[str] = r"\mathcal{L}"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)), kernel("b", "b", (Y,), (FEATURES,)))

    def definitions(self):
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        rhs = integral(p["W"] * apply(STATE, X, XI), XI) + p["b"]
        return (Definition("out", r"\mathcal{L}", (X, Y), rhs, "an affine integral transform over the features"),)


#: The hyperplane of fields with zero mean over the features.
CENTRED = ConstraintSet(
    name="S_0",
    latex=r"S_0 = \{u : \mathrm{mean}_y\, u = 0\}",
    moments=(Moment(U, 0),),
    statistics=(Statistic("alpha", SYMBOLS.alpha, r"\alpha", SYMBOLS.v, "mean over features"),),
)


@register_operator
@dataclass(frozen=True)
class Centre(ProjectionOperator):
    """Projection onto ``S_0``: given only by its constraint set (the deriver yields ``v − α``)."""

    kind: ClassVar[str] = "centre"
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_0}"
    constraint: ClassVar[str] = "S_0"
    constraints: ClassVar[ConstraintSet] = CENTRED
    affine: ClassVar[tuple[str, ...]] = ()
    projection_meaning: ClassVar[str] = r"projection onto the hyperplane $S_0$ (derived)"


#: The box [0, 1]: two pointwise bounds, so the deriver splits KKT cases (it yields a clip).
BOX = ConstraintSet(name="S_box", latex=r"S_{\mathrm{box}} = \{u : 0 \le u \le 1\}", bounds=(Bound(U), Bound(1 - U)))


@register_operator
@dataclass(frozen=True)
class Clip(ProjectionOperator):
    """Projection onto the box ``[0, 1]``, given only by its two bounds."""

    kind: ClassVar[str] = "clip"
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_{\mathrm{box}}}"
    constraint: ClassVar[str] = r"S_{\mathrm{box}}"
    constraints: ClassVar[ConstraintSet] = BOX
    affine: ClassVar[tuple[str, ...]] = ()
    projection_meaning: ClassVar[str] = "projection onto the box [0, 1] (derived from its KKT cases)"


#: Ralston's second-order method.
RALSTON = register_tableau(make_tableau("ralston", [[], ["2/3"]], ["1/4", "3/4"], "Ralston (RK2)"))


@register_operator
@dataclass(frozen=True)
class ScaledField(Operator):
    """``u ↦ scale · ∫ W u dξ``: a kind with a required option (``{ kind = "scaled-field", scale = 2 }``)."""

    scale: float
    kind: ClassVar[str] = "scaled-field"
    symbol: ClassVar[str] = r"\mathcal{S}"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),)

    def definitions(self):
        rhs = self.scale * integral(self.parameters()[0].applied() * apply(STATE, X, XI), XI)
        return (Definition("out", r"\mathcal{S}", (X, Y), rhs, "a scaled linear integral transform"),)
