"""Independent derivations on the machine's cores: forked workers, results in input order.

``derive`` of several schemes spends its time in SymPy, one scheme at a time; the schemes do
not depend on each other, so forked workers derive them side by side. A forked worker starts
with everything the parent has already imported, loaded and derived (the scheme files, the
plug-ins of ``--load``, the projections derived or read from the cache), so nothing is done
twice, and its results come back in the order of the input: the output does not depend on
which worker finished first. Workers ignore Ctrl-C: the parent handles the interrupt, drops
the jobs not started and waits for the running ones; a worker that dies (killed) ends the
command with an error instead of a hang. Workers die with their parent: on Linux the kernel
sends them SIGKILL when it ends (``PR_SET_PDEATHSIG``), elsewhere a watchdog thread in each
worker notices that its parent is gone (``os.getppid`` changes) and ends the worker.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from splitformer.symbolic.errors import SplitformerError

__all__ = ["ordered_map", "worker_count"]

T = TypeVar("T")
R = TypeVar("R")

#: The work of the running ``ordered_map``, inherited by its forked workers.
_work: tuple[Callable, Sequence] | None = None


def _threads() -> int:
    """Threads of this process, native ones included (0 when the system does not tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def worker_count(items: int) -> int:
    """Workers for ``items`` independent jobs: one per core, or 1 (serial) where forking is unsafe.

    Forking a process that runs other threads (torch's, a test runner's) can leave locks
    held in the child, so such a process, or one that cannot tell, works serially.
    """
    if items < 2 or "fork" not in multiprocessing.get_all_start_methods() or _threads() != 1:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(items, cores))


#: How often a worker's watchdog checks that its parent is alive (seconds).
WATCH_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """End this worker when ``parent`` ends: the kernel's death signal where there is one, and a watchdog."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the watchdog below is enough
    if os.getppid() != parent:  # the parent ended before the death signal was set
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(WATCH_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="splitformer-parent-watch", daemon=True).start()


def _start_worker(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)


def _run(position: int):
    function, items = _work
    return function(items[position])


def ordered_map(function: Callable[[T], R], items: Sequence[T], workers: int | None = None) -> list[R]:
    """``[function(item) for item in items]``, on ``workers`` forked processes (default: ``worker_count``).

    ``function`` and ``items`` reach the workers by the fork, not pickled; the results and any
    exception come back pickled (a ``SplitformerError`` is re-raised here as it was raised there).
    """
    global _work
    workers = worker_count(len(items)) if workers is None else workers
    if workers <= 1:
        return [function(item) for item in items]
    _work = (function, items)
    executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                   initializer=_start_worker, initargs=(os.getpid(),))
    try:
        return list(executor.map(_run, range(len(items))))
    except BrokenProcessPool:
        raise SplitformerError("a worker process ended abruptly (killed, or out of memory); nothing was written. "
                               "Derive fewer schemes per command to use less memory") from None
    finally:  # after an error or an interrupt: the jobs not started are dropped
        executor.shutdown(wait=True, cancel_futures=True)
        _work = None
