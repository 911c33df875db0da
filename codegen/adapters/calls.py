"""Are the functions a library forward calls the libraries' own, each where its source puts it? Adapters read a
module's parameters and configuration as the library's forward uses them; a module-level function that forward
calls, replaced after import (``modeling_llama.apply_rotary_pos_emb = my_rope``, ``torch.nn.functional.gelu =
torch.tanh``), changes what the source computes while its parameters stay the same.

``check_calls`` follows, from a library class's ``forward`` (and the methods of the class it calls through
``self``), every global name and attribute chain its code loads (``F.linear``, ``torch.nn.functional.gelu``,
``apply_rotary_pos_emb``), into the library functions those hold, and refuses a binding ``module.name`` whose value

- is a Python function, a callable object or a module defined outside torch, transformers, timm, x-transformers
  (and their einops helpers), the standard library, typing_extensions and the package of ``module`` itself
  (``einx.add`` may be einx's); a module must be the one imported under its name;
- is not the function or class the module's source defines under that name (``def name``/``class name``: the
  value's ``__module__`` and ``__name__`` must be the module's and ``name``, through ``functools.wraps``
  layers, and its code what that source compiles to: ``as_in_source``), or, for a name the source imports (``from x import y as name``), is not what that import binds
  (checked the same way there), or, for a name the source assigns (``gelu = _add_docstr(torch._C._nn.gelu, …)``),
  is a function whose name the assignment does not mention (or a ``functools.partial`` it does not make).

A module kernels made of a function (transformers 5.25's ``apply_rotary_pos_emb``: ``hub_kernels``) stands for the
function it calls, checked as above and followed; its class must be kernels' own.

The chains of each code object are read once (``dis``); the values are looked up on every check.
"""

from __future__ import annotations

import dis
import functools
import re
import sys
import types
from typing import Any

from splitformer.symbolic.errors import SplitformerError

from .hub_kernels import function_module, replaced_in_class, wrapped_function
from .places import LIBRARIES, PLACES, functions_of, inside, is_library

__all__ = ["check_calls", "check_function_module", "assigns", "as_in_source"]

#: Names of a module's source bound by ``import``: ``(module or None, name imported)`` for each name bound.
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+)?import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_DEFINED = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)", re.M)
_WORD = re.compile(r"[A-Za-z_]\w*")
_DOCSTRING = re.compile(r'[rbuf]?(?:"""|\'\'\')')
_STRING = re.compile(r'"[^"\n]*"|\'[^\'\n]*\'')


def check_calls(where: str, cls: type, checked: set[Any]) -> list[tuple[str, Any]]:
    """Refuse (naming ``where``) a function, callable or module that a library class in ``cls``'s MRO calls from
    its forward and that is not its library's own, where the library's source puts it (module docstring).
    Classes, code objects and function modules in ``checked`` are skipped, and added. Returns the modules kernels
    made of functions that the forward calls (``hub_kernels.function_module``), named: the caller checks their
    hooks and instance methods as a part's."""
    classes = [klass for klass in cls.__mro__ if klass not in checked and is_library(klass)]
    checked.update(classes)
    return _follow(where, [function for klass in classes for function in _forward_methods(klass)], checked)


def check_function_module(where: str, module: Any, checked: set[Any]) -> list[tuple[str, Any]]:
    """Refuse a module kernels made of a function (``module``, named ``where``: a part's private copy) unless its
    class is kernels' own and the function it calls is a library's, the one its module's source defines under its
    name; then check what that function calls (``check_calls``, whose result this returns)."""
    function = _function_of(where, type(module).__name__, module)
    home = sys.modules.get(function.__module__ or "")
    if home is None or not _is_library_function(function) or home.__name__.split(".")[0] not in LIBRARIES:
        raise SplitformerError(f"{where} is a module kernels made of {function.__module__}.{function.__qualname__}, "
                               "not of a library's function; adapters read the installed library's computation")
    _check_binding(where, home, function.__name__, function)
    return _follow(where, [function], checked)


