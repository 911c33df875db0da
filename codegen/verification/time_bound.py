"""A time bound on a SymPy computation that may not return (``solveset`` of a transcendental equation can run for
minutes): the caller falls back to what it does when SymPy cannot decide.

The bound is a ``SIGALRM`` timer, so it holds in the main thread of a process whose real-time timer is free; elsewhere
(another thread, a timer of the caller's pending, a platform without ``setitimer``) the computation runs unbounded.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable, TypeVar

__all__ = ["OutOfTime", "within"]

T = TypeVar("T")


class OutOfTime(Exception):
    """The computation did not return within its bound."""


def within(seconds: float, computation: Callable[[], T]) -> T:
    """``computation()``, or ``OutOfTime`` once ``seconds`` of real time have passed (where a timer can be set)."""
    if (not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread()
            or signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0)):
        return computation()

    def expire(*_):
        raise OutOfTime

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        return computation()
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:  # an alarm due as the computation returned raises here: the handler is put back all the same
            signal.signal(signal.SIGALRM, previous)
