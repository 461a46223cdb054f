"""Fixtures of the cachew package's tests: real cachewd processes on
loopback (a dispatcher and workers, as test/cwt_daemon.c starts them),
each waited for by its "event=listening ... url=" log line and stopped at
the end, killed if need be."""
import os
import re
import signal
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("CACHEW_BUILD", os.path.join(ROOT, "build")))


class Daemon:
    def __init__(self, name, args, workdir):
        self.log = os.path.join(workdir, name + ".log")
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen([os.path.join(BUILD, "cachewd")] + args,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err)
        self.url = self._await_url()

    def _await_url(self):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                m = re.search(r"event=listening.*?url=(\S+)", f.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.stop()
        with open(self.log, encoding="utf-8", errors="replace") as f:
            raise RuntimeError("cachewd did not start: " + f.read())

    @property
    def pid(self):
        return self.proc.pid

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(sig)
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Cluster:
    """A dispatcher and n workers on 127.0.0.1 with fast heartbeats."""

    def __init__(self, nworkers):
        self.dir = tempfile.mkdtemp(prefix="cachew-py-")
        self.dispatcher = Daemon("dispatcher", [
            "--role=dispatcher", "--listen", "tcp://127.0.0.1:0", "--work-dir",
            os.path.join(self.dir, "work"), "--heartbeat-ms", "50",
            "--worker-timeout-ms", "2000", "--client-timeout-ms", "20000"], self.dir)
        self.url = self.dispatcher.url
        self.workers = []
        try:
            for i in range(nworkers):
                self.workers.append(Daemon("worker%d" % i, [
                    "--role=worker", "--dispatcher", self.url, "--listen",
                    "tcp://127.0.0.1:0", "--heartbeat-ms", "50", "--threads", "1",
                    "--allow-read", self.dir, "--cache-root",
                    os.path.join(self.dir, "cache")], self.dir))
        except Exception:
            self.stop()
            raise

    def stop(self):
        for w in self.workers:
            w.stop(signal.SIGKILL)
        self.dispatcher.stop()
        subprocess.call(["rm", "-rf", self.dir])


@pytest.fixture
def cluster():
    c = Cluster(1)
    yield c
    c.stop()


@pytest.fixture
def cluster2():
    c = Cluster(2)
    yield c
    c.stop()


def run_python(code, env=None, timeout=60):
    """Runs code in a fresh interpreter (this one) with the package on
    its path; returns the CompletedProcess."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    e.update(env or {})
    import sys
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,
                          text=True, timeout=timeout)