def _follow(where: str, stack: list[Any], checked: set[Any]) -> list[tuple[str, Any]]:
    """``check_calls`` from the functions in ``stack``."""
    found = []
    while stack:
        function = stack.pop()
        code = function.__code__
        if code in checked:
            continue
        checked.add(code)
        home = sys.modules.get(function.__globals__.get("__name__", ""))
        for chain in _chains(code):
            if chain[0] not in function.__globals__:
                continue  # a builtin
            owner, value = home, function.__globals__[chain[0]]
            for depth, name in enumerate(chain):
                if depth:
                    owner, value = value, _attribute(value, name)
                    if value is _MISSING:
                        break
                _check_binding(where, owner, name, value)
                if function_module(value) and value not in checked:
                    checked.add(value)
                    found.append((f"{getattr(owner, '__name__', type(owner).__name__)}.{name}", value))
                    value = wrapped_function(value)
                if isinstance(value, types.FunctionType) and _is_library_function(value):
                    stack.append(value)
                if not isinstance(value, (types.ModuleType, types.SimpleNamespace)):
                    break
    return found


def _is_library_function(function: Any) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and any(inside(code.co_filename, package) for package in LIBRARIES)


def _forward_methods(klass: type) -> list[Any]:
    """``klass``'s own ``forward`` and the functions of ``klass`` it reaches through names it loads (``self._sa_block``)."""
    if "forward" not in vars(klass):
        return []
    found, names, todo = [], {"forward"}, ["forward"]
    while todo:
        for function in _layers(functions_of(vars(klass).get(todo.pop()))):
            found.append(function)
            for name in _names(function.__code__):
                if name not in names and isinstance(vars(klass).get(name), (types.FunctionType, staticmethod, property)):
                    names.add(name)
                    todo.append(name)
    return found


def _layers(functions: list[Any]) -> list[types.FunctionType]:
    """The Python functions among ``functions`` and what each wraps (``functools.wraps``: a decorated forward)."""
    layers = []
    for function in functions:
        while isinstance(function, types.FunctionType) and len(layers) < 64:
            layers.append(function)
            function = getattr(function, "__wrapped__", None)
    return layers


@functools.cache
def _names(code: types.CodeType) -> frozenset[str]:
    nested = [_names(const) for const in code.co_consts if isinstance(const, types.CodeType)]
    return frozenset(code.co_names).union(*nested)


@functools.cache
def _chains(code: types.CodeType) -> tuple[tuple[str, ...], ...]:
    """The global names ``code`` (and the code nested in it) loads, each with the attributes loaded from it
    (``F.linear`` → ``("F", "linear")``)."""
    chains: list[list[str]] = []
    current: list[str] | None = None
    for instruction in dis.get_instructions(code):
        if instruction.opname == "LOAD_GLOBAL":
            current = [instruction.argval]
            chains.append(current)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and current is not None:
            current.append(instruction.argval)
        else:
            current = None
    nested = [chain for const in code.co_consts if isinstance(const, types.CodeType) for chain in _chains(const)]
    return tuple(dict.fromkeys([*map(tuple, chains), *nested]))


_MISSING = object()


def _attribute(owner: Any, name: str) -> Any:
    """``owner.name`` without running code (a module's or a namespace's own entry); ``_MISSING`` when absent."""
    return vars(owner).get(name, _MISSING)


def _check_binding(where: str, owner: Any, name: str, value: Any) -> None:
    """Refuse ``value`` as ``owner.name`` (``owner`` a module or namespace) when it is not the libraries' own
    (``_foreign``) or not what ``owner``'s source binds to ``name`` (``_misplaced``). A module kernels made of a
    function must be of a class that is kernels' own, and its function must be so."""
    label = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
    if function_module(value):
        value = _function_of(where, label, value)
    try:
        key: tuple[Any, str, Any] | None = (owner, name, value)
        if key in _ACCEPTED:
            return
    except TypeError:  # an unhashable value: checked each time
        key = None
    foreign = _foreign(owner, value)
    if foreign is not None:
        raise SplitformerError(f"{where} runs {label}, which is {foreign}: a library function replaced; adapters "
                               "read the installed library's computation")
    if isinstance(owner, types.ModuleType):
        misplaced = _misplaced(owner, name, value, 0)
        if misplaced is not None:
            raise SplitformerError(f"{where} runs {label}, which is {misplaced}: a library function replaced; "
                                   "adapters read the installed library's computation")
    if key is not None:
        _ACCEPTED.add(key)


def _function_of(where: str, label: str, module: Any) -> types.FunctionType:
    """The function a module kernels made of it calls (``label`` names the module); refused when the module's class
    has a method that is not kernels' own, or it calls something other than a Python function."""
    replaced = replaced_in_class(module)
    function = wrapped_function(module)
    if replaced is not None or not isinstance(function, types.FunctionType):
        what = f"its class's {replaced}" if replaced is not None else f"the {type(function).__name__} it calls"
        raise SplitformerError(f"{where} runs {label}, a module kernels made of a function, but {what} is not "
                               "kernels' own; adapters read the installed library's computation")
    return function


