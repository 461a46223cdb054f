#!/usr/bin/python3
"""W5 - W2 and W1 through the service: a dispatcher and 2 worker processes
over ipc:// and over tcp://127.0.0.1, against cachew in-process on the same
cores. Client and workers share the host, so their links carry large
replies in shared memory (transports/nng/nng_shm.c); the tcp-wire rows are
tcp with it off (CACHEW_SHM=0 in the client), what the wire itself costs.

cachew in-process (the reference): `cachew run --json --set service=local`
(the plain executor; the default is the embedded service), threads 2, the
pipelines of bench/w2.py and bench/w1.py with parallel=2.
cachew service: `cachewd --role=dispatcher` and 2 `cachewd --role=worker
--threads 1` (so the pipeline has the same 2 cores: one thread per worker
process), `--heartbeat-ms 500` (cachewd's default: what an operator
runs; the daemons' timers are part of the service's CPU), all on the
transport under test (the
dispatcher's and the workers' listen URLs); the client is `cachew run
--json` with CACHEW_SERVICE=<dispatcher URL>, and the pipeline sent is the
threads-1 one (each worker runs one split at a time on one thread). The
whole pipeline runs on the workers (distributed_epoch; its client part is
empty); the client receives the finished batches. The client process also
uses CPU (receiving, on the same 2 cores): every row reports the CPU
seconds of the client, the workers and the dispatcher, read from
getrusage and /proc/<pid>/stat around the measured run.

Each service run starts fresh daemons (waiting for the `event=listening`
line and each worker's `event=registered`), runs an untimed probe client
(`range(64) | batch(64)`: its seconds are the fixed cost of a job, job
creation to release, reported as "setup"), then the measured client, then
stops the workers and the dispatcher by pid (SIGTERM, then SIGKILL after a
bound) whatever happened.

W2 here reads W2's shards (bench/data/w2-<n>-s1, made by `cachew gen
imagenet`) listed 3 times in `tfrecord(files=[...])`: 3 x 2000 images, 12
files (12 splits for 2 workers), so a run lasts several seconds and the
job's fixed cost stays small. W1 is range(N) | map(add 1) | batch(64).
Per split, the service batches each lease on its own, so it may yield a
few more (partial) batches than in-process: the checks count bytes
exactly and batches up to one extra per split.

Ratio = service throughput / in-process throughput (images/s for W2,
range elements/s for W1). Also printed: the in-process CPU seconds per unit
over the service's (all its processes), which the throughput ratio tends to
when both sides are CPU-bound on the same cores and which depends much less
on what else runs on the machine. Targets (issue 5): W2 through the service >=
0.9x in-process over both transports; W1 through the service >= 1M
elements/s. The last line gives the W2 tcp:// ratio.

Usage: /usr/bin/python3 bench/w5.py [--quick] [--reps R] [--transports T,..]
       [--client-tail auto,off] [--no-w1]   (or bench/run W5)
--client-tail auto,off runs W2 through the service both ways, interleaved
(issues 14, 18: the client normalizes and the workers send u8, or the
workers send f32), and prints CPU per image of the client and the workers
and the wire bytes (the job's payload bytes in `cachew status`).
"""
import argparse
import atexit
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import w2  # noqa: E402  (W2's data, constants)

WID = "W5"
BATCH = 64
SIZES = {
    # images of W2's data set, how many times its shards are listed, W1's N
    "full": {"images": 2000, "passes": 3, "w1": 100_000_000},
    "quick": {"images": 200, "passes": 1, "w1": 5_000_000},
}
VERIFY_N = 100_003
TARGETS = {"w2_ratio": 0.9, "w1_rate": 1_000_000.0}
# tcp-wire: tcp with the same-host shared memory off (CACHEW_SHM=0 in the
# client, so it offers no region): what a worker on another host costs.
TRANSPORTS = ("ipc", "tcp", "tcp-wire")
WORKERS = 2
WORKER_THREADS = 1
# cachewd's default (docs/cachewd.md). Was 100: 5x the heartbeats of a
# deployed service, about 0.5 % of W5's CPU in the three daemons' timers.
HEARTBEAT_MS = 500
START_TIMEOUT_S = 15.0
# A service client that runs longer than this is killed and counted as a
# hang (full runs take about 10 s, quick ones about 1 s).
CLIENT_LIMIT_S = {"full": 60, "quick": 15}
STOP_TIMEOUT_S = 15.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cachewd_bin(cachew):
    path = os.path.join(os.path.dirname(cachew), "cachewd")
    if not os.access(path, os.X_OK):
        raise h.BenchError(f"{path}: not built (run `make`; cachewd is "
                           "looked up beside the cachew CLI)")
    return path


# ---- the service: a dispatcher and workers, by pid ------------------------

