#!/usr/bin/python3
"""W9 - dispatcher scale: N simulated workers and N simulated clients
against one real dispatcher.

For each size N (full: 100, 1,000 and 10,000; quick: 100 and 1,000) and
each of two configurations, a fresh `cachewd --role=dispatcher --listen
tcp://127.0.0.1:0 --work-dir WORK` (loopback, no tokens) with its journal
(as deployed: a request's reply waits for its record's fsync) and the same
with `--journal 0` (what the state machine and the transport cost alone)
is started, and
build/w9_load (bench/w9_load.c, `make bench-progs`) plays N workers and N
clients speaking the real protocol, each on its own connection (up to the
file limit): workers register, heartbeat at the interval the dispatcher
tells (500 ms) with every task they hold, and lease one split per task
every 500 ms; clients join shared jobs of 10 clients and 10 workers each,
heartbeat at the interval the dispatcher tells, acknowledge the leased
splits every 200 ms, and join the next epoch's job when one ends; one
client asks for the status every second. After a 3 s warm-up it records
every request's latency (send to reply, on the generator's side) for the
window, and the dispatcher's CPU (/proc/PID/stat over the window) and
RSS (VmRSS at the end, VmHWM). Medians over the repetitions of each
figure (min and max of the p99s). The generator runs on the same 2 cores
and its own CPU is reported beside.

Targets (issue 18): at 1,000 workers and 1,000 clients, heartbeat and
lease p99 < 20 ms and the dispatcher < 0.5 core; 10,000 of each runs
(report what breaks first). A lease that gets no split (every split of
the epoch leased elsewhere) is held by the dispatcher until its answer
changes or its retry_ms is over: a long poll, timed on its own row
(split_lease_empty) and not in split_lease's latency.

Usage: /usr/bin/python3 bench/w9.py [--quick] [--reps R]   (or bench/run W9)
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
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import w5  # noqa: E402
import w6  # noqa: E402  (bench_prog)

WID = "W9"
SIZES = {"full": [100, 1000, 10000], "quick": [100, 1000]}
WINDOW_S = {"full": 10, "quick": 4}
CONFIGS = [("journal", []), ("--journal 0", ["--journal", "0"])]
TARGET_N = 1000
TARGET_P99_MS = 20.0
TARGET_CORES = 0.5
OPS = ["worker_heartbeat", "client_heartbeat", "split_lease", "split_ack",
       "status"]
TARGET_OPS = ["worker_heartbeat", "client_heartbeat", "split_lease"]
START_TIMEOUT_S = 30


def start_dispatcher(cachewd, work, n, extra):
    """A fresh dispatcher; returns (process, url) once it listens. Its log
    goes to WORK/dispatcher.log (a pipe nobody reads could stall it)."""
    argv = [cachewd, "--role=dispatcher", "--listen", "tcp://127.0.0.1:0",
            "--work-dir", work, "--max-connections", str(2 * n + 1024),
            "--log-level", "warn"] + extra
    logp = os.path.join(work, "dispatcher.log")
    with open(logp, "w") as log:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and p.poll() is None:
        with open(logp) as f:
            m = re.search(r"event=listening .*url=(tcp://\S+)", f.read())
        if m:
            return p, m.group(1)
        time.sleep(0.02)
    if p.poll() is None:
        p.kill()
    p.wait()
    with open(logp) as f:
        raise h.BenchError(f"{' '.join(argv)}: did not listen within "
                           f"{START_TIMEOUT_S} s:\n{f.read()[-2000:]}")


def stop_dispatcher(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise h.BenchError("dispatcher: still up 30 s after SIGTERM")


def one_run(cachewd, load, n, window, extra):
    with tempfile.TemporaryDirectory(prefix="cachew-w9-") as work:
        p, url = start_dispatcher(cachewd, work, n, extra)
        try:
            r = subprocess.run([load, url, str(n), str(n), str(window),
                                str(p.pid)], capture_output=True, text=True,
                               timeout=window + 600)
        finally:
            stop_dispatcher(p)
    if r.returncode != 0:
        raise h.BenchError(f"w9_load {n}: exit {r.returncode}: "
                           f"{broke_summary(r.stdout)}"
                           f"{r.stderr.strip()[-2000:]}\n{r.stdout[-2000:]}")
    out, _ = h.last_json(r.stdout, f"w9_load {n}")
    for op in OPS:
        if out.get(op, {}).get("n", 0) == 0:
            raise h.BenchError(f"w9_load {n}: no {op} answered: {out}")
    return out


def broke_summary(stdout):
    """What went wrong, on one line, from w9_load's JSON (if any)."""
    try:
        out, _ = h.last_json(stdout, "w9_load")
    except h.BenchError:
        return ""
    parts = [f"dispatcher {out['dispatcher_cores']:.2f} cores, RSS "
             f"{out['dispatcher_rss_kib'] / 1024:.0f} MiB"]
    for op in TARGET_OPS + ["job_get_or_create"]:
        o = out.get(op, {})
        parts.append(f"{op} {o.get('n', 0)} answered, {o.get('errors', 0)} "
                     f"failed, p99 {o.get('p99_ms', 0):.0f} ms")
    return "; ".join(parts)


