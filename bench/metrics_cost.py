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

Each repetition is a triple of interleaved runs, none-scraped-none (A B A)
or scraped-none-scraped (B A B) in turn, so that a linear drift of the
shared machine's load cancels: ratio = scraped el/s / none el/s, each arm's
el/s the mean of its runs in the triple. The two runs of the same arm in a
triple give an A/A ratio (second / first): the noise floor the ratio has to
be read against. Printed per repetition: el/s of each arm, the ratio, the
A/A ratio, the CPU per element of the daemons and of the client in each
arm (CPU varies much less with the load than wall time), and the load
average at its start. Then min / median / max of the ratios and of the A/A
ratios, the CPU medians, the scrapes, and what a scrape cost: the time it
held the dispatcher's lock (cachew_dispatcher_scrape_lock_seconds, read at
each scraped run's end) and the scraper's own CPU per GET. Target: ratio
>= 0.99.

Usage: /usr/bin/python3 bench/metrics_cost.py [--reps R] [--n N]
       [--cachew build/cachew]
"""
import argparse
import json
import os
import re
import resource
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
        self.cpu = 0.0  # this thread's CPU seconds: the scraper's side

    def run(self):
        c0 = time.thread_time()
        while not self.stop.is_set():
            t0 = time.monotonic()
            for u in self.urls:
                with urllib.request.urlopen(u + "/metrics", timeout=5) as r:
                    self.bytes += len(r.read())
                self.n += 1
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))
        self.cpu = time.thread_time() - c0


def scrape_lock(url):
    """(sum seconds, count, count over 100 us) of the dispatcher's
    cachew_dispatcher_scrape_lock_seconds, this GET's own hold included."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    name = "cachew_dispatcher_scrape_lock_seconds"
    total = float(re.search(name + r"_sum (\S+)", text).group(1))
    count = int(re.search(name + r"_count (\d+)", text).group(1))
    first = int(re.search(name + r'_bucket\{le="0.0001"\} (\d+)',
                          text).group(1))
    return total, count, count - first


def child_cpu():
    """CPU seconds of the children waited for so far (the client's runs:
    the daemons are reaped only after the measurement)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Run:
    """One run's figures: el/s, CPU per million elements (daemons,
    client), the load at its start, its scraper (None: none), and the
    dispatcher's scrape lock histogram at its end (scraped runs)."""


def one_run(args, scraped):
    r = Run()
    r.load = os.getloadavg()[0]
    r.lock = None
    with tempfile.TemporaryDirectory(prefix="cachew-mcost-") as tmp, \
            Cluster(args.cachewd, tmp) as c:
        env = dict(os.environ, CACHEW_SERVICE=c.url)
        pipeline = f"range({args.n}) | map(add, value=1) | batch(64)"
        r.scraper = Scraper(c.metrics) if scraped else None
        cpu0, ccpu0 = c.cpu(), child_cpu()
        if r.scraper:
            r.scraper.start()
        out = subprocess.run([args.cachew, "run", "--json", pipeline],
                             env=env, capture_output=True, text=True,
                             timeout=600)
        if r.scraper:
            r.scraper.stop.set()
            r.scraper.join()
        r.cpu = (c.cpu() - cpu0) / (args.n / 1e6)
        r.client_cpu = (child_cpu() - ccpu0) / (args.n / 1e6)
        if out.returncode != 0:
            raise SystemExit(f"metrics_cost: cachew run failed: "
                             f"{out.stderr.strip()}")
        if r.scraper:
            r.lock = scrape_lock(c.metrics[0])
        res = json.loads(out.stdout.strip().splitlines()[-1])
        if res["elements"] != (args.n + 63) // 64:
            raise SystemExit(f"metrics_cost: {res['elements']} batches, "
                             f"expected {(args.n + 63) // 64}")
        r.eps = args.n / res["seconds"]
        return r


def spread(v, fmt="{:.3f}"):
    return (f"median {fmt.format(statistics.median(v))} (min "
            f"{fmt.format(min(v))}, max {fmt.format(max(v))})")


