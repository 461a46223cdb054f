#!/usr/bin/python3
"""malloc tuning in a multi-threaded host (issue 18 item 6): a PyTorch
training step beside a cachew iterator through the Python binding, with
and without glibc's malloc tuned (one arena, 64 MiB mmap and trim
thresholds: CACHEW_MALLOPT=1 or 0 in the trainer's environment).

The trainer (this file run with --trainer) reads W2's pipeline at
--size pixels (tfrecord JPEGs -> fused random resized crop -> flip ->
batch -> normalize to f32 NCHW) from a cachew service: a dispatcher and
one worker (`cachewd`, --threads 1, tcp://127.0.0.1, started here and
stopped by pid, with the daemons' own default), so the trainer opens nng
sockets, which is where the library tuned malloc for the whole process.
Each step: next batch through the binding (DLPack into torch, no copy),
then a torchvision model's forward, backward and an SGD step on CPU
(--model: mobilenet_v3_small by default, many small tensors; resnet18
fewer and larger) with --torch-threads intra-op threads. The first
--warmup steps are not timed. At 2 torch threads on this shared 2-core
machine, at a load of 8-10, a step of mobilenet_v3_small took 7-17 s
against 0.5-2.5 s at 1 thread with no cachew at all: torch's OpenMP
barriers spin-wait on descheduled threads. So the default is 1 torch
thread; the process still has cachew's threads (nng's I/O threads, the
client's fetch thread) beside the trainer's.

Reported per mode (median, min, max over --reps runs, interleaved): step
time (data wait + compute), the share of it spent waiting for data,
images/s, the trainer's peak RSS (VmHWM) and its RSS at the end.

Usage: /usr/bin/python3 bench/trainer_host.py [--reps 3] [--steps 20]
           [--warmup 3] [--batch 32] [--size 128] [--images 500]
           [--model mobilenet_v3_small|resnet18] [--torch-threads 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
MODES = (("untuned", "0"), ("tuned", "1"))


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def trainer(a):
    """One run in this process: prints a JSON line."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import torchvision
    import cachew

    torch.set_num_threads(a.torch_threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    ds = (cachew.tfrecord(os.path.join(a.data, "*.tfrecord"))
          .parse_example(image="image/encoded:bytes", label="image/class/label:i64")
          .random_resized_crop(size=a.size)
          .flip_left_right()
          .batch(a.batch, drop_remainder=True)
          .normalize(mean=MEAN, std=STD, channels_first=True)
          .repeat())
    steps, waits = [], []
    with ds.iterator(seed=1) as it:
        for i in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            e = next(it)
            images = e["image"].to_torch()
            labels = e["label"].to_torch() % 1000
            t1 = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            opt.step()
            del images, labels, e
            t2 = time.perf_counter()
            if i >= a.warmup:
                steps.append(t2 - t0)
                waits.append(t1 - t0)
    print(json.dumps({"step_s": statistics.median(steps),
                      "wait_share": sum(waits) / sum(steps),
                      "images_per_s": a.batch * len(steps) / sum(steps),
                      "hwm_kib": status_kib("VmHWM"), "rss_kib": status_kib("VmRSS")}))
    return 0


def summary(xs, fmt):
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(xs), min(xs), max(xs))


def driver(a):
    import harness as h
    import w2
    import w5

    cachew_bin = h.cachew_bin()
    cachewd = w5.cachewd_bin(cachew_bin)
    data = w2.data_dir(cachew_bin, a.images, 1)
    runs = {m: [] for m, _ in MODES}
    info = h.machine_info()
    h.log("trainer host: %s batch %d at %dx%d, %d steps (+%d warmup), "
          "load %s" % (a.model, a.batch, a.size, a.size, a.steps, a.warmup,
                       info["loadavg_start"]))
    with w5.Service(cachewd, "tcp", workers=1, threads=1) as svc:
        for rep in range(a.reps):
            for mode, value in MODES:
                env = dict(svc.client_env(), CACHEW_MALLOPT=value)
                argv = [sys.executable, os.path.abspath(__file__), "--trainer",
                        "--data", data] + [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in
                                           ("steps", "warmup", "batch", "size",
                                            "model", "torch_threads")]
                out = subprocess.run(argv, env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise h.BenchError("trainer %s: exit %d\n%s" % (
                        mode, out.returncode, out.stderr[-2000:]))
                r = json.loads(out.stdout.strip().splitlines()[-1])
                runs[mode].append(r)
                h.log("  rep %d/%d %-8s step %.3f s, wait %.0f%%, %.1f images/s, "
                      "peak RSS %.0f MiB, end %.0f MiB, load %s" % (
                          rep + 1, a.reps, mode, r["step_s"], 100 * r["wait_share"],
                          r["images_per_s"], r["hwm_kib"] / 1024, r["rss_kib"] / 1024,
                          h.loadavg()))
    print("trainer host (%s, commit %s, load %s -> %s): %s, batch %d at %dx%d, "
          "torch threads %d, service 1 worker x 1 thread over tcp" % (
              info["date"], info["commit"], info["loadavg_start"], h.loadavg(),
              a.model, a.batch, a.size, a.size, a.torch_threads))
    print("mode      step s (min-max)  data wait % (min-max)  images/s (min-max)  "
          "peak RSS MiB (min-max)  end RSS MiB (min-max)")
    for mode, _ in MODES:
        v = runs[mode]
        print("%-8s  %s  %s  %s  %s  %s" % (
            mode, summary([r["step_s"] for r in v], "%.3f"),
            summary([100 * r["wait_share"] for r in v], "%.0f"),
            summary([r["images_per_s"] for r in v], "%.1f"),
            summary([r["hwm_kib"] / 1024 for r in v], "%.0f"),
            summary([r["rss_kib"] / 1024 for r in v], "%.0f")))
    tuned = statistics.median(r["step_s"] for r in runs["tuned"])
    untuned = statistics.median(r["step_s"] for r in runs["untuned"])
    print("step time tuned / untuned = %.3f" % (tuned / untuned))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--model", default="mobilenet_v3_small",
                    choices=["mobilenet_v3_small", "resnet18"])
    ap.add_argument("--torch-threads", type=int, default=1)
    a = ap.parse_args()
    if a.trainer:
        return trainer(a)
    sys.path.insert(0, HERE)
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
