"""Proof checks: each claim linking the continuous equation to a discrete layer, checkable.

Every check returns ``Check`` records; a record states its claim and hypotheses in words,
says how it was checked (``symbolic`` or ``numeric``), whether it holds, and why. A check
that could not be run has the method ``SKIPPED`` (it counts as holding) and says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from splitformer.symbolic.latex import plain_text as plain
from splitformer.symbolic.markdown import inert

__all__ = ["Check", "plain", "SKIPPED"]

#: The ``method`` of a check that was not run; its ``detail`` says why.
SKIPPED = "skipped"


@dataclass(frozen=True)
class Check:
    id: str
    scheme: str | None
    statement: str
    method: str
    holds: bool
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)

    def _repr_markdown_(self) -> str:
        mark = "⏭" if self.method == SKIPPED else "✅" if self.holds else "❌"
        return inert(f"{mark} `{self.id}` ({self.method}): {self.statement}\n\n→ {self.detail}", f"check {self.id!r}")
