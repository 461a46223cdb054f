#!/usr/bin/python3
"""W2 - ImageNet-like: TFRecord shards of JPEGs -> decode -> random resized
crop 224 -> flip -> normalize -> batch 64.

cachew: the in-process iterator through `cachew run --json`, threads 1 and
2. random_resized_crop reads the JPEG bytes itself (the fused path: it
decodes only the crop, DCT-scaled); then flip_left_right, batch(64) of the
u8 crops, then normalize with channels_first=true, which writes the f32
NCHW batch in the same pass: the same f32 [64, 3, 224, 224] batches as the
peer's (normalizing whole batches
rather than single images moves a quarter of the bytes through the batch
copy and allocates one f32 buffer per batch instead of 64).
peer: torch.utils.data.DataLoader + PIL + torchvision (RandomResizedCrop,
RandomHorizontalFlip, ToTensor, Normalize), num_workers 0 and 2, reading
the same TFRecord files with a pure-Python reader (bench/peers/w2_torch.py);
at num_workers 2 also the fastest CPU decoders a PyTorch user would pick:
PIL with Image.draft() (libjpeg's DCT scaling of the crop box, as fast
loaders do) and torchvision.io.decode_jpeg with the same transforms on
tensors. The 2-thread target is against the best of the three.
Memory: peak RSS of the largest process (/usr/bin/time) and the peak
summed PSS of the whole process tree (sampled every 50 ms: a DataLoader's
workers are processes of their own; PSS counts each shared page once).
Each cachew configuration runs twice: as the default (the embedded service,
its worker inline) and with `--set service=local` (the plain executor);
issue 5 wants the default within 5% (ratio >= 0.95).
Also measured: cachew's unfused chain (decode_jpeg, then the crop) and the
raw libjpeg-turbo full-decode rate (`... | decode_jpeg`, one thread), the
"physical" reference for images/s per core.
Unit: images per second on both sides.

Usage: /usr/bin/python3 bench/w2.py [--quick] [--reps R]   (or bench/run W2)
"""
import argparse
import glob
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

WID = "W2"
BATCH = 64
SHARDS = 4
SIZES = {"full": 2000, "quick": 200}
TARGETS = {"seq": 1.5, "par": 2.0}
PEER = os.path.join(h.BENCH_DIR, "peers", "w2_torch.py")
MEAN = "[0.485, 0.456, 0.406]"
STD = "[0.229, 0.224, 0.225]"


def data_dir(binary, n, seed):
    """Generates the shards once (deterministic for the seed) into
    bench/data/w2-<n>-s<seed>/."""
    d = os.path.join(h.BENCH_DIR, "data", f"w2-{n}-s{seed}")
    if len(glob.glob(os.path.join(d, "*.tfrecord"))) == SHARDS:
        return d
    os.makedirs(os.path.dirname(d), exist_ok=True)
    h.log(f"W2: generating {n} images into {d}")
    r = subprocess.run([binary, "gen", "imagenet", "--out", d, "--images",
                        str(n), "--shards", str(SHARDS), "--seed",
                        str(seed)], capture_output=True, text=True)
    if r.returncode != 0:
        raise h.BenchError(f"cachew gen imagenet failed: {r.stderr.strip()}")
    return d


def source(d):
    return (f'tfrecord(files="{d}/*.tfrecord") | parse_example('
            'image="image/encoded:bytes", label="image/class/label:i64")')


def pipeline(d, parallel, fused=True):
    par = f", parallel={parallel}" if parallel > 1 else ""
    crop = (f"random_resized_crop(size=224{par})" if fused else
            f"decode_jpeg(channels=3{par}) | random_resized_crop(size=224{par})")
    return (f"{source(d)} | {crop} | flip_left_right | batch({BATCH}) | "
            f"normalize(mean={MEAN}, std={STD}, channels_first=true{par})")


