"""What an operator kind returns, checked before it is derived: a plug-in's output is data too.

``parameters()``, ``definitions()``, ``constants`` and ``input_fields`` of any kind (a built-in, or a user's loaded with
``--load``) become identifiers, comments and expressions of the generated code. Names must
be identifiers (exact ``str``), text one line, variables and domains the library's own objects, and a
definition a SymPy expression over the continuous variables, the sizes of the domains, ``eps``,
``rope_theta``, the kind's parameters and the functions defined before it, built of SymPy's own
classes only (``trusted_expressions``: a subclass could print itself as code): anything else
would be emitted as a name the generated module cannot resolve (or as code), so it is refused
here in one line naming the kind.
"""

from __future__ import annotations

import re
import sys

import sympy as sp
from sympy.core.function import AppliedUndef

from . import domains
from .errors import SplitformerError
from .constraints import ConstraintSet
from .inputs import MEMORY, MEMORY_SUPPORT, POSITIONS, ROLES, Constant, Input
from .markdown import ATTRIBUTES, MACRO
from .names import MODULE_ATTRIBUTES, check_identifier, check_line
from .operators import BRANCH, EPSILON, STATE, SUPPORT, Definition, Parameter
from .trusted_expressions import check_expression

__all__ = ["check_output", "check_declared", "check_constraints", "check_symbols"]


def _known_symbols() -> set[sp.Symbol]:
    """The symbols the generated code gives a value (variables, sizes, ``eps``, ``rope_theta``)."""
    from .rotary_attention import ROPE_THETA

    symbols = set(domains.VARIABLES) | {EPSILON, ROPE_THETA}
    for domain in vars(domains).values():
        if isinstance(domain, domains.Domain):
            symbols |= {symbol for symbol in (domain.size, domain.spacing, domain.measure)
                        if isinstance(symbol, sp.Symbol)}
    return symbols


def _assumptions(symbol: sp.Symbol) -> str:
    """The assumptions ``symbol`` was made with, as its constructor takes them (``positive=True``; ``none``)."""
    given = symbol._assumptions_orig  # what the constructor was given, not what SymPy deduced from it
    return ", ".join(f"{name}={value}" for name, value in sorted(given.items())) or "none"