def triple(args, i):
    """Repetition i: A B A or B A B (A none, B scraped), alternating."""
    order = (False, True, False) if i % 2 == 0 else (True, False, True)
    runs = {False: [], True: []}
    for scraped in order:
        runs[scraped].append(one_run(args, scraped))
    return runs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=100_000_000)
    ap.add_argument("--cachew", default=os.environ.get(
        "CACHEW_BIN", os.path.join(here, "..", "build", "cachew")))
    args = ap.parse_args()
    args.cachewd = os.path.join(os.path.dirname(args.cachew), "cachewd")
    load0 = os.getloadavg()
    ratios, aa, scrapers, locks = [], [], [], []
    cpu = {False: [], True: []}
    ccpu = {False: [], True: []}
    print(f"W1 through the service, range({args.n}) | map(add, value=1) | "
          f"batch(64), dispatcher + 2 workers --threads 1, tcp loopback; "
          f"triples A B A / B A B (A none, B scraped)")
    print(f"{'rep':>3} {'order':>5} {'none el/s':>11} {'scraped el/s':>12} "
          f"{'ratio':>6} {'A/A':>6} {'daemons us/1k el none/scr':>26} "
          f"{'client us/1k el':>16} {'load':>5}")
    for i in range(args.reps):
        runs = triple(args, i)
        eps = {k: statistics.mean(r.eps for r in v) for k, v in runs.items()}
        twice = runs[False] if len(runs[False]) == 2 else runs[True]
        ratios.append(eps[True] / eps[False])
        aa.append(twice[1].eps / twice[0].eps)
        for k, v in runs.items():
            cpu[k] += [r.cpu for r in v]
            ccpu[k] += [r.client_cpu for r in v]
        scrapers += [r.scraper for r in runs[True]]
        locks += [r.lock for r in runs[True]]
        med = {k: statistics.median(r.cpu for r in v) * 1e3
               for k, v in runs.items()}
        cmed = {k: statistics.median(r.client_cpu for r in v) * 1e3
                for k, v in runs.items()}
        print(f"{i + 1:>3} {'ABA' if i % 2 == 0 else 'BAB':>5} "
              f"{eps[False]:>11.0f} {eps[True]:>12.0f} {ratios[-1]:>6.3f} "
              f"{aa[-1]:>6.3f} {med[False]:>12.1f} /{med[True]:>12.1f} "
              f"{cmed[False]:>7.1f} /{cmed[True]:>7.1f} "
              f"{runs[False][0].load:>5.2f}")
    load1 = os.getloadavg()
    scrapes = sum(s.n for s in scrapers)
    print(f"wall ratio scraped/none: {spread(ratios)} over {args.reps} "
          f"triples (target >= 0.99)")
    print(f"A/A ratio, same arm twice in a triple (the noise floor): "
          f"{spread(aa)}")
    cpu_ratio = statistics.median(cpu[True]) / statistics.median(cpu[False])
    print(f"daemons' CPU per 1k elements, us: none "
          f"{spread([c * 1e3 for c in cpu[False]], '{:.1f}')}, scraped "
          f"{spread([c * 1e3 for c in cpu[True]], '{:.1f}')}; ratio of "
          f"medians scraped/none {cpu_ratio:.3f}")
    print(f"client's CPU per 1k elements, us: none "
          f"{statistics.median(ccpu[False]) * 1e3:.1f}, scraped "
          f"{statistics.median(ccpu[True]) * 1e3:.1f} (medians)")
    held = sum(lk[0] for lk in locks)
    held_n = sum(lk[1] for lk in locks)
    size = sum(s.bytes for s in scrapers) / max(scrapes, 1)
    print(f"scrapes {scrapes}, mean {size:.0f} bytes; the scraper's CPU per "
          f"GET "
          f"{sum(s.cpu for s in scrapers) / max(scrapes, 1) * 1e3:.2f} ms; "
          f"the dispatcher's lock held per scrape: mean "
          f"{held / max(held_n, 1) * 1e6:.1f} us over {held_n}, "
          f"{sum(lk[2] for lk in locks)} over 100 us")
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
          f"{load1[2]:.2f}")
    print(f"METRICS ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    sys.exit(main())
