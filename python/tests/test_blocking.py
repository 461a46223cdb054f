"""Blocking done right: the GIL is released while next() waits, Ctrl-C
(SIGINT) raises KeyboardInterrupt within 100 ms whatever the pipeline is
doing, nothing is lost by it, and cancel() ends a wait from another
thread. Signals go to real subprocesses."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import cachew

from conftest import run_python

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def interrupt(code, before_sigint=None):
    """Starts code in a fresh interpreter, waits for its "ready" line,
    sends SIGINT and returns (seconds until it printed "interrupted",
    the rest of its output)."""
    env = dict(os.environ, PYTHONPATH=PKG)
    p = subprocess.Popen([sys.executable, "-u", "-c", code], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        if before_sigint:
            before_sigint()
        time.sleep(0.3)  # well inside the blocked next()
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().strip()
        took = time.monotonic() - t0
        assert line == "interrupted", (line, p.stderr.read())
        rest, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        return took, rest
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_ctrl_c_interrupts_a_local_pipeline_and_loses_nothing():
    code = """
import cachew, os
it = cachew.range(3).map("sleep_us", us=1500000).iterator(service="local")
print("ready", flush=True)
try:
    next(it)
except KeyboardInterrupt:
    print("interrupted", flush=True)
# The pull goes on: the next call gets element 0, then the others.
print([e[0].tolist() for e in it], flush=True)
"""
    took, rest = interrupt(code)
    print("SIGINT -> KeyboardInterrupt (local, map sleeping): %.1f ms" % (took * 1e3))
    assert took < 1.0
    assert rest.strip() == "[0, 1, 2]"


def test_ctrl_c_interrupts_a_wait_on_a_stopped_worker(cluster):
    code = """
import cachew, os
it = cachew.range(100000).map("sleep_us", us=1000).iterator(service=%r,
    client_buffer=65536)
for _ in range(20):
    next(it)
print("ready", flush=True)
try:
    while True:
        next(it)
except KeyboardInterrupt:
    print("interrupted", flush=True)
it.cancel()
os._exit(0)
""" % cluster.url
    worker = cluster.workers[0]

    def stop_worker():
        os.kill(worker.pid, signal.SIGSTOP)
        time.sleep(0.5)  # the client drains what it holds and blocks

    try:
        took, _ = interrupt(code, stop_worker)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    print("SIGINT -> KeyboardInterrupt (remote, worker stopped): %.1f ms" % (took * 1e3))
    assert took < 1.0


def test_cancel_from_another_thread_raises_canceled_error():
    it = cachew.range(10).map("sleep_us", us=300000).iterator(service="local")
    t = threading.Timer(0.1, it.cancel)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(cachew.CanceledError, match="canceled"):
        next(it)
    assert time.monotonic() - t0 < 1.0
    t.join()
    with pytest.raises(cachew.CanceledError):
        next(it)
    it.close()


def test_the_gil_is_released_while_next_waits():
    count = 0
    done = threading.Event()

    def spin():
        nonlocal count
        while not done.is_set():
            count += 1

    th = threading.Thread(target=spin)
    th.start()
    try:
        it = cachew.range(1).map("sleep_us", us=500000).iterator(service="local")
        before = count
        assert next(it)[0].tolist() == 0
        during = count - before
    finally:
        done.set()
        th.join()
    # The other thread ran during the 0.5 s wait (it would not move at
    # all if next() held the GIL).
    assert during > 1000


def test_close_from_another_thread_ends_a_waiting_next():
    it = cachew.range(10).map("sleep_us", us=400000).iterator(service="local")
    got = {}

    def reader():
        try:
            next(it)
        except cachew.ClosedError as e:
            got["error"] = str(e)

    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.1)
    # A second reader at once is refused: the iterator is one thread's.
    with pytest.raises(RuntimeError, match="already running"):
        next(it)
    it.close()  # cancels; the waiting next() destroys it as it returns
    th.join(5)
    assert not th.is_alive()
    assert got["error"] == "iterator: closed while next() waited"
    with pytest.raises(cachew.ClosedError, match="iterator: closed"):
        next(it)