def proc_cpu_s(pid):
    """utime + stime of a live process, in seconds (/proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_hwm_kib(pid):
    """Peak RSS of a live process (VmHWM), KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


class Daemon:
    def __init__(self, name, argv, log_path):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.proc = None
        self.url = None

    def start(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log,
                                     cwd=h.REPO_DIR)

    def text(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, n=15):
        return "\n".join(self.text().splitlines()[-n:])

    def wait_for(self, pred, what, deadline):
        """Polls the log until pred(text) returns a value; fails when the
        process exits or the deadline passes."""
        while True:
            got = pred(self.text())
            if got:
                return got
            if self.proc.poll() is not None:
                raise h.BenchError(f"{self.name} exited with "
                                   f"{self.proc.returncode} before {what}:\n"
                                   f"{self.tail()}")
            if time.monotonic() > deadline:
                raise h.BenchError(f"{self.name}: no {what} within "
                                   f"{START_TIMEOUT_S:.0f} s:\n{self.tail()}")
            time.sleep(0.01)

    def stop(self):
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; returns the exit code
        (None if it never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                h.log(f"  {self.name} (pid {self.proc.pid}) still up "
                      f"{STOP_TIMEOUT_S:.0f} s after SIGTERM: SIGKILL")
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def listening_url(role):
    def pred(text):
        for line in text.splitlines():
            if line.startswith(f"event=listening role={role} "):
                for kv in line.split():
                    if kv.startswith("url="):
                        return kv[4:]
        return None
    return pred


_TLS_DIR = None


def tls_dir():
    """TLS material for transport "tls", made once per bench process with
    the openssl command into a temp dir (removed at exit): ca.pem, and
    server.pem + server.key (P-256, signed by ca.pem, for 127.0.0.1) that
    every daemon shows; clients trust ca.pem (CACHEW_TLS_CA)."""
    global _TLS_DIR
    if _TLS_DIR is not None:
        return _TLS_DIR
    d = tempfile.mkdtemp(prefix="cachew-tls-", dir="/tmp")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]
    with open(os.path.join(d, "leaf.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1\n")
    steps = [
        ["openssl", "req", "-x509"] + ec + ["-keyout", "ca.key", "-out",
                                            "ca.pem", "-days", "1", "-subj",
                                            "/CN=cachew-bench-ca"],
        ["openssl", "req", "-new"] + ec + ["-keyout", "server.key", "-out",
                                           "server.csr", "-subj",
                                           "/CN=localhost"],
        ["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem",
         "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile",
         "leaf.ext", "-out", "server.pem"],
    ]
    for argv in steps:
        r = subprocess.run(argv, cwd=d, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise h.BenchError(f"TLS material: {' '.join(argv)}: exit "
                               f"{r.returncode}: {r.stderr.strip()}")
    atexit.register(shutil.rmtree, d, True)
    _TLS_DIR = d
    return d


def tls_flags():
    """The daemons' TLS options for transports "tls" and "tls+auth"."""
    d = tls_dir()
    return ["--tls-cert", os.path.join(d, "server.pem"), "--tls-key",
            os.path.join(d, "server.key"), "--tls-ca",
            os.path.join(d, "ca.pem")]


def auth_files(d):
    """Transport "tls+auth": the dispatcher's token table and one token
    file per role in dir d (mode 600, as the dispatcher demands). Returns
    {"table", "worker", "client"} paths."""
    out = {"table": os.path.join(d, "tokens")}
    lines = []
    for role in ("worker", "client"):
        tok = os.urandom(24).hex()
        lines.append(f"{role} bench-{role} {tok}\n")
        out[role] = os.path.join(d, f"{role}.token")
        with open(os.open(out[role], os.O_WRONLY | os.O_CREAT, 0o600),
                  "w") as f:
            f.write(tok + "\n")
    with open(os.open(out["table"], os.O_WRONLY | os.O_CREAT, 0o600),
              "w") as f:
        f.writelines(lines)
    return out


class Service:
    """A dispatcher and WORKERS workers on one transport (tcp, ipc, tls:
    tls+tcp with tls_dir()'s certificate, or tls+auth: that and role
    tokens, `--auth-tokens` on the dispatcher, `--token-file` on workers
    and CACHEW_TOKEN_FILE for clients), in a temp dir. Use as a context
    manager: the daemons are stopped on exit, whatever happened."""

    def __init__(self, cachewd, transport, workers=WORKERS,
                 threads=WORKER_THREADS, extra=(), dispatcher_extra=()):
        self.cachewd = cachewd
        self.transport = transport
        self.nworkers = workers
        self.threads = threads
        self.extra = list(extra)  # every daemon's
        self.dispatcher_extra = list(dispatcher_extra)  # W8: --journal 0
        self.dir = None
        self.dispatcher = None
        self.workers = []
        self.url = None
        self.exit_codes = {}
        self.auth = None  # auth_files(), transport tls+auth

    def listen(self, name):
        if self.transport == "ipc":
            return f"ipc://{self.dir}/{name}.sock"
        if self.transport in ("tls", "tls+auth"):
            return "tls+tcp://127.0.0.1:0"
        return "tcp://127.0.0.1:0"

    def common(self):
        tls = tls_flags() if self.transport in ("tls", "tls+auth") else []
        return ["--heartbeat-ms", str(HEARTBEAT_MS)] + tls + self.extra

    def client_env(self):
        """The environment of a client of this service."""
        env = dict(os.environ, CACHEW_SERVICE=self.url)
        if self.transport in ("tls", "tls+auth"):
            env["CACHEW_TLS_CA"] = os.path.join(tls_dir(), "ca.pem")
        if self.transport == "tcp-wire":
            env["CACHEW_SHM"] = "0"
        if self.auth is not None:
            env["CACHEW_TOKEN_FILE"] = self.auth["client"]
        return env

    def __enter__(self):
        # Short: a Unix socket path has a limit of 107 bytes.
        self.dir = tempfile.mkdtemp(prefix="cachew-w5-", dir="/tmp")
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            auth = []
            if self.transport == "tls+auth":
                self.auth = auth_files(self.dir)
                auth = ["--auth-tokens", self.auth["table"]]
            self.dispatcher = Daemon(
                "dispatcher",
                [self.cachewd, "--role=dispatcher", "--listen",
                 self.listen("d"), "--work-dir",
                 os.path.join(self.dir, "work")] + self.common() + auth +
                self.dispatcher_extra,
                os.path.join(self.dir, "dispatcher.log"))
            self.dispatcher.start()
            self.url = self.dispatcher.wait_for(
                listening_url("dispatcher"), "listening line", deadline)
            for i in range(self.nworkers):
                self.start_worker()
            for w in self.workers:
                self.wait_worker(w, deadline)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start_worker(self):
        i = len(self.workers)
        w = Daemon(f"worker {i + 1}",
                   [self.cachewd, "--role=worker", "--dispatcher",
                    self.url, "--listen", self.listen(f"w{i + 1}"),
                    "--threads", str(self.threads),
                    "--drain-timeout-ms", "10000",
                    # The workloads' data, wherever it was generated: a
                    # worker reads only what --allow-read allows.
                    "--allow-read", "/"] + self.common() +
                   (["--token-file", self.auth["worker"]]
                    if self.auth is not None else []),
                   os.path.join(self.dir, f"worker{i + 1}.log"))
        self.workers.append(w)
        w.start()
        return w

    def wait_worker(self, w, deadline):
        w.url = w.wait_for(listening_url("worker"), "listening line",
                           deadline)
        w.wait_for(lambda t: "event=registered" in t,
                   "registration with the dispatcher", deadline)

    def replace_worker(self, i):
        """SIGKILLs worker i (0-based) and starts a new one in its place
        (appended); returns when the new one registered."""
        old = self.workers[i]
        old.proc.kill()
        old.proc.wait()
        w = self.start_worker()
        self.wait_worker(w, time.monotonic() + START_TIMEOUT_S)

    def __exit__(self, *exc):
        # Workers first (they drain and deregister while the dispatcher is
        # still there to answer), then the dispatcher.
        for w in self.workers:
            self.exit_codes[w.name] = w.stop()
        if self.dispatcher is not None:
            self.exit_codes["dispatcher"] = self.dispatcher.stop()
        return False

    def cleanup(self):
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def pids(self):
        return [("dispatcher", self.dispatcher.proc.pid)] + [
            (w.name, w.proc.pid) for w in self.workers
            if w.proc.poll() is None]

    def cpu(self):
        return {name: proc_cpu_s(pid) for name, pid in self.pids()}

    def hwm_kib(self):
        return {name: proc_hwm_kib(pid) for name, pid in self.pids()}

    def events(self):
        path = os.path.join(self.dir, "work", "events.jsonl")
        out = []
        try:
            with open(path) as f:
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return out

    def warnings(self):
        """The warn/error lines of the daemons' logs."""
        lines = []
        for d in [self.dispatcher] + self.workers:
            for line in d.text().splitlines():
                if " warn " in line or " error " in line or \
                        line.startswith("event=drain_timeout"):
                    lines.append(f"{d.name}: {line}")
        return lines


def job_bytes(cachew, svc, job_id):
    """The payload bytes the dispatcher counted for a job (what its client
    received from the workers: the wire's element bytes), from `cachew
    status --json`; None when it cannot tell."""
    r = subprocess.run([cachew, "status", svc.url, "--json"],
                       env=svc.client_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True, timeout=30)
    try:
        jobs = json.loads(r.stdout).get("jobs", [])
    except ValueError:
        return None
    for j in jobs:
        if j.get("id") == job_id:
            return j.get("bytes")
    return None


def job_summary(events, job_id):
    """Splits of a job and how many each worker was leased."""
    splits, per_worker = None, {}
    for e in events:
        if e.get("job_id") != job_id:
            continue
        if e.get("event") == "job_created":
            splits = e.get("splits")
        elif e.get("event") == "split_leased":
            wid = e.get("worker_id")
            per_worker[wid] = per_worker.get(wid, 0) + len(e.get("splits",
                                                                []))
    return splits, per_worker


# ---- configurations -----------------------------------------------------

def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class InProcess(h.Config):
    """An in-process run; records the client's CPU seconds."""

    transport = "in-process"

    def run(self):
        c0 = children_cpu_s()
        rec = super().run()
        rec["cpu"] = {"client": children_cpu_s() - c0}
        return rec


HANG_EXIT = 124  # timeout(1)'s status when the limit passed
ATTEMPTS = 3


def with_timeout(argv, limit_s):
    """Every service client runs under timeout(1): a client that never
    exits (docs/performance.md, "Service misbehaviour found by W5") is a
    hang, counted and reported, not a stuck benchmark."""
    return ["timeout", "-k", "5", str(limit_s)] + list(argv)


def is_hang(err):
    return f": exit {HANG_EXIT}:" in str(err).splitlines()[0]


class Served(h.Config):
    """A run through a fresh service on one transport: daemons started,
    probe job (setup), the measured client, daemons stopped. A client that
    hangs is killed after limit_s, counted in self.hangs, and the run is
    tried again on a fresh service (ATTEMPTS in all)."""

    check_splits = None
    # callable(svc): runs on a thread while the measured client runs (W7
    # kills a worker from it)
    during = None
    # callable(svc, rec): runs after the measured client, the service still
    # up (W8 asks the dispatcher for its journal's counts)
    after = None
    # options for the dispatcher only (W8: --journal 0)
    dispatcher_extra = ()

    def __init__(self, cachew, cachewd, transport, limit_s, side, label,
                 parallelism, argv, units, workers=WORKERS, **kw):
        super().__init__(side, label, parallelism,
                         with_timeout(argv, limit_s), units, **kw)
        self.cachew = cachew
        self.cachewd = cachewd
        self.transport = transport
        self.limit_s = limit_s
        self.workers = workers
        self.hangs = []

    def run(self):
        for _ in range(ATTEMPTS):
            try:
                return self.run_fresh()
            except h.BenchError as e:
                if not is_hang(e):
                    raise
                self.hangs.append(str(e))
                h.log(f"  {self.what}: a client did not exit within "
                      f"{self.limit_s} s (killed); again on a fresh service")
        raise h.BenchError(f"{self.what}: the client hung {ATTEMPTS} times "
                           f"in a row:\n{self.hangs[-1]}")

    def run_fresh(self):
        svc = Service(self.cachewd, self.transport, workers=self.workers,
                      dispatcher_extra=self.dispatcher_extra)
        try:
            with svc:
                env = svc.client_env()
                self.env = env
                probe, _, _, _ = h.run_once(
                    with_timeout([self.cachew, "run", "--json", "--no-digest",
                                  "--quiet", f"range(64) | batch({BATCH})"],
                                 self.limit_s),
                    f"{self.what} setup probe", env)
                d0 = svc.cpu()
                c0 = children_cpu_s()
                th = None
                if self.during is not None:
                    th = threading.Thread(target=self.during, args=(svc,))
                    th.start()
                try:
                    rec = super().run()
                finally:
                    if th is not None:
                        th.join()
                c1 = children_cpu_s()
                d1 = svc.cpu()
                hwm = svc.hwm_kib()
                rec["wire_bytes"] = job_bytes(self.cachew, svc, 2)
                if self.after is not None:
                    self.after(svc, rec)
            events = svc.events()
            # The probe is job 1, the measured run job 2.
            splits, per_worker = job_summary(events, 2)
            rec["setup_s"] = float(probe["seconds"])
            rec["cpu"] = {"client": c1 - c0}
            rec["cpu"]["dispatcher"] = d1["dispatcher"] - d0["dispatcher"]
            rec["cpu"]["workers"] = sum(d1[k] - d0.get(k, 0) for k in d1
                                        if k != "dispatcher" and
                                        d1[k] is not None)
            rec["worker_hwm_kib"] = max(v for k, v in hwm.items()
                                        if k != "dispatcher" and v)
            rec["dispatcher_hwm_kib"] = hwm["dispatcher"]
            rec["splits"] = splits
            rec["splits_per_worker"] = sorted(per_worker.values())
            rec["exit_codes"] = svc.exit_codes
            rec["warnings"] = svc.warnings()
            bad = {k: v for k, v in svc.exit_codes.items() if v != 0}
            if bad:
                h.log(f"  {self.what}: daemons exited with {bad}")
            if self.check_splits is not None:
                self.check_splits(rec["json"], splits)
            return rec
        except h.BenchError as e:
            if svc.dir is not None:
                tails = "\n".join(f"--- {d.name}:\n{d.tail()}"
                                  for d in [svc.dispatcher] + svc.workers
                                  if d is not None)
                raise h.BenchError(f"{e}\n{tails}")
            raise
        finally:
            svc.cleanup()


def w2_source(d, passes):
    files = ", ".join([f'"{d}/*.tfrecord"'] * passes)
    return (f"tfrecord(files=[{files}]) | parse_example("
            'image="image/encoded:bytes", label="image/class/label:i64")')


def w2_pipeline(d, passes, parallel):
    par = f", parallel={parallel}" if parallel > 1 else ""
    return (f"{w2_source(d, passes)} | random_resized_crop(size=224{par}) | "
            f"flip_left_right | batch({BATCH}) | normalize(mean={w2.MEAN}, "
            f"std={w2.STD}, channels_first=true{par})")


def w1_pipeline(n, parallel):
    par = f", parallel={parallel}" if parallel > 1 else ""
    return f"range({n}) | map(add, value=1{par}) | batch({BATCH})"


def counts_check(label, units, unit_bytes, exact_batches):
    """bytes exact; batches exactly ceil(units/64) in-process, and through
    the service at most one partial batch more per split."""
    batches = -(-units // BATCH)
    want_bytes = units * unit_bytes

    def check(obj):
        if obj.get("bytes") != want_bytes:
            raise h.BenchError(f"{label}: {obj.get('bytes')} bytes, "
                               f"expected {want_bytes} for {units}")
        if exact_batches and obj.get("elements") != batches:
            raise h.BenchError(f"{label}: {obj.get('elements')} batches, "
                               f"expected {batches}")

    def check_splits(obj, splits):
        got = obj.get("elements")
        if splits is None or not batches <= got <= batches + splits:
            raise h.BenchError(f"{label}: {got} batches with {splits} "
                               f"splits, expected {batches}..{batches} + "
                               "splits")

    return check, check_splits


W2_UNIT_BYTES = 3 * 224 * 224 * 4 + 8  # f32 image + i64 label


def w2_configs(cachew, cachewd, d, passes, n, seed, limit_s,
               tails=("auto",)):
    """In-process, then per transport one service config per client_tail
    value (the option's --set; a single value keeps W5's labels)."""
    out = []
    check, _ = counts_check("W2 in-process", n, W2_UNIT_BYTES, True)
    out.append(InProcess(
        "in-process", "W2 threads 2", 2,
        [cachew, "run", "--json", "--no-digest", "--quiet", "--threads", "2",
         "--set", "service=local",
         "--seed", str(seed), w2_pipeline(d, passes, 2)], n, check=check))
    for tr in TRANSPORTS:
        for tail in tails:
            label = f"W2 {tr}" + (f" tail={tail}" if len(tails) > 1 else "")
            check, check_splits = counts_check(label, n, W2_UNIT_BYTES,
                                               False)
            c = Served(cachew, cachewd, tr, limit_s, "service", label,
                       f"{WORKERS}x{WORKER_THREADS}",
                       [cachew, "run", "--json", "--no-digest", "--quiet",
                        "--seed", str(seed), "--set",
                        f"client_tail={tail}", w2_pipeline(d, passes, 1)],
                       n, check=check)
            c.check_splits = check_splits
            c.tail = tail
            out.append(c)
    return out


def w1_configs(cachew, cachewd, n, seed, limit_s):
    out = []
    check, _ = counts_check("W1 in-process", n, 8, True)
    out.append(InProcess(
        "in-process", "W1 threads 2", 2,
        [cachew, "run", "--json", "--no-digest", "--quiet", "--threads", "2",
         "--set", "service=local",
         "--seed", str(seed), w1_pipeline(n, 2)], n, check=check))
    for tr in TRANSPORTS:
        check, check_splits = counts_check(f"W1 {tr}", n, 8, False)
        c = Served(cachew, cachewd, tr, limit_s, "service", f"W1 {tr}",
                   f"{WORKERS}x{WORKER_THREADS}",
                   [cachew, "run", "--json", "--no-digest", "--quiet",
                    "--seed", str(seed), w1_pipeline(n, 1)], n,
                   check=check)
        c.check_splits = check_splits
        out.append(c)
    return out


def verify(cachew, cachewd, d, seed, limit_s):
    """Untimed: the service delivers the same multiset as in-process (the
    order-independent digest) on both transports, for W1's range | map and
    for W2's records (label and JPEG bytes). Returns the client hangs met
    (each retried on a fresh service)."""
    pipes = [f"range({VERIFY_N}) | map(add, value=1)", w2_source(d, 1)]
    want = []
    for p in pipes:
        obj, _, _, _ = h.run_once([cachew, "run", "--json", "--quiet",
                                   "--seed", str(seed), p],
                                  "verify in-process")
        want.append(obj.get("digest"))
    hangs = []
    for tr in TRANSPORTS:
        for p, dg in zip(pipes, want):
            for attempt in range(ATTEMPTS):
                svc = Service(cachewd, tr)
                try:
                    with svc:
                        env = svc.client_env()
                        obj, _, _, _ = h.run_once(with_timeout(
                            [cachew, "run", "--json", "--quiet", "--seed",
                             str(seed), p], limit_s), f"verify {tr}", env)
                    break
                except h.BenchError as e:
                    if not is_hang(e) or attempt == ATTEMPTS - 1:
                        raise
                    hangs.append(str(e))
                    h.log(f"  verify {tr}: a client did not exit within "
                          f"{limit_s} s (killed); again on a fresh service")
                finally:
                    svc.cleanup()
            if obj.get("digest") != dg or dg is None:
                raise h.BenchError(
                    f"verify {tr}: digest {obj.get('digest')} through the "
                    f"service, {dg} in-process, for {p}")
    return hangs


# ---- report -------------------------------------------------------------

def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt_s(x):
    return "-" if x is None else f"{x:.2f}"


def fmt_mib(kib):
    return "-" if kib is None else f"{kib / 1024:.1f}"


def rows_for(configs):
    rows = []
    for c in configs:
        r = c.rates()
        cpu = [run["cpu"] for run in c.runs]
        served = c.side == "service"
        rows.append([
            c.label, c.transport if served else "in-process",
            str(c.parallelism),
            h.fmt_int(statistics.median(r)), h.fmt_int(min(r)),
            h.fmt_int(max(r)),
            fmt_s(med([run["seconds"] for run in c.runs])),
            fmt_s(med([run.get("setup_s") for run in c.runs])) if served
            else "-",
            fmt_s(med([x["client"] for x in cpu])),
            fmt_s(med([x.get("workers") for x in cpu])) if served else "-",
            fmt_s(med([x.get("dispatcher") for x in cpu])) if served
            else "-",
            fmt_s(med([cpu_total(x) for x in cpu])),
            f"{c.peak_rss_mib():.1f}",
            fmt_mib(max(run["worker_hwm_kib"] for run in c.runs)) if served
            else "-",
            fmt_mb(med([run.get("wire_bytes") for run in c.runs]))
            if served else "-",
        ])
    return rows


def fmt_mb(b):
    return "-" if b is None else f"{b / 1e6:.0f}"


HEADER = ["config", "transport", "pipeline threads", "median /s", "min",
          "max", "median s", "setup s", "client CPU s", "workers CPU s",
          "dispatcher CPU s", "total CPU s", "client peak RSS MiB",
          "worker peak RSS MiB", "wire MB"]


def cpu_per_image(run, units):
    """(client, workers) CPU milliseconds per unit of a service run."""
    x = run["cpu"]
    return (1000 * x["client"] / units,
            1000 * (x.get("workers") or 0) / units)


def cpu_total(x):
    return sum(v for v in x.values() if v is not None)


def cpu_ratio(inproc, served):
    """In-process CPU seconds per unit over the service's (client +
    workers + dispatcher): what the throughput ratio tends to when both
    sides are CPU-bound on the same cores. Unlike the throughput ratio,
    it hardly depends on what else runs on the machine."""
    a = med([cpu_total(r["cpu"]) / inproc.units for r in inproc.runs])
    b = med([cpu_total(r["cpu"]) / served.units for r in served.runs])
    return a / b if a and b else None


def main():
    global TRANSPORTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes, under 60 s, same code paths")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per configuration (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--transports", default=",".join(TRANSPORTS),
                    help="comma-separated, of ipc, tcp, tcp-wire (tcp "
                    "without the same-host shared memory: CACHEW_SHM=0), tls "
                    "(tls+tcp) and tls+auth (TLS and role tokens); default "
                    "ipc,tcp,tcp-wire. With "
                    "tls+auth and tcp, also prints tls+auth / tcp; a full "
                    "run not on the default writes the TLS section")
    ap.add_argument("--client-tail", default="auto",
                    help="comma-separated client_tail values for W2's "
                    "service runs, each its own row, interleaved (auto: "
                    "the client normalizes, the workers send u8; off: the "
                    "workers normalize and send f32); default auto. The "
                    "ratios are of the first")
    ap.add_argument("--no-w1", action="store_true",
                    help="W2 only (W1 has no client tail to compare)")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    tails = tuple(t for t in args.client_tail.split(",") if t)
    if not tails or any(t not in ("auto", "on", "off") for t in tails):
        ap.error(f"--client-tail {args.client_tail}: auto, on or off, "
                 "comma-separated")
    default_transports = TRANSPORTS
    TRANSPORTS = tuple(t for t in args.transports.split(",") if t)
    bad = [t for t in TRANSPORTS if t not in ("ipc", "tcp", "tcp-wire",
                                              "tls", "tls+auth")]
    if bad or not TRANSPORTS or "tcp" not in TRANSPORTS:
        ap.error(f"--transports {args.transports}: ipc, tcp, tls, "
                 "tls+auth, comma-separated, tcp among them (the reference "
                 "of the last line)")
    wid = WID if TRANSPORTS == default_transports else "TLS"
    mode = "quick" if args.quick else "full"
    sz = SIZES[mode]

    h.check_tools()
    cachew = h.cachew_bin()
    cachewd = cachewd_bin(cachew)
    info = h.machine_info()
    h.log(f"W5 ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
          f"commit {info['commit']}, cachew {cachew}")
    d = w2.data_dir(cachew, sz["images"], args.seed)
    n_images = sz["images"] * sz["passes"]
    limit_s = CLIENT_LIMIT_S[mode]
    verify_hangs = verify(cachew, cachewd, d, args.seed, limit_s)

    w2all = w2_configs(cachew, cachewd, d, sz["passes"], n_images,
                       args.seed, limit_s, tails)
    w1c = [] if args.no_w1 else w1_configs(cachew, cachewd, sz["w1"],
                                           args.seed, limit_s)
    configs = w2all + w1c
    h.run_interleaved(configs, args.reps)
    info["loadavg_end"] = h.loadavg()

    # The ratios are of the first client_tail value; the others get a
    # line each comparing them with it.
    w2c = [w2all[0]] + [c for c in w2all[1:] if c.tail == tails[0]]
    w2_ratio = {c.transport: c.median() / w2c[0].median() for c in w2c[1:]}
    w2_tcp = next(c for c in w2c if c.transport == "tcp")
    w1_ratio = {c.transport: c.median() / w1c[0].median() for c in w1c[1:]}
    w1_rate = {c.transport: c.median() for c in w1c[1:]}
    rows = rows_for(configs)

    def verdict(ok):
        return "met" if ok else "MISSED"

    ratio_lines = []
    for tr in TRANSPORTS:
        served = next(c for c in w2c if c.transport == tr)
        ratio_lines.append(
            f"W2 {tr}://: service / in-process = {w2_ratio[tr]:.2f}x "
            f"(target >= {TARGETS['w2_ratio']:.1f}x: "
            f"{verdict(w2_ratio[tr] >= TARGETS['w2_ratio'])}); CPU per "
            f"image in-process / service = "
            f"{cpu_ratio(w2c[0], served):.2f}x")
    for tr in TRANSPORTS if w1c else ():
        served = next(c for c in w1c if c.transport == tr)
        ratio_lines.append(
            f"W1 {tr}://: service {w1_rate[tr]:,.0f} elements/s (target >= "
            f"{TARGETS['w1_rate']:,.0f}: "
            f"{verdict(w1_rate[tr] >= TARGETS['w1_rate'])}); "
            f"{w1_ratio[tr]:.2f}x in-process; CPU per element in-process / "
            f"service = {cpu_ratio(w1c[0], served):.2f}x")
    for c in w2all[1:]:
        if c.tail == tails[0]:
            continue
        base = next(b for b in w2c if b.transport == c.transport)
        ratio_lines.append(
            f"W2 {c.transport}:// client_tail={c.tail} / "
            f"client_tail={tails[0]} = {c.median() / base.median():.2f}x; "
            f"service / in-process = {c.median() / w2c[0].median():.2f}x; "
            f"CPU per image in-process / service = "
            f"{cpu_ratio(w2c[0], c):.2f}x")
    for c in w2all[1:]:
        per = [cpu_per_image(r, c.units) for r in c.runs]
        ratio_lines.append(
            f"{c.label}: CPU ms per image client "
            f"{med([p[0] for p in per]):.3f}, workers "
            f"{med([p[1] for p in per]):.3f}; wire "
            f"{fmt_mb(med([r.get('wire_bytes') for r in c.runs]))} MB")
    ratio_lines.append(
        f"{w2c[0].label} in-process: CPU ms per image "
        f"{med([1000 * cpu_total(r['cpu']) / w2c[0].units for r in w2c[0].runs]):.3f}")
    for tr in [t for t in TRANSPORTS if t in ("tls", "tls+auth")]:
        for name, cs in (("W2", w2c), ("W1", w1c)):
            if not cs:
                continue
            a = next(c for c in cs if c.transport == tr)
            b = next(c for c in cs if c.transport == "tcp")
            ratio_lines.append(
                f"{name} {tr} / tcp = {a.median() / b.median():.2f}x"
                + (f" (target >= {TARGETS['w2_ratio']:.1f}x: "
                   f"{verdict(a.median() / b.median() >= TARGETS['w2_ratio'])})"
                   if name == "W2" else "")
                + f"; CPU per unit tcp / {tr} = {cpu_ratio(b, a):.2f}x")
    warning = h.load_warning(info)
    if warning is not None:
        ratio_lines.append(warning)
    for c in w2all + w1c:
        if c.side != "service":
            continue
        spw = [r["splits_per_worker"] for r in c.runs]
        warn = sum(len(r["warnings"]) for r in c.runs)
        codes = {k: v for r in c.runs for k, v in r["exit_codes"].items()
                 if v != 0}
        ratio_lines.append(
            f"{c.label}: {c.runs[0]['splits']} splits, leased per worker "
            f"{spw}; {warn} warn/error lines in the daemons' logs"
            + (f"; non-zero exits {codes}" if codes else ""))
    nhang = len(verify_hangs) + sum(len(c.hangs) for c in configs
                                    if c.side == "service")
    nclients = 2 * len(TRANSPORTS) + len(verify_hangs) + sum(
        2 * (len(c.runs) + len(c.hangs)) for c in configs
        if c.side == "service")
    ratio_lines.append(
        f"client hangs: {nhang} of about {nclients} service clients did "
        f"not exit within {limit_s} s (killed; the run was repeated on a "
        "fresh service)")

    raw = {"workload": WID, "mode": mode, "reps": args.reps,
           "machine": info, "targets": TARGETS,
           "ratios": {"w2": w2_ratio, "w1": w1_ratio},
           "hangs": {"verify": verify_hangs,
                     **{c.what: c.hangs for c in configs
                        if c.side == "service"}},
           "configs": [{"side": c.side, "label": c.label,
                        "transport": c.transport,
                        "parallelism": c.parallelism, "argv": c.argv,
                        "units": c.units, "runs": c.runs}
                       for c in configs]}
    raw_path = h.write_raw((WID if wid == WID else WID + "-" + wid)
                           + ("" if mode == "full" else "-quick"), raw)

    if mode == "full":
        over = " and ".join(
            {"ipc": "ipc://", "tcp": "tcp://127.0.0.1",
             "tcp-wire": "tcp://127.0.0.1 without shared memory",
             "tls": "tls+tcp://127.0.0.1",
             "tls+auth": "tls+tcp://127.0.0.1 with role tokens"}[t]
            for t in TRANSPORTS)
        md = [f"## W5 - W2 and W1 through the service (dispatcher + "
              f"{WORKERS} workers) over {over}", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each, interleaved; 1-min "
              f"load average {info['loadavg_start']} before, "
              f"{info['loadavg_end']} after; cachew CLI "
              f"`{os.path.relpath(cachew, h.REPO_DIR)}`. In-process: "
              "`--threads 2`, parallel=2. Service: a dispatcher and "
              f"{WORKERS} workers with `--threads {WORKER_THREADS}` "
              f"(`--heartbeat-ms {HEARTBEAT_MS}`), fresh for every run, the "
              "client `cachew run` with CACHEW_SERVICE; W2 is "
              f"{sz['passes']} passes over W2's {sz['images']} images "
              f"({n_images} images), W1 N = {sz['w1']:,}. /s is images/s "
              "(W2) or range elements/s (W1). CPU seconds are medians per "
              "run; setup is the seconds of a `range(64) | batch(64)` job "
              "on the same service just before; peak RSS is the largest "
              "of the reps.", "",
              h.md_table(HEADER, rows), ""]
        md += [f"- {line}" for line in ratio_lines]
        h.write_section(wid, "\n".join(md) + "\n")

    print(f"W5 ({mode}, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}, load "
          f"{info['loadavg_start']} -> {info['loadavg_end']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(HEADER, rows))
    for line in ratio_lines:
        print(line)
    print(f"W5 ratio={w2_ratio['tcp']:.2f} "
          f"cachew={w2_tcp.median():.0f}images/s "
          f"peer={w2c[0].median():.0f}images/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"W5: {e}", file=sys.stderr)
        sys.exit(1)
