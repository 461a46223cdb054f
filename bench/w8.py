#!/usr/bin/python3
"""W8 - the dispatcher's journal: its restart (recovery) time for 10^4 and
10^6 journal records, and its cost on a running service.

Recovery. For each size N (full: 10^4 and 10^6 records; quick: 10^3 and
10^4), build/journal_gen (bench/journal_gen.c, `make bench-progs`) writes
the journal a busy dispatcher would have written (4 workers, one client,
job after job, no snapshot) into WORK/journal of a fresh work dir; then
`cachewd --role=dispatcher --listen tcp://127.0.0.1:0 --work-dir WORK
--snapshot-records 1000000000` is spawned and timed from the spawn to its
first `event=listening` line (the wall time a restart costs: exec,
journal open, replay, listener); its `event=recovered` line gives the
replay's own `ms=` and the record count, which must be journal_gen's
(and `diverged=0`). The baselines are the same start on an empty work dir
(`event=journal_created`) and with `--journal 0`, so the cost of the
records is the difference. Then the same journal after a snapshot: the
dispatcher is started on it with `--snapshot-records 16` (the least
cachewd takes; replayed records do not count towards it, appended ones
do, and its ticker appends one every 50 ms), stopped with SIGTERM once
it logged `event=snapshot`, and the restart timed as before: it must
load the snapshot and replay only the few records after it. The
dispatcher's peak RSS (VmHWM) is read once it listens; it is stopped
with SIGTERM (time to exit reported). All of it once per repetition, the
sizes interleaved, medians. The journal files are in the page cache (just
written): this is the restart of a process, not of a machine.

Overhead. W1 (`range(N) | map(add 1) | batch(64)`) through a fresh
dispatcher and 2 `cachewd --role=worker --threads 1` over tcp per run,
W5's service runs (bench/w5.py), with the journal (the default: W5's
dispatcher has a work dir) against `--journal 0` on the dispatcher,
repetitions interleaved. After each measured client, `cachew status
--json` gives the dispatcher's journal counts (fsyncs and records since
its start: the probe job, the measured job, the ticks). Checks: exactly
ceil(N/64) batches and every byte.

Targets (issue 19): recovery (spawn to listening) < 1 s for 10^4 records;
W1 through the service with the journal >= 0.97x without it.

Usage: /usr/bin/python3 bench/w8.py [--quick] [--reps R]   (or bench/run W8)
"""
import argparse
import os
import re
import selectors
import shutil
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

WID = "W8"
SIZES = {
    "full": {"records": (10_000, 1_000_000), "w1": w5.SIZES["full"]["w1"]},
    # W1 quick: W5's 5 M is a 0.2 s run, too short to see a few percent
    "quick": {"records": (1_000, 10_000), "w1": 20_000_000},
}
TARGET_RECORDS = 10_000
TARGET_RECOVERY_S = 1.0
TARGET_RATIO = 0.97
NO_SNAPSHOT = 1_000_000_000  # cachewd's largest --snapshot-records
SNAPSHOT_SOON = 16  # its smallest
# A restart after the snapshot replays the records appended between the
# snapshot and the stop: a few ticks; more than this is wrong.
AFTER_SNAPSHOT_MAX = 1000
START_TIMEOUT_S = 120.0
SNAPSHOT_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
GEN_TIMEOUT_S = 600.0
STATUS_TIMEOUT_S = 10.0


# ---- one dispatcher start, timed ----------------------------------------

def kv(line):
    """The key=value fields of a log line."""
    return dict(t.split("=", 1) for t in line.split() if "=" in t)