def cachew_config(binary, d, n, threads, seed, fused=True, label=None,
                  local=False, extra=(), digest=False):
    batches = -(-n // BATCH)
    want_bytes = n * (3 * 224 * 224 * 4 + 8)  # f32 images + i64 labels

    def check(obj):
        if obj.get("elements") != batches or obj.get("bytes") != want_bytes:
            raise h.BenchError(f"cachew {label}: {obj.get('elements')} "
                               f"batches, {obj.get('bytes')} bytes; expected "
                               f"{batches}, {want_bytes} for {n} images")

    label = label or (f"threads {threads}" + ("" if fused else ", unfused")
                      + (", service=local" if local else ""))
    # Timed runs skip the digest (xxh3 of every output byte, 4 % of the
    # CPU time: the peer hashes nothing); verify() asks for it.
    argv = [binary, "run", "--json", "--stats", "--quiet", "--threads",
            str(threads), "--seed", str(seed)] + (
        [] if digest else ["--no-digest"]) + (
        ["--set", "service=local"] if local else []) + list(extra) + [
        pipeline(d, threads, fused)]
    return h.Config("cachew", label, threads, argv, n, check=check, tree=True)


def decode_config(binary, d, n, seed):
    def check(obj):
        if obj.get("elements") != n:
            raise h.BenchError(f"raw decode: {obj.get('elements')} images, "
                               f"expected {n}")

    argv = [binary, "run", "--json", "--quiet", "--no-digest", "--threads",
            "1", "--seed", str(seed), f"{source(d)} | decode_jpeg(channels=3)"]
    return h.Config("libjpeg-turbo", "full decode only", 1, argv, n,
                    check=check)


def peer_config(d, n, workers, decoder="pil"):
    label = f"num_workers={workers}" + (
        "" if decoder == "pil" else f", {decoder}")

    def check(obj):
        if obj.get("images") != n:
            raise h.BenchError(f"DataLoader {label}: "
                               f"{obj.get('images')} images, expected {n}")

    argv = [h.PEER_PYTHON, PEER, "--data", d, "--workers", str(workers),
            "--batch", str(BATCH), "--expect", str(n), "--decoder", decoder]
    return h.Config("DataLoader", label, workers, argv, n, check=check,
                    tree=True)


def verify(binary, d, n, seed):
    """Untimed: cachew gives the same pipeline and the same bytes (the
    digest of every element) at threads 1 and 2."""
    seen = set()
    for threads in (1, 2):
        c = cachew_config(binary, d, n, threads, seed, digest=True)
        c.run()
        obj = c.runs[-1]["json"]
        seen.add((obj.get("fingerprint"), obj.get("digest")))
    if len(seen) != 1 or None in next(iter(seen)):
        raise h.BenchError("cachew: fingerprints or digests differ between "
                           f"threads 1 and 2: {sorted(map(str, seen))}")


def verdict(value, target):
    return "met" if value >= target else "MISSED"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="200 images, under 60 s, same code paths")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per configuration (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    mode = "quick" if args.quick else "full"
    n = SIZES[mode]

    h.check_tools()
    h.check_peer_python("torchvision")
    binary = h.cachew_bin()
    info = h.machine_info()
    h.log(f"W2 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {binary}")
    d = data_dir(binary, n, args.seed)
    verify(binary, d, n, args.seed)

    seq = cachew_config(binary, d, n, 1, args.seed)
    par = cachew_config(binary, d, n, 2, args.seed)
    unfused = cachew_config(binary, d, n, 1, args.seed, fused=False)
    seq_local = cachew_config(binary, d, n, 1, args.seed, local=True)
    par_local = cachew_config(binary, d, n, 2, args.seed, local=True)
    raw = decode_config(binary, d, n, args.seed)
    peer0 = peer_config(d, n, 0)
    peer2 = peer_config(d, n, 2)
    peer2_draft = peer_config(d, n, 2, "pil-draft")
    peer2_tvio = peer_config(d, n, 2, "tvio")
    peers2 = [peer2, peer2_draft, peer2_tvio]
    configs = [seq, seq_local, peer0, par, par_local] + peers2 + [unfused,
                                                                  raw]
    h.run_interleaved(configs, args.reps)
    info["loadavg_end"] = h.loadavg()

    best2 = max(peers2, key=lambda c: c.median())
    seq_ratio = seq.median() / peer0.median()
    par_ratio = par.median() / best2.median()
    header = ["side", "config", "threads/workers", "median images/s", "min",
              "max", "peak RSS MiB", "peak PSS, all processes MiB"]
    rows = [r + ["-" if c.peak_tree_mib() is None
                 else f"{c.peak_tree_mib():.1f}"]
            for r, c in zip(h.table_rows(configs), configs)]
    ratio_lines = [
        f"1 thread: cachew threads 1 / DataLoader num_workers=0 = "
        f"{seq_ratio:.2f}x (target >= {TARGETS['seq']:.1f}x: "
        f"{verdict(seq_ratio, TARGETS['seq'])})",
        f"2 threads: cachew threads 2 / the best DataLoader at "
        f"num_workers=2 ({best2.label}) = {par_ratio:.2f}x (target >= "
        f"{TARGETS['par']:.1f}x: {verdict(par_ratio, TARGETS['par'])}); "
        f"against PIL {par.median() / peer2.median():.2f}x, PIL draft "
        f"{par.median() / peer2_draft.median():.2f}x, "
        f"torchvision.io {par.median() / peer2_tvio.median():.2f}x",
        f"memory at 2 threads: cachew peak RSS {par.peak_rss_mib():.0f} "
        f"MiB vs the DataLoader's largest process "
        f"{min(c.peak_rss_mib() for c in peers2):.0f}-"
        f"{max(c.peak_rss_mib() for c in peers2):.0f} MiB (target <=: "
        f"{'met' if par.peak_rss_mib() <= min(c.peak_rss_mib() for c in peers2) else 'MISSED'}); "
        f"all processes (PSS) {par.peak_tree_mib():.0f} MiB vs "
        f"{min(c.peak_tree_mib() for c in peers2):.0f}-"
        f"{max(c.peak_tree_mib() for c in peers2):.0f} MiB",
        f"fused crop: cachew threads 1 fused / unfused (decode_jpeg, then "
        f"crop) = {seq.median() / unfused.median():.2f}x",
        f"per core: cachew threads 1 {seq.median():.0f} images/s, threads 2 "
        f"{par.median() / 2:.0f} images/s per core; raw libjpeg-turbo full "
        f"decode {raw.median():.0f} images/s on one core: the whole "
        f"pipeline runs at {seq.median() / raw.median():.2f}x the bare "
        f"decode rate",
    ]
    for c, loc in ((seq, seq_local), (par, par_local)):
        r = c.median() / loc.median()
        ratio_lines.append(
            f"{c.label}: the embedded default / the plain executor "
            f"(service=local) = {r:.3f} (target >= 0.95: "
            f"{'met' if r >= 0.95 else 'MISSED'})")
    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", {
        "workload": WID, "mode": mode, "reps": args.reps, "machine": info,
        "targets": TARGETS, "ratios": {
            "seq": seq_ratio, "par": par_ratio, "par_best_peer": best2.label,
            "embedded_seq": seq.median() / seq_local.median(),
            "embedded_par": par.median() / par_local.median()},
        "configs": [{"side": c.side, "label": c.label,
                     "parallelism": c.parallelism, "argv": c.argv,
                     "units": c.units, "runs": c.runs} for c in configs]})

    if mode == "full":
        md = [f"## W2 - ImageNet-like: {n} JPEGs (500x375, ~110 KB) in "
              f"{SHARDS} TFRecord shards -> random resized crop 224 -> flip "
              f"-> normalize -> batch {BATCH}", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each, interleaved; 1-min "
              f"load average {info['loadavg_start']} before, "
              f"{info['loadavg_end']} after; cachew CLI "
              f"`{os.path.relpath(binary, h.REPO_DIR)}`, PyTorch "
              f"{peer0.runs[0]['json'].get('torch')} on `{h.PEER_PYTHON}`; "
              "both sides read the same shards; peak RSS is the largest "
              "process (`/usr/bin/time %M`).", "",
              "cachew pipeline (threads 1 drops the `parallel=2`):", "", "```", pipeline("DIR", 2), "```", "",
              h.md_table(header, rows), ""]
        md += [f"- {line}" for line in ratio_lines]
        for c in (seq, par):
            out = c.median_run()["output"]
            if out:
                md += ["", f"<details><summary>cachew {c.label}: "
                       "<code>cachew run --stats</code> of the median "
                       "rep</summary>", "", "```", out, "```", "",
                       "</details>"]
        h.write_section(WID, "\n".join(md) + "\n")

    print(f"W2 ({mode}, {n} images, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(header, rows))
    for line in ratio_lines:
        print(line)
    print(f"W2 ratio={par_ratio:.2f} cachew={par.median():.0f}images/s "
          f"peer={best2.median():.0f}images/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W2: {e}", file=sys.stderr)
        sys.exit(1)
