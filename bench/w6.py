#!/usr/bin/python3
"""W6 - the transfer path: 1 MiB and 64 KiB elements, worker -> client,
through the service against raw nng push/pull on the same machine, in the
same run.

peer (the physical reference): build/nng_raw (bench/nng_raw.c): one nng
push socket sending fixed-size messages to one pull socket, two threads of
one process, over tcp://127.0.0.1, ipc:// or tls+tcp://127.0.0.1 (nng's
TLS, mbedTLS; the bench makes a CA and a server certificate with openssl in
a temp dir, bench/w5.py tls_dir()); a fresh message per send, not
filled; the receiver touches one byte per 4 KiB page. One message per
element.
cachew, transport API alone: build/transport_bench (bench/transport_bench.c):
the request/reply transport the service uses (transports/transport.h),
a server answering get-next requests with elements of the size (as many
as make 1 MiB per reply), the client keeping 4 requests in flight.
cachew service: `cachewd` dispatcher + 1 or 2 workers (`--threads 1`),
the client `cachew run --json --no-digest` with CACHEW_SERVICE, the
pipeline `fixed_length_records(files=[...], record_bytes=S)` over
generated files (bench/data/w6-*: deterministic bytes, 8 files, listed
several times so that a run moves several GB): each worker maps its
splits (files) and streams the records to the client from the page cache
(its get_elements replies carry up to 8 MiB of elements; the worker's
log says files=mapped). Also, for
reference, the same pipeline in-process (how fast the source alone is).
Unit: GB/s (1e9 bytes of element payload per second), at the receiver.

Each ratio line also gives the CPU seconds per GB of payload: raw nng
(its one process, both ends) and the service's client and workers apart,
so that a change can be judged by the side it costs (medians per run).

Target (issue 18, was 80% in issue 5): the service's 1 MiB transfer >=
90% of raw nng push/pull in the same run. TLS (issue 14) is reported beside tcp: each
tls+tcp configuration against the same one on plain tcp (no target; the
TLS runs move files x MiB x tls_passes, fewer bytes, as TLS is slower).
The last line gives the tcp:// 1 MiB ratio with 1 worker (one sender and
one receiver, as in nng_raw).

Usage: /usr/bin/python3 bench/w6.py [--quick] [--reps R]   (or bench/run W6)
"""
import argparse
import os
import random
import statistics
import sys

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import w5  # noqa: E402  (the service: daemons by pid, CPU, hangs)

WID = "W6"
MIB = 1 << 20
SIZES = {
    # files x MiB each on disk, passes over them per run
    "full": {"files": 8, "file_mib": 128, "passes": 5, "tls_passes": 1},
    "quick": {"files": 4, "file_mib": 32, "passes": 2, "tls_passes": 1},
}
ELEMENT_SIZES = (1 * MIB, 64 * 1024)
TRANSPORTS = ("tcp", "ipc", "tls")
WORKER_COUNTS = (1, 2)
TARGET = 0.9


def data_dir(files, file_mib, seed):
    """files x file_mib MiB of deterministic bytes (random.Random(seed)),
    made once into bench/data/w6-<files>x<mib>-s<seed>/."""
    d = os.path.join(h.BENCH_DIR, "data", f"w6-{files}x{file_mib}-s{seed}")
    want = file_mib * MIB
    paths = [os.path.join(d, f"part-{i:02d}.bin") for i in range(files)]
    if all(os.path.exists(p) and os.path.getsize(p) == want for p in paths):
        return d
    os.makedirs(d, exist_ok=True)
    h.log(f"W6: generating {files} x {file_mib} MiB into {d}")
    rng = random.Random(seed)
    for p in paths:
        tmp = p + ".tmp"
        with open(tmp, "wb") as f:
            for _ in range(file_mib):
                f.write(rng.randbytes(MIB))
        os.replace(tmp, p)
    return d


def pipeline(d, passes, size):
    files = ", ".join([f'"{d}/*.bin"'] * passes)
    return f"fixed_length_records(files=[{files}], record_bytes={size})"


def size_label(size):
    return "1 MiB" if size == MIB else f"{size // 1024} KiB"


def bench_prog(cachew, name):
    path = os.path.join(os.path.dirname(cachew), name)
    if not os.access(path, os.X_OK):
        raise h.BenchError(f"{path}: not built (run `make bench-progs` "
                           "with the same BUILD as the cachew CLI)")
    return path