class Dispatcher:
    """A dispatcher whose stdout and stderr are read through one pipe, each
    line stamped with the time it arrived (time.monotonic())."""

    def __init__(self, cachewd, work, extra, what):
        self.argv = [cachewd, "--role=dispatcher", "--listen",
                     "tcp://127.0.0.1:0", "--work-dir", work] + list(extra)
        self.what = what
        self.lines = []  # (seconds since the spawn, text)
        self.buf = b""
        self.eof = False
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT,
                                     cwd=h.REPO_DIR)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def text(self):
        return "\n".join(l for _, l in self.lines)

    def tail(self, n=15):
        return "\n".join(l for _, l in self.lines[-n:])

    def pump(self, timeout):
        """Reads what is there (waiting up to timeout s); False at EOF."""
        if self.eof:
            return False
        if not self.sel.select(timeout):
            return True
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        now = time.monotonic() - self.t0
        if not chunk:
            self.eof = True
            if self.buf:
                self.lines.append((now, self.buf.decode(errors="replace")))
                self.buf = b""
            return False
        self.buf += chunk
        *done, self.buf = self.buf.split(b"\n")
        self.lines.extend((now, l.decode(errors="replace")) for l in done)
        return True

    def wait_line(self, pred, what, timeout_s):
        """(seconds since the spawn, line) of the first line for which
        pred is true."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for t, line in self.lines[seen:]:
                if pred(line):
                    return t, line
            seen = len(self.lines)
            left = deadline - time.monotonic()
            if left <= 0:
                raise h.BenchError(f"{self.what}: no {what} within "
                                   f"{timeout_s:.0f} s:\n{self.tail()}")
            if not self.pump(min(left, 1.0)):
                self.proc.wait()
                raise h.BenchError(f"{self.what}: exited with "
                                   f"{self.proc.returncode} before {what}:"
                                   f"\n{self.tail()}")

    def stop(self):
        """SIGTERM (SIGKILL after STOP_TIMEOUT_S), reading the output to
        its end; returns (exit code, seconds from the signal to the exit)."""
        t = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = t + STOP_TIMEOUT_S
        while self.pump(min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                h.log(f"  {self.what}: still up {STOP_TIMEOUT_S:.0f} s "
                      "after SIGTERM: SIGKILL")
                self.proc.kill()
                deadline = float("inf")
        code = self.proc.wait()
        stop_s = time.monotonic() - t
        self.sel.close()
        self.proc.stdout.close()
        return code, stop_s


def start_once(cachewd, work, extra, what, then=None):
    """Spawns a dispatcher on work, times it to its listening line, reads
    its recovered/journal_created line and peak RSS, runs then(d) if given,
    stops it. Returns a dict."""
    d = Dispatcher(cachewd, work, extra, what)
    try:
        listen_s, _ = d.wait_line(lambda l: "event=listening" in l,
                                  "listening line", START_TIMEOUT_S)
        hwm = w5.proc_hwm_kib(d.proc.pid)
        rec = {"listen_s": listen_s, "hwm_kib": hwm}
        for _, line in d.lines:
            if "event=recovered " in line or "event=journal_created" in line:
                rec["journal"] = kv(line)
                break
        if then is not None:
            then(d, rec)
    finally:
        code, stop_s = d.stop()
    rec["exit_code"] = code
    rec["stop_s"] = stop_s
    if code != 0:
        raise h.BenchError(f"{what}: exited with {code} after SIGTERM:\n"
                           f"{d.tail()}")
    rec["log"] = d.text()
    return rec


def intf(fields, key, what):
    try:
        return int(fields[key])
    except (KeyError, ValueError):
        raise h.BenchError(f"{what}: no integer {key}= in {fields}")


def check_recovered(rec, what, records=None, snapshot=False):
    """The start replayed the journal without divergence; records (when
    given) is how many it must report."""
    j = rec.get("journal")
    if j is None or j.get("event") != "recovered":
        raise h.BenchError(f"{what}: no event=recovered line:\n{rec['log']}")
    got = intf(j, "records", what)
    if intf(j, "diverged", what) != 0:
        raise h.BenchError(f"{what}: diverged={j['diverged']} (the replay "
                           "did not reproduce the journaled replies)")
    if records is not None and got != records:
        raise h.BenchError(f"{what}: replayed {got} records, journal_gen "
                           f"wrote {records}")
    lsn = intf(j, "snapshot_lsn", what)
    if snapshot and (lsn == 0 or got > AFTER_SNAPSHOT_MAX):
        raise h.BenchError(f"{what}: snapshot_lsn={lsn} records={got}: "
                           "expected a snapshot and at most "
                           f"{AFTER_SNAPSHOT_MAX} records after it")
    if not snapshot and lsn != 0:
        raise h.BenchError(f"{what}: snapshot_lsn={lsn}, expected none")
    try:
        rec["replay_ms"] = float(j["ms"])
    except (KeyError, ValueError):
        raise h.BenchError(f"{what}: no ms= in {j}")
    rec["records"] = got
    rec["snapshot_lsn"] = lsn


def journal_gen(prog, jdir, n):
    """Runs journal_gen; returns its records, bytes, jobs, seconds and the
    bytes of the files it wrote."""
    t = time.monotonic()
    try:
        r = subprocess.run([prog, jdir, str(n)], capture_output=True,
                           text=True, timeout=GEN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise h.BenchError(f"journal_gen {n}: not done in "
                           f"{GEN_TIMEOUT_S:.0f} s")
    secs = time.monotonic() - t
    if r.returncode != 0:
        raise h.BenchError(f"journal_gen {n}: exit {r.returncode}: "
                           f"{r.stderr.strip()}")
    f = kv(r.stdout)
    out = {"seconds": secs}
    for k in ("records", "bytes", "jobs"):
        out[k] = intf(f, k, f"journal_gen {n}")
    if out["records"] < n:
        raise h.BenchError(f"journal_gen {n}: wrote {out['records']} "
                           "records")
    out["file_bytes"] = sum(os.path.getsize(os.path.join(jdir, x))
                            for x in os.listdir(jdir))
    return out


def wait_snapshot(d, rec):
    """A start_once hook: waits for the dispatcher's first snapshot."""
    _, line = d.wait_line(lambda l: "event=snapshot" in l,
                          "event=snapshot line", SNAPSHOT_TIMEOUT_S)
    if "event=snapshot " not in line:
        raise h.BenchError(f"{d.what}: {line}")
    rec["snapshot"] = kv(line)


