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

    @property
    def status(self) -> str:
        """``skip`` (not run; it counts as holding), ``ok`` or ``fail``."""
        return "skip" if self.method == SKIPPED else "ok" if self.holds else "fail"

    @property
    def label(self) -> str:
        """The status as the text report and ``check``'s progress lines show it, four columns wide."""
        return f"{'FAIL' if self.status == 'fail' else self.status:4}"

    @property
    def mark(self) -> str:
        """The status as Markdown reports and notebooks show it."""
        return {"skip": "⏭", "ok": "✅", "fail": "❌"}[self.status]

    def as_dict(self) -> dict:
        """The fields and ``status``: a reader of ``holds`` alone cannot tell a skipped check from one that held."""
        return {**asdict(self), "status": self.status}

    def _repr_markdown_(self) -> str:
        return inert(f"{self.mark} `{self.id}` ({self.method}): {self.statement}\n\n→ {self.detail}", f"check {self.id!r}")