class Prog(w5.InProcess):
    """nng_raw / transport_bench: one process; an ipc:// socket file is
    removed before each run."""

    def __init__(self, transport, ipc_path, *args, **kw):
        super().__init__(*args, **kw)
        self.transport = transport
        self.ipc_path = ipc_path

    def run(self):
        if self.ipc_path is not None:
            try:
                os.unlink(self.ipc_path)
            except FileNotFoundError:
                pass
        return super().run()


def url_for(transport, name):
    if transport == "tcp":
        return "tcp://127.0.0.1:0", None
    if transport == "tls":
        return "tls+tcp://127.0.0.1:0", None
    path = f"/tmp/cachew-w6-{os.getpid()}-{name}.sock"
    return f"ipc://{path}", path


def scheme(transport):
    return "tls+tcp" if transport == "tls" else transport


def passes_for(sz, transport):
    return sz["tls_passes"] if transport == "tls" else sz["passes"]


def total_for(sz, transport):
    """Bytes of element payload one run of transport moves."""
    return sz["files"] * sz["file_mib"] * MIB * passes_for(sz, transport)


def tls_args(transport):
    return ["--tls-dir", w5.tls_dir()] if transport == "tls" else []


def configs_for(cachew, cachewd, d, sz, size, limit_s):
    out = {}
    for tr in TRANSPORTS:
        total = total_for(sz, tr)
        count = total // size
        url, path = url_for(tr, f"raw{size}")

        def check_raw(obj, count=count, what=f"nng_raw {tr}"):
            if obj.get("count") != count:
                raise h.BenchError(f"{what}: {obj.get('count')} messages, "
                                   f"expected {count}")

        out[("raw", tr)] = Prog(
            tr, path, "nng push/pull", f"raw {tr} {size_label(size)}", "1+1",
            [bench_prog(cachew, "nng_raw"), "--url", url, "--size",
             str(size), "--count", str(count)] + tls_args(tr), total,
            check=check_raw)
        url, path = url_for(tr, f"tb{size}")

        def check_tb(obj, count=count, what=f"transport_bench {tr}"):
            if obj.get("count") != count:
                raise h.BenchError(f"{what}: {obj.get('count')} elements, "
                                   f"expected {count}")

        out[("api", tr)] = Prog(
            tr, path, "cachew", f"transport API {tr} {size_label(size)}",
            "1+1",
            [bench_prog(cachew, "transport_bench"), "--url", url, "--size",
             str(size), "--count", str(count)] + tls_args(tr), total,
            check=check_tb)

        def check_svc(obj, count=count, total=total, what=f"service {tr}"):
            if obj.get("elements") != count or obj.get("bytes") != total:
                raise h.BenchError(f"{what}: {obj.get('elements')} elements"
                                   f", {obj.get('bytes')} bytes; expected "
                                   f"{count}, {total}")

        for nw in WORKER_COUNTS:
            c = w5.Served(
                cachew, cachewd, tr, limit_s, "cachew",
                f"service {tr} {size_label(size)} {nw} worker"
                + ("s" if nw > 1 else ""), f"{nw}x1",
                [cachew, "run", "--json", "--no-digest", "--quiet",
                 pipeline(d, passes_for(sz, tr), size)], total, workers=nw,
                check=check_svc)
            c.check_splits = None
            out[("svc", tr, nw)] = c
    return out


def inprocess_config(cachew, d, sz, size):
    total = sz["files"] * sz["file_mib"] * MIB * sz["passes"]

    def check(obj):
        if obj.get("bytes") != total:
            raise h.BenchError(f"in-process read: {obj.get('bytes')} bytes, "
                               f"expected {total}")

    return w5.InProcess(
        "cachew", f"in-process source {size_label(size)}", 1,
        [cachew, "run", "--json", "--no-digest", "--quiet", "--threads", "1",
         pipeline(d, sz["passes"], size)], total, check=check)


def verify(cachew, cachewd, d, limit_s):
    """Untimed: one pass of the records through the service (tcp and ipc,
    2 workers) has the digest of the in-process run."""
    p = pipeline(d, 1, MIB)
    want, _, _, _ = h.run_once([cachew, "run", "--json", "--quiet", p],
                               "verify in-process")
    hangs = []
    for tr in TRANSPORTS:
        for attempt in range(w5.ATTEMPTS):
            svc = w5.Service(cachewd, tr)
            try:
                with svc:
                    env = svc.client_env()
                    got, _, _, _ = h.run_once(w5.with_timeout(
                        [cachew, "run", "--json", "--quiet", p], limit_s),
                        f"verify {tr}", env)
                break
            except h.BenchError as e:
                if not w5.is_hang(e) or attempt == w5.ATTEMPTS - 1:
                    raise
                hangs.append(str(e))
            finally:
                svc.cleanup()
        if got.get("digest") is None or got.get("digest") != \
                want.get("digest"):
            raise h.BenchError(f"verify {tr}: digest {got.get('digest')} "
                               f"through the service, {want.get('digest')} "
                               "in-process")
    return hangs


