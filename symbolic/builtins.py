"""The built-in scheme and network files shipped with the package (light: no SymPy import)."""

from __future__ import annotations

import tomllib
from importlib import resources

__all__ = ["builtin_names", "builtin_text", "builtin_summary", "network_names", "is_network", "network_summary", "network_text"]

#: The order ``splitformer list`` prints them in; any other built-in file follows, by name.
_ORDER = ["post-ln", "pre-ln", "macaron", "macaron-pre-ln", "parallel", "symmetric-parallel", "rk2", "rk4", "gpt2", "llama",
          "decoder", "decoder-pre-ln", "paper-lie"]


def builtin_names() -> list[str]:
    """Names of the built-in schemes, in the order ``splitformer list`` prints them."""
    folder = resources.files("splitformer.symbolic") / "schemes"
    names = [entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".toml")]
    return sorted(names, key=lambda name: (_ORDER.index(name) if name in _ORDER else len(_ORDER), name))


def builtin_text(name: str) -> str:
    return (resources.files("splitformer.symbolic") / "schemes" / f"{name}.toml").read_text(encoding="utf-8")


def builtin_summary(name: str) -> str:
    """The ``summary`` field of a built-in (validated when the scheme is loaded, not here)."""
    return tomllib.loads(builtin_text(name))["summary"]


def _networks():
    return resources.files("splitformer.symbolic") / "networks"


def network_names() -> list[str]:
    """Names of the built-in networks."""
    return sorted(entry.name[:-5] for entry in _networks().iterdir() if entry.name.endswith(".toml"))


def is_network(name: str) -> bool:
    return name in network_names()


def network_text(name: str) -> str:
    return (_networks() / f"{name}.toml").read_text(encoding="utf-8")


def network_summary(name: str) -> str:
    return tomllib.loads(network_text(name))["summary"]
