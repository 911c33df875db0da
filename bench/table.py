"""The one table of ``make bench``: a row per figure, ratios of alternating pairs with their spread.

A row is met when its whole spread lies on the target's side (time ratios at or below it, rate
ratios at or above it); a target inside the spread counts as missed, and says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from rows import Row

__all__ = ["Measured", "verdict", "table"]

COLUMNS = ("row", "shapes", "reference", "ref ms", "gen ms", "ratio, median (min–max)", "target", "verdict",
           "GFLOP/s (share of the GEMM limit)", "kept for backward, ref / gen")


@dataclass
class Measured:
    """A row's per-pair results (the JSON objects of ``bench/figure.py``)."""

    row: Row
    reference: list[dict] = field(default_factory=list)
    candidate: list[dict] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Per pair: generated / reference time, or for a rate row the candidate's rate / the reference's."""
        pairs = zip(self.reference, self.candidate)
        if self.row.rate:
            return [reference["median_s"] / candidate["median_s"] for reference, candidate in pairs]
        return [candidate["median_s"] / reference["median_s"] for reference, candidate in pairs]


def verdict(ratios: list[float], target: float, rate: bool = False) -> str:
    """``met`` when every ratio is on the target's side; ``missed (target inside the spread)`` when
    the median is but the spread crosses it; ``missed`` otherwise."""
    def good(ratio: float) -> bool:
        return ratio >= target if rate else ratio <= target

    if all(good(ratio) for ratio in ratios):
        return "met"
    return "missed (target inside the spread)" if good(statistics.median(ratios)) else "missed"


def _median_ms(results: list[dict]) -> str:
    return f"{1e3 * statistics.median(result['median_s'] for result in results):.2f}"


def _mib(result: dict) -> str:
    return f"{result['kept_bytes'] / 2**20:.1f}" if "kept_bytes" in result else "–"


def cells(measured: Measured, gemm: dict[str, float]) -> list[str]:
    """The table's cells of one measured row."""
    row, ratios = measured.row, measured.ratios
    target = f"{'≥' if row.rate else '≤'} {row.target:.2f}" + (" (rate)" if row.rate else "")
    rate = ""
    if row.limit and measured.candidate and "gflops" in measured.candidate[0]:
        gflops = statistics.median(result["gflops"] for result in measured.candidate)
        rate = f"{gflops:.1f} ({gflops / gemm[row.limit]:.0%} of {row.limit})" if gemm.get(row.limit) else f"{gflops:.1f}"
    kept = f"{_mib(measured.reference[-1])} / {_mib(measured.candidate[-1])} MiB" if row.training else ""
    return [row.name, row.shapes, row.reference, _median_ms(measured.reference), _median_ms(measured.candidate),
            f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})", target,
            verdict(ratios, row.target, row.rate), rate, kept]


def table(measured: list[Measured], gemm: dict[str, float]) -> list[str]:
    """A Markdown table of the measured rows (rows without results left out)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for entry in measured:
        if entry.reference and entry.candidate:
            lines.append("| " + " | ".join(cells(entry, gemm)) + " |")
    return lines