#: Bindings ``(owner, name, value)`` found to be the libraries' own (the values are held: an id is never reused).
_ACCEPTED: set[tuple[Any, str, Any]] = set()


def _foreign(owner: Any, value: Any) -> str | None:
    """What ``value`` is when it is defined outside the places a library's forward may call into, else ``None``."""
    if isinstance(value, types.ModuleType):
        if sys.modules.get(value.__name__) is not value:
            return f"a module not imported as {value.__name__}"
        file = getattr(value, "__file__", None)
        return None if file is None or _placed(file, owner) else f"a module in {file}"
    if isinstance(value, types.SimpleNamespace):
        return "a namespace, not the module the library imports"
    if not callable(value):
        return None
    for layer in _wrapping(value):
        for function in (getattr(layer, "func", None), layer):  # a functools.partial's function, or the layer
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType) and not _placed(code.co_filename, owner):
                return f"defined in {code.co_filename}"
        klass = layer if isinstance(layer, type) else type(layer)
        file = getattr(sys.modules.get(klass.__module__), "__file__", None)
        if file is not None and not _placed(file, owner):
            return f"a {klass.__name__} defined in {file}"
    return None


def _wrapping(value: Any) -> list[Any]:
    """``value`` and what it wraps (``functools.wraps``), outermost first."""
    layers = [value]
    while hasattr(layers[-1], "__wrapped__") and len(layers) < 16:
        layers.append(layers[-1].__wrapped__)
    return layers


def _placed(filename: str, owner: Any) -> bool:
    """``filename`` lies in a library, the standard library, typing_extensions or the package of ``owner``."""
    package = str(getattr(owner, "__name__", "")).split(".")[0]
    return filename.startswith("<frozen ") or any(inside(filename, place) for place in (*PLACES, package) if place)


def _misplaced(module: types.ModuleType, name: str, value: Any, depth: int) -> str | None:
    """How ``value``, a function, differs from what ``module``'s source (a library's) binds to ``name``; ``None``
    when it does not, or the source does not say (module docstring)."""
    source = _source(module) if module.__name__.split(".")[0] in LIBRARIES else None
    if source is None or depth > 8:
        return None
    if isinstance(value, functools.partial):  # a function bound to other arguments: where the source says so
        return None if any("partial" in mentioned for mentioned in source.assigned.get(name, ())) else \
            f"functools.partial({getattr(value.func, '__qualname__', value.func)}, …), not what {module.__name__} binds to {name}"
    if not isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return None
    layers = _wrapping(value)
    shown = f"{getattr(value, '__module__', None)}.{getattr(value, '__qualname__', value)}"
    if name in source.defined:
        if any(getattr(layer, "__module__", None) == module.__name__ and getattr(layer, "__name__", None) == name
               and as_in_source(layer) is not False for layer in layers):
            return None
        return f"{shown}, not the {name} {module.__name__} defines"
    named, imported_otherwise = value.__name__ == name, False
    for origin, imported in source.imports.get(name, ()):
        home = sys.modules.get(_absolute(origin, module)) if origin else None
        if home is None or imported not in vars(home):
            continue
        if vars(home)[imported] is value and _misplaced(home, imported, value, depth + 1) is None:
            return None
        imported_otherwise = True
    if named and not imported_otherwise and as_in_source(value) is not False:
        return None
    words = {value.__name__, getattr(value, "__qualname__", "").split(".<locals>")[0]}
    assigned = source.assigned.get(name, ())
    if not imported_otherwise and (any(words & mentioned for mentioned in assigned)
                                   or "<lambda>" in words and any("lambda" in mentioned for mentioned in assigned)):
        return None
    return f"{shown}, not what {module.__name__} binds to {name}"


def _absolute(origin: str, module: types.ModuleType) -> str:
    """The module an ``import`` in ``module`` names (``..utils`` relative to its package)."""
    level = len(origin) - len(origin.lstrip("."))
    if not level:
        return origin
    package = (module.__package__ or "").split(".")
    base = package[:len(package) - level + 1]
    return ".".join([*base, origin[level:]] if origin[level:] else base)


