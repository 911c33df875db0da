"""splitformer's symbolic side: the continuous model, schemes, derivation and proofs.

A Transformer block is one step of an operator-splitting scheme for a continuous
integro-differential equation (Tai, Liu, Li, Chan, arXiv 2510.03989). ``derive`` turns
a ``Scheme`` into a discrete ``Program`` of index-notation assignments.

Attributes are imported on first use, so that light commands (``splitformer list``)
do not pay for SymPy's import.
"""

from importlib import import_module

__version__ = "0.2.0"

_EXPORTS = {
    "derive": "derivation",
    "SplitformerError": "errors",
    "builtin_names": "builtins",
    "load_scheme": "scheme_file",
    "parse_scheme": "scheme_file",
    "load_plugin": "plugins",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
