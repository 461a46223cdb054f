#!/usr/bin/python3
"""grouping_ops.py - group_by_window, bucket_by_sequence_length and
ragged_batch beside the closest existing operator, and the padding waste of
bucket_by_sequence_length against padded_batch (issue 15).

    bench/grouping_ops.py [--lines N] [--range N] [--reps K]

One thread (`cachew run --threads 1`). Each pipeline runs K times,
interleaved (rep 1 of every pipeline, then rep 2, ...), and the table gives
input elements per second of the whole pipeline, median with min and max,
beside its source alone. `seqs` are the tokenized lines read back from a
cache (`cache(root=..., threads=1)`, written by a first untimed run) and
repeated 5 times, so the batching operators are not hidden under
tokenizing. On a loaded shared machine the wall-clock rate follows the
load; the rate per CPU second (user + system of the cachew process, from
getrusage) is what the operator costs.

Padding waste = padding tokens / real tokens, over `cachew gen text` lines
(4 to 24 words each) tokenized, batches of 32: the real tokens are what
`text_lines | tokenize` yields, a batched run's tokens are its bytes / 8.
Standard library only.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHEW = os.environ.get("CACHEW_BIN", os.path.join(REPO, "build", "cachew"))
BATCH = 32
BOUNDS = [8, 12, 16, 20]
REPEAT = 5
FINE = [6, 8, 10, 12, 14, 16, 18, 20, 22, 24]


def run(pipeline):
    """The run's JSON, with "cpu": the process's user + system seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([CACHEW, "run", "--json", "--quiet", "--threads", "1",
                        pipeline], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"grouping_ops: {pipeline}: {r.stderr.strip()}")
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    obj["cpu"] = (after.ru_utime - before.ru_utime +
                  after.ru_stime - before.ru_stime)
    return obj


def bucket(bounds):
    sizes = ", ".join([str(BATCH)] * (len(bounds) + 1))
    return (f"bucket_by_sequence_length(0, [{', '.join(map(str, bounds))}], "
            f"[{sizes}])")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200000)
    ap.add_argument("--range", type=int, default=2000000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--data", default="/tmp/cachew-grouping-text")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    if not os.path.isdir(a.data):
        subprocess.run([CACHEW, "gen", "text", "--out", a.data, "--lines",
                        str(a.lines), "--files", "4", "--seed", "7"],
                       check=True, capture_output=True)
    text = f'text_lines(files="{a.data}/*.txt") | tokenize'
    n = a.range
    # The tokenized lines read back from a cache (written by the first
    # run), so the batching operators are not hidden under tokenizing.
    seqs = (f'{text} | cache(root="{a.data}-cache", threads=1) | '
            f'repeat({REPEAT})')
    run(seqs)
    m = None
    runs = {
        "range": (f"range({n})", n),
        "range | batch(64)": (f"range({n}) | batch(64)", n),
        "range | group_by_window(mod, 64, value=4)":
            (f"range({n}) | group_by_window(mod, 64, value=4)", n),
        "seqs": (seqs, m),
        "seqs | padded_batch(32)": (f"{seqs} | padded_batch({BATCH})", m),
        "seqs | bucket_by_sequence_length(4 bounds, 32)":
            (f"{seqs} | {bucket(BOUNDS)}", m),
        "seqs | ragged_batch(32)": (f"{seqs} | ragged_batch({BATCH})", m),
        "text | tokenize": (text, None),
        "text | tokenize | padded_batch(32)":
            (f"{text} | padded_batch({BATCH})", None),
        "text | tokenize | bucket_by_sequence_length(4 bounds, 32)":
            (f"{text} | {bucket(BOUNDS)}", None),
        "text | tokenize | bucket_by_sequence_length(10 bounds, 32)":
            (f"{text} | {bucket(FINE)}", None),
    }
    secs = {k: [] for k in runs}
    cpus = {k: [] for k in runs}
    last = {}
    for rep in range(a.reps):
        for k, (p, _) in runs.items():
            obj = run(p)
            secs[k].append(obj["seconds"])
            cpus[k].append(obj["cpu"])
            last[k] = obj
            print(f"rep {rep + 1} {k}: {obj['seconds']:.3f} s",
                  file=sys.stderr, flush=True)
    lines = last["text | tokenize"]["elements"]
    real = last["text | tokenize"]["bytes"] // 8
    print(f"load average before: {load0:.2f}, after: "
          f"{os.getloadavg()[0]:.2f}; one thread; {a.reps} reps, "
          "median (min-max)")
    print("| pipeline | input elements | input elements/s (wall) | "
          "input elements per CPU second |")
    print("|---|---|---|---|")
    for k, (_, count) in runs.items():
        count = (count if count is not None
                 else lines * REPEAT if k.startswith("seqs") else lines)
        rate = [count / s for s in secs[k]]
        crate = [count / max(c, 1e-3) for c in cpus[k]]
        print(f"| `{k}` | {count} | {statistics.median(rate):,.0f} "
              f"({min(rate):,.0f}-{max(rate):,.0f}) | "
              f"{statistics.median(crate):,.0f} "
              f"({min(crate):,.0f}-{max(crate):,.0f}) |")
    print(f"\npadding waste over {lines} lines, {real} real tokens, "
          f"batches of {BATCH}:")
    print("| batching | tokens with padding | padding / real tokens |")
    print("|---|---|---|")
    for k in ("text | tokenize | padded_batch(32)",
              "text | tokenize | bucket_by_sequence_length(4 bounds, 32)",
              "text | tokenize | bucket_by_sequence_length(10 bounds, 32)"):
        tokens = last[k]["bytes"] // 8
        print(f"| `{k}` | {tokens} | {(tokens - real) / real:.1%} |")


if __name__ == "__main__":
    main()