def gbps(c):
    r = [x / 1e9 for x in c.rates()]
    return statistics.median(r), min(r), max(r)


def cpu_per_gb(c, key=None):
    """Median CPU seconds per GB of payload: one side of a service run
    (key "client" or "workers") or, key None, the whole process."""
    vals = []
    for run in c.runs:
        x = run["cpu"].get(key) if key else w5.cpu_total(run["cpu"])
        if x is not None:
            vals.append(x / (c.units / 1e9))
    return w5.med(vals)


def rows_for(configs):
    rows = []
    for c in configs:
        med, lo, hi = gbps(c)
        cpu = [run["cpu"] for run in c.runs]
        served = isinstance(c, w5.Served)
        rows.append([
            c.label, c.side, str(c.parallelism), f"{med:.2f}", f"{lo:.2f}",
            f"{hi:.2f}", w5.fmt_s(w5.med([run["seconds"]
                                          for run in c.runs])),
            w5.fmt_s(w5.med([x["client"] for x in cpu])),
            w5.fmt_s(w5.med([x.get("workers") for x in cpu])) if served
            else "-",
            w5.fmt_s(w5.med([w5.cpu_total(x) for x in cpu])),
            f"{c.peak_rss_mib():.1f}",
            w5.fmt_mib(max(run["worker_hwm_kib"] for run in c.runs))
            if served else "-",
        ])
    return rows


HEADER = ["config", "side", "senders x threads", "median GB/s", "min", "max",
          "median s", "client/process CPU s", "workers CPU s",
          "total CPU s", "client/process peak RSS MiB",
          "worker peak RSS MiB"]