def check_output(parameters: tuple[Parameter, ...], definitions: tuple[Definition, ...], where: str,
                 combiner: bool = False, constants: tuple = (), inputs: tuple = ()) -> None:
    """``SplitformerError`` starting with ``where`` unless every parameter and definition can be emitted
    (a residual ``combiner`` also reads the branch output ``BRANCH``; a definition may read the kind's declared
    ``constants``, keyword arguments of the emitted code, and its declared ``inputs``, fields it reads), every declared
    constant is read (as the very symbol declared: one of another name's assumptions prints alike but is another), and
    the last definition, the output, is on the state's (x, y)."""
    functions = {STATE, SUPPORT} | {field.name for field in inputs} | ({BRANCH} if combiner else set())
    arities = {field.name: len(field.arguments) for field in inputs}  # how many arguments each function takes
    for parameter in parameters:
        for field in ("name", "function"):
            check_identifier(getattr(parameter, field), f"{where}: parameter {field}")
        _text(parameter.latex, f"{where}: parameter {parameter.name!r} latex", math=True)
        _library_objects(parameter, f"{where}: parameter {parameter.name!r}")
        functions.add(parameter.function)
        arities[parameter.function] = len(parameter.arguments)
    declared = {constant.symbol for constant in constants
                if isinstance(constant, Constant) and type(constant.symbol) is sp.Symbol}
    known = {symbol.name: symbol for symbol in _known_symbols() | declared}
    for definition in definitions:
        check_identifier(definition.function, f"{where}: definition function")
        what = f"{where}: definition {definition.function!r}"
        _text(definition.latex, f"{what} latex", math=True)
        _text(definition.meaning, f"{what} meaning")
        _library_objects(definition, what)
        if not isinstance(definition.rhs, sp.Expr):
            raise SplitformerError(f"{what}: rhs must be a SymPy expression, got {type(definition.rhs).__name__}")
        check_expression(definition.rhs, what)
        unknown = sorted(symbol.name for symbol in definition.rhs.atoms(sp.Symbol) if symbol.name not in known)
        if unknown:
            raise SplitformerError(f"{what}: the symbol {unknown[0][:64]!r} is neither a continuous variable nor a "
                                   "size, eps, rope_theta or a declared constant; the generated code would have no "
                                   "value for it")
        other = sorted((symbol for symbol in definition.rhs.atoms(sp.Symbol) if known[symbol.name] != symbol), key=str)
        if other:  # one name, two SymPy symbols: the code would print one name, the checks evaluate the declared one
            symbol = other[0]
            raise SplitformerError(f"{what}: reads a symbol {symbol.name!r} made with the assumptions "
                                   f"{_assumptions(symbol)}, but the declared {symbol.name!r} has "
                                   f"{_assumptions(known[symbol.name])}: they are two SymPy symbols; read the declared "
                                   "Symbol object itself")
        applied = sorted(type(call).__name__ for call in definition.rhs.atoms(AppliedUndef)
                         if type(call).__name__ not in functions)
        undeclared = [name for name, field in _INPUT_FIELDS.items() if field.name in applied]
        if undeclared:
            field = _INPUT_FIELDS[undeclared[0]]
            raise SplitformerError(f"{what}: reads the input field {field.name!r} ({field.role}) without declaring "
                                   f"it: input_fields = ({undeclared[0]},) from splitformer.symbolic.inputs")
        if applied:
            raise SplitformerError(f"{what}: applies {applied[0][:64]!r}, which is neither a parameter nor a "
                                   "function defined before it")
        wrong = sorted((type(call).__name__, len(call.args)) for call in definition.rhs.atoms(AppliedUndef)
                       if arities.get(type(call).__name__, len(call.args)) != len(call.args))
        if wrong:
            name, count = wrong[0]
            raise SplitformerError(f"{what}: applies {name!r} to {count} argument{'s' * (count != 1)}; it takes "
                                   f"{arities[name]}")
        functions.add(definition.function)
        arities[definition.function] = len(definition.arguments)
    read = set().union(*(definition.rhs.free_symbols for definition in definitions))
    unread = sorted(symbol.name for symbol in declared - read)
    if unread:
        raise SplitformerError(f"{where}: declares the constant {unread[0]!r}, but no definition reads it: the emitted "
                               f"keyword argument {unread[0]}= would change nothing")
    output = definitions[-1]
    if tuple(output.arguments) != (domains.X, domains.Y):
        on = ", ".join(str(variable.symbol) for variable in output.arguments)
        raise SplitformerError(f"{where}: its last definition, {output.function!r}, is its output, but it is on "
                               f"({on}): a block step's operator is a field of the state u(x, y); end definitions() "
                               "with its value on (x, y)")


#: The input fields a kind may declare, by the names it imports them as.
_INPUT_FIELDS = {"POSITIONS": POSITIONS, "MEMORY": MEMORY, "MEMORY_SUPPORT": MEMORY_SUPPORT}


def _library_objects(entry: Parameter | Definition | Input, what: str) -> None:
    """``SplitformerError`` unless the variables and domains of ``entry`` are the library's own objects
    (their symbols and grid indices become names and einsum labels of the emitted code)."""
    variables = domains.VARIABLES.values()
    for field in ("arguments", "absorbs", "shape"):
        items = getattr(entry, field, ())
        known = _DOMAINS if field == "shape" else variables
        wrong = [item for item in items if not any(item is own for own in known)] if type(items) is tuple else [items]
        if wrong:
            noun = "domain" if field == "shape" else "variable"
            raise SplitformerError(f"{what}: {field} holds a {type(wrong[0]).__name__}, not one of the {noun}s of "
                                   "splitformer.symbolic.domains")


#: The domains a kind's parameters may be shaped over.
_DOMAINS = tuple(value for value in vars(domains).values() if isinstance(value, domains.Domain))


def _rope_theta() -> sp.Symbol:
    """RoPE's θ, the one constant a built-in kind declares (the Block keeps it as ``rope_theta``)."""
    from .rotary_attention import ROPE_THETA

    return ROPE_THETA