def med(runs, op, key):
    return w5.med([r[op].get(key) for r in runs])


def rows_for(results):
    rows = []
    for (n, cfg), runs in results.items():
        # split_lease_empty: leases answered with no split, which the
        # dispatcher holds until their answer changes (a long poll): shown,
        # never a target (w9_load.c says why).
        shown = OPS + [o for o in ["split_lease_empty"]
                       if all(r.get(o, {}).get("n", 0) > 0 for r in runs)]
        for op in shown:
            p99 = [r[op]["p99_ms"] for r in runs]
            rows.append([f"{n:,}", cfg, op,
                         h.fmt_int(med(runs, op, "n") / runs[0]["seconds"]),
                         f"{med(runs, op, 'p50_ms'):.2f}",
                         f"{statistics.median(p99):.2f}",
                         f"{min(p99):.2f}", f"{max(p99):.2f}",
                         f"{med(runs, op, 'max_ms'):.1f}",
                         h.fmt_int(sum(r[op]["errors"] for r in runs))])
    return rows


def summary_rows(results):
    rows = []
    for (n, cfg), runs in results.items():
        cores = [r["dispatcher_cores"] for r in runs]
        rows.append([f"{n:,}", cfg, f"{runs[0]['jobs']:,}",
                     f"{runs[0]['connections']:,}",
                     f"{statistics.median(cores):.3f}", f"{min(cores):.3f}",
                     f"{max(cores):.3f}",
                     w5.fmt_mib(w5.med([r["dispatcher_rss_kib"]
                                        for r in runs])),
                     w5.fmt_mib(max(r["dispatcher_hwm_kib"] for r in runs)),
                     f"{w5.med([r['generator_cores'] for r in runs]):.3f}"])
    return rows


OP_HEADER = ["N", "dispatcher", "request", "per s", "p50 ms", "p99 ms",
             "min", "max", "max ms", "errors"]
SUM_HEADER = ["N (workers = clients)", "dispatcher", "jobs", "connections",
              "dispatcher cores", "min", "max", "RSS MiB", "peak RSS MiB",
              "generator cores"]


