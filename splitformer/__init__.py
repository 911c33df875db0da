"""splitformer: Transformers as operator splitting of a continuous integro-differential equation.

One installed name holds the whole tool: ``splitformer.symbolic`` (the continuous model,
schemes, derivation and proofs), ``splitformer.codegen`` (lowering, passes, emission, the
CLI) and ``splitformer.templates`` (the Jinja templates). The names below are the supported
Python API; they are imported on first use, so ``import splitformer`` stays light.
"""

from importlib import import_module

from .symbolic import __version__

_EXPORTS = {
    "SplitformerError": "splitformer.symbolic.errors",
    "PluginError": "splitformer.symbolic.plugins",
    "builtin_names": "splitformer.symbolic.builtins",
    "load_scheme": "splitformer.symbolic.scheme_file",
    "parse_scheme": "splitformer.symbolic.scheme_file",
    "register_operator": "splitformer.symbolic.kinds",
    "scheme": "splitformer.symbolic.builder",
    "substep": "splitformer.symbolic.builder",
    "projection": "splitformer.symbolic.builder",
    "parallel": "splitformer.symbolic.builder",
    "rk2": "splitformer.symbolic.builder",
    "runge_kutta": "splitformer.symbolic.builder",
    "derive": "splitformer.codegen.api",
    "Derivation": "splitformer.codegen.api",
    "NetworkDerivation": "splitformer.codegen.network_api",
    "compare": "splitformer.codegen.compare",
    "Operator": "splitformer.symbolic.operators",
    "ProjectionOperator": "splitformer.symbolic.operators",
    "ConstraintSet": "splitformer.symbolic.constraints",
    "register_tableau": "splitformer.symbolic.tableaux",
    "make_tableau": "splitformer.symbolic.tableaux",
    "load_plugin": "splitformer.symbolic.plugins",
    "register_activation": "splitformer.symbolic.activations",
}
__all__ = ["__version__", "adapters", "nn", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name in ("adapters", "nn"):
        return import_module(f"splitformer.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy names too, so that tab completion in a notebook finds the API."""
    return sorted({*globals(), *__all__})