def tls_lines(cfg, size, ratios):
    """TLS beside tcp: each tls+tcp configuration's rate over the same
    one's on plain tcp, and CPU seconds per GB of both."""
    lines = []
    for what, key in [("raw nng", ("raw",)), ("transport API", ("api",))] + \
            [(f"service {nw} worker{'s' if nw > 1 else ''}", ("svc", nw))
             for nw in WORKER_COUNTS]:
        tls = cfg[(key[0], "tls") + key[1:]]
        tcp = cfg[(key[0], "tcp") + key[1:]]
        r = tls.median() / tcp.median()
        ratios[f"{size_label(size)} tls/tcp {' '.join(map(str, key))}"] = r
        if key[0] == "svc":
            cpu = (f"client {w5.fmt_s(cpu_per_gb(tls, 'client'))} + workers "
                   f"{w5.fmt_s(cpu_per_gb(tls, 'workers'))} (tcp: client "
                   f"{w5.fmt_s(cpu_per_gb(tcp, 'client'))} + workers "
                   f"{w5.fmt_s(cpu_per_gb(tcp, 'workers'))})")
        else:
            cpu = (f"{w5.fmt_s(cpu_per_gb(tls))} (tcp: "
                   f"{w5.fmt_s(cpu_per_gb(tcp))})")
        lines.append(f"{size_label(size)} tls+tcp:// / tcp://, {what}: "
                     f"{tls.median() / 1e9:.2f} / {tcp.median() / 1e9:.2f} "
                     f"GB/s = {r:.0%}; CPU s/GB {cpu}")
    return lines


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
    h.log(f"W6 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {cachew}")
    d = data_dir(sz["files"], sz["file_mib"], args.seed)
    limit_s = w5.CLIENT_LIMIT_S[mode]
    verify_hangs = verify(cachew, cachewd, d, limit_s)

    by_size = {s: configs_for(cachew, cachewd, d, sz, s, limit_s)
               for s in ELEMENT_SIZES}
    src = {s: inprocess_config(cachew, d, sz, s) for s in ELEMENT_SIZES}
    configs = []
    for s in ELEMENT_SIZES:
        for tr in TRANSPORTS:
            configs += [by_size[s][("raw", tr)], by_size[s][("api", tr)]]
            configs += [by_size[s][("svc", tr, nw)] for nw in WORKER_COUNTS]
        configs.append(src[s])
    h.run_interleaved(configs, args.reps)
    info["loadavg_end"] = h.loadavg()

    total = sz["files"] * sz["file_mib"] * MIB * sz["passes"]
    ratio_lines = []
    ratios = {}
    for s in ELEMENT_SIZES:
        for tr in TRANSPORTS:
            raw = by_size[s][("raw", tr)].median()
            api = by_size[s][("api", tr)].median()
            for nw in WORKER_COUNTS:
                r = by_size[s][("svc", tr, nw)].median() / raw
                ratios[f"{size_label(s)} {tr} {nw}w"] = r
                ok = "met" if r >= TARGET else "MISSED"
                tgt = (f" (target >= {TARGET:.0%}: {ok})"
                       if s == MIB and tr != "tls" else " (no target)")
                cr = w5.cpu_ratio(by_size[s][("raw", tr)],
                                  by_size[s][("svc", tr, nw)])
                svc = by_size[s][("svc", tr, nw)]
                ratio_lines.append(
                    f"{size_label(s)} {scheme(tr)}://, service {nw} worker"
                    f"{'s' if nw > 1 else ''} / raw nng = {r:.0%}{tgt}; CPU "
                    f"per byte raw / service = {cr:.0%}; CPU s/GB raw "
                    f"{w5.fmt_s(cpu_per_gb(by_size[s][('raw', tr)]))}, "
                    f"service client {w5.fmt_s(cpu_per_gb(svc, 'client'))}"
                    f" + workers {w5.fmt_s(cpu_per_gb(svc, 'workers'))}")
            ratio_lines.append(
                f"{size_label(s)} {scheme(tr)}://, transport API / raw nng = "
                f"{api / raw:.0%}")
        ratio_lines += tls_lines(by_size[s], s, ratios)
    warning = h.load_warning(info)
    if warning is not None:
        ratio_lines.append(warning)
    nhang = len(verify_hangs) + sum(len(c.hangs) for c in configs
                                    if isinstance(c, w5.Served))
    ratio_lines.append(
        f"client hangs: {nhang} service clients did not exit within "
        f"{limit_s} s (killed; the run was repeated on a fresh service)")

    raw_path = h.write_raw(WID if mode == "full" else WID + "-quick", {
        "workload": WID, "mode": mode, "reps": args.reps, "machine": info,
        "target": TARGET, "ratios": ratios, "bytes_per_run": total,
        "hangs": {"verify": verify_hangs,
                  **{c.what: c.hangs for c in configs
                     if isinstance(c, w5.Served)}},
        "configs": [{"side": c.side, "label": c.label,
                     "parallelism": c.parallelism, "argv": c.argv,
                     "units": c.units, "runs": c.runs} for c in configs]})
    rows = rows_for(configs)

    if mode == "full":
        md = ["## W6 - transfer path: 1 MiB and 64 KiB elements, worker -> "
              "client, against raw nng push/pull", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each, interleaved; 1-min "
              f"load average {info['loadavg_start']} before, "
              f"{info['loadavg_end']} after; cachew CLI "
              f"`{os.path.relpath(cachew, h.REPO_DIR)}`. "
              f"{total / 1e9:.2f} GB of element payload per run "
              f"({sz['files']} files x {sz['file_mib']} MiB, "
              f"{sz['passes']} passes; over TLS {sz['tls_passes']} pass, "
              f"{total_for(sz, 'tls') / 1e9:.2f} GB); GB/s = 1e9 bytes/s "
              "at the receiver. TLS: tls+tcp://127.0.0.1 with a P-256 "
              "certificate made by openssl (nng 1.5's TLS, mbedTLS 2.28). "
              "Raw nng: push -> pull, one message per element, two threads "
              "of one process. Transport API: bench/transport_bench.c. "
              "Service: dispatcher + 1 or 2 workers (`--threads 1`), "
              "`fixed_length_records` from the page cache, client `cachew "
              "run` with CACHEW_SERVICE (fresh daemons every run). CPU "
              "seconds are medians per run (for nng_raw and "
              "transport_bench: the whole process, both ends).", "",
              h.md_table(HEADER, rows), ""]
        md += [f"- {line}" for line in ratio_lines]
        h.write_section(WID, "\n".join(md) + "\n")

    print(f"W6 ({mode}, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); "
          f"{total / 1e9:.2f} GB per run; raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(HEADER, rows))
    for line in ratio_lines:
        print(line)
    svc = by_size[MIB][("svc", "tcp", 1)]
    raw = by_size[MIB][("raw", "tcp")]
    print(f"W6 ratio={svc.median() / raw.median():.2f} "
          f"cachew={svc.median() / 1e9:.2f}GB/s "
          f"peer={raw.median() / 1e9:.2f}GB/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W6: {e}", file=sys.stderr)
        sys.exit(1)
