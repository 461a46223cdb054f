#!/usr/bin/python3
"""Autoscaling, real: the `model` policy against a sweep of fixed worker
counts, in the same run, with workers started by the dispatcher itself.

Job: `range(N) | map(sleep_us, us=S)` run by `cachewd --role=worker
--threads 1` processes, so one worker delivers about 1e6/S elements/s
whatever the cores (the map sleeps like an I/O wait: extra workers help
without extra CPU). Consumer: examples/train_loop.c (build/train_loop)
with a fixed step of T ms per element, the stand-in for a training step.
Service: `cachewd --role=dispatcher --provisioner process --max-workers M
--worker-threads 1` on loopback, one fresh dispatcher per run (it starts
and stops its workers; none is started by hand), the client pointed at it
with CACHEW_SERVICE.

Runs: `--scale-policy fixed:K` for K = 1..M (each `--repeat` times, the
median counts), then `--scale-policy model`. Each run is one epoch; its
time is train_loop's `seconds`. The best fixed count is the smallest K
whose epoch time is within 5 % of the sweep's best (the oracle of issue
6). The model's run is longer (`--model-elements`, 5x by default): it
measures at one worker, jumps, confirms, probes one fewer for at least
10 s and keeps judging the probe for a while (a worker being removed
first finishes the splits it leased, 5-9 s here, and the buffer it
filled lasts after it); its epoch time is reported per sweep epoch
(scaled by elements) next to the fixed ones. For `model`, the converged count is the
job's last decision (`want` in `cachew status --json`, also the last
`scale_decision` event), with the decisions (time, count, reason) from
the dispatcher's events log. Target (issue 6): model within +-1 of the
sweep's best count.

Usage: /usr/bin/python3 bench/autoscale.py [--build DIR] [--quick]
       [--elements N] [--model-elements N] [--repeat R] [--sleep-us S]
       [--step-ms T] [--max-workers M]
The last line is one JSON object with the results.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_url(log_path, proc, timeout=10.0):
    """The dispatcher's URL from its `event=listening role=dispatcher`
    line; waits for it (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dispatcher exited with {proc.returncode}: "
                               + open(log_path).read()[-2000:])
        with open(log_path) as f:
            for line in f:
                if line.startswith("event=listening role=dispatcher "):
                    m = re.search(r"url=(\S+)", line)
                    if m:
                        return m.group(1)
        time.sleep(0.02)
    raise RuntimeError("dispatcher did not listen within %.0f s" % timeout)


