"""Per-statement time of a generated NumPy forward: where the milliseconds of a call go.

    python bench/figure.py post-ln/N1024/numpy candidate --inputs DIR --profile   # the table

A line tracer (``sys.settrace``) follows the frames of ``forward`` and of the helpers it calls
(``_attention``, ``_layer_norm``, …); each line's time is the time until the next line event
of the same frame, the median over a few calls, so a line that calls a helper includes that
helper's lines, shown indented below it. The tracer adds a few microseconds per line: the
table explains the shares of a call, the sustained figure is ``figure.py``'s.
"""

from __future__ import annotations

import linecache
import statistics
import sys
import time
from collections import defaultdict

__all__ = ["line_profile", "profile_lines"]


def line_profile(function, module, calls: int = 5, clock=time.perf_counter) -> dict[tuple[str, int], float]:
    """Per (function name, line number) of ``module``'s functions: the median over ``calls`` calls
    of the time (``clock``'s units) spent on that line in one call."""
    code_file = module.__file__
    last: dict[int, tuple[int, float]] = {}
    spent: dict[tuple[str, int], float] = defaultdict(float)

    def local(frame, event, _):
        now = clock()
        key = id(frame)
        if key in last:
            line, since = last[key]
            spent[(frame.f_code.co_name, line)] += now - since
        if event == "return":
            last.pop(key, None)
        else:
            last[key] = (frame.f_lineno, clock())
        return local

    def tracer(frame, event, _):
        return local if frame.f_code.co_filename == code_file else None

    function()  # warm caches and BLAS threads
    per_call = []
    for _ in range(calls):
        spent.clear()
        sys.settrace(tracer)
        try:
            function()
        finally:
            sys.settrace(None)
        per_call.append(dict(spent))
    keys = {key for times in per_call for key in times}
    return {key: statistics.median(times.get(key, 0.0) for times in per_call) for key in keys}


def _top_lines(times: list[tuple[float, int]], total: float, module, label: str = "") -> list[str]:
    """A function's top 8 lines by time (at least 0.5 % of ``total``), indented, each after ``label``."""
    return [f"    {seconds * 1e3:7.2f} {seconds / total:6.0%}      {label}"
            f"{linecache.getline(module.__file__, line).strip()[:110 - 14 - len(label)]}"
            for seconds, line in sorted(times, reverse=True)[:8] if seconds / total >= 0.005]


def profile_lines(function, module, calls: int = 5, rows: int = 14) -> list[str]:
    """The table: forward's statements by time, each helper's top lines under it, then the functions called further
    down (a network's programs and their helpers) with theirs."""
    spent = line_profile(function, module, calls)
    total = sum(seconds for (name, _), seconds in spent.items() if name == "forward") or 1.0
    by_function: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for (name, line), seconds in spent.items():
        by_function[name].append((seconds, line))
    lines = [f"    {'ms':>7} {'share':>6}  statement of the generated forward (helpers' lines indented)"]
    for seconds, line in sorted(by_function.pop("forward", []), reverse=True)[:rows]:
        text = linecache.getline(module.__file__, line).strip()
        lines.append(f"    {seconds * 1e3:7.2f} {seconds / total:6.0%}  {text[:110]}")
        for name in [name for name in by_function if f"{name}(" in text]:
            lines += _top_lines(by_function.pop(name), total, module, f"{name}: ")
    # the functions called further down (a network's programs, which its chain runs through a variable, and their helpers)
    for name, times in sorted(by_function.items(), key=lambda item: -sum(seconds for seconds, _ in item[1])):
        own = sum(seconds for seconds, _ in times)
        if own / total >= 0.05:
            lines.append(f"    {own * 1e3:7.2f} {own / total:6.0%}  {name}, called further down (its top lines)")
            lines += _top_lines(times, total, module)
    lines.append(f"    {total * 1e3:7.2f} {1:6.0%}  forward, traced (sum of the medians over {calls} calls)")
    return lines
