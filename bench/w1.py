#!/usr/bin/python3
"""W1 - per-element overhead: range(N) | map(add 1) | batch(64).

cachew: the in-process iterator through `cachew run --json`, threads 1
(sequential map) and threads 2 (map parallel=2): the default, which is the
embedded service (a dispatcher and an inline worker in the process), and
`--set service=local` (the plain executor alone); issue 5 wants the
default within 5% of the plain executor (ratio >= 0.95).
peer: torch.utils.data.DataLoader over an IterableDataset yielding x + 1,
batch_size 64, default collate, num_workers 0 and 2 (bench/peers/w1_torch.py).
Unit: input elements (N) per second on both sides.

Usage: /usr/bin/python3 bench/w1.py [--quick] [--reps R]   (or bench/run W1)
"""
import argparse
import os
import sys

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

WID = "W1"
BATCH = 64
# N per configuration. Full: cachew on 20M elements; the peer on sizes that
# take ~5-10 s a run (its rate does not depend on N once warm, and
# num_workers=2 is ~30x slower than num_workers=0 on this workload).
SIZES = {
    "full": {"cachew": 20_000_000, "peer0": 20_000_000, "peer2": 1_000_000},
    "quick": {"cachew": 5_000_000, "peer0": 1_000_000, "peer2": 200_000},
}
VERIFY_N = 100_003  # not a multiple of 64 nor of 2: exercises the tails
TARGETS = {"seq": 10.0, "par": 30.0, "rss_mib": 64.0}
PEER = os.path.join(h.BENCH_DIR, "peers", "w1_torch.py")


def pipeline(n, parallel):
    if parallel > 1:
        return f"range({n}) | map(add, value=1, parallel={parallel}) | batch({BATCH})"
    return f"range({n}) | map(add, value=1) | batch({BATCH})"


