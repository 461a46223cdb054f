#!/usr/bin/python3
"""What the Python binding costs (issue 16's figures), side by side with
the C CLI on the same pipeline in the same run; medians of --reps runs.

  overhead  per-batch cost of the binding on range(N) | batch(32): the
            Python loop's time minus the CLI's, per batch (target < 5 us)
  named     CPU time per element of two-component elements read as
            tuples and as dicts (named), runs interleaved, and the
            difference: what a dict element costs over a tuple
  w2        W2 (bench/w2.py's pipeline: TFRecord JPEGs -> fused random
            resized crop 224 -> flip -> batch 64 -> normalize) through
            Python into torch tensors vs `cachew run` (target >= 0.95),
            and vs torch's DataLoader on the same JPEGs with
            --dl-workers worker processes (bench/peers/w2_torch.py; PIL
            and torchvision.io.decode_jpeg: target >= 2.5x the best)
  rss       VmRSS after each of --epochs epochs of W2 through Python
            (target: growth under 5% from the second epoch on)

Usage: /usr/bin/python3 python/bench_binding.py [overhead|named|w2|rss|all]
           [--reps 3] [--images 500] [--epochs 20] [--threads 1]
           [--dl-workers 2] [--dl-decoders pil,tvio]
Run `make python` first; W2's data is made by `cachew gen imagenet` into
bench/data/ (as bench/w2.py does).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.environ.get("CACHEW_BUILD", os.path.join(ROOT, "build"))
CLI = os.path.join(BUILD, "cachew")
sys.path.insert(0, HERE)
import cachew  # noqa: E402

MEAN = "[0.485, 0.456, 0.406]"
STD = "[0.229, 0.224, 0.225]"


def cli_seconds(pipeline, opts):
    args = [CLI, "run", "--json", "--no-digest"]
    for k, v in opts.items():
        args += ["--set", "%s=%s" % (k, v)]
    out = subprocess.run(args + [pipeline], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def py_seconds(pipeline, opts, touch):
    ds = cachew.Dataset.parse(pipeline)
    t0 = time.perf_counter()
    n = 0
    with ds.iterator(**opts) as it:
        for e in it:
            touch(e)
            n += 1
    return time.perf_counter() - t0, n


def summary(xs):
    return "median %.3f (min %.3f, max %.3f)" % (statistics.median(xs), min(xs), max(xs))


def overhead(a):
    n = 32 * 200000
    p = "range(%d) | batch(32)" % n
    opts = {"service": "local", "threads": 1, "seed": 1}
    per = []
    for _ in range(a.reps):
        c = cli_seconds(p, opts)
        s, batches = py_seconds(p, opts, lambda e: e[0])
        per.append((s - c) / batches * 1e6)
        print("  cli %.3f s, python %.3f s, %d batches" % (c, s, batches))
    print("overhead per batch (us): " + summary(per))


def py_cpu_per_element(pipeline, opts, touch):
    """CPU time of the process (all its threads) per element read, in us:
    steadier than wall time on a machine shared with other work."""
    ds = cachew.Dataset.parse(pipeline)
    n = 0
    t0 = time.process_time()
    with ds.iterator(**opts) as it:
        for e in it:
            touch(e)
            n += 1
    return (time.process_time() - t0) / n * 1e6


def named(a):
    """What named components cost per element handed to Python: the same
    two-component elements read as tuples and as dicts, with no batch so
    that the binding's share is large, runs interleaved; the figure is the
    median of the per-pair differences of CPU time."""
    n = 2000000
    opts = {"service": "local", "threads": 1, "seed": 1}
    runs = {"tuple": ("(0, 1)", lambda e: e[1]), "dict": ("{a=0, b=1}", lambda e: e["b"])}
    per = {"tuple": [], "dict": []}
    for _ in range(a.reps):
        for label, (literal, touch) in runs.items():
            p = "from_tensors(%s) | repeat(%d)" % (literal, n)
            per[label].append(py_cpu_per_element(p, opts, touch))
        print("  tuple %.3f us, dict %.3f us CPU per element" % (per["tuple"][-1], per["dict"][-1]))
    for label in runs:
        print("CPU per element, %s (us): %s" % (label, summary(per[label])))
    print("dict minus tuple per element (us): "
          + summary([d - t for d, t in zip(per["dict"], per["tuple"])]))


def w2_data(images):
    d = os.path.join(ROOT, "bench", "data", "w2-%d-s1" % images)
    if not os.path.isdir(d):
        os.makedirs(os.path.dirname(d), exist_ok=True)
        subprocess.run([CLI, "gen", "imagenet", "--out", d, "--images", str(images),
                        "--shards", "4", "--seed", "1"], check=True, capture_output=True)
    return d


def w2_pipeline(d, threads):
    par = ", parallel=%d" % threads if threads > 1 else ""
    return ('tfrecord(files="%s/*.tfrecord") | parse_example(image="image/encoded:bytes", '
            'label="image/class/label:i64") | random_resized_crop(size=224%s) | '
            'flip_left_right | batch(64) | normalize(mean=%s, std=%s, channels_first=true%s)'
            % (d, par, MEAN, STD, par))


def to_torch(e):
    return [t.to_torch() for t in (e.values() if isinstance(e, dict) else e)]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dataloader_seconds(d, images, workers, decoder):
    """torch's DataLoader on the same shards (bench/peers/w2_torch.py),
    its own timing of the epoch."""
    out = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "peers", "w2_torch.py"),
                          "--data", d, "--workers", str(workers), "--batch", "64",
                          "--expect", str(images), "--decoder", decoder],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def w2(a):
    """Wall time and CPU time (user + system of every thread and process
    of a side: the CLI's, this interpreter's, the DataLoader's with its
    workers) per image; on a loaded shared machine the CPU ratio is the
    steadier figure (throughput tends to it when both sides are CPU-bound
    on the same cores)."""
    import torch  # noqa: F401  (imported outside the timed runs)
    d = w2_data(a.images)
    p = w2_pipeline(d, a.threads)
    opts = {"threads": a.threads, "seed": 1}
    decoders = [x for x in a.dl_decoders.split(",") if x]
    ratios, cpu_ratios, py_rates, py_cpu = [], [], [], []
    dl_rates = {x: [] for x in decoders}
    dl_cpu = {x: [] for x in decoders}
    for _ in range(a.reps):
        c0 = children_cpu()
        c = cli_seconds(p, opts)
        cc = children_cpu() - c0
        p0 = time.process_time()
        s, _ = py_seconds(p, opts, to_torch)
        pc = time.process_time() - p0
        ratios.append(c / s)
        cpu_ratios.append(cc / pc)
        py_rates.append(a.images / s)
        py_cpu.append(pc / a.images * 1e3)
        line = ("  cli %.3f s (%.0f img/s, %.2f CPU s), python+torch %.3f s (%.0f img/s, "
                "%.2f CPU s)" % (c, a.images / c, cc, s, a.images / s, pc))
        for x in decoders:
            c0 = children_cpu()
            t = dataloader_seconds(d, a.images, a.dl_workers, x)
            tc = children_cpu() - c0
            dl_rates[x].append(a.images / t)
            dl_cpu[x].append(tc / a.images * 1e3)
            line += ", DataLoader %s %.3f s (%.0f img/s, %.2f CPU s)" % (
                x, t, a.images / t, tc)
        print(line + ", load %s" % open("/proc/loadavg").read().split()[0])
    print("W2 python/cli (threads %d): throughput %s; CPU per image cli/python %s"
          % (a.threads, summary(ratios), summary(cpu_ratios)))
    if not decoders:
        return
    py, pyc = statistics.median(py_rates), statistics.median(py_cpu)
    print("python: %s images/s, %s CPU ms per image" % (summary(py_rates), summary(py_cpu)))
    for x in decoders:
        print("W2 python (threads %d) / DataLoader %s (num_workers=%d): throughput %.2fx, "
              "CPU per image %.2fx (DataLoader %s images/s, %s CPU ms per image)"
              % (a.threads, x, a.dl_workers, py / statistics.median(dl_rates[x]),
                 statistics.median(dl_cpu[x]) / pyc, summary(dl_rates[x]), summary(dl_cpu[x])))
    best = max(decoders, key=lambda x: statistics.median(dl_rates[x]))
    r = py / statistics.median(dl_rates[best])
    print("W2 python / the best DataLoader (%s): %.2fx (target >= 2.5x: %s)"
          % (best, r, "met" if r >= 2.5 else "MISSED"))
    best = min(decoders, key=lambda x: statistics.median(dl_cpu[x]))
    r = statistics.median(dl_cpu[best]) / pyc
    print("W2 CPU per image, the leanest DataLoader (%s) / python: %.2fx" % (best, r))


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss(a):
    d = w2_data(a.images)
    ds = cachew.Dataset.parse(w2_pipeline(d, a.threads))
    seen, rates = [], []
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        with ds.iterator(threads=a.threads, seed=1, epoch=epoch) as it:
            for e in it:
                to_torch(e)
        rates.append(a.images / (time.perf_counter() - t0))
        seen.append(rss_kb())
    print("RSS per epoch (KiB): " + " ".join(str(x) for x in seen))
    print("images/s per epoch: " + summary(rates))
    print("growth from epoch 2 to %d: %.1f%% (largest %.1f%% above epoch 2)"
          % (a.epochs, 100.0 * (seen[-1] - seen[1]) / seen[1],
             100.0 * (max(seen[1:]) - seen[1]) / seen[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="all", choices=["overhead", "named", "w2", "rss", "all"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dl-workers", type=int, default=2)
    ap.add_argument("--dl-decoders", default="pil,tvio",
                    help="DataLoader decoders to run beside w2 (none: empty)")
    a = ap.parse_args()
    for name, fn in (("overhead", overhead), ("named", named), ("w2", w2), ("rss", rss)):
        if a.what in (name, "all"):
            fn(a)


if __name__ == "__main__":
    main()
