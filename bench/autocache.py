#!/usr/bin/python3
"""Autocaching, real: a job's epochs through a dispatcher with a cache
root, against the same epochs with caching off, in the same run.

Job: `range(N) | map(sleep_us, us=S) | map(add, value=1)`, an expensive
pipeline (S us per element, like a decode or a remote read) whose output
is small, run by `cachewd --role=worker --threads 1` processes that the
dispatcher starts (`--provisioner process --scale-policy fixed:W`).
Client: `cachew run --epochs E` with CACHEW_SERVICE; every epoch is a new
job of the dataset, so one autocaching pass.

Runs, each with a fresh dispatcher and cache root:
  1. `--autocache compute`: every epoch computes (the baseline);
  2. `--autocache default`: PROFILE, then PUT (written by the workers in
     parts, committed at the end of the pass), then GET;
  3. on the same dispatcher as 2, a second client with the same pipeline:
     a new job that must read the cache at once.
Per epoch: the mode and the time from the job's `job_created` event to its
`epoch_done` (the dispatcher's events log). Targets (issue 6): the third
epoch of run 2 reads the cache and is faster than computing; the second
client's first epoch reads the cache.

Usage: /usr/bin/python3 bench/autocache.py [--build DIR] [--elements N]
       [--sleep-us S] [--epochs E] [--workers W]
The last line is one JSON object with the results.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from autoscale import wait_url  # noqa: E402  (the dispatcher's URL)


def passes(events_path, first_job=0):
    """[(job_id, mode, seconds)] from job_created to epoch_done, and the
    autocache events' texts."""
    created, out, notes = {}, [], []
    with open(events_path) as f:
        for line in f:
            ev = json.loads(line)
            if ev.get("job_id", 0) <= first_job:
                continue
            if ev["event"] == "job_created":
                created[ev["job_id"]] = (ev["ts_ns"], ev.get("cache_mode", "?"))
            elif ev["event"] == "epoch_done" and ev["job_id"] in created:
                t0, mode = created[ev["job_id"]]
                out.append((ev["job_id"], mode, (ev["ts_ns"] - t0) / 1e9))
            elif ev["event"] == "autocache":
                notes.append(ev["cache"])
    return out, notes


class Dispatcher:
    def __init__(self, args, tmp, name, policy):
        self.work = os.path.join(tmp, name)
        os.makedirs(self.work)
        self.log = os.path.join(self.work, "dispatcher.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [os.path.join(args.build, "cachewd"), "--role=dispatcher",
                 "--listen", "tcp://127.0.0.1:0", "--work-dir", self.work,
                 "--heartbeat-ms", "100", "--provisioner", "process",
                 "--max-workers", str(args.workers), "--min-workers",
                 str(args.workers), "--worker-threads", "1",
                 "--scale-policy", f"fixed:{args.workers}",
                 "--cache-root", os.path.join(self.work, "cache"),
                 "--autocache", policy],
                stderr=log, stdout=subprocess.DEVNULL)
        self.url = wait_url(self.log, self.proc)
        self.events = os.path.join(self.work, "events.jsonl")

    def run(self, args, pipeline, epochs):
        env = dict(os.environ, CACHEW_SERVICE=self.url)
        out = subprocess.run(
            [os.path.join(args.build, "cachew"), "run", "--json",
             "--epochs", str(epochs), pipeline],
            env=env, capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            raise RuntimeError("cachew run: " + out.stderr[-2000:])
        res = json.loads(out.stdout.strip().splitlines()[-1])
        if res["elements"] != args.elements * epochs:
            raise RuntimeError(f"cachew run delivered {res['elements']}")
        return res

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--elements", type=int, default=3000)
    ap.add_argument("--sleep-us", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    for b in ("cachewd", "cachew"):
        if not os.access(os.path.join(args.build, b), os.X_OK):
            sys.exit(f"autocache: {args.build}/{b} is not built (make)")
    pipeline = (f"range({args.elements}) | map(sleep_us, us={args.sleep_us})"
                " | map(add, value=1)")
    tmp = tempfile.mkdtemp(prefix="cachew-autocache-")
    try:
        base = Dispatcher(args, tmp, "compute", "compute")
        try:
            r0 = base.run(args, pipeline, args.epochs)
            compute, _ = passes(base.events)
        finally:
            base.stop()
        auto = Dispatcher(args, tmp, "default", "default")
        try:
            r1 = auto.run(args, pipeline, args.epochs)
            cached, notes = passes(auto.events)
            last_job = max(j for j, _, _ in cached)
            auto.run(args, pipeline, 1)
            second, _ = passes(auto.events, last_job)
        finally:
            auto.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"pipeline: {pipeline}; {args.workers} workers (--threads 1), "
          f"{args.epochs} epochs")
    print(f"{'epoch':>5} {'compute s':>10} {'autocache':>10} {'mode':>8}")
    for i in range(min(len(compute), len(cached))):
        print(f"{i + 1:5d} {compute[i][2]:10.2f} {cached[i][2]:10.2f} "
              f"{cached[i][1]:>8}")
    for n in notes:
        print(f"  decision: {n}")
    sec_mode, sec_s = second[0][1], second[0][2]
    print(f"second client, same pipeline: {sec_mode} {sec_s:.2f} s")
    third_ok = (len(cached) >= 3 and cached[2][1] == "get" and
                cached[2][2] < compute[2][2])
    mean_compute = sum(p[2] for p in compute) / len(compute)
    print(f"third epoch reads the cache and is faster than compute: "
          f"{'yes' if third_ok else 'NO'} ({cached[2][2]:.2f} s vs "
          f"{compute[2][2]:.2f} s, {mean_compute / cached[2][2]:.1f}x the "
          f"mean compute epoch); second job reads at once: "
          f"{'yes' if sec_mode == 'get' else 'NO'}")
    print(json.dumps({
        "bench": "autocache", "elements": args.elements,
        "sleep_us": args.sleep_us, "workers": args.workers,
        "compute_epoch_s": [round(p[2], 3) for p in compute],
        "autocache_epoch_s": [round(p[2], 3) for p in cached],
        "autocache_modes": [p[1] for p in cached],
        "second_job_mode": sec_mode, "second_job_s": round(sec_s, 3),
        "total_compute_s": r0["seconds"], "total_autocache_s": r1["seconds"],
        "third_epoch_faster": third_ok}))
    return 0 if third_ok and sec_mode == "get" else 1


if __name__ == "__main__":
    sys.exit(main())
