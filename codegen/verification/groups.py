"""The groups of checks that ``splitformer check --only`` (``only=`` in Python) selects: a researcher iterating on a
scheme's order runs ``order,convergence`` alone, without the statements that hold for every scheme."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from splitformer.symbolic.errors import SplitformerError

if TYPE_CHECKING:  # the runner imports the checks: this module stays light for the command line's help
    from .runner import CheckReport

__all__ = ["GROUPS", "check_groups", "require_checks"]

#: The groups of checks ``splitformer check --only`` (``only=`` in Python) selects, and what each holds.
GROUPS = {
    "general": "the statements that hold for every scheme: the projections, the sign, the activations, the attention "
               "field's structure and kernel, RoPE, GQA, the normalizations' Jacobians (run once)",
    "semantics": "the derived and emitted programs against the independent evaluator",
    "recovery": "exact recovery of the published blocks and networks (and the paper's own equations)",
    "adjoint": "the derived adjoint against central differences",
    "causality": "prefix dependence of the emitted block, stack and next-token distribution; cached decoding",
    "adjoint-test": "the dot-product and Taylor tests of the emitted vjp; torch's gradients against it",
    "order": "the orders a scheme file claims against the order conditions on trees",
    "convergence": "the numeric convergence study at the series order",
}


def check_groups(names: str | Iterable[str] | None, where: str = "only") -> frozenset[str]:
    """The groups ``names`` select (comma-separated text or names); every group for ``None``. One
    ``SplitformerError`` naming ``where`` for a name that is no group, or for none at all."""
    if names is None:
        return frozenset(GROUPS)
    items = names.split(",") if isinstance(names, str) else list(names) if isinstance(names, Iterable) else [names]
    if not all(isinstance(item, str) for item in items):
        raise SplitformerError(f"{where}: expected group names (a str or strs), got {names!r:.80}")
    chosen = [item.strip() for item in items if item.strip()]
    unknown = [item for item in chosen if item not in GROUPS]
    if unknown or not chosen:
        shown = f"unknown group {unknown[0][:40]!r}" if unknown else "no group given"
        raise SplitformerError(f"{where}: {shown}; the groups: {', '.join(GROUPS)}")
    return frozenset(chosen)


def require_checks(report: CheckReport, only: frozenset[str], names: list[str], where: str = "only") -> CheckReport:
    """``report`` when it holds a check; one ``SplitformerError`` otherwise (no check of the groups ``only`` applies to
    ``names``), since an empty report would read as a success that proved nothing."""
    if not report.checks:
        chosen = ",".join(group for group in GROUPS if group in only)
        raise SplitformerError(f"{where} {chosen}: no check of these groups applies to {', '.join(names)}")
    return report
