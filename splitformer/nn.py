"""Whole models around an emitted stack (see ``splitformer.codegen.nn``, ``splitformer.codegen.nn_hf``
and ``splitformer.codegen.nn_hf_encoder``).

``to_hf``, ``replace_blocks``, ``SplitformerConfig`` and ``SplitformerForCausalLM`` need
transformers (an optional dependency): they are imported on first use.
"""

import importlib

from splitformer.codegen.nn import *  # noqa: F403
from splitformer.codegen.nn import __all__ as _models
from splitformer.codegen.nn_hf import from_hf_lm
from splitformer.codegen.nn_hf_encoder import from_hf_encoder

#: Names that import transformers, and the module that defines each.
_TRANSFORMERS_NATIVE = {"to_hf": "hf_native", "SplitformerConfig": "hf_native", "SplitformerForCausalLM": "hf_native",
                        "replace_blocks": "hf_blocks", "SchemeBlock": "hf_blocks"}

__all__ = [*_models, "from_hf_lm", "from_hf_encoder", *_TRANSFORMERS_NATIVE]


def __getattr__(name: str):
    if name in _TRANSFORMERS_NATIVE:
        return getattr(importlib.import_module(f"splitformer.codegen.{_TRANSFORMERS_NATIVE[name]}"), name)
    raise AttributeError(f"module 'splitformer.nn' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
