"""Schemes built in Python: the document a scheme file holds, checked by the same reader.

``scheme(...)`` takes the fields of a scheme file as arguments and the steps as the tables
``substep``, ``projection``, ``parallel``, ``rk2`` and ``runge_kutta`` return; the document goes through the
reader of scheme files, so a Python-built scheme is rejected with the same one-line
``SplitformerError`` a TOML file gets, and its ``source`` is the equivalent TOML text::

    from splitformer import scheme, substep, projection

    block = scheme("my-block", "attention then feed-forward, one LayerNorm",
                   operators={"attn": "attention", "norm": "layer-norm", "ffn": "feed-forward"},
                   steps=[substep("attn", on="norm"), substep("ffn", on="norm")],
                   final_norm=True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import sympy as sp

from .errors import SplitformerError
from .scheme import Scheme
from .scheme_fields import MAX_DEPTH
from .scheme_file import parse_scheme
from .toml_text import toml_key, toml_value

__all__ = ["scheme", "substep", "projection", "parallel", "rk2", "runge_kutta", "to_toml"]

Number = int | str | Fraction | sp.Rational


def substep(operator: str, solver: str = "explicit", *, fraction: Number = 1, on: str | None = None,
            then: str | None = None, step: str = "fixed", combine: str | None = None,
            shift: str | None = None, stream: bool = False) -> dict:
    """One substep: ``solver`` (``explicit`` or ``projection``) applied to ``operator``; ``then`` a projection
    of its output before it is added, ``step = "per-channel"`` a learned diagonal time step, ``step = "scalar"``
    one learned number scaling the field (ReZero); ``combine`` a residual combiner of the state and the
    field's output (``gru-gate``); ``shift`` a token map of the branch input after ``on`` (``token-shift``);
    ``stream=True`` also adds the increment to the second state (the accumulating stream of ResiDual)."""
    table: dict[str, Any] = {"operator": operator, "solver": solver}
    if fraction != 1:
        table["fraction"] = fraction
    for key, value, default in (("on", on, None), ("then", then, None), ("step", step, "fixed"), ("combine", combine, None),
                                ("shift", shift, None), ("stream", stream, False)):
        if value != default:
            table[key] = value
    return table


def projection(operator: str) -> dict:
    """The projection substep ``u ← Proj_S(u)`` of a projection operator."""
    return substep(operator, "projection")


def parallel(*branches: Sequence[Mapping], weights: Sequence[Number] | None = None) -> dict:
    """Branches (lists of substeps; ``[]`` is the trivial flow) from one state, weighted sum."""
    table: dict[str, Any] = {"parallel": [list(branch) for branch in branches]}
    if weights is not None:
        table["weights"] = list(weights)
    return table


def rk2(*fields: str | Mapping) -> dict:
    """A Heun (RK2) step of the summed field; a field is an operator name or ``substep(…)``."""
    return {"rk2": [{"operator": field} if isinstance(field, str) else dict(field) for field in fields]}


def runge_kutta(method: str | Mapping, *fields: str | Mapping) -> dict:
    """One explicit Runge–Kutta step of the summed field: ``method`` is a tableau name
    (``"rk4"``, ``"heun"``, one under ``tableaux=``) or ``{"a": [[...], ...], "b": [...]}``."""
    if not isinstance(method, (str, Mapping)):
        raise SplitformerError(f"runge_kutta: method must be a tableau name or a mapping {{'a': …, 'b': …}}, got "
                               f"{type(method).__name__}")
    return {"rk": method if isinstance(method, str) else dict(method),
            "fields": rk2(*fields)["rk2"]}


def scheme(name: str, summary: str, operators: Mapping[str, str], steps: Sequence[Mapping], **fields: Any) -> Scheme:
    """A ``Scheme`` from the fields of a scheme file (``activation``, ``final_norm``, ``order``, …)."""
    document = {"name": name, "summary": summary, **fields, "operators": operators, "steps": steps}
    where = f"Python scheme {name!r}" if isinstance(name, str) else "Python scheme"
    return parse_scheme(to_toml(document, where), where)


def _exact_rational(value: object) -> bool:
    """``value`` is a ``Fraction`` or one of SymPy's own rational classes (``Integer``, ``Half``, ``One``…)."""
    return type(value) is Fraction or (isinstance(value, sp.Rational) and type(value).__module__.startswith("sympy."))


#: The deepest containers a Python scheme may nest: a parallel step is a table of lists of steps, three containers
#: a level, and ``MAX_DEPTH`` levels are allowed (deeper ones are refused by the scheme's own reading, with its message).
_MAX_CONTAINERS = 3 * MAX_DEPTH + 8


def _plain(value: Any, where: str, path: str = "", depth: int = 0) -> Any:
    """Exact fractions as strings (``"1/2"``), containers as dicts and lists: TOML's values. A number is converted only
    when it is ``Fraction`` or one of SymPy's own rationals exactly: a subclass could print another number. Errors name
    ``where`` and the value's ``path``; containers nested past ``_MAX_CONTAINERS`` (one holding itself) are refused."""
    at = f"{where}: {path}" if path else where
    if depth > _MAX_CONTAINERS:  # its path, as long as the nesting, cut short
        raise SplitformerError(f"{where}: {path[:48]}…: nested deeper than {_MAX_CONTAINERS} containers (parallel steps nest at most "
                               f"{MAX_DEPTH} levels; a list or dict that holds itself never ends)")
    if isinstance(value, (Fraction, sp.Rational)) and not _exact_rational(value):
        raise SplitformerError(f"{at}: a number of type {type(value).__name__} (a subclass of {Fraction.__name__} or of "
                               "SymPy's Rational) is refused: give a Fraction, a SymPy rational, a string or an int")
    if isinstance(value, (Fraction, sp.Rational)):
        largest = max(abs(int(value.numerator)), int(value.denominator))
        if largest >= 2**63:  # before printing: str refuses very long ints
            raise SplitformerError(f"{at}: a number of {largest.bit_length()} bits is out of range (a scheme file "
                                   "holds 64-bit integers)")
    if isinstance(value, sp.Integer):
        return int(value.p)
    if isinstance(value, sp.Rational):
        return f"{value.p}/{value.q}"
    if isinstance(value, Fraction):
        return f"{value.numerator}/{value.denominator}" if value.denominator != 1 else str(value.numerator)
    if isinstance(value, Mapping):
        return {key: _plain(item, where, f"{path}.{key}" if path else str(key), depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, where, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    return value


def to_toml(document: Mapping[str, Any], where: str = "to_toml") -> str:
    """A scheme document as the text of a scheme file: scalars, then tables, then ``[[steps]]`` (its values made TOML's
    first, ``_plain``: errors name ``where``)."""
    document = _plain(document, where)
    lines, tables = [], []
    for key, value in document.items():
        name = toml_key(key, "scheme")
        if isinstance(value, Mapping):
            tables += ["", f"[{name}]", *(f"{toml_key(k, name)} = {toml_value(v, f'{name}.{k}')}" for k, v in value.items())]
        elif isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
            for item in value:
                tables += ["", f"[[{name}]]", *(f"{toml_key(k, name)} = {toml_value(v, f'{name}.{k}')}" for k, v in item.items())]
        else:
            lines.append(f"{name} = {toml_value(value, name)}")
    return "\n".join(lines + tables) + "\n"
