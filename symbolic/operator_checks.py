"""What an operator kind returns, checked before it is derived: a plug-in's output is data too.

``parameters()`` and ``definitions()`` of any kind (a built-in, or a user's loaded with
``--load``) become identifiers, comments and expressions of the generated code. Names must
be identifiers, text one line, and a definition a SymPy expression over the continuous
variables, the sizes of the domains, ``eps``, ``rope_theta``, the kind's parameters and
the functions defined before it: anything else would be emitted as a name the generated
module cannot resolve (or as code), so it is refused here in one line naming the kind.
"""

from __future__ import annotations

import re

import sympy as sp

from . import domains
from .errors import SplitformerError
from .operators import EPSILON, STATE, SUPPORT, Definition, Parameter

__all__ = ["check_output"]

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def _known_symbols() -> set[str]:
    """The names of the symbols the generated code gives a value (variables, sizes, ``eps``, ``rope_theta``)."""
    from .rotary_attention import ROPE_THETA

    names = {symbol.name for symbol in domains.VARIABLES} | {EPSILON.name, ROPE_THETA.name}
    for domain in vars(domains).values():
        if isinstance(domain, domains.Domain):
            names |= {symbol.name for symbol in (domain.size, domain.spacing, domain.measure)
                      if isinstance(symbol, sp.Symbol)}
    return names


def check_output(parameters: tuple[Parameter, ...], definitions: tuple[Definition, ...], where: str) -> None:
    """``SplitformerError`` starting with ``where`` unless every parameter and definition can be emitted."""
    functions = {STATE, SUPPORT, "chi_m", "pos", "mem"}
    for parameter in parameters:
        for field in ("name", "function"):
            _identifier(getattr(parameter, field), f"{where}: parameter {field}")
        _text(parameter.latex, f"{where}: parameter {parameter.name!r} latex")
        functions.add(parameter.function)
    known = _known_symbols()
    for definition in definitions:
        _identifier(definition.function, f"{where}: definition function")
        what = f"{where}: definition {definition.function!r}"
        _text(definition.latex, f"{what} latex")
        _text(definition.meaning, f"{what} meaning")
        if not isinstance(definition.rhs, sp.Expr):
            raise SplitformerError(f"{what}: rhs must be a SymPy expression, got {type(definition.rhs).__name__}")
        unknown = sorted(symbol.name for symbol in definition.rhs.free_symbols
                         if isinstance(symbol, sp.Symbol) and symbol.name not in known)
        if unknown:
            raise SplitformerError(f"{what}: the symbol {unknown[0][:64]!r} is neither a continuous variable nor a "
                                   "size, eps or rope_theta; the generated code would have no value for it")
        applied = sorted(type(call).__name__ for call in definition.rhs.atoms(sp.core.function.AppliedUndef)
                         if type(call).__name__ not in functions)
        if applied:
            raise SplitformerError(f"{what}: applies {applied[0][:64]!r}, which is neither a parameter nor a "
                                   "function defined before it")
        functions.add(definition.function)


def _identifier(name: object, what: str) -> None:
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise SplitformerError(f"{what} {str(name)[:64]!r} is not an identifier (letters, digits, '_', at most 64)")


def _text(text: object, what: str) -> None:
    if not isinstance(text, str) or not text.isprintable():
        raise SplitformerError(f"{what}: must be one printable line of text")
