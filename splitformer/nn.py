"""Whole models around an emitted stack (see ``splitformer.codegen.nn``)."""

from splitformer.codegen.nn import *  # noqa: F403
from splitformer.codegen.nn import __all__  # noqa: F401