class _Source:
    """The top-level names a module's source defines (``def``/``class``), imports (``name`` → ``(module, name
    there)``) and assigns (``name`` → the words of each assignment's first lines, strings left out)."""

    def __init__(self, text: str) -> None:
        self.defined = frozenset(_DEFINED.findall(text))
        self.imports: dict[str, list[tuple[str | None, str]]] = {}
        for origin, names in _IMPORT.findall(text):
            for item in re.sub(r"#[^\n]*", "", names).strip("()").split(","):
                words = item.split()
                if not words:
                    continue
                bound = words[-1] if len(words) == 3 and words[1] == "as" else words[0].split(".")[0]
                self.imports.setdefault(bound, []).append((origin or None, words[0]))
        self.assigned: dict[str, list[frozenset[str]]] = {}
        for match in re.finditer(r"^[ \t]*(\w+)[ \t]*(?::[^=\n]*)?=(?!=)([^\n]*(?:\n[ \t]+[^\n]*){0,3})", text, re.M):
            right = _STRING.sub("", _DOCSTRING.split(match.group(2))[0])
            self.assigned.setdefault(match.group(1), []).append(frozenset(_WORD.findall(right)))


@functools.cache
def _source_of(filename: str) -> _Source | None:
    try:
        with open(filename, encoding="utf-8") as handle:
            return _Source(handle.read())
    except (OSError, UnicodeDecodeError):
        return None


def _source(module: types.ModuleType) -> _Source | None:
    filename = getattr(module, "__file__", None)
    return _source_of(filename) if isinstance(filename, str) and filename.endswith(".py") else None


@functools.cache
def _compiled(filename: str) -> dict[str, list[types.CodeType]]:
    """The code of the functions the source file ``filename`` defines, by qualified name (several: overloads, a
    property's getter and setter), compiled as its import compiled it; empty when the file cannot be read or
    compiled."""
    try:
        with open(filename, encoding="utf-8") as handle:
            stack = [compile(handle.read(), filename, "exec", dont_inherit=True)]
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return {}
    codes: dict[str, list[types.CodeType]] = {}
    while stack:
        for constant in stack.pop().co_consts:
            if isinstance(constant, types.CodeType):
                codes.setdefault(constant.co_qualname, []).append(constant)
                stack.append(constant)
    return codes


def _defined(code: types.CodeType, filename: str) -> bool | None:
    """Whether ``filename``'s source defines ``code`` under its qualified name (``None``: nothing under it)."""
    candidates = _compiled(filename).get(code.co_qualname)
    return None if candidates is None else any(_same_code(code, candidate) for candidate in candidates)


def _same_code(code: types.CodeType, other: types.CodeType) -> bool:
    """The same instructions on the same names and constants (nested functions' code compared alike)."""
    if (code.co_code, code.co_names, code.co_varnames, code.co_freevars) != (
            other.co_code, other.co_names, other.co_varnames, other.co_freevars) or \
            len(code.co_consts) != len(other.co_consts):
        return False
    return all(_same_code(a, b) if isinstance(a, types.CodeType) and isinstance(b, types.CodeType)
               else type(a) is type(b) and a == b for a, b in zip(code.co_consts, other.co_consts))


def as_in_source(function: Any) -> bool | None:
    """Whether ``function`` is the code its source defines where it says it comes from: each wrapper a decorator
    put around it (a closure with ``__wrapped__``) is what its own file compiles to, and the function it wraps keeps
    its code's qualified name and is what the source of its ``__module__`` defines under it. ``False`` for a function
    re-made under another's name (``types.FunctionType(rotate_every_two.__code__, …, "rotate_half")``, a method
    given another class's ``__qualname__``); ``None`` when a source cannot be read or defines nothing there."""
    for _ in range(16):
        code = getattr(function, "__code__", None)
        if not isinstance(code, types.CodeType):
            return None
        wrapped = getattr(function, "__wrapped__", None)
        if wrapped is None or not code.co_freevars:
            break
        if _defined(code, code.co_filename) is False:
            return False
        function = wrapped
    if getattr(function, "__qualname__", None) != code.co_qualname:
        return False
    filename = getattr(sys.modules.get(getattr(function, "__module__", None) or ""), "__file__", None)
    if not isinstance(filename, str) or not filename.endswith(".py"):
        return None
    return _defined(code, filename)



def assigns(module: Any, name: str, word: str) -> bool:
    """``module``'s source assigns to ``name`` (at any indentation: a class body) a value that mentions ``word``."""
    source = _source(module) if isinstance(module, types.ModuleType) else None
    return source is not None and any(word in mentioned for mentioned in source.assigned.get(name, ()))
