#!/usr/bin/python3
"""W4 - the second epoch of W2 read from the cache (uint8 crops).

Epoch 1 (untimed set-up) runs W2's pipeline with a cache point right after
the crop, where the elements are still u8 [224, 224, 3] (a quarter of the
f32 bytes):
    tfrecord | parse_example | random_resized_crop(224) | cache_put(ROOT)
      | flip_left_right | batch(64) | normalize(channels_first=true)
cachew (timed): the second epoch reads the cache instead of decoding,
    cache_get(ROOT, FP) | flip_left_right
      | normalize(mean, std, channels_first=true) | batch(64)
in-process (`cachew run --json`), threads 1 and 2, plus the same epoch
through `cache(ROOT)` placed after the crop (tf.data's semantics: the
input is not started when the cache is complete).
peer: torch.utils.data.DataLoader over the same number of pre-decoded
uint8 224x224x3 crops stored as .npy files, one file per image
(bench/peers/w4_torch.py; the crops are made once, untimed, by PIL +
torchvision RandomResizedCrop from the same JPEGs), RandomHorizontalFlip
+ float/255 + Normalize in torch, batch 64, num_workers 0 and 2; plus one
row with the crops in one memory-mapped .npy per 500 images.
Unit: images per second on both sides.

Also measured:
- the cache's read rate against the storage's raw sequential read rate on
  the same files: `cat` of the chunk files to /dev/null vs `cachew run
  cache_get(ROOT, FP)` alone (2 threads), in MB/s of chunk-file bytes,
  warm (the files in the page cache) and cold (each run starts after
  posix_fadvise(DONTNEED) dropped the chunk files' pages: only these
  files, not the whole page cache other processes share); target: at
  least 0.8 of `cat` both ways. What the rate times: cat's whole process
  (about a millisecond of it exec and exit), cachew's read from iterator
  creation to destruction (its --json "seconds"), both over one pass of
  the files; cat is one stream, cachew two reader threads. Beside it:
  the same warm read over 1.2 GB or more (the files several times over
  in one process: cat of the list repeated, cachew --epochs K), where
  fixed costs do not weigh; the whole processes' rates (cachew's
  start-up counted too); and the CPU time per 100 MB of both;
- the cost of writing: W2's epoch (2 threads, and 1) with and without
  cache_put after the crop, a fresh cache root for every repetition
  (target: at most 15% slower).

Usage: /usr/bin/python3 bench/w4.py [--quick] [--reps R]   (or bench/run W4)
       /usr/bin/python3 bench/w4.py --raw-read DIR [--passes K]   (internal:
           times cat)
       /usr/bin/python3 bench/w4.py --timed CACHEW_ARGV...   (internal:
           adds the process's wall and CPU time to cachew run's JSON)
"""
import argparse
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import w2  # noqa: E402  (W2's data, source and constants)

WID = "W4"
BATCH = w2.BATCH
SIZES = w2.SIZES
TARGETS = {"par": 4.0, "put_overhead": 0.15, "read_fraction": 0.8}
# Bytes the steady-state read row reads (the cache's files several times
# over): at 301 MB in 47 ms, one pass of `cat` is short enough for fixed
# costs (exec, thread start, the first page faults) to weigh.
COLD_PER_REP = 3  # cold runs of each side per rep (storage_configs)
STEADY_BYTES = 1_200_000_000
PEER = os.path.join(h.BENCH_DIR, "peers", "w4_torch.py")
MEAN, STD = w2.MEAN, w2.STD


def crop(d, parallel):
    par = f", parallel={parallel}" if parallel > 1 else ""
    return f"{w2.source(d)} | random_resized_crop(size=224{par})"


def w2_tail(parallel):
    """W2's stages after the crop: batch, then normalize whole batches
    (what suits a decode-bound epoch; bench/w2.py says why)."""
    par = f", parallel={parallel}" if parallel > 1 else ""
    return (f"flip_left_right | batch({BATCH}) | normalize(mean={MEAN}, "
            f"std={STD}, channels_first=true{par})")


