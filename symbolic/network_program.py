"""A derived network, whatever its composition: the one representation render, report and checks read.

A network is an initial condition, steps on (possibly changing) grids and a readout. Derived, it is
its discretized operators by part (``parts``: what its report shows and its checks read) and the
programs its module runs (``pieces``), each a ``Program`` whose every assignment, the chaining
between operators included (layout assignments such as ``t[1 + N₂p + q, l] = f[p, q, l]``), is in
index notation: one lowering emits its forward and reverse mode derives its adjoint. A token network
steps with a block scheme: its step and final projection are block programs (``blocks``), derived
as any block's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from .adjoint import Adjoint, derive_adjoint
from .network_spec import NetworkSpec
from .program import Assignment, Program
from .stages import Stage

__all__ = ["Piece", "NetworkProgram"]


@dataclass(frozen=True)
class Piece:
    """One program of a network's module: the program, the input whose costate its adjoint returns, the sizes its
    operators fix (kernels), and, where operators of one program fix different ones, those by operator key."""

    program: Program
    input: str
    sizes: Mapping = field(default_factory=dict)
    group_sizes: Mapping | None = None

    @cached_property
    def adjoint(self) -> Adjoint:
        """``derive_adjoint(program)``, derived once: the module's lowering, the report and the adjoint checks read it."""
        return derive_adjoint(self.program)


@dataclass(frozen=True)
class NetworkProgram:
    """A derived network: its file's ``spec``; its ``composition`` (``token``: an embedding, block steps, a readout;
    ``grid``: one step ``u⁺ = Proj(R u + Δt F(u))`` on the 2-D grid; ``cvt``: stages on successively coarser grids),
    which names how its module chains its pieces and its report's prose; its stages and loose assignments by
    ``parts``; its ``pieces`` in the order the forward runs them; its ``blocks`` (a token network's step and final
    projection)."""

    spec: NetworkSpec
    composition: str
    parts: Mapping[str, tuple[Stage | Assignment, ...]]
    pieces: Mapping[str, Piece]
    blocks: Mapping[str, Program] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The name of its generated module."""
        return self.spec.module_name

    def stages(self) -> tuple[Stage, ...]:
        """Every discretized operator, in the order of the parts."""
        return tuple(item for part in self.parts.values() for item in part if isinstance(item, Stage))

    def stage(self, key: str) -> Stage:
        """The (first) stage of the operator ``key``."""
        return next(stage for stage in self.stages() if stage.operator.key == key)

    def with_stage(self, stage: Stage) -> "NetworkProgram":
        """This network with ``stage`` in place of its operator's (a check's wrongly derived variant); its pieces,
        built from the old stage, are dropped."""
        parts = {name: tuple(stage if isinstance(item, Stage) and item.operator.key == stage.operator.key else item
                             for item in part) for name, part in self.parts.items()}
        return replace(self, parts=parts, pieces={})
