"""The registry of operator kinds with every built-in kind in it: look kinds up by name here.

``operators`` holds the base classes and the registry (``register_operator``); each built-in
kind lives in its own module and registers itself on import, exactly as a user's plug-in
does. Importing this module imports them all, so ``OPERATOR_KINDS`` read from here knows
every built-in kind, and ``register_operator`` taken from here (``splitformer.register_operator``)
refuses a user's kind under a built-in's name.
"""

from __future__ import annotations

from . import gated_feed_forward, gated_residual, paper_operators, rms_norm  # noqa: F401  (registered on import)
from . import cross_attention, rotary_attention, scored_attention, token_shift  # noqa: F401  (registered on import)
from .operators import OPERATOR_KINDS, register_operator

__all__ = ["OPERATOR_KINDS", "register_operator"]