def tail(parallel):
    """The read epoch's stages: flip, normalize each crop, batch. Same
    f32 [64, 3, 224, 224] batches as W2's order; without decoding, the
    38.5 MB f32 output of a whole-batch normalize (fresh pages every
    batch) costs more than batching normalized crops (measured: 0.60 s
    vs 1.0 s for 2000 crops at 2 threads)."""
    par = f", parallel={parallel}" if parallel > 1 else ""
    return (f"flip_left_right | normalize(mean={MEAN}, std={STD}, "
            f"channels_first=true{par}) | batch({BATCH})")


def epoch1(d, root, parallel):
    return (f'{crop(d, parallel)} | cache_put("{root}") | '
            f"{w2_tail(parallel)}")


def epoch2(root, fp, parallel):
    return f'cache_get("{root}", "{fp}") | {tail(parallel)}'


def epoch2_cache(d, root, parallel):
    return f'{crop(d, parallel)} | cache("{root}") | {tail(parallel)}'


def cli_json(argv, what):
    r = subprocess.run(argv, capture_output=True, text=True, cwd=h.REPO_DIR)
    if r.returncode != 0:
        raise h.BenchError(f"{what}: exit {r.returncode}: {r.stderr.strip()}")
    return h.last_json(r.stdout, what)[0]


