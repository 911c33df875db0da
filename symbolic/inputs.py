"""What an operator reads besides its state: declared inputs and constants of the emitted code.

An operator kind lists them (``Operator.inputs``, ``Operator.constants``); the derivation
declares an array for each input some operator of the scheme reads, and the emitted
functions take them as arguments. Nothing downstream knows which kind declared what:

- an ``Input`` is a field over grid variables (token positions, a memory, its support);
  its ``role`` says how the emitted signature supplies it (``"positions"``: the optional
  ``positions`` argument, ``0 … N−1`` by default and shifted by the cache; ``"memory"``: a
  second input, differentiated; ``"support"``: an indicator built from a padding mask);
- a ``Constant`` is a free symbol of the definitions (RoPE's θ): a keyword argument with a
  default, checked to be a finite number > 0; the proof checks run at another value (``checked_at``).

The inputs here are the ones the emitted code knows how to take; any kind may read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .domains import X, X_MEMORY, Y, Variable

__all__ = ["Input", "Constant", "POSITIONS", "MEMORY", "MEMORY_SUPPORT", "ROLES"]

#: How an input reaches the emitted signature, by role.
ROLES = ("positions", "memory", "support")


@dataclass(frozen=True)
class Input:
    """A field an operator reads besides its state and the token support ``χ``."""

    #: The function in the continuous definitions and the array in programs and emitted code.
    name: str
    latex: str
    arguments: tuple[Variable, ...]
    #: One of ``ROLES``: how the emitted signature supplies it.
    role: str
    #: The keyword of the emitted functions it comes from.
    argument: str

    @property
    def indices(self) -> tuple[sp.Idx, ...]:
        return tuple(variable.index for variable in self.arguments)


@dataclass(frozen=True)
class Constant:
    """A free symbol of an operator's definitions, emitted as a keyword argument with a default."""

    symbol: sp.Symbol
    default: float
    #: What it is (the docstring of its argument check).
    meaning: str
    #: The value ``check`` runs the emitted code and the evaluator at: one where the constant matters (RoPE's θ
    #: = 100 turns a few features far more than 10000); by default 4/5 of ``default``. Not the default, so that
    #: code ignoring the argument fails.
    checked_at: float | None = None

    @property
    def name(self) -> str:
        return self.symbol.name

    @property
    def check_value(self) -> float:
        return self.default * 4 / 5 if self.checked_at is None else self.checked_at


#: Token positions ``p(x)``; emitted from the ``positions`` argument (default ``0 … N−1``).
POSITIONS = Input("pos", "p", (X,), "positions", "positions")
#: A memory ``M(x̂, ξ)`` on its own token domain, held fixed over the step (a decoder's encoder output).
MEMORY = Input("mem", "M", (X_MEMORY, Y), "memory", "memory")
#: The support ``χ_m(x, x̂)`` of an integral over memory tokens; from ``memory_key_padding_mask``.
MEMORY_SUPPORT = Input("chi_m", r"\chi_m", (X, X_MEMORY), "support", "memory_key_padding_mask")
