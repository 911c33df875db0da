"""Every field of a ``Scheme`` checked for its type and for what it may hold.

One path for every way a scheme reaches the pipeline: ``Scheme.check`` runs it, and a scheme
file, a ``Scheme`` built in Python and one that a plug-in builds all pass through
``Scheme.check`` before anything is derived. Names become file names, module names and
attributes (``names``); summaries reach docstrings and reports (``names.check_line``);
numbers are exact rationals; the composition is bounded in depth.
"""

from __future__ import annotations

import math
import unicodedata
from typing import TYPE_CHECKING

from .activations import ACTIVATIONS
from .across_layers import AcrossLayers, ACROSS_LAYER_METHODS
from .composition import Parallel, RungeKutta, Sequence, Substep
from .errors import SplitformerError
from .names import check_line, check_operator_name, check_scheme_name
from .tableaux import Tableau
from .trusted_expressions import RATIONALS

if TYPE_CHECKING:
    from .scheme import Scheme

__all__ = ["check_fields", "MAX_DEPTH", "CLAIMS"]

#: Parallel branches nest at most this deep.
MAX_DEPTH = 32
#: The orders a scheme may claim.
CLAIMS = ("order", "splitting_order")
#: The most characters of a description (shown in reports, never in code).
MAX_DESCRIPTION = 20_000


def check_fields(scheme: "Scheme") -> None:
    """``SplitformerError`` naming the first field of ``scheme`` that is of the wrong type or holds bad text."""
    check_scheme_name(scheme.name)
    where = f"scheme {scheme.name!r}"
    check_line(scheme.summary, f"{where}: summary")
    for field in ("description", "source"):
        if not isinstance(getattr(scheme, field), str):
            raise SplitformerError(f"{where}: {field}: expected str, got {type(getattr(scheme, field)).__name__}")
    if len(scheme.description) > MAX_DESCRIPTION:
        raise SplitformerError(f"{where}: description: longer than {MAX_DESCRIPTION} characters")
    unprintable = next((character for character in scheme.description if _controls(character)), None)
    if unprintable is not None:  # it reaches reports and `show`: a terminal would obey an escape sequence
        raise SplitformerError(f"{where}: description: holds the control character {unprintable!r} (printable text, "
                               "new lines and tabs only)")
    for field in ("activation", "declared_activation"):
        value = getattr(scheme, field)
        if type(value) is not str or value not in ACTIVATIONS:
            raise SplitformerError(f"{where}: {field}: unknown activation {_short(value)} "
                                   f"(known: {', '.join(sorted(ACTIVATIONS))})")
    if scheme.emitted_name:
        check_scheme_name(scheme.emitted_name)
    for field in ("final_norm", "causal", "made_causal", "padded_queries_outside"):
        if not isinstance(getattr(scheme, field), bool):
            raise SplitformerError(f"{where}: {field}: expected bool, got {type(getattr(scheme, field)).__name__}")
    _check_claims(scheme.claims, where)
    _check_operators(scheme.operators, scheme.options, where)
    _check_sequence(scheme.body, f"{where}: steps", 0)
    _check_across_layers(scheme.across_layers, f"{where}: across_layers")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:64] + "…"