def run_all(cachewd, load, sizes, window, reps):
    results = {(n, cfg): [] for n in sizes for cfg, _ in CONFIGS}
    broke = {}
    for rep in range(1, reps + 1):
        for n, (cfg, extra) in [(n, c) for n in sizes for c in CONFIGS]:
            try:
                out = one_run(cachewd, load, n, window, extra)
            except h.BenchError as e:
                if n < max(sizes):
                    raise
                broke[(n, cfg)] = str(e)  # what breaks first is the result
                h.log(f"  rep {rep}/{reps} N={n:,} {cfg}: FAILED: {e}")
                continue
            results[(n, cfg)].append(out)
            h.log(f"  rep {rep}/{reps} N={n:,} {cfg}: dispatcher "
                  f"{out['dispatcher_cores']:.3f} cores, rss "
                  f"{out['dispatcher_rss_kib'] / 1024:.1f} MiB; p99 ms "
                  + ", ".join(f"{op} {out[op]['p99_ms']:.2f}"
                              for op in TARGET_OPS))
    return {k: v for k, v in results.items() if v}, broke


def target_lines(results, broke):
    lines, worst = [], {}
    for cfg, _ in CONFIGS:
        t = results[(TARGET_N, cfg)]
        p99 = max(statistics.median(r[op]["p99_ms"] for r in t)
                  for op in TARGET_OPS)
        worst[cfg] = p99
        cores = statistics.median(r["dispatcher_cores"] for r in t)
        lines.append(f"{TARGET_N:,} workers and {TARGET_N:,} clients, "
                     f"dispatcher with {cfg}: worst heartbeat/lease p99 "
                     f"{p99:.2f} ms (target < {TARGET_P99_MS:.0f} ms: "
                     f"{'met' if p99 < TARGET_P99_MS else 'MISSED'}), "
                     f"{cores:.3f} cores (target < {TARGET_CORES}: "
                     f"{'met' if cores < TARGET_CORES else 'MISSED'})")
    for (n, cfg), err in broke.items():
        lines.append(f"{n:,} with {cfg}: broke: "
                     f"{err.splitlines()[0][:300]}")
    return lines, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="100 and 1,000, 4 s windows, one rep, under 60 s")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per size (default 3)")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    mode = "quick" if args.quick else "full"
    sizes, window = SIZES[mode], WINDOW_S[mode]
    if args.quick:
        args.reps = 1

    cachew = h.cachew_bin()
    cachewd = w5.cachewd_bin(cachew)
    load = w6.bench_prog(cachew, "w9_load")
    info = h.machine_info()
    h.log(f"W9 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {cachew}")
    results, broke = run_all(cachewd, load, sizes, window, args.reps)
    info["loadavg_end"] = h.loadavg()
    lines, worst = target_lines(results, broke)
    warning = h.load_warning(info)
    if warning is not None:
        lines.append(warning)

    print(h.text_table(SUM_HEADER, summary_rows(results)))
    print()
    print(h.text_table(OP_HEADER, rows_for(results)))
    print()
    for line in lines:
        print(line)
    raw = {"workload": WID, "mode": mode, "reps": args.reps, "machine": info,
           "targets": {"n": TARGET_N, "p99_ms": TARGET_P99_MS,
                       "cores": TARGET_CORES},
           "broke": {f"{n} {cfg}": e for (n, cfg), e in broke.items()},
           "runs": {f"{n} {cfg}": v for (n, cfg), v in results.items()}}
    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", raw)
    if mode == "full":
        md = ["## W9 - dispatcher scale: simulated workers and clients "
              "against one real dispatcher", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, load average {info['loadavg_start']} -> "
              f"{info['loadavg_end']}, {args.reps} reps, {window} s windows; "
              "`bench/run W9`.", "",
              h.md_table(SUM_HEADER, summary_rows(results)), "",
              h.md_table(OP_HEADER, rows_for(results)), ""]
        md += [f"- {line}" for line in lines]
        h.write_section(WID, "\n".join(md) + "\n")
    h.log(f"raw runs: {raw_path}")
    p99 = worst["journal"]
    print(f"{WID} ratio={p99 / TARGET_P99_MS:.3f} cachew={p99:.2f}ms "
          f"peer={TARGET_P99_MS:.0f}ms")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W9: {e}", file=sys.stderr)
        sys.exit(1)
