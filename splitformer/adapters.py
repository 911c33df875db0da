"""Weight adapters: source modules → canonical parameters (see ``splitformer.codegen.adapters``)."""

from splitformer.codegen.adapters import *  # noqa: F403
from splitformer.codegen.adapters import __all__  # noqa: F401
