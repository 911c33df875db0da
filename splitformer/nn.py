"""Whole models around an emitted stack (see ``splitformer.codegen.nn``, ``splitformer.codegen.nn_hf``
and ``splitformer.codegen.nn_hf_encoder``)."""

from splitformer.codegen.nn import *  # noqa: F403
from splitformer.codegen.nn import __all__ as _models
from splitformer.codegen.nn_hf import from_hf_lm
from splitformer.codegen.nn_hf_encoder import from_hf_encoder

__all__ = [*_models, "from_hf_lm", "from_hf_encoder"]