def cachew_config(binary, n, threads, seed, local=False):
    batches = -(-n // BATCH)

    def check(obj):
        if obj.get("elements") != batches:
            raise h.BenchError(f"cachew threads {threads}: {obj.get('elements')}"
                               f" batches, expected {batches} for N={n}")
        if obj.get("bytes") != 8 * n:  # N int64 values
            raise h.BenchError(f"cachew threads {threads}: {obj.get('bytes')}"
                               f" bytes, expected {8 * n} for N={n}")

    label = "map sequential" if threads == 1 else f"map parallel={threads}"
    if local:
        label += ", service=local"
    # --stats only prints the counters the iterator always keeps.
    argv = [binary, "run", "--json", "--stats", "--quiet",
            "--threads", str(threads),
            "--seed", str(seed)] + (["--set", "service=local"] if local
                                    else []) + [pipeline(n, threads)]
    return h.Config("cachew", label, threads, argv, n, check=check)


def peer_config(n, workers, verify=False):
    def check(obj):
        if obj.get("elements") != n:
            raise h.BenchError(f"DataLoader workers {workers}: "
                               f"{obj.get('elements')} elements, expected {n}")

    argv = [h.PEER_PYTHON, PEER, "--n", str(n), "--workers", str(workers),
            "--batch", str(BATCH)] + (["--verify"] if verify else [])
    return h.Config("DataLoader", f"num_workers={workers}", workers, argv, n,
                    check=check)


def verify(binary, seed):
    """Untimed correctness runs: the peer's count and sum, and cachew's
    batch count and equal fingerprints at threads 1 and 2."""
    for workers in (0, 2):
        c = peer_config(VERIFY_N, workers, verify=True)
        c.run()
        want = VERIFY_N * (VERIFY_N + 1) // 2
        got = c.runs[-1]["json"].get("checksum")
        if got != want:
            raise h.BenchError(f"DataLoader workers {workers}: sum {got}, "
                               f"expected {want}")
    fps = set()
    for threads in (1, 2):
        c = cachew_config(binary, VERIFY_N, threads, seed)
        c.run()
        fps.add(c.runs[-1]["json"].get("fingerprint"))
    if len(fps) != 1:
        raise h.BenchError(f"cachew: fingerprints differ between threads 1 "
                           f"and 2: {sorted(map(str, fps))}")


def verdict(value, target, higher=True):
    ok = value >= target if higher else value < target
    return "met" if ok else "MISSED"


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
    sizes = SIZES[mode]

    h.check_tools()
    h.check_peer_python("torch")
    binary = h.cachew_bin()
    info = h.machine_info()
    h.log(f"W1 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {binary}")
    verify(binary, args.seed)

    seq = cachew_config(binary, sizes["cachew"], 1, args.seed)
    par = cachew_config(binary, sizes["cachew"], 2, args.seed)
    seq_local = cachew_config(binary, sizes["cachew"], 1, args.seed, True)
    par_local = cachew_config(binary, sizes["cachew"], 2, args.seed, True)
    peer0 = peer_config(sizes["peer0"], 0)
    peer2 = peer_config(sizes["peer2"], 2)
    configs = [seq, seq_local, peer0, par, par_local, peer2]
    h.run_interleaved(configs, args.reps)
    info["loadavg_end"] = h.loadavg()

    seq_ratio = seq.median() / peer0.median()
    par_ratio = par.median() / peer2.median()
    rss = max(seq.peak_rss_mib(), par.peak_rss_mib())

    header = ["side", "config", "threads/workers", "N",
              "median elements/s", "min", "max", "peak RSS MiB"]
    rows = h.table_rows(configs)
    for row, c in zip(rows, configs):
        row.insert(3, h.fmt_int(c.units))
    ratio_lines = [
        f"sequential: cachew threads 1 / DataLoader num_workers=0 = "
        f"{seq_ratio:.2f}x (target >= {TARGETS['seq']:.0f}x: "
        f"{verdict(seq_ratio, TARGETS['seq'])})",
        f"parallel: cachew threads 2 (parallel=2) / DataLoader "
        f"num_workers=2 = {par_ratio:.2f}x (target >= {TARGETS['par']:.0f}x: "
        f"{verdict(par_ratio, TARGETS['par'])})",
        f"cachew peak RSS: {rss:.1f} MiB (target < {TARGETS['rss_mib']:.0f} "
        f"MiB: {verdict(rss, TARGETS['rss_mib'], higher=False)})",
    ]
    for c, loc in ((seq, seq_local), (par, par_local)):
        r = c.median() / loc.median()
        ratio_lines.append(
            f"{c.label}: the embedded default / the plain executor "
            f"(service=local) = {r:.3f} (target >= 0.95: "
            f"{verdict(r, 0.95)})")

    raw = {"workload": WID, "mode": mode, "reps": args.reps,
           "machine": info, "targets": TARGETS,
           "ratios": {"seq": seq_ratio, "par": par_ratio,
                      "embedded_seq": seq.median() / seq_local.median(),
                      "embedded_par": par.median() / par_local.median()},
           "configs": [{"side": c.side, "label": c.label,
                        "parallelism": c.parallelism, "argv": c.argv,
                        "units": c.units, "runs": c.runs}
                       for c in configs]}
    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", raw)

    if mode == "full":
        md = [f"## W1 - per-element overhead: `range(N) | map(add 1) | "
              f"batch({BATCH})`", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), "
              f"commit {info['commit']}, {args.reps} reps each, interleaved; "
              f"1-min load average {info['loadavg_start']} before, "
              f"{info['loadavg_end']} after; "
              f"cachew CLI `{os.path.relpath(binary, h.REPO_DIR)}`, "
              f"PyTorch {peer0.runs[0]['json'].get('torch')} on "
              f"`{h.PEER_PYTHON}`; "
              "elements/s counts input elements (N) on both sides; peak RSS "
              "is the largest of the reps (`/usr/bin/time %M`, largest "
              "process).", "",
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

    print(f"W1 ({mode}, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(header, rows))
    for line in ratio_lines:
        print(line)
    print(f"W1 ratio={seq_ratio:.2f} cachew={seq.median():.0f}elements/s "
          f"peer={peer0.median():.0f}elements/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W1: {e}", file=sys.stderr)
        sys.exit(1)