def recovery_rep(cachewd, gen, sizes, rows):
    """One repetition of every recovery measurement; appends to rows
    (a dict: row key -> list of dicts)."""
    base = tempfile.mkdtemp(prefix="cachew-w8-", dir="/tmp")
    try:
        work = os.path.join(base, "empty")
        r = start_once(cachewd, work, ["--snapshot-records",
                                       str(NO_SNAPSHOT)], "empty work dir")
        if (r.get("journal") or {}).get("event") != "journal_created":
            raise h.BenchError("empty work dir: no event=journal_created:\n"
                               + r["log"])
        rows["empty"].append(r)
        r = start_once(cachewd, os.path.join(base, "off"), ["--journal", "0"],
                       "journal off")
        if r.get("journal") is not None:
            raise h.BenchError("--journal 0: the journal was opened:\n"
                               + r["log"])
        rows["off"].append(r)
        for n in sizes:
            work = os.path.join(base, f"n{n}")
            g = journal_gen(gen, os.path.join(work, "journal"), n)
            what = f"{n:,} records"
            r = start_once(cachewd, work, ["--snapshot-records",
                                           str(NO_SNAPSHOT)], what)
            check_recovered(r, what, records=g["records"])
            r["gen"] = g
            rows[("full", n)].append(r)
            what = f"{n:,} records, taking a snapshot"
            r = start_once(cachewd, work, ["--snapshot-records",
                                           str(SNAPSHOT_SOON)], what,
                           then=wait_snapshot)
            check_recovered(r, what)
            snap = r["snapshot"]
            snap_lsn = intf(snap, "lsn", what)
            what = f"{n:,} records after a snapshot"
            r = start_once(cachewd, work, ["--snapshot-records",
                                           str(NO_SNAPSHOT)], what)
            check_recovered(r, what, snapshot=True)
            r["snapshot_taken"] = snap
            if r["snapshot_lsn"] < snap_lsn:
                raise h.BenchError(f"{what}: loaded the snapshot at "
                                   f"{r['snapshot_lsn']}, one at {snap_lsn} "
                                   "was written")
            rows[("snap", n)].append(r)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for r in [v[-1] for v in rows.values()]:
        r.pop("log", None)  # kept only while checking


# ---- overhead: W1 through the service -------------------------------------

JOURNAL_RE = re.compile(r"(\d+) records \((\d+) durable\), snapshot at "
                        r"(\d+), (\d+) fsyncs for (\d+) records since this "
                        r"start")


