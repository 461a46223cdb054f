#!/usr/bin/python3
"""W3 - text: lines -> tokenize (lowercase, split, hash to 2^18 ids) ->
pad/truncate 128 -> batch 256.

cachew: `text_lines | tokenize | pad_truncate(len=128) | batch(256)`
through `cachew run --json`, one thread.
peer: torch.utils.data.DataLoader over an IterableDataset doing the same
in Python (str.lower().split(), zlib.crc32 mod 2^18, pad 0 to 128, int64
tensor), batch_size=256, default collate, num_workers 0
(bench/peers/w3_torch.py). Both read the same `cachew gen text` files.
Unit: documents (lines) per second on both sides.

Usage: /usr/bin/python3 bench/w3.py [--quick] [--reps R]   (or bench/run W3)
"""
import argparse
import glob
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

WID = "W3"
BATCH = 256
LEN = 128
FILES = 4
SIZES = {"full": 1_000_000, "quick": 100_000}
TARGET = 7.0
PEER = os.path.join(h.BENCH_DIR, "peers", "w3_torch.py")


def data_dir(binary, n, seed):
    d = os.path.join(h.BENCH_DIR, "data", f"w3-{n}-s{seed}")
    if len(glob.glob(os.path.join(d, "*.txt"))) == FILES:
        return d
    os.makedirs(os.path.dirname(d), exist_ok=True)
    h.log(f"W3: generating {n} lines into {d}")
    r = subprocess.run([binary, "gen", "text", "--out", d, "--lines", str(n),
                        "--files", str(FILES), "--seed", str(seed)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise h.BenchError(f"cachew gen text failed: {r.stderr.strip()}")
    return d


def pipeline(d):
    return (f'text_lines(files="{d}/*.txt") | tokenize(lowercase=true, '
            f'vocab=262144) | pad_truncate(len={LEN}, pad=0) | '
            f'batch({BATCH})')


def cachew_config(binary, d, n, seed):
    batches = -(-n // BATCH)

    def check(obj):
        if obj.get("elements") != batches or obj.get("bytes") != n * LEN * 8:
            raise h.BenchError(f"cachew: {obj.get('elements')} batches, "
                               f"{obj.get('bytes')} bytes; expected "
                               f"{batches}, {n * LEN * 8} for {n} lines")

    argv = [binary, "run", "--json", "--stats", "--quiet", "--threads", "1",
            "--seed", str(seed), pipeline(d)]
    return h.Config("cachew", "threads 1", 1, argv, n, check=check)


def token_count(binary, d):
    """Words in the files by cachew's tokenizer (untimed)."""
    r = subprocess.run([binary, "run", "--json", "--quiet", "--threads", "1",
                        f'text_lines(files="{d}/*.txt") | tokenize'],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise h.BenchError(f"cachew tokenize: {r.stderr.strip()}")
    obj, _ = h.last_json(r.stdout, "cachew tokenize")
    return obj["bytes"] // 8


def peer_config(d, n, workers, tokens):
    def check(obj):
        if obj.get("documents") != n or obj.get("tokens") != tokens:
            raise h.BenchError(f"DataLoader: {obj.get('documents')} "
                               f"documents, {obj.get('tokens')} words; "
                               f"expected {n}, {tokens} (cachew's count)")

    argv = [h.PEER_PYTHON, PEER, "--data", d, "--workers", str(workers),
            "--batch", str(BATCH), "--len", str(LEN), "--expect", str(n)]
    return h.Config("DataLoader", f"num_workers={workers}", workers, argv, n,
                    check=check)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="100,000 lines, under 60 s, same code paths")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per configuration (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    mode = "quick" if args.quick else "full"
    n = SIZES[mode]

    h.check_tools()
    h.check_peer_python("torch")
    binary = h.cachew_bin()
    info = h.machine_info()
    h.log(f"W3 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {binary}")
    d = data_dir(binary, n, args.seed)
    tokens = token_count(binary, d)

    cw = cachew_config(binary, d, n, args.seed)
    peer0 = peer_config(d, n, 0, tokens)
    configs = [cw, peer0]
    h.run_interleaved(configs, args.reps)
    info["loadavg_end"] = h.loadavg()

    ratio = cw.median() / peer0.median()
    header = ["side", "config", "threads/workers", "median documents/s",
              "min", "max", "peak RSS MiB"]
    rows = h.table_rows(configs)
    ratio_lines = [
        f"cachew threads 1 / DataLoader num_workers=0 = {ratio:.2f}x "
        f"(target >= {TARGET:.0f}x: {'met' if ratio >= TARGET else 'MISSED'})",
        f"both sides split the {n:,} lines into the same {tokens:,} words",
    ]
    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", {
        "workload": WID, "mode": mode, "reps": args.reps, "machine": info,
        "target": TARGET, "ratio": ratio,
        "configs": [{"side": c.side, "label": c.label,
                     "parallelism": c.parallelism, "argv": c.argv,
                     "units": c.units, "runs": c.runs} for c in configs]})
    if mode == "full":
        md = [f"## W3 - text: {n:,} lines -> tokenize -> pad_truncate "
              f"{LEN} -> batch {BATCH}", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each, interleaved; 1-min "
              f"load average {info['loadavg_start']} before, "
              f"{info['loadavg_end']} after; PyTorch "
              f"{peer0.runs[0]['json'].get('torch')} on `{h.PEER_PYTHON}`; "
              "the peer hashes with zlib.crc32 (Python's hash() is "
              "randomized per process), cachew with XXH3-64.", "",
              "```", pipeline("DIR"), "```", "",
              h.md_table(header, rows), ""]
        md += [f"- {line}" for line in ratio_lines]
        h.write_section(WID, "\n".join(md) + "\n")

    print(f"W3 ({mode}, {n} lines, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(header, rows))
    for line in ratio_lines:
        print(line)
    print(f"W3 ratio={ratio:.2f} cachew={cw.median():.0f}documents/s "
          f"peer={peer0.median():.0f}documents/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W3: {e}", file=sys.stderr)
        sys.exit(1)
