"""Where the libraries adapters read live: their top-level packages, the folders their code may come from, and
whether a class or file is theirs."""

from __future__ import annotations

import os
import sys
import sysconfig
import types
from typing import Any

__all__ = ["LIBRARIES", "PLACES", "inside", "is_library", "functions_of"]

#: Top-level packages whose classes adapters read by name; any other class is the user's.
LIBRARIES = ("torch", "transformers", "timm", "x_transformers", "einops", "torch_einops_utils")


def inside(filename: str, place: str) -> bool:
    """``filename`` lies in the installed folder of the top-level package ``place`` (once imported), or under the
    folder ``place`` (an absolute path)."""
    folder = _FOLDERS.get(place)
    if folder is None:
        root = place if os.path.isabs(place) else getattr(sys.modules.get(place), "__file__", None)
        if root is None:
            return False
        folder = _FOLDERS[place] = (place if os.path.isabs(place) else os.path.dirname(root)) + os.sep
    return filename.startswith(folder)


#: The folder of each place ``inside`` has looked up (a package's, once it is imported).
_FOLDERS: dict[str, str] = {}

#: Where a decorator's wrapper of a library method may be defined: the libraries, the standard library, typing_extensions.
PLACES = (*LIBRARIES, sysconfig.get_paths()["stdlib"], "typing_extensions")


def is_library(cls: type) -> bool:
    """``cls`` is a library's own class: its module is a library's, and that module holds it under its name
    (a user class that sets ``__module__ = "torch.nn"`` is not found there)."""
    module = sys.modules.get(cls.__module__)
    if cls.__module__.split(".")[0] not in LIBRARIES or module is None:
        return False
    found: Any = module
    for name in cls.__qualname__.split("."):
        found = vars(found).get(name) if isinstance(found, (types.ModuleType, type)) else None
    return found is cls


def functions_of(value: Any) -> list[Any]:
    """The functions a class attribute runs when called or read: itself, a static or class method's, a property's."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [accessor for accessor in (value.fget, value.fset, value.fdel) if accessor is not None]
    return [value] if callable(value) and not isinstance(value, type) else []  # a nested class is not run