def check_declared(constants: object, inputs: object, where: str) -> None:
    """``SplitformerError`` starting with ``where`` unless every declared constant and input field can be
    emitted: a constant is a keyword argument (an identifier) with a finite default > 0 and a docstring
    line for meaning; an input field's names are identifiers and its role one of ``ROLES``."""
    for what, declared, item in (("constants", constants, Constant), ("input_fields", inputs, Input)):
        wrong = [entry for entry in declared if not isinstance(entry, item)] if isinstance(declared, tuple) else [declared]
        if wrong:
            raise SplitformerError(f"{where}: {what} must be a tuple of {item.__name__}, "
                                   f"got {type(wrong[0]).__name__} {str(wrong[0])[:60]!r}")
    for constant in constants:
        if type(constant.symbol) is not sp.Symbol:  # exact: a subclass could print itself
            raise SplitformerError(f"{where}: a constant's symbol must be a SymPy Symbol, "
                                   f"got {type(constant.symbol).__name__}")
        check_identifier(constant.symbol.name, f"{where}: constant")
        if constant.symbol.name in MODULE_ATTRIBUTES and constant.symbol != _rope_theta():
            raise SplitformerError(f"{where}: constant {constant.name!r} is the name of an attribute of the emitted "
                                   "torch Block (or of torch.nn.Module), which would hold it in its place; rename it")
        given = {"the default": constant.default}  # printed as its default
        if constant.checked_at is not None:
            given["checked_at"] = constant.checked_at
        for field, value in given.items():
            if type(value) not in (int, float) or not 0 < value <= sys.float_info.max:
                raise SplitformerError(f"{where}: constant {constant.name!r}: {field} must be a finite number > 0, "
                                       f"got {str(value)[:40]!r}")
        check_line(constant.meaning, f"{where}: constant {constant.name!r} meaning")  # its argument's docstring
    for field in inputs:
        for attribute in ("name", "argument"):
            check_identifier(getattr(field, attribute), f"{where}: input field {attribute}")
        _library_objects(field, f"{where}: input field {field.name!r}")
        _text(field.latex, f"{where}: input field {field.name!r} latex", math=True)
        if field.role not in ROLES:
            raise SplitformerError(f"{where}: input field {field.name!r}: role {str(field.role)[:40]!r} is not one "
                                   f"of {', '.join(ROLES)}")


def check_symbols(kind: type, where: str) -> None:
    """``SplitformerError`` starting with ``where`` unless the LaTeX a kind is written with in equations (its
    ``symbol``, a projection's ``constraint``) is math text a report can print."""
    _text(getattr(kind, "symbol", None), f"{where}: symbol", math=True)
    if kind.is_projection:
        _text(getattr(kind, "constraint", None), f"{where}: constraint", math=True)


def check_constraints(constraints: object, where: str) -> None:
    """``SplitformerError`` starting with ``where`` unless a projection's constraint set can be printed in a report:
    its LaTeX and the names of the symbols its formulas are written in are math text (the report prints a symbol
    by its name). Its statistics become definitions, checked by ``check_output``."""
    if not isinstance(constraints, ConstraintSet):
        raise SplitformerError(f"{where}: constraints must be a ConstraintSet, got {type(constraints).__name__}")
    _text(constraints.name, f"{where}: constraint set name", math=True)  # a check's statement prints it
    _text(constraints.latex, f"{where}: constraint set latex", math=True)
    formulas = [moment.component + moment.value + moment.ghost for moment in constraints.moments]
    formulas += [bound.expr for bound in constraints.bounds]
    formulas += [statistic.symbol + statistic.mean_of for statistic in constraints.statistics]
    for symbol in sorted(set().union(*(sp.sympify(f).free_symbols for f in formulas)), key=str):
        _text(symbol.name, f"{where}: constraint set symbol {symbol.name[:40]!r}", math=True)


#: Markup live in a report's Markdown outside math: raw HTML, a link, a link definition, an image (attributes and
#: LaTeX link macros: the report guard's own patterns, ``markdown.ATTRIBUTES`` and ``markdown.MACRO``).
_MARKUP = re.compile(r"<|\]\(|\]\[|\]:|!\[")


def _text(text: object, what: str, math: bool = False) -> None:
    """One printable line holding no markup a report would render: ``math`` text (LaTeX the report puts between
    ``$``) holds no ``$``; other text keeps its ``$`` in pairs."""
    if type(text) is not str or not text.isprintable():
        raise SplitformerError(f"{what}: must be one printable line of text")
    markup = any(pattern.search(text) for pattern in (_MARKUP, ATTRIBUTES, MACRO))
    if markup or ("$" in text if math else text.count("$") % 2):
        raise SplitformerError(f"{what}: must hold no markup (no '<', link, image or \\href"
                               + (", no '$')" if math else ", its '$' in pairs)"))
