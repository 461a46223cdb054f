#!/usr/bin/python3
"""The cost of the metrics endpoint (issue 17): W1 through the service with a
scraper reading /metrics every second vs none.

Each run starts fresh daemons on tcp://127.0.0.1: `cachewd --role=dispatcher`
and 2 `cachewd --role=worker --threads 1`, each with `--metrics-listen
127.0.0.1:0` (the endpoint is served in both arms; only the scraping
differs), then runs W1, `range(N) | map(add, value=1) | batch(64)`, with
`cachew run --json` and CACHEW_SERVICE=<dispatcher>. In the scraped arm a
thread GETs /metrics of all three daemons once a second from the client's
start to its end, as a Prometheus server with a 1 s scrape_interval would
(a 1 s interval is 15-60x Prometheus's usual). The daemons are stopped by
pid after each run.

Runs are paired (none, scraped), the order alternating from pair to pair so
that a drift of the shared machine's load does not favour one arm; each pair
gives ratio = scraped elements/s / none elements/s. Printed: every pair, then
min / median / max of the ratios, the scrapes done and their mean size, and
the load average before and after (the machine is shared: the load says how
much to trust the figure). Also the daemons' CPU seconds per million
elements in each arm, which varies less with the load than throughput.
Target: ratio >= 0.99.

Usage: /usr/bin/python3 bench/metrics_cost.py [--reps R] [--n N]
       [--cachew build/cachew]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from w5 import proc_cpu_s  # noqa: E402  (utime + stime of a pid, or None)

START_TIMEOUT_S = 15.0


def wait_log(path, pattern, proc, what):
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        with open(path) as f:
            m = re.search(pattern, f.read())
        if m:
            return m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise SystemExit(f"metrics_cost: {what} did not start (see {path})")


class Cluster:
    """A dispatcher and 2 one-thread workers, each serving /metrics."""

    def __init__(self, cachewd, tmp):
        self.cachewd, self.tmp, self.procs = cachewd, tmp, []
        self.metrics = []

    def start(self, name, args):
        log = os.path.join(self.tmp, name + ".log")
        p = subprocess.Popen([self.cachewd] + args + [
            "--metrics-listen", "127.0.0.1:0"], stdout=subprocess.DEVNULL,
            stderr=open(log, "w"))
        self.procs.append(p)
        self.metrics.append(wait_log(log, r"event=metrics_listening "
                                     r"url=(\S+)", p, name))
        return log, p

    def __enter__(self):
        log, p = self.start("dispatcher", [
            "--role=dispatcher", "--listen", "tcp://127.0.0.1:0",
            "--heartbeat-ms", "100"])
        self.url = wait_log(log, r"event=listening url=(\S+)", p,
                            "the dispatcher")
        for i in range(2):
            log, p = self.start(f"worker{i}", [
                "--role=worker", "--dispatcher", self.url, "--listen",
                "tcp://127.0.0.1:0", "--threads", "1", "--heartbeat-ms",
                "100"])
            wait_log(log, r"(event=registered)", p, f"worker {i}")
        return self

    def cpu(self):
        return sum(proc_cpu_s(p.pid) or 0.0 for p in self.procs)

    def __exit__(self, *exc):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL if p is not self.procs[0]
                              else signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Scraper(threading.Thread):
    """GETs each URL's /metrics once a second until stopped."""

    def __init__(self, urls):
        super().__init__(daemon=True)
        self.urls, self.stop, self.n, self.bytes = urls, threading.Event(), 0, 0

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            for u in self.urls:
                with urllib.request.urlopen(u + "/metrics", timeout=5) as r:
                    self.bytes += len(r.read())
                self.n += 1
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))


def one_run(args, scraped):
    with tempfile.TemporaryDirectory(prefix="cachew-mcost-") as tmp, \
            Cluster(args.cachewd, tmp) as c:
        env = dict(os.environ, CACHEW_SERVICE=c.url)
        pipeline = f"range({args.n}) | map(add, value=1) | batch(64)"
        scraper = Scraper(c.metrics) if scraped else None
        cpu0 = c.cpu()
        if scraper:
            scraper.start()
        out = subprocess.run([args.cachew, "run", "--json", pipeline],
                             env=env, capture_output=True, text=True,
                             timeout=600)
        if scraper:
            scraper.stop.set()
            scraper.join()
        cpu = c.cpu() - cpu0
        if out.returncode != 0:
            raise SystemExit(f"metrics_cost: cachew run failed: "
                             f"{out.stderr.strip()}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        if res["elements"] != (args.n + 63) // 64:
            raise SystemExit(f"metrics_cost: {res['elements']} batches, "
                             f"expected {(args.n + 63) // 64}")
        eps = args.n / res["seconds"]
        return eps, cpu, scraper


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=200_000_000)
    ap.add_argument("--cachew", default=os.environ.get(
        "CACHEW_BIN", os.path.join(here, "..", "build", "cachew")))
    args = ap.parse_args()
    args.cachewd = os.path.join(os.path.dirname(args.cachew), "cachewd")
    load0 = os.getloadavg()
    ratios, cpu = [], {False: [], True: []}
    scrapes = sizes = 0
    print(f"W1 through the service, range({args.n}) | map(add, value=1) | "
          f"batch(64), dispatcher + 2 workers --threads 1, tcp loopback")
    print(f"{'pair':>4} {'none el/s':>12} {'scraped el/s':>13} {'ratio':>7}")
    for i in range(args.reps):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {}
        for scraped in order:
            eps, c, s = one_run(args, scraped)
            got[scraped] = eps
            cpu[scraped].append(c / (args.n / 1e6))
            if s:
                scrapes += s.n
                sizes += s.bytes
        ratios.append(got[True] / got[False])
        print(f"{i + 1:>4} {got[False]:>12.0f} {got[True]:>13.0f} "
              f"{ratios[-1]:>7.3f}")
    load1 = os.getloadavg()
    print(f"ratio scraped/none: min {min(ratios):.3f} median "
          f"{statistics.median(ratios):.3f} max {max(ratios):.3f} "
          f"over {args.reps} pairs (target >= 0.99)")
    print(f"scrapes {scrapes}, mean {sizes / max(scrapes, 1):.0f} bytes; "
          f"daemons' CPU s per 1M elements: none "
          f"{statistics.median(cpu[False]):.3f}, scraped "
          f"{statistics.median(cpu[True]):.3f} (medians)")
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
          f"{load1[2]:.2f}")
    print(f"METRICS ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    sys.exit(main())
