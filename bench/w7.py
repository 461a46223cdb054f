#!/usr/bin/python3
"""W7 - the cost of exactly-once delivery and batch stitching: W2 and W1
through a dispatcher and 2 worker processes over tcp://127.0.0.1, with the
exactly-once bookkeeping (the default) against the same runs with it
switched off (`--set exactly_once=false`, the debug switch).

Both sides are W5's service runs (bench/w5.py: a fresh dispatcher and 2
`cachewd --role=worker --threads 1` per run, `--heartbeat-ms 100`, a probe
job first, the client `cachew run --json` with CACHEW_SERVICE), on the
same data and pipelines; only the option differs. What exactly once adds:
every reply carries runs (which group and element numbers it holds), the
client records what it received of each group, leases keep their tails and
the client stitches them into full batches (W2: up to one stitched batch
of 64 crops per lease; W1: the same for its batches of 64 integers).

Checks: with exactly once, exactly ceil(units/64) batches and every byte
(batches are in-process's); without, every byte and at most one partial
batch more per split. Ratio = exactly-once throughput / switched-off
throughput (images/s for W2, range elements/s for W1), per workload.
Targets (issue 20): >= 0.97 for both. Also printed: the CPU seconds per
unit, all processes, of the switched-off run over the exactly-once run.

Recovery: the exactly-once W2 run once more with worker 1 SIGKILLed at 40%
of the undisturbed run's median time and a new worker started at once;
its epoch (every image exactly once: the batch and byte counts are
checked exactly) against the undisturbed one. Target (issue 20): at most
1.5x the undisturbed epoch + 2 s.

Usage: /usr/bin/python3 bench/w7.py [--quick] [--reps R]   (or bench/run W7)
"""
import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import w2  # noqa: E402
import w5  # noqa: E402

WID = "W7"
TRANSPORT = "tcp"
TARGET = 0.97
SIZES = w5.SIZES


def served(cachew, cachewd, limit_s, label, argv, units, unit_bytes, exact):
    extra = [] if exact else ["--set", "exactly_once=false"]
    check, check_splits = w5.counts_check(label, units, unit_bytes, exact)
    c = w5.Served(cachew, cachewd, TRANSPORT, limit_s, "service", label,
                  f"{w5.WORKERS}x{w5.WORKER_THREADS}",
                  argv[:3] + extra + argv[3:], units, check=check)
    if not exact:
        c.check_splits = check_splits
    return c


def configs(cachew, cachewd, d, sz, seed, limit_s):
    n_images = sz["images"] * sz["passes"]
    base = [cachew, "run", "--json", "--no-digest", "--quiet", "--seed",
            str(seed)]
    w2p = w5.w2_pipeline(d, sz["passes"], 1)
    w1p = w5.w1_pipeline(sz["w1"], 1)
    return {
        "W2": [served(cachew, cachewd, limit_s, f"W2 {what}", base + [w2p],
                      n_images, w5.W2_UNIT_BYTES, exact)
               for what, exact in (("exactly once", True), ("off", False))],
        "W1": [served(cachew, cachewd, limit_s, f"W1 {what}", base + [w1p],
                      sz["w1"], 8, exact)
               for what, exact in (("exactly once", True), ("off", False))],
    }


KILL_AT = 0.4


def kill_config(cachew, cachewd, d, sz, seed, limit_s, ref):
    """W2 exactly once with worker 1 killed (and replaced) at KILL_AT of
    ref's median time."""
    argv = [cachew, "run", "--json", "--no-digest", "--quiet", "--seed",
            str(seed), w5.w2_pipeline(d, sz["passes"], 1)]
    c = served(cachew, cachewd, limit_s, "W2 exactly once, 1 worker killed",
               argv, sz["images"] * sz["passes"], w5.W2_UNIT_BYTES, True)

    def during(svc):
        secs = [r["seconds"] for r in ref.runs]
        time.sleep(KILL_AT * (sorted(secs)[len(secs) // 2] if secs
                              else 5.0))
        svc.replace_worker(0)
    c.during = during
    return c


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

    h.check_tools()
    cachew = h.cachew_bin()
    cachewd = w5.cachewd_bin(cachew)
    info = h.machine_info()
    h.log(f"W7 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {cachew}")
    d = w2.data_dir(cachew, sz["images"], args.seed)
    limit_s = w5.CLIENT_LIMIT_S[mode]
    byw = configs(cachew, cachewd, d, sz, args.seed, limit_s)
    killed = kill_config(cachew, cachewd, d, sz, args.seed, limit_s,
                         byw["W2"][0])
    allc = byw["W2"] + byw["W1"] + [killed]
    h.run_interleaved(allc, args.reps)
    info["loadavg_end"] = h.loadavg()

    ratios, lines = {}, []
    for wl, (on, off) in byw.items():
        ratios[wl] = on.median() / off.median()
        cpu = w5.cpu_ratio(off, on)
        unit = "image" if wl == "W2" else "element"
        lines.append(
            f"{wl}: exactly once / off = {ratios[wl]:.3f}x (target >= "
            f"{TARGET}: {'met' if ratios[wl] >= TARGET else 'MISSED'}); "
            f"CPU per {unit} off / exactly once = "
            + ("-" if cpu is None else f"{cpu:.3f}x")
            + f"; batches {on.runs[0]['json'].get('elements')} with, "
            f"{off.runs[0]['json'].get('elements')} without")
    base_s = w5.med([r["seconds"] for r in byw["W2"][0].runs])
    kill_s = w5.med([r["seconds"] for r in killed.runs])
    limit = 1.5 * base_s + 2.0
    lines.append(
        f"recovery: W2 with worker 1 of {w5.WORKERS} SIGKILLed at "
        f"{KILL_AT:.0%} (a new one started) {kill_s:.2f} s, undisturbed "
        f"{base_s:.2f} s: {kill_s / base_s:.2f}x (target <= 1.5x + 2 s = "
        f"{limit:.2f} s: {'met' if kill_s <= limit else 'MISSED'}); every "
        "batch and byte counted exactly")
    warning = h.load_warning(info)
    if warning is not None:
        lines.append(warning)
    rows = w5.rows_for(allc)

    raw = {"workload": WID, "mode": mode, "reps": args.reps,
           "machine": info, "target": TARGET, "ratios": ratios,
           "recovery": {"undisturbed_s": base_s, "killed_s": kill_s},
           "configs": [{"label": c.label, "argv": c.argv, "units": c.units,
                        "runs": c.runs} for c in allc]}
    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", raw)
    if mode == "full":
        md = [f"## W7 - the cost of exactly once: W2 and W1 through a "
              f"dispatcher and {w5.WORKERS} workers (tcp), with and without",
              "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each, interleaved; 1-min "
              f"load average {info['loadavg_start']} before, "
              f"{info['loadavg_end']} after. Both sides are W5's tcp "
              "service runs (fresh daemons per run); `off` adds "
              "`--set exactly_once=false`. W2 is "
              f"{sz['passes']} passes over {sz['images']} images, W1 N = "
              f"{sz['w1']:,}.", "",
              h.md_table(w5.HEADER, rows), ""]
        md += [f"- {line}" for line in lines]
        h.write_section(WID, "\n".join(md) + "\n")
    print(f"W7 ({mode}, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(w5.HEADER, rows))
    for line in lines:
        print(line)
    on, off = byw["W2"]
    print(f"W7 ratio={ratios['W2']:.3f} cachew={on.median():.0f}images/s "
          f"peer={off.median():.0f}images/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W7: {e}", file=sys.stderr)
        sys.exit(1)
