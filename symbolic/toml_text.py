"""TOML text of a scheme document, from exact-typed values only.

A value written into a scheme file is read back as what the text says, so the text must be what
the value is: ``bool``, ``int``, ``float`` and ``str`` by exact type (a subclass can print other
text, or raw TOML: ``16, x = 1 }  #``), strings escaped, keys bare or quoted, lists and tables of
the same. Anything else is refused by its type's name.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import SplitformerError

__all__ = ["toml_key", "toml_value"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _string(text: str) -> str:
    """A TOML basic string: JSON's escapes, and DEL, which TOML needs escaped and JSON does not."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_key(key: Any, where: str) -> str:
    """``key`` bare (``max_distance``) or quoted; ``SplitformerError`` naming ``where`` unless an exact ``str``."""
    if type(key) is not str:
        raise SplitformerError(f"{where}: a key of a scheme file is a str, got {type(key).__name__}")
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def toml_value(value: Any, where: str) -> str:
    """``value`` as TOML text; ``SplitformerError`` naming ``where`` and the type for anything but
    ``bool``, ``int``, ``float``, ``str`` (exact types) and lists and tables of them."""
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int and not -2**63 <= value < 2**63:
        raise SplitformerError(f"{where}: an int of {value.bit_length()} bits is out of range (a scheme file holds "
                               "64-bit integers)")
    if kind is int or kind is float:
        return repr(value)  # exact types: their own repr, which TOML reads back (inf and nan too)
    if kind is str:
        return _string(value)
    if kind is dict:
        return "{ " + ", ".join(f"{toml_key(key, where)} = {toml_value(item, f'{where}: {key}')}"
                                for key, item in value.items()) + " }"
    if kind is list or kind is tuple:
        return "[" + ", ".join(toml_value(item, where) for item in value) + "]"
    raise SplitformerError(f"{where}: a {kind.__name__} cannot be written into a scheme file (bool, int, float "
                           "and str by exact type, and lists and tables of them)")
