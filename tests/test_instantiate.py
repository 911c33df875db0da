"""A scheme's operators are built and checked once per kind class, key and options (``scheme._checked``'s memo):
what the memo serves must be what a fresh build gives."""

from dataclasses import dataclass
from typing import ClassVar

import math

import pytest
import sympy as sp

from splitformer.symbolic import SplitformerError
from splitformer.symbolic.domains import X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply
from splitformer.symbolic.scheme import _checked


def _scaling(name: str, broken: bool = False) -> type[Operator]:
    """A kind ``u ↦ scale·u`` (its definitions fail when ``broken``), a new class at every call, as a reloaded
    plug-in's is."""

    @dataclass(frozen=True)
    class Scaling(Operator):
        kind: ClassVar[str] = name
        symbol: ClassVar[str] = r"\mathcal{S}"
        scale: object = 1
        extra: object = None  # read by nothing: an option beside the scale

        def parameters(self):
            return ()

        def definitions(self):
            if broken:
                raise RuntimeError("definitions() broke")
            scale = sp.sympify(self.scale[0] if isinstance(self.scale, tuple) else self.scale)
            return (Definition("out", r"\mathcal{S}", (X, Y), scale * apply(STATE, X, Y), "a scaling"),)

    return Scaling


def test_options_equal_in_python_but_of_other_types_build_other_operators():
    cls = _scaling("memo-scaling")
    built = {repr(value): _checked(cls, "s", {"scale": value}, "s") for value in (1, 1.0, (1,), (1.0,))}
    assert [type(operator.scale) for operator in built.values()] == [int, float, tuple, tuple]
    assert type(built["(1.0,)"].scale[0]) is float
    for name in ("1.0", "(1.0,)"):  # not the Integer 1 an entry shared with 1 would give
        assert built[name].definitions()[0].rhs.has(sp.Float(1.0)), name


def test_a_negative_zero_and_containers_whose_members_merge_are_told_apart():
    """0.0 and -0.0 are equal in Python, and a formula may read the sign (copysign); dict keys 1 and 1.0 merge in a
    dict, members of a set in the set: each its own operator (the review's reproducer: a plug-in derived 0.0 after
    -0.0 got -0.0's operator)."""
    cls = _scaling("memo-signs")
    positive, negative = (_checked(cls, "s", {"scale": value}, "s") for value in (0.0, -0.0))
    assert positive is not negative and math.copysign(1, negative.scale) == -1
    zeros = [_checked(cls, "s", {"scale": (value,)}, "s").scale[0] for value in (0.0, -0.0)]
    assert [math.copysign(1, zero) for zero in zeros] == [1, -1]
    keyed = [_checked(cls, "s", {"scale": 2, "extra": {key: 1}}, "s") for key in (1, 1.0)]
    assert keyed[0] is not keyed[1]
    for members in (frozenset({1}), frozenset({1.0})):  # no memo: built each time
        first, second = (_checked(cls, "s", {"scale": 2, "extra": members}, "s") for _ in range(2))
        assert first is not second and type(next(iter(second.extra))) is type(next(iter(members)))


def test_the_same_options_are_served_the_operator_checked_before():
    cls = _scaling("memo-again")
    assert _checked(cls, "s", {"scale": 2}, "s") is _checked(cls, "s", {"scale": 2}, "s")
    assert _checked(cls, "s", {"scale": 2}, "s") is not _checked(cls, "t", {"scale": 2}, "t")


def test_a_class_loaded_again_is_checked_again():
    _checked(_scaling("memo-reloaded"), "s", {"scale": 2}, "s")
    with pytest.raises(SplitformerError, match="RuntimeError: definitions\\(\\) broke"):
        _checked(_scaling("memo-reloaded", broken=True), "s", {"scale": 2}, "s")


class _Unhashable:
    """An option value with no hash (equal to its kind, 3 to SymPy)."""

    __hash__ = None

    def __eq__(self, other):
        return isinstance(other, _Unhashable)

    def _sympy_(self):
        return sp.Integer(3)


def test_an_unhashable_option_is_built_each_time():
    cls = _scaling("memo-unhashable")
    first, second = (_checked(cls, "s", {"scale": _Unhashable()}, "s") for _ in range(2))
    assert first == second and first is not second
    assert first.definitions()[0].rhs.has(sp.Integer(3))