def status_journal(cachew, journal_on):
    """An `after` hook for w5.Served: the dispatcher's journal counts."""
    def after(svc, rec):
        r = subprocess.run(w5.with_timeout([cachew, "status", svc.url,
                                            "--json"], STATUS_TIMEOUT_S),
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise h.BenchError(f"cachew status {svc.url}: exit "
                               f"{r.returncode}: {r.stderr.strip()}")
        obj, _ = h.last_json(r.stdout, "cachew status --json")
        line = obj.get("journal")
        if not journal_on:
            if line is not None:
                raise h.BenchError(f"--journal 0, yet status says journal "
                                   f"{line!r}")
            rec["journal"] = None
            return
        m = JOURNAL_RE.search(line or "")
        if m is None or ": ok;" not in line:
            raise h.BenchError(f"cachew status: journal {line!r}")
        rec["journal"] = {"records": int(m.group(1)),
                          "fsyncs": int(m.group(4)),
                          "appended": int(m.group(5))}
    return after


def overhead_configs(cachew, cachewd, n, seed, limit_s):
    out = []
    for label, on in (("W1 journal", True), ("W1 --journal 0", False)):
        check, _ = w5.counts_check(label, n, 8, True)
        c = w5.Served(cachew, cachewd, "tcp", limit_s, "service", label,
                      f"{w5.WORKERS}x{w5.WORKER_THREADS}",
                      [cachew, "run", "--json", "--no-digest", "--quiet",
                       "--seed", str(seed), w5.w1_pipeline(n, 1)], n,
                      check=check)
        if not on:
            c.dispatcher_extra = ("--journal", "0")
        c.after = status_journal(cachew, on)
        out.append(c)
    return out


# ---- report ---------------------------------------------------------------

REC_HEADER = ["start", "records replayed", "journal MiB", "gen s",
              "replay ms", "min", "max", "to listening ms", "min", "max",
              "stop ms", "dispatcher peak RSS MiB"]


def ms(x):
    return "-" if x is None else f"{x * 1000:.1f}"


def rec_rows(rows, sizes):
    out = []
    keys = [("empty", "empty work dir (journal created)"),
            ("off", "--journal 0")]
    for n in sizes:
        keys += [(("full", n), f"{n:,} records"),
                 (("snap", n), f"{n:,} records, after a snapshot")]
    for key, label in keys:
        runs = rows[key]
        listen = [r["listen_s"] for r in runs]
        replay = [r["replay_ms"] / 1000 for r in runs if "replay_ms" in r]
        gens = [r["gen"] for r in runs if "gen" in r]
        out.append([
            label,
            h.fmt_int(w5.med([r["records"] for r in runs if "records" in r])
                      ) if replay else "-",
            f"{gens[0]['file_bytes'] / 2**20:.1f}" if gens else "-",
            w5.fmt_s(w5.med([g["seconds"] for g in gens])) if gens else "-",
            ms(w5.med(replay)) if replay else "-",
            ms(min(replay)) if replay else "-",
            ms(max(replay)) if replay else "-",
            ms(statistics.median(listen)), ms(min(listen)), ms(max(listen)),
            ms(w5.med([r["stop_s"] for r in runs])),
            w5.fmt_mib(max((r["hwm_kib"] or 0) for r in runs)),
        ])
    return out


def snap_bytes(runs):
    return w5.med([int(r["snapshot_taken"].get("bytes", 0)) for r in runs])


def snap_ms(runs):
    return w5.med([float(r["snapshot_taken"].get("ms", 0)) for r in runs])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes, under 60 s, same code paths")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per configuration (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    mode = "quick" if args.quick else "full"
    sz = SIZES[mode]
    sizes = sz["records"]

    h.check_tools()
    cachew = h.cachew_bin()
    cachewd = w5.cachewd_bin(cachew)
    gen = w6.bench_prog(cachew, "journal_gen")
    info = h.machine_info()
    h.log(f"W8 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {cachew}")

    rows = {"empty": [], "off": []}
    for n in sizes:
        rows[("full", n)] = []
        rows[("snap", n)] = []
    for rep in range(1, args.reps + 1):
        recovery_rep(cachewd, gen, sizes, rows)
        h.log(f"  rep {rep}/{args.reps} recovery: empty "
              f"{ms(rows['empty'][-1]['listen_s'])} ms, " + ", ".join(
                  f"{n:,} records {ms(rows[('full', n)][-1]['listen_s'])} "
                  f"ms (replay {rows[('full', n)][-1]['replay_ms']:.1f}), "
                  f"after a snapshot "
                  f"{ms(rows[('snap', n)][-1]['listen_s'])} ms"
                  for n in sizes))

    limit_s = w5.CLIENT_LIMIT_S[mode]
    on, off = overhead_configs(cachew, cachewd, sz["w1"], args.seed, limit_s)
    h.run_interleaved([on, off], args.reps)
    info["loadavg_end"] = h.loadavg()

    lines = []
    listen = {k: statistics.median(r["listen_s"] for r in v)
              for k, v in rows.items()}
    replay = {k: statistics.median(r["replay_ms"] for r in v)
              for k, v in rows.items() if k not in ("empty", "off")}
    base = listen["empty"]
    for n in sizes:
        full, snap = ("full", n), ("snap", n)
        g = rows[full][0]["gen"]
        target = ""
        if n == TARGET_RECORDS:
            ok = listen[full] < TARGET_RECOVERY_S
            target = (f" (target < {TARGET_RECOVERY_S:.0f} s: "
                      f"{'met' if ok else 'MISSED'})")
        lines.append(
            f"{n:,} records ({g['records']:,} written, "
            f"{g['file_bytes'] / 2**20:.1f} MiB, {g['jobs']} jobs): "
            f"restart {listen[full] * 1000:.1f} ms spawn to listening"
            f"{target}, {(listen[full] - base) * 1000:+.1f} ms against an "
            f"empty work dir; replay {replay[full]:.1f} ms "
            f"({replay[full] * 1000 / g['records']:.2f} us a record); after "
            f"a snapshot {listen[snap] * 1000:.1f} ms (replay "
            f"{replay[snap]:.1f} ms of "
            f"{w5.med([r['records'] for r in rows[snap]]):.0f} records; the "
            f"snapshot {snap_bytes(rows[snap])} bytes, written in "
            f"{snap_ms(rows[snap])} ms)")
    ratio = on.median() / off.median()
    cpu = w5.cpu_ratio(off, on)
    jn = [r["journal"] for r in on.runs]
    lines.append(
        f"W1 through the service ({sz['w1']:,} elements, tcp): journal / "
        f"--journal 0 = {ratio:.3f}x (target >= {TARGET_RATIO}: "
        f"{'met' if ratio >= TARGET_RATIO else 'MISSED'}); CPU per element "
        "--journal 0 / journal = "
        + ("-" if cpu is None else f"{cpu:.3f}x")
        + "; dispatcher CPU s "
        f"{w5.fmt_s(w5.med([r['cpu']['dispatcher'] for r in on.runs]))} / "
        f"{w5.fmt_s(w5.med([r['cpu']['dispatcher'] for r in off.runs]))}; "
        f"journal per run (median): "
        f"{w5.med([j['appended'] for j in jn]):.0f} records, "
        f"{w5.med([j['fsyncs'] for j in jn]):.0f} fsyncs")
    warning = h.load_warning(info)
    if warning is not None:
        lines.append(warning)
    rrows = rec_rows(rows, sizes)
    orows = w5.rows_for([on, off])

    raw = {"workload": WID, "mode": mode, "reps": args.reps,
           "machine": info,
           "targets": {"recovery_s": TARGET_RECOVERY_S,
                       "recovery_records": TARGET_RECORDS,
                       "ratio": TARGET_RATIO},
           "ratio": ratio,
           "recovery": {("empty" if k == "empty" else "off" if k == "off"
                         else f"{k[0]}-{k[1]}"): v
                        for k, v in rows.items()},
           "configs": [{"label": c.label, "argv": c.argv,
                        "dispatcher_extra": list(c.dispatcher_extra),
                        "units": c.units, "runs": c.runs}
                       for c in (on, off)]}
    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", raw)
    if mode == "full":
        md = [f"## W8 - the dispatcher's journal: recovery time and its "
              "cost on W1 through the service", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each; 1-min load average "
              f"{info['loadavg_start']} before, {info['loadavg_end']} after. "
              "Recovery: journals of N records by `journal_gen`, a "
              "dispatcher started on them (`--snapshot-records "
              f"{NO_SNAPSHOT}`), timed from the spawn to its listening "
              "line; replay ms is its `event=recovered` figure; after a "
              "snapshot: the same journal once a run with "
              f"`--snapshot-records {SNAPSHOT_SOON}` wrote a snapshot. "
              "Overhead: W5's tcp service runs (fresh daemons per run, 2 "
              f"workers), W1 N = {sz['w1']:,}, with the journal against "
              "`--journal 0`, interleaved.", "",
              h.md_table(REC_HEADER, rrows), "",
              h.md_table(w5.HEADER, orows), ""]
        md += [f"- {line}" for line in lines]
        h.write_section(WID, "\n".join(md) + "\n")
    print(f"W8 ({mode}, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(REC_HEADER, rrows))
    print()
    print(h.text_table(w5.HEADER, orows))
    for line in lines:
        print(line)
    print(f"W8 ratio={ratio:.3f} cachew={on.median():.0f}elements/s "
          f"peer={off.median():.0f}elements/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W8: {e}", file=sys.stderr)
        sys.exit(1)
