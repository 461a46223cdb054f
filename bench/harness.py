"""harness.py - what every cachew benchmark workload shares.

A workload (bench/w<n>.py) describes its runs as Config objects (one
command line per side and configuration); this module runs them
interleaved (rep 1 of every config, then rep 2, ...) so that drift on a
shared machine hits both sides alike, measures the peak RSS of each run
with /usr/bin/time, reduces the repetitions to median/min/max, prints the
table, writes the raw runs to bench/results/w<n>.json (ignored by git) and
the table to its section of bench/results/latest.md (committed).

Every command must print one JSON object as its LAST stdout line; the
workload says which key holds the measured seconds. Throughput is computed
here as units / seconds so both sides count the same thing.

Run with Debian's interpreter (/usr/bin/python3): the peers need its
python3-torch. Standard library only.
"""
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
PEER_PYTHON = "/usr/bin/python3"
TIME_BIN = "/usr/bin/time"


class BenchError(Exception):
    """A run failed, printed no JSON, or produced the wrong data."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cachew_bin():
    """The CLI under test: $CACHEW_BIN, default build/cachew in the repo."""
    path = os.environ.get("CACHEW_BIN", os.path.join(REPO_DIR, "build",
                                                     "cachew"))
    if not os.path.isabs(path):
        path = os.path.join(REPO_DIR, path)
    if not os.access(path, os.X_OK):
        raise BenchError(f"{path}: not built (run `make`, or set "
                         "CACHEW_BIN to the cachew CLI)")
    r = subprocess.run([path, "help"], capture_output=True, text=True)
    if "--json" not in r.stdout + r.stderr:
        raise BenchError(f"{path}: has no `run --json` (an old build? run "
                         "`make`, or set CACHEW_BIN to the cachew CLI)")
    return path


def check_tools():
    if not os.access(TIME_BIN, os.X_OK):
        raise BenchError(f"{TIME_BIN} missing: apt-get install time "
                         "(or `BENCH_DEPS=1 sh .ci/deps.sh`)")


def check_peer_python(module):
    """Fails early, with the install hint, when the peer cannot import."""
    r = subprocess.run([PEER_PYTHON, "-c", f"import {module}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError(f"{PEER_PYTHON} cannot import {module}: "
                         "apt-get install python3-torch (or "
                         "`BENCH_DEPS=1 sh .ci/deps.sh`)")


def last_json(stdout, what):
    """The JSON object on the last non-empty line, and the text before it
    (e.g. the `cachew run --stats` table)."""
    lines = stdout.rstrip().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise BenchError(f"{what}: printed nothing")
    try:
        obj = json.loads(lines[-1])
    except ValueError:
        raise BenchError(f"{what}: last line is not JSON: {lines[-1][:200]!r}")
    if not isinstance(obj, dict):
        raise BenchError(f"{what}: last line is not a JSON object")
    return obj, "\n".join(lines[:-1]).strip("\n")


def tree_pids(root):
    """root and its descendants (/proc/<pid>/task/<tid>/children)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def pss_kib(pid):
    """Proportional set size of a process (shared pages split between the
    processes that map them), KiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class TreeSampler:
    """Samples the summed PSS of a process tree every 50 ms on a thread:
    the memory of a program and of the workers it forks (a DataLoader's),
    each shared page counted once. peak_kib after stop()."""

    def __init__(self, pid):
        self.pid = pid
        self.peak_kib = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.done.wait(0.05):
            total = sum(pss_kib(p) for p in tree_pids(self.pid)[1:])
            self.peak_kib = max(self.peak_kib, total)

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.peak_kib


def run_once(argv, what, env=None, tree=False):
    """Runs argv under /usr/bin/time; returns (json, text before it,
    peak_rss_kib, wall_s), and with tree=True also the peak summed PSS
    of the process tree (KiB, sampled every 50 ms; /usr/bin/time itself
    left out) as a fifth item."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        full = [TIME_BIN, "-f", "%M", "-o", tf.name] + list(argv)
        t0 = time.monotonic()
        p = subprocess.Popen(full, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env,
                             cwd=REPO_DIR)
        sampler = TreeSampler(p.pid) if tree else None
        out, err = p.communicate()
        tree_kib = sampler.stop() if sampler is not None else None
        r = subprocess.CompletedProcess(full, p.returncode, out, err)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            tail = "\n".join((r.stderr or r.stdout).splitlines()[-15:])
            raise BenchError(f"{what}: exit {r.returncode}: "
                             f"{shlex.join(argv)}\n{tail}")
        rss_lines = [l for l in tf.read().splitlines() if l.strip()]
    try:
        rss_kib = int(rss_lines[-1])
    except (IndexError, ValueError):
        raise BenchError(f"{what}: no peak RSS from {TIME_BIN}")
    obj, head = last_json(r.stdout, what)
    if tree:
        return obj, head, rss_kib, wall, tree_kib
    return obj, head, rss_kib, wall


class Config:
    """One row of the table: a side ("cachew" or the peer's name), a label,
    the parallelism it used, the command, how many units one run processes,
    and an optional check(json) that raises BenchError on wrong data."""

    def __init__(self, side, label, parallelism, argv, units,
                 seconds_key="seconds", check=None, env=None, tree=False):
        self.side = side
        self.tree = tree  # also sample the process tree's summed PSS
        self.label = label
        self.parallelism = parallelism
        self.argv = argv
        self.units = units
        self.seconds_key = seconds_key
        self.check = check
        self.env = env
        self.runs = []  # dicts: seconds, rate, rss_kib, wall, json

    @property
    def what(self):
        return f"{self.side} {self.label}"

    def run(self):
        got = run_once(self.argv, self.what, self.env, tree=self.tree)
        obj, head, rss, wall = got[:4]
        if self.check is not None:
            self.check(obj)
        try:
            seconds = float(obj[self.seconds_key])
        except (KeyError, TypeError, ValueError):
            raise BenchError(f"{self.what}: no number under "
                             f"{self.seconds_key!r} in {obj}")
        if seconds <= 0:
            raise BenchError(f"{self.what}: non-positive time {seconds}")
        rec = {"seconds": seconds, "rate": self.units / seconds,
               "rss_kib": rss, "wall": wall, "json": obj, "output": head}
        if self.tree:
            rec["tree_pss_kib"] = got[4]
        self.runs.append(rec)
        return rec

    def rates(self):
        return [r["rate"] for r in self.runs]

    def median(self):
        return statistics.median(self.rates())

    def median_run(self):
        """The repetition whose rate is the median (the lower middle one
        for an even count)."""
        ranked = sorted(self.runs, key=lambda r: r["rate"])
        return ranked[(len(ranked) - 1) // 2]

    def peak_rss_mib(self):
        return max(r["rss_kib"] for r in self.runs) / 1024.0

    def peak_tree_mib(self):
        """The largest summed PSS of the process tree over the reps (MiB),
        None when not sampled."""
        v = [r["tree_pss_kib"] for r in self.runs if "tree_pss_kib" in r]
        return max(v) / 1024.0 if v else None


def run_interleaved(configs, reps):
    """Rep 1 of every config, then rep 2, ...: drift hits all rows alike."""
    for rep in range(1, reps + 1):
        for c in configs:
            rec = c.run()
            log(f"  rep {rep}/{reps} {c.what:<34} "
                f"{rec['rate']:>14,.0f} /s  {rec['seconds']:8.3f} s  "
                f"rss {rec['rss_kib'] / 1024:7.1f} MiB")


def loadavg():
    """The 1-minute load average: how busy the shared machine was."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def load_warning(info):
    """A ratio line warning that the machine was busier than its CPUs
    during the run (info from machine_info, with loadavg_end), or None."""
    load = [x for x in (info["loadavg_start"], info["loadavg_end"])
            if x is not None]
    if not load or max(load) <= info["cpus"]:
        return None
    return (f"load average {max(load):.1f} over the {info['cpus']} CPUs: "
            "other processes took CPU from the rows unevenly, so the "
            "throughput ratios are unreliable; the CPU-per-unit ratios "
            "are the better guide (docs/performance.md)")


def machine_info():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True,
                                cwd=REPO_DIR).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True,
                               cwd=REPO_DIR).stdout.strip()
        if commit and dirty:
            commit += "+dirty"
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc)
        .strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "commit": commit or "unknown",
        "loadavg_start": loadavg(),
    }


def fmt_int(x):
    return f"{x:,.0f}"


def table_rows(configs):
    rows = []
    for c in configs:
        r = c.rates()
        rows.append([c.side, c.label, str(c.parallelism),
                     fmt_int(statistics.median(r)), fmt_int(min(r)),
                     fmt_int(max(r)), f"{c.peak_rss_mib():.1f}"])
    return rows


def text_table(header, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows))
              for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) if i < 2 else h.rjust(w)
                     for i, (h, w) in enumerate(zip(header, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for r in rows:
        out.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                             for i, (v, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i < 2 else "---:"
                          for i in range(len(header))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    return "\n".join(out)


def write_raw(wid, payload):
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{wid.lower()}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    return path


LATEST_HEAD = """# cachew benchmark results

Written by `make bench` / `bench/run` (full runs only; `--quick` runs do not
touch this file). Each section is replaced by the latest full run of its
workload. Method: /work/shared/BENCHMARKS.md and docs/performance.md.
"""


def write_section(wid, markdown):
    """Replaces workload wid's section of bench/results/latest.md, keeping
    the sections in workload order."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, "latest.md")
    sections = {}
    try:
        with open(path) as f:
            text = f.read()
        for m in re.finditer(r"<!-- (W\d+|[A-Z]+) begin -->\n(.*?)"
                             r"<!-- \1 end -->", text, re.S):
            sections[m.group(1)] = m.group(2)
    except FileNotFoundError:
        pass
    sections[wid] = markdown.rstrip("\n") + "\n"
    parts = [LATEST_HEAD]
    # W1, W2, ... in order, then named workloads (HTTP) by name.
    def order(k):
        return (0, int(k[1:]), "") if re.fullmatch(r"W\d+", k) else (1, 0, k)
    for key in sorted(sections, key=order):
        parts.append(f"<!-- {key} begin -->\n{sections[key]}<!-- {key} end -->\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(parts))
    os.replace(tmp, path)
    return path