def status_json(cachew, url):
    out = subprocess.run([cachew, "status", url, "--json"],
                         capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise RuntimeError("cachew status: " + out.stderr)
    return json.loads(out.stdout)


def one_run(args, policy, tmp, elements, tag=""):
    """One epoch of `elements` through a fresh dispatcher with `policy`;
    returns a dict with the epoch time, the job's final decision and the
    decisions."""
    work = os.path.join(tmp, policy.replace(":", "-") + tag)
    os.makedirs(work, exist_ok=True)
    log_path = os.path.join(work, "dispatcher.log")
    cachewd = os.path.join(args.build, "cachewd")
    cachew = os.path.join(args.build, "cachew")
    train = os.path.join(args.build, "train_loop")
    with open(log_path, "w") as log:
        disp = subprocess.Popen(
            [cachewd, "--role=dispatcher", "--listen", "tcp://127.0.0.1:0",
             "--work-dir", work, "--heartbeat-ms", str(args.heartbeat_ms),
             "--provisioner", "process", "--max-workers",
             str(args.max_workers), "--worker-threads", "1",
             "--scale-policy", policy],
            stderr=log, stdout=subprocess.DEVNULL)
    try:
        url = wait_url(log_path, disp)
        pipeline = f"range({elements}) | map(sleep_us, us={args.sleep_us})"
        env = dict(os.environ, CACHEW_SERVICE=url)
        t0 = time.monotonic()
        out = subprocess.run([train, pipeline, str(args.step_ms)], env=env,
                             capture_output=True, text=True,
                             timeout=args.timeout)
        wall = time.monotonic() - t0
        if out.returncode != 0:
            raise RuntimeError(f"train_loop ({policy}): {out.stderr}")
        m = re.search(r"^seconds\s+([0-9.]+)", out.stdout, re.M)
        batches = re.search(r"^batches\s+([0-9]+)", out.stdout, re.M)
        if m is None or batches is None or int(batches.group(1)) != elements:
            raise RuntimeError(f"train_loop ({policy}): {out.stdout}")
        st = status_json(cachew, url)
        job = st["jobs"][-1] if st["jobs"] else {}
        decisions = []
        t_first = None
        with open(os.path.join(work, "events.jsonl")) as f:
            for line in f:
                ev = json.loads(line)
                if t_first is None:
                    t_first = ev["ts_ns"]
                if ev["event"] == "scale_decision":
                    decisions.append({
                        "t_s": round((ev["ts_ns"] - t_first) / 1e9, 2),
                        "want": ev["want"], "settled": ev["settled"],
                        "reason": ev["reason"]})
        return {"policy": policy, "epoch_s": float(m.group(1)),
                "wall_s": round(wall, 2), "want": job.get("want"),
                "granted": job.get("granted"),
                "settled": job.get("settled"), "decisions": decisions}
    finally:
        disp.send_signal(signal.SIGTERM)
        try:
            disp.wait(timeout=30)
        except subprocess.TimeoutExpired:
            disp.kill()
            disp.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true",
                    help="fewer elements and a smaller sweep")
    ap.add_argument("--elements", type=int, default=None,
                    help="elements per sweep epoch (6000; --quick 4000)")
    ap.add_argument("--model-elements", type=int, default=None,
                    help="elements of the model's epoch (5x --elements)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per fixed count (the median counts)")
    ap.add_argument("--sleep-us", type=int, default=4000,
                    help="per-element pipeline time (one worker: 1e6/S el/s)")
    ap.add_argument("--step-ms", type=float, default=1.0,
                    help="the consumer's time per element")
    ap.add_argument("--max-workers", type=int, default=None)
    ap.add_argument("--heartbeat-ms", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if args.elements is None:
        args.elements = 4000 if args.quick else 6000
    if args.max_workers is None:
        args.max_workers = 5 if args.quick else 6
    if args.model_elements is None:
        args.model_elements = 5 * args.elements
    if args.repeat < 1:
        sys.exit("autoscale: --repeat needs at least 1")
    for b in ("cachewd", "cachew", "train_loop"):
        if not os.access(os.path.join(args.build, b), os.X_OK):
            sys.exit(f"autoscale: {args.build}/{b} is not built (make)")

    tmp = tempfile.mkdtemp(prefix="cachew-autoscale-")
    results = []
    try:
        per_worker = 1e6 / args.sleep_us
        demand = 1e3 / args.step_ms if args.step_ms > 0 else float("inf")
        print(f"job: {args.elements} elements, {args.sleep_us} us each "
              f"(~{per_worker:.0f} el/s per worker); consumer {args.step_ms} "
              f"ms per element (~{demand:.0f} el/s); up to "
              f"{args.max_workers} workers")
        print(f"{'policy':<10} {'epoch s':>8} {'workers':>8}  runs")
        for k in range(1, args.max_workers + 1):
            runs = [one_run(args, f"fixed:{k}", tmp, args.elements, f"-{i}")
                    for i in range(args.repeat)]
            times = sorted(r["epoch_s"] for r in runs)
            r = dict(runs[0], epoch_s=times[len(times) // 2], runs=times)
            results.append(r)
            print(f"{r['policy']:<10} {r['epoch_s']:8.2f} {k:8d}  "
                  + " ".join(f"{t:.2f}" for t in times), flush=True)
        model = one_run(args, "model", tmp, args.model_elements)
        model["per_sweep_epoch_s"] = (model["epoch_s"] * args.elements
                                      / args.model_elements)
        print(f"{'model':<10} {model['per_sweep_epoch_s']:8.2f} "
              f"{model['want']!s:>8}  {model['epoch_s']:.2f} s for "
              f"{args.model_elements} elements"
              f"{' (settled)' if model['settled'] else ''}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    best_s = min(r["epoch_s"] for r in results)
    best_k = min(k + 1 for k, r in enumerate(results)
                 if r["epoch_s"] <= best_s * 1.05)
    print("model decisions:")
    for d in model["decisions"]:
        print(f"  {d['t_s']:6.2f} s  -> {d['want']}"
              f"{' settled' if d['settled'] else ''}: {d['reason']}")
    ok = model["want"] is not None and abs(model["want"] - best_k) <= 1
    print(f"best fixed count {best_k} ({results[best_k - 1]['epoch_s']:.2f} s; "
          f"fastest {best_s:.2f} s); model converged on {model['want']} "
          f"({model['per_sweep_epoch_s']:.2f} s per sweep epoch): "
          f"{'within' if ok else 'NOT within'} +-1 of the best")
    print(json.dumps({
        "bench": "autoscale", "elements": args.elements,
        "model_elements": args.model_elements, "repeat": args.repeat,
        "sleep_us": args.sleep_us, "step_ms": args.step_ms,
        "max_workers": args.max_workers,
        "fixed_epoch_s": {r["policy"]: r["epoch_s"] for r in results},
        "best_fixed": best_k, "best_fixed_epoch_s": results[best_k - 1]["epoch_s"],
        "model_workers": model["want"], "model_settled": model["settled"],
        "model_epoch_s": model["epoch_s"],
        "model_per_sweep_epoch_s": round(model["per_sweep_epoch_s"], 3),
        "model_decisions": len(model["decisions"]), "within_1": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