def _mapping(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise SplitformerError(f"{what}: expected dict, got {type(value).__name__}")
    return value


def _check_claims(claims: object, where: str) -> None:
    for key, value in _mapping(claims, f"{where}: claims").items():
        if key not in CLAIMS:
            raise SplitformerError(f"{where}: claims: unknown claim {_short(key)} (known: {', '.join(CLAIMS)})")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SplitformerError(f"{where}: claims: {key} must be a positive integer, got {_short(value)}")


def _check_operators(operators: object, options: object, where: str) -> None:
    if not _mapping(operators, f"{where}: operators"):
        raise SplitformerError(f"{where}: operators: empty; name at least one operator")
    for key, kind in operators.items():
        try:
            check_operator_name(key)
        except SplitformerError as error:
            raise SplitformerError(f"{where}: operators: {error}") from None
        if type(kind) is not str:
            raise SplitformerError(f"{where}: operators.{key}: expected a kind name (str), got {type(kind).__name__}")
    for key, table in _mapping(options, f"{where}: options").items():
        if key not in operators:
            raise SplitformerError(f"{where}: options: {_short(key)} is not a declared operator")
        for name, value in _mapping(table, f"{where}: options.{key}").items():
            if type(name) is not str or not name.isidentifier():
                raise SplitformerError(f"{where}: options.{key}: {_short(name)} is not an option name")
            if type(value) not in (bool, int, float, str):  # exact: a subclass could print other text
                raise SplitformerError(f"{where}: options.{key}.{name}: expected a number, string or boolean, "
                                       f"got {type(value).__name__}")
            if isinstance(value, float) and not math.isfinite(value):
                raise SplitformerError(f"{where}: options.{key}.{name}: {value} is not a finite number")
            if isinstance(value, str):
                check_line(value, f"{where}: options.{key}.{name}")


def _rational(value: object, what: str) -> None:
    if type(value) not in RATIONALS:  # exact: a subclass could print itself into emitted code
        raise SplitformerError(f"{what}: expected an exact rational (sympy.Rational), got {type(value).__name__}")


def _check_across_layers(across: object, where: str) -> None:
    """Each field of ``across`` by exact type (a ``str`` subclass may compare equal to a method and print
    other text), then by value: the constructor's checks run again on the fields as they are now."""
    if across is None:
        return
    if type(across) is not AcrossLayers:
        raise SplitformerError(f"{where}: expected AcrossLayers, got {type(across).__name__}")
    if type(across.method) is not str or across.method not in ACROSS_LAYER_METHODS:
        raise SplitformerError(f"{where}: method: expected one of {', '.join(ACROSS_LAYER_METHODS)}, "
                               f"got {_short(across.method)}")
    _rational(across.momentum, f"{where}: momentum")
    if type(across.weights) is not tuple:
        raise SplitformerError(f"{where}: weights: expected a tuple, got {type(across.weights).__name__}")
    for n, weight in enumerate(across.weights):
        _rational(weight, f"{where}: weights[{n}]")
    try:  # momentum and weights fit the method
        AcrossLayers(across.method, across.momentum, across.weights)
    except SplitformerError as error:
        raise SplitformerError(f"{where}: {str(error).removeprefix('across_layers: ')}") from None


#: Characters that reorder the text around them (bidirectional embeddings, overrides and isolates).
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _controls(character: str) -> bool:
    """Whether ``character`` is a control character a terminal obeys (C0, DEL, C1 but new lines, carriage returns
    and tabs) or one that reorders the text around it; spaces of other widths, soft hyphens and marks are text."""
    return (unicodedata.category(character) == "Cc" and character not in "\n\r\t") or character in _BIDI


def _check_sequence(sequence: object, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SplitformerError(f"{where}: parallel steps nest deeper than {MAX_DEPTH} levels")
    if not isinstance(sequence, Sequence) or not isinstance(sequence.steps, tuple):
        raise SplitformerError(f"{where}: expected a Sequence of a tuple of steps, got {type(sequence).__name__}")
    for position, step in enumerate(sequence.steps):
        path = f"{where}[{position}]"
        if isinstance(step, Substep):
            _check_substep(step, path)
        elif isinstance(step, Parallel):
            if not isinstance(step.branches, tuple) or not isinstance(step.weights, tuple) or not step.branches:
                raise SplitformerError(f"{path}: a Parallel takes non-empty tuples of branches and weights")
            if len(step.weights) != len(step.branches):
                raise SplitformerError(f"{path}: {len(step.weights)} weights for {len(step.branches)} branches")
            for number, weight in enumerate(step.weights):
                _rational(weight, f"{path}.weights[{number}]")
            if sum(step.weights) != 1:
                raise SplitformerError(f"{path}.weights: weights must sum to 1, they sum to {sum(step.weights)}")
            for number, branch in enumerate(step.branches):
                _check_sequence(branch, f"{path}.parallel[{number}]", depth + 1)
        elif isinstance(step, RungeKutta):
            if not isinstance(step.tableau, Tableau):
                raise SplitformerError(f"{path}.tableau: expected a Tableau, got {type(step.tableau).__name__}")
            if not isinstance(step.fields, tuple) or not step.fields:
                raise SplitformerError(f"{path}.fields: a Runge–Kutta step needs a non-empty tuple of fields")
            for number, field in enumerate(step.fields):
                if not isinstance(field, Substep):
                    raise SplitformerError(f"{path}.fields[{number}]: expected a Substep, got {type(field).__name__}")
                _check_substep(field, f"{path}.fields[{number}]")
                if field.solver != "explicit":
                    raise SplitformerError(f"{path}.fields[{number}].solver: the stages of a Runge–Kutta step "
                                           "evaluate vector fields: use 'explicit'")
        else:
            raise SplitformerError(f"{path}: expected a Substep, Parallel or RungeKutta, got {type(step).__name__}")


def _check_substep(step, path: str) -> None:
    for field in ("operator", "solver"):
        if type(getattr(step, field)) is not str:  # exact: a str subclass can print other text
            raise SplitformerError(f"{path}.{field}: expected str, got {type(getattr(step, field)).__name__}")
    for role in ("on", "then", "combine", "shift"):
        if getattr(step, role) is not None and type(getattr(step, role)) is not str:
            raise SplitformerError(f"{path}.{role}: expected str or None, got {type(getattr(step, role)).__name__}")
    if type(step.step) is not str:
        raise SplitformerError(f"{path}.step: expected str, got {type(step.step).__name__}")
    if type(step.stream) is not bool:
        raise SplitformerError(f"{path}.stream: expected bool, got {type(step.stream).__name__}")
    _rational(step.fraction, f"{path}.fraction")
    if step.fraction == 0:
        raise SplitformerError(f"{path}.fraction: must not be 0 (either sign is a step; 0 applies nothing)")