def fill_cache(binary, d, root, n, seed):
    """Epoch 1: writes the cache; returns (fingerprint, manifest entry,
    seconds)."""
    shutil.rmtree(root, ignore_errors=True)
    obj = cli_json([binary, "run", "--json", "--quiet", "--threads", "2",
                    "--seed", str(seed), epoch1(d, root, 2)], "epoch 1")
    r = subprocess.run([binary, "cache", "ls", root, "--json"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise h.BenchError(f"cachew cache ls: {r.stderr.strip()}")
    caches = [c for c in json.loads(r.stdout) if c["state"] == "complete"]
    if len(caches) != 1 or caches[0]["elements"] != n:
        raise h.BenchError(f"epoch 1 left {r.stdout.strip()}; expected one "
                           f"complete cache of {n} crops")
    return caches[0]["fingerprint"], caches[0], float(obj["seconds"])


def verify(binary, d, root, fp, seed):
    """Untimed: the cache holds exactly the crops (same digest, which is
    order-independent, as recomputing them with the same seed)."""
    a = cli_json([binary, "run", "--json", "--quiet", "--threads", "2",
                  "--seed", str(seed), f'cache_get("{root}", "{fp}")'],
                 "cache_get digest")
    b = cli_json([binary, "run", "--json", "--quiet", "--threads", "2",
                  "--seed", str(seed), crop(d, 2)], "crop digest")
    if a.get("digest") != b.get("digest") or a.get("elements") != \
            b.get("elements"):
        raise h.BenchError(f"cache_get yields {a.get('elements')} elements "
                           f"digest {a.get('digest')}; recomputing gives "
                           f"{b.get('elements')} digest {b.get('digest')}")


def batch_check(label, n):
    batches = -(-n // BATCH)
    want_bytes = n * (3 * 224 * 224 * 4 + 8)  # f32 images + i64 labels

    def check(obj):
        if obj.get("elements") != batches or obj.get("bytes") != want_bytes:
            raise h.BenchError(f"cachew {label}: {obj.get('elements')} "
                               f"batches, {obj.get('bytes')} bytes; expected "
                               f"{batches}, {want_bytes} for {n} images")
    return check


def cachew_config(binary, pipeline, n, threads, seed, label):
    argv = [binary, "run", "--json", "--stats", "--quiet", "--no-digest",
            "--threads", str(threads), "--seed", str(seed), pipeline]
    return h.Config("cachew", label, threads, argv, n,
                    check=batch_check(label, n))


class FreshRootConfig(h.Config):
    """A config whose run starts with an empty cache root, so cache_put
    writes every repetition."""

    def __init__(self, root, *a, **kw):
        super().__init__(*a, **kw)
        self.root = root

    def run(self):
        shutil.rmtree(self.root, ignore_errors=True)
        try:
            return super().run()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def put_configs(binary, d, n, threads, seed, root):
    plain = w2.cachew_config(binary, d, n, threads, seed,
                             label=f"W2 epoch, threads {threads}")
    argv = [binary, "run", "--json", "--stats", "--quiet", "--threads",
            str(threads), "--seed", str(seed), epoch1(d, root, threads)]
    label = f"W2 epoch + cache_put, threads {threads}"
    put = FreshRootConfig(root, "cachew", label, threads, argv, n,
                          check=batch_check(label, n))
    return plain, put


def peer_config(npy, n, workers, layout="image"):
    def check(obj):
        if obj.get("images") != n:
            raise h.BenchError(f"DataLoader workers {workers}: "
                               f"{obj.get('images')} images, expected {n}")

    argv = [h.PEER_PYTHON, PEER, "--npy", npy, "--layout", layout,
            "--workers", str(workers), "--batch", str(BATCH), "--expect",
            str(n)]
    label = f"num_workers={workers}" + ("" if layout == "image" else
                                         ", mmap shards")
    return h.Config("DataLoader", label, workers, argv, n, check=check)


def npy_dir(d, n, seed):
    out = os.path.join(h.BENCH_DIR, "data", f"w4-npy-{n}-s{seed}")
    if os.path.exists(os.path.join(out, "labels.npy")):
        return out
    shutil.rmtree(out + ".tmp", ignore_errors=True)
    h.log(f"W4: writing {n} uint8 crops as .npy into {out}")
    cli_json([h.PEER_PYTHON, PEER, "--prepare", "--data", d, "--npy", out],
             "w4_torch --prepare")
    return out


def chunk_files(directory):
    """The chunk files of a cache directory (docs/cache-format.md)."""
    return sorted(glob.glob(os.path.join(directory, "chunk-*.cwc")))


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def raw_read(directory, passes):
    """--raw-read: `cat` of a cache's chunk files to /dev/null, `passes`
    times over in one process; prints {"seconds", "process_seconds",
    "cpu_seconds", "bytes"} (for cat the process is the read)."""
    files = chunk_files(directory)
    nbytes = sum(os.path.getsize(f) for f in files)
    cpu0, t0 = child_cpu(), time.perf_counter()
    subprocess.run(["cat"] + files * passes, stdout=subprocess.DEVNULL,
                   check=True)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "process_seconds": seconds,
                      "cpu_seconds": child_cpu() - cpu0,
                      "bytes": nbytes * passes}))
    return 0


def timed(argv):
    """--timed: runs a `cachew run --json` command; prints its JSON with
    the whole process's wall time (exec, start-up and exit included, as
    `cat`'s figure has them) and CPU time added."""
    cpu0, t0 = child_cpu(), time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr, end="")
        return r.returncode
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    obj.update(process_seconds=wall, cpu_seconds=child_cpu() - cpu0)
    print(json.dumps(obj))
    return 0


