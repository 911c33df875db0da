"""Whole models around an emitted stack (see ``splitformer.codegen.nn`` and ``splitformer.codegen.nn_hf``)."""

from splitformer.codegen.nn import *  # noqa: F403
from splitformer.codegen.nn import __all__ as _models
from splitformer.codegen.nn_hf import from_hf_lm

__all__ = [*_models, "from_hf_lm"]
