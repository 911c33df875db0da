"""splitformer's symbolic side: the continuous model, schemes, derivation and proofs.

A Transformer block is one step of an operator-splitting scheme for a continuous
integro-differential equation (Tai, Liu, Li, Chan, arXiv 2510.03989). ``derive`` turns
a ``Scheme`` into a discrete ``Program`` of index-notation assignments.
"""

__version__ = "0.1.0"

from .derivation import derive  # noqa: E402
from .errors import SplitformerError  # noqa: E402
from .scheme_file import builtin_names, load_scheme, parse_scheme  # noqa: E402

__all__ = ["__version__", "derive", "SplitformerError", "builtin_names", "load_scheme", "parse_scheme"]