def drop_pages(files):
    """Evicts the files' pages from the page cache (clean pages of files
    nobody maps go; other files' pages stay)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class ColdConfig(h.Config):
    """A config whose every run starts with the given files out of the
    page cache."""

    def __init__(self, files, *a, **kw):
        super().__init__(*a, **kw)
        self.files = files

    def run(self):
        drop_pages(self.files)
        return super().run()


def storage_configs(binary, root, fp, entry, n, seed):
    """All in MB of chunk files per second: raw cat, and cachew reading
    and verifying them (no flip/normalize), warm then cold, one pass;
    then warm over STEADY_BYTES or more (the files read several times in
    one process: cat of the list repeated, cachew --epochs), where fixed
    costs no longer count. The rate is over the read itself: cat's
    process (exec and exit included, about a millisecond), cachew's
    iterator from creation to destruction (its --json "seconds": the
    process's start-up, a few ms of dynamic linking, is left out); each
    run also records the whole process's wall and CPU time."""
    nbytes = sum(os.path.getsize(f)
                 for f in chunk_files(os.path.join(root, fp)))
    mb = nbytes / 1e6
    passes = max(1, min(64, -(-STEADY_BYTES // nbytes)))
    me = [sys.executable, os.path.abspath(__file__)]

    def counted(what, key, want):
        """A check that obj[key] is want: the bytes cat read, the crops
        cache_get yielded."""
        def check(obj):
            if obj.get(key) != want:
                raise h.BenchError(f"{what}: {obj.get(key)} {key}, "
                                   f"expected {want}")
        return check

    def check_raw(k):
        return counted("cat of the chunk files", "bytes", nbytes * k)

    def check_read(k):
        return counted("cache_get", "elements", n * k)

    def cat_argv(k):
        return me + ["--raw-read", os.path.join(root, fp), "--passes",
                     str(k)]

    def get_argv(k):
        return me + ["--timed", binary, "run", "--json", "--quiet",
                     "--no-digest", "--threads", "2", "--seed", str(seed),
                     "--epochs", str(k), f'cache_get("{root}", "{fp}")']

    raw = h.Config("cat", "chunk files -> /dev/null", 1, cat_argv(1), mb,
                   check=check_raw(1))
    read = h.Config("cachew", "cache_get alone (read + verify)", 2,
                    get_argv(1), mb, check=check_read(1))
    files = chunk_files(os.path.join(root, fp))
    raw_cold = ColdConfig(files, "cat", "chunk files -> /dev/null, cold", 1,
                          raw.argv, mb, check=check_raw(1))
    read_cold = ColdConfig(files, "cachew", "cache_get alone, cold", 2,
                           read.argv, mb, check=check_read(1))
    raw_k = h.Config("cat", f"the files {passes} times over", 1,
                     cat_argv(passes), mb * passes, check=check_raw(passes))
    read_k = h.Config("cachew", f"cache_get --epochs {passes}", 2,
                      get_argv(passes), mb * passes,
                      check=check_read(passes))
    return raw, read, raw_cold, read_cold, raw_k, read_k


def process_figures(cfg):
    """Medians of the whole process: MB/s over its wall time, and CPU ms
    per 100 MB."""
    runs = cfg.runs
    rate = statistics.median(cfg.units / r["json"]["process_seconds"]
                             for r in runs)
    cpu = statistics.median(r["json"]["cpu_seconds"] * 1e3 * 100 /
                            cfg.units for r in runs)
    return rate, cpu


def verdict(ok):
    return "met" if ok else "MISSED"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="200 images, under 60 s, same code paths")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per configuration (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--raw-read", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    if len(sys.argv) > 2 and sys.argv[1] == "--timed":
        return timed(sys.argv[2:])
    args = ap.parse_args()
    if args.raw_read:
        return raw_read(args.raw_read, args.passes)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    mode = "quick" if args.quick else "full"
    n = SIZES[mode]

    h.check_tools()
    h.check_peer_python("torchvision")
    binary = h.cachew_bin()
    info = h.machine_info()
    h.log(f"W4 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {binary}")
    d = w2.data_dir(binary, n, args.seed)
    root = os.path.join(h.BENCH_DIR, "data", f"w4-cache-{n}-s{args.seed}")
    put_root = root + "-put"
    fp, entry, fill_s = fill_cache(binary, d, root, n, args.seed)
    verify(binary, d, root, fp, args.seed)
    npy = npy_dir(d, n, args.seed)

    seq = cachew_config(binary, epoch2(root, fp, 1), n, 1, args.seed,
                        "cache_get, threads 1")
    par = cachew_config(binary, epoch2(root, fp, 2), n, 2, args.seed,
                        "cache_get, threads 2")
    via = cachew_config(binary, epoch2_cache(d, root, 2), n, 2, args.seed,
                        "cache(root) reading, threads 2")
    peer0 = peer_config(npy, n, 0)
    peer2 = peer_config(npy, n, 2)
    peer2s = peer_config(npy, n, 2, layout="shard")
    raw, read, raw_cold, read_cold, raw_k, read_k = storage_configs(
        binary, root, fp, entry, n, args.seed)
    plain2, put2 = put_configs(binary, d, n, 2, args.seed, put_root)
    configs = [seq, peer0, par, peer2, via, peer2s]
    costs = [plain2, put2]
    if mode == "full":
        plain1, put1 = put_configs(binary, d, n, 1, args.seed, put_root)
        costs += [plain1, put1]
    # The cold pair runs COLD_PER_REP times a rep: on this kind of disk
    # cat's own cold rate swings 4x between runs (311-1,709 MB/s in one
    # run), so three samples of each say little.
    storage = [raw, read, raw_cold, read_cold, raw_k, read_k]
    runs = ([raw, read] + [raw_cold, read_cold] * COLD_PER_REP +
            [raw_k, read_k])
    h.run_interleaved(configs + runs + costs, args.reps)
    info["loadavg_end"] = h.loadavg()

    seq_ratio = seq.median() / peer0.median()
    par_ratio = par.median() / peer2.median()
    shard_ratio = par.median() / peer2s.median()
    read_frac = read.median() / raw.median()
    cold_frac = read_cold.median() / raw_cold.median()
    steady_frac = read_k.median() / raw_k.median()
    proc_read, cpu_read = process_figures(read)
    proc_raw, cpu_raw = process_figures(raw)
    overhead = {}
    for i in range(0, len(costs), 2):
        plain, put = costs[i], costs[i + 1]
        overhead[plain.parallelism] = plain.median() / put.median() - 1.0
    header = ["side", "config", "threads/workers", "median images/s", "min",
              "max", "peak RSS MiB"]
    rows = h.table_rows(configs)
    sheader = ["side", "config", "threads", "median MB/s", "min", "max",
               "peak RSS MiB"]
    srows = h.table_rows(storage)
    crows = h.table_rows(costs)
    ratio_lines = [
        f"1 thread: cachew cache_get threads 1 / DataLoader num_workers=0 "
        f"= {seq_ratio:.2f}x",
        f"2 threads: cachew cache_get threads 2 / DataLoader "
        f"num_workers=2 = {par_ratio:.2f}x (target >= "
        f"{TARGETS['par']:.1f}x: {verdict(par_ratio >= TARGETS['par'])}); "
        f"against mmap'd shard .npy files {shard_ratio:.2f}x",
        f"cache(root) reading / cache_get, threads 2: "
        f"{via.median() / par.median():.2f}x",
        f"read rate: cachew reads and verifies the chunk files at "
        f"{read.median():.0f} MB/s = {read_frac:.2f} of `cat` on the same "
        f"files ({raw.median():.0f} MB/s, page cache warm; target >= "
        f"{TARGETS['read_fraction']:.1f}: "
        f"{verdict(read_frac >= TARGETS['read_fraction'])}); cold: "
        f"{read_cold.median():.0f} MB/s = {cold_frac:.2f} of `cat`'s "
        f"{raw_cold.median():.0f} MB/s "
        f"({verdict(cold_frac >= TARGETS['read_fraction'])}; "
        f"{len(raw_cold.rates())} runs each, cat {min(raw_cold.rates()):.0f}"
        f"-{max(raw_cold.rates()):.0f}, cachew "
        f"{min(read_cold.rates()):.0f}-{max(read_cold.rates()):.0f} MB/s); "
        f"warm over "
        f"{raw_k.units:.0f} MB (the files {raw_k.units / raw.units:.0f} "
        f"times over, in one process each): {steady_frac:.2f} of `cat`; "
        f"whole processes (cachew's start-up and exit counted, as cat's "
        f"are), one warm pass: {proc_read / proc_raw:.2f} of `cat`; CPU "
        f"time per 100 MB: cachew {cpu_read:.1f} ms (2 threads), cat "
        f"{cpu_raw:.1f} ms (1); the cache is "
        f"{entry['bytes'] / 1e6:.1f} MB for {n * 224 * 224 * 3 / 1e6:.1f} MB "
        f"of u8 crops ({entry['bytes'] / (n * 224 * 224 * 3):.2f}x)",
    ] + [
        f"writing: W2 epoch with cache_put, threads {t}, is "
        f"{o * 100:.1f}% slower than without (target <= "
        f"{TARGETS['put_overhead'] * 100:.0f}%: "
        f"{verdict(o <= TARGETS['put_overhead'])})"
        for t, o in sorted(overhead.items(), reverse=True)
    ] + [f"epoch 1 (fill, threads 2, untimed set-up): {fill_s:.2f} s"]
    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", {
        "workload": WID, "mode": mode, "reps": args.reps, "machine": info,
        "targets": TARGETS, "cache": entry, "fill_seconds": fill_s,
        "ratios": {"seq": seq_ratio, "par": par_ratio, "shard": shard_ratio,
                   "read_fraction": read_frac,
                   "read_fraction_cold": cold_frac,
                   "read_fraction_steady": steady_frac,
                   "read_fraction_process": proc_read / proc_raw,
                   "read_cpu_ms_per_100mb": {"cachew": cpu_read,
                                             "cat": cpu_raw},
                   "put_overhead": {str(k): v for k, v in overhead.items()}},
        "configs": [{"side": c.side, "label": c.label,
                     "parallelism": c.parallelism, "argv": c.argv,
                     "units": c.units, "runs": c.runs}
                    for c in configs + storage + costs]})

    if mode == "full":
        md = [f"## W4 - second epoch of W2 from the cache: {n} u8 224x224x3 "
              f"crops, chunk files -> flip -> normalize -> batch {BATCH}", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each, interleaved; 1-min "
              f"load average {info['loadavg_start']} before, "
              f"{info['loadavg_end']} after; cachew CLI "
              f"`{os.path.relpath(binary, h.REPO_DIR)}`, PyTorch "
              f"{peer0.runs[0]['json'].get('torch')} on `{h.PEER_PYTHON}`; "
              "the peer reads one .npy per crop (same count and shape); "
              "peak RSS is the largest process (`/usr/bin/time %M`).", "",
              "cachew epoch 1 (fills the cache) and epoch 2 (timed; "
              "threads 1 drops the `parallel=2`):", "", "```",
              epoch1("DIR", "ROOT", 2), epoch2("ROOT", "FP", 2), "```", "",
              h.md_table(header, rows), "",
              "Storage (MB/s of chunk-file bytes; warm: in the page "
              "cache, cold: the chunk files' pages dropped before each "
              "run):", "",
              h.md_table(sheader, srows), "",
              "Cost of writing the cache during W2's epoch (images/s):", "",
              h.md_table(header, crows), ""]
        md += [f"- {line}" for line in ratio_lines]
        h.write_section(WID, "\n".join(md) + "\n")

    print(f"W4 ({mode}, {n} images, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(header, rows))
    print()
    print(h.text_table(sheader, srows))
    print()
    print(h.text_table(header, crows))
    for line in ratio_lines:
        print(line)
    print(f"W4 ratio={par_ratio:.2f} cachew={par.median():.0f}images/s "
          f"peer={peer2.median():.0f}images/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W4: {e}", file=sys.stderr)
        sys.exit(1)
