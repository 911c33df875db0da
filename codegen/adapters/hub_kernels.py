"""What the ``kernels`` package (a dependency of transformers from 5.25) attaches to transformers' classes and modules,
known by its code: each is accepted only as kernels' own code builds it, since kernels is no library adapters read.

- ``@use_kernel_forward_from_hub(name)`` on a class (``LlamaRMSNorm``, ``SiLUActivation``) sets ``kernel_layer_name``
  (a string) and ``kernel_condition`` (``staticmethod(lambda module: True)``: ``default_condition``) on it; only
  ``kernelize`` reads either, the forward stays the class's own.
- On a function (``modeling_llama.apply_rotary_pos_emb``), it binds the function's name to an instance of a ``Func``
  module class made for it, whose forward calls the function (``function_module``, ``wrapped_function``).
- ``@use_kernelized_func(f)`` on a class (``LlamaAttention``) wraps its forward (``unwrapped``) to route the calls of
  ``f`` to a copy of ``f``'s module of the same class, made per instance: ``_kernel_funcs[name]``.

``kernelize`` (which transformers' ``from_pretrained`` runs by default from 5.25) sets such a module's forward, or a
copy's, on the instance to a hub kernel's (``kernel_repository`` names it), or leaves the class's where it finds no
kernel for the device (transformers' own mapping has none for the CPU): ``inspection`` checks every part and copy
for what it set; ``as_built`` accepts the record it leaves on the model (``_use_kernels`` with an ``is_mode``).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .places import functions_of

__all__ = ["default_condition", "function_module", "wrapped_function", "replaced_in_class", "unwrapped", "is_mode",
           "kernel_repository"]

#: Where kernels defines what it attaches: its function, and the qualified name of the code it compiles inside it.
_DEFAULT_CONDITION = ("replace_kernel_forward_from_hub", "replace_kernel_forward_from_hub.<locals>.<lambda>")
_FUNC_FORWARD = ("_create_func_module", "_create_func_module.<locals>.Func.forward")
_FUNC_CLASS = "_create_func_module.<locals>.Func"
_ROUTING_FORWARD = ("use_kernelized_func", "use_kernelized_func.<locals>.decorator.<locals>.new_forward")


def default_condition(klass: type, name: str, value: Any) -> bool:
    """``value`` is ``klass``'s ``kernel_condition`` as kernels sets it without a condition (``lambda module: True``,
    a static method), on a class it names a hub layer of (``kernel_layer_name``)."""
    return (name == "kernel_condition" and isinstance(value, staticmethod)
            and isinstance(vars(klass).get("kernel_layer_name"), str) and _is(value.__func__, _DEFAULT_CONDITION))


def function_module(value: Any) -> bool:
    """``value`` is an instance of a class kernels made of a function: named as kernels names it, or running its
    ``Func.forward`` (``replaced_in_class`` says whether all of the class is kernels')."""
    cls = type(value)
    return cls.__qualname__ == _FUNC_CLASS or _is(vars(cls).get("forward"), _FUNC_FORWARD)


def wrapped_function(value: Any) -> Any:
    """The function a ``function_module`` calls (its class's forward's ``func``; ``None`` when it has none)."""
    return _cells(vars(type(value)).get("forward")).get("func")


def replaced_in_class(value: Any) -> str | None:
    """The first method of a ``function_module``'s class that is not one kernels' ``_create_func_module`` defines
    there (or its default condition): ``forward`` when it is not kernels' ``Func.forward``, ``__bases__`` when they
    are not ``torch.nn.Module`` alone; ``None`` when there is none."""
    import torch

    cls = type(value)
    if not _is(vars(cls).get("forward"), _FUNC_FORWARD):
        return "forward"
    if cls.__bases__ != (torch.nn.Module,):
        return "__bases__"
    made = _nested(_kernels_function(_FUNC_FORWARD[0]))
    for name, attribute in vars(cls).items():
        if default_condition(cls, name, attribute):
            continue
        for function in functions_of(attribute):
            if getattr(function, "__code__", None) not in made:
                return name
    return None


def unwrapped(function: Any) -> Any:
    """The forward kernels' ``use_kernelized_func`` wraps when ``function`` is that wrapper (its code kernels', the
    forward it calls the one it names as wrapped), else ``function``."""
    if not _is(function, _ROUTING_FORWARD):
        return function
    wrapped = getattr(function, "__wrapped__", None)
    return wrapped if wrapped is not None and _cells(function).get("orig_forward") is wrapped else function


def is_mode(value: Any) -> bool:
    """``value`` is one of kernels' ``Mode`` flags (what ``kernelize`` ran for)."""
    return isinstance(value, getattr(sys.modules.get("kernels"), "Mode", ()))


def kernel_repository(module: Any) -> str | None:
    """The hub repository whose kernel ``kernelize`` set as ``module``'s forward, as kernels shows it (``None`` when
    it set none)."""
    repository = vars(module).get("_kernel_repo")
    if repository is None:
        return None
    try:
        return str(repository)
    except Exception:  # kernels' own __str__ reads the repository's lock; any other is shown by its class
        return type(repository).__name__


def _is(function: Any, where: tuple[str, str]) -> bool:
    """``function``'s code is the one kernels compiles for ``where`` (its function, the qualified name inside it)."""
    code = getattr(function, "__code__", None)
    return code is not None and code is _code(*where)


def _code(outer: str, qualname: str) -> types.CodeType | None:
    if qualname not in _CODES:
        found = next((code for code in _nested(_kernels_function(outer)) if code.co_qualname == qualname), None)
        if found is None:
            return None
        _CODES[qualname] = found
    return _CODES[qualname]


#: The code of each qualified name ``_code`` has found (none is kept before kernels is imported).
_CODES: dict[str, types.CodeType] = {}


def _kernels_function(name: str) -> Any:
    """The function ``name`` of the module where kernels defines its public ``use_kernel_forward_from_hub`` (``None``
    while kernels is not imported: nothing of it is attached then)."""
    public = getattr(sys.modules.get("kernels"), "use_kernel_forward_from_hub", None)
    home = sys.modules.get(getattr(public, "__module__", None) or "")
    return vars(home).get(name) if home is not None else None


def _nested(function: Any) -> list[types.CodeType]:
    """The code objects compiled inside ``function`` (its classes', methods', lambdas'), at any depth."""
    todo = [getattr(function, "__code__", None)]
    found = []
    while todo:
        code = todo.pop()
        if code is not None:
            found.append(code)
            todo.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return found[1:]


def _cells(function: Any) -> dict[str, Any]:
    """The values of ``function``'s closure, by name."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or cells is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
