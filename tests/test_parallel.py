"""Forked workers for independent derivations: input order kept, errors carried, serial when unsafe."""

import os
import subprocess
import sys
import threading

import pytest

from splitformer.codegen.parallel import ordered_map, worker_count
from splitformer.codegen.passes import select
from splitformer.codegen.pipeline import generate
from splitformer.symbolic.scheme_file import load_scheme

from conftest import ROOT

needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: always serial")

#: Run in a fresh process: a single-threaded one, where ``ordered_map`` forks.
WORKERS = """
import os, sys, time
from splitformer.codegen.parallel import ordered_map, worker_count
from splitformer.symbolic.errors import SplitformerError

def job(item):
    time.sleep(0.5 if item == 0 else 0.0)  # the first item finishes last
    if item == "bad":
        raise SplitformerError("scheme 'bad': no such operator")
    if item == "killed":
        os.kill(os.getpid(), 9)
    return item, os.getpid(), time.monotonic()

print(worker_count(4))
results = ordered_map(job, [0, 1, 2, 3])
print([item for item, _, _ in results])
print(len({pid for _, pid, _ in results} - {os.getpid()}))
print(results[0][2] > results[1][2])
try:
    ordered_map(job, [1, "bad", 2], workers=2)  # the pool's threads may still be ending: ask for workers
except SplitformerError as error:
    print(error)
try:
    ordered_map(job, [1, "killed", 2], workers=2)
except SplitformerError as error:
    print(error)
"""


@needs_two_cores
def test_workers_return_results_in_input_order_and_reraise_errors_and_a_killed_worker_is_one_error():
    lines = subprocess.run([sys.executable, "-c", WORKERS], capture_output=True, text=True, check=True,
                           cwd=ROOT).stdout.splitlines()
    assert lines[0] == "2"  # forked: two workers
    assert lines[1] == "[0, 1, 2, 3]"
    assert lines[2] == "2"  # done by two processes other than the parent
    assert lines[3] == "True"  # control: the first item finished after the second, yet comes first
    assert lines[4] == "scheme 'bad': no such operator"
    assert lines[5].startswith("a worker process ended abruptly (killed, or out of memory); nothing was written")


def test_a_process_running_other_threads_works_serially():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert worker_count(4) == 1
        assert ordered_map(lambda item: (item, os.getpid()), [1, 2]) == [(1, os.getpid()), (2, os.getpid())]
    finally:
        stop.set()
        thread.join()


def test_one_item_is_never_forked():
    assert worker_count(1) == 1


@needs_two_cores
def test_derive_of_several_schemes_in_workers_writes_what_a_serial_derive_writes(tmp_path):
    names = ["post-ln", "parallel"]
    subprocess.run([sys.executable, "-m", "splitformer", "derive", *names, "--out", str(tmp_path)],
                   check=True, capture_output=True, cwd=ROOT)
    expected = {}
    for name in names:
        expected.update(generate(load_scheme(name), ("numpy", "torch"), tmp_path, select("all")))
    written = {path: path.read_text(encoding="utf-8") for path in tmp_path.rglob("*.*")}
    assert written == expected


#: A parent whose two forked workers block (each writes its pid first); ``watchdog-only`` takes the
#: kernel's death signal away, leaving the portable fallback.
ORPHANS = """
import os, sys, time
from pathlib import Path
from splitformer.codegen import parallel

folder = Path(sys.argv[1])
if sys.argv[2] == "watchdog-only":
    def no_prctl(*arguments, **keywords):
        raise OSError("no prctl")
    parallel.ctypes.CDLL = no_prctl

def job(item):
    (folder / str(os.getpid())).write_text("")
    time.sleep(60)

parallel.ordered_map(job, [0, 1], workers=2)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(condition, seconds: float) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
@pytest.mark.parametrize("signal_name, mode", [("SIGTERM", "death-signal"), ("SIGKILL", "death-signal"),
                                               ("SIGKILL", "watchdog-only")])
def test_workers_die_with_their_parent(signal_name, mode, tmp_path):
    """A signal that ends ``derive`` ends every worker it forked: none is left blocked on its pipe."""
    import signal

    parent = subprocess.Popen([sys.executable, "-c", ORPHANS, str(tmp_path), mode], cwd=ROOT)
    workers: list[int] = []
    try:
        assert _wait(lambda: len(list(tmp_path.iterdir())) == 2, 30), "the workers did not start"
        workers = [int(path.name) for path in tmp_path.iterdir()]
        assert all(_alive(pid) for pid in workers)  # control: they block until their parent goes
        parent.send_signal(getattr(signal, signal_name))
        parent.wait(10)
        assert _wait(lambda: not any(_alive(pid) for pid in workers), 5), f"orphaned workers: {workers}"
    finally:
        for pid in [parent.pid] * (parent.poll() is None) + workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        parent.wait(10)
