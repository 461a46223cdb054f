#!/usr/bin/python3
"""What a TLS connection costs a dispatcher (issue 14): N peers finish a
TLS handshake with a `cachewd --role=dispatcher` on tls+tcp://127.0.0.1
(role tokens on, no client certificates: what a stranger reaches), send
the SP header, a length prefix claiming 32 MiB + 4 and 64 KiB, and stay
connected while the dispatcher resets each (the attack of cluster/tls
tls_hostile_claims_of_32_mib_reserve_nothing). Prints the dispatcher's RSS
before and after, and with --dhat the bytes allocated per connection by
allocation site (valgrind --tool=dhat, a run with N peers minus one with
none).

Usage: /usr/bin/python3 bench/tls_conn_memory.py [--build build/asan]
       [--peers 300] [--layer cachew|nng] [--dhat]
"""
import argparse, json, os, re, socket, ssl, subprocess, sys, tempfile, time
from collections import defaultdict

HELLO = bytes([0, ord("S"), ord("P"), 0, 0, 0x30, 0, 0])
ALLOC = ("malloc", "calloc", "realloc", "CRYPTO_malloc", "CRYPTO_zalloc",
         "CRYPTO_realloc", "CRYPTO_clear_realloc")


def certs(d):
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    subprocess.run(f"""set -e; cd {d}
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > leaf.ext
openssl req -x509 {ec} -keyout ca.key -out ca.pem -days 1 -subj /CN=ca
openssl req -new {ec} -keyout server.key -out server.csr -subj /CN=localhost
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
  -days 1 -extfile leaf.ext -out server.pem""", shell=True, check=True,
                   capture_output=True)
    with open(f"{d}/tokens", "w") as f:
        f.write("worker w " + "a" * 32 + "\nclient tenant " + "b" * 32 + "\n")
    os.chmod(f"{d}/tokens", 0o600)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def settled(pid):
    """RSS once two samples 100 ms apart agree within 256 kB (5 s at most)."""
    last = rss(pid)
    for _ in range(50):
        time.sleep(0.1)
        now = rss(pid)
        if abs(now - last) < 256:
            break
        last = now
    return now


def wait_log(path, pattern, count=1, limit_s=120):
    for _ in range(limit_s * 10):
        text = open(path).read()
        if len(re.findall(pattern, text)) >= count:
            return text
        time.sleep(0.1)
    raise SystemExit(f"{path}: no {count} x '{pattern}' within {limit_s} s")


def attack(build, n, env, wrap, d):
    """One dispatcher, n hostile peers: (rss before, rss after, resets)."""
    os.makedirs(f"{d}/work", exist_ok=True)
    log = f"{d}/dispatcher.log"
    with open(log, "w") as lf:
        p = subprocess.Popen(wrap + [
            f"{build}/cachewd", "--role=dispatcher", "--listen",
            "tls+tcp://127.0.0.1:0", "--work-dir", f"{d}/work",
            "--tls-cert", f"{d}/server.pem", "--tls-key", f"{d}/server.key",
            "--tls-ca", f"{d}/ca.pem", "--tls-client-auth", "none",
            "--auth-tokens", f"{d}/tokens"], stdout=lf, stderr=lf, env=env)
    peers = []
    try:
        url = re.search(r"event=listening.*?url=(\S+)",
                        wait_log(log, r"event=listening")).group(1)
        host, port = url.split("//")[1].rsplit(":", 1)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        claim = ((32 << 20) + 4).to_bytes(8, "big")
        body = b"\x80" + b"x" * 65535

        def peer():
            s = ctx.wrap_socket(socket.create_connection((host, int(port))))
            for b in (HELLO, claim, body):
                try:
                    s.sendall(b)
                except OSError:
                    break
            return s

        # One first, held until it is reset, so that the process's
        # one-time allocations are made before the measure.
        first = peer()
        wait_log(log, "action=reset", 1)
        first.close()
        r0 = settled(p.pid)
        peers = [peer() for _ in range(n)]
        text = wait_log(log, "action=reset", n + 1)
        return r0, settled(p.pid), text.count("action=reset") - 1
    finally:
        for s in peers:
            s.close()
        p.terminate()
        p.wait()


def dhat_sites(path):
    d = json.load(open(path))
    out = defaultdict(lambda: [0, 0])
    for pp in d["pps"]:
        keep = []
        for f in (d["ftbl"][i] for i in pp["fs"]):
            m = re.search(r": (\S+) \((?:in )?([^)]*)\)", f)
            name, where = (m.group(1), m.group(2).split("/")[-1]) if m \
                else (f, "")
            if name not in ALLOC:
                keep.append(f"{name}@{where}")
            if len(keep) == 3:
                break
        site = " < ".join(keep)
        out[site][0] += pp["tb"]
        out[site][1] += pp["tbk"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--peers", type=int, default=300)
    ap.add_argument("--layer", choices=("cachew", "nng"), default="cachew")
    ap.add_argument("--dhat", action="store_true",
                    help="bytes per connection by site (valgrind, slow: "
                    "use --peers 20 or so)")
    args = ap.parse_args()
    env = dict(os.environ)
    env.pop("CACHEW_TLS_LAYER", None)
    if args.layer == "nng":
        env["CACHEW_TLS_LAYER"] = "nng"
    with tempfile.TemporaryDirectory(prefix="cachew-tlsmem-") as d:
        certs(d)
        load = open("/proc/loadavg").read().split()[0]
        if not args.dhat:
            r0, r1, resets = attack(args.build, args.peers, env, [], d)
            print(f"layer={args.layer} peers={args.peers} resets={resets} "
                  f"rss {r0} -> {r1} kB: +{r1 - r0} kB, "
                  f"{(r1 - r0) / args.peers:.1f} kB per connection "
                  f"(load {load})")
            return
        runs = []
        for n in (0, args.peers):
            out = f"{d}/dhat.{n}.json"
            attack(args.build, n, env, ["valgrind", "--tool=dhat",
                   f"--dhat-out-file={out}", f"--log-file={d}/dhat.log"], d)
            runs.append(dhat_sites(out))
        rows = sorted(((runs[1][k][0] - runs[0][k][0]) / args.peers,
                       (runs[1][k][1] - runs[0][k][1]) / args.peers, k)
                      for k in set(runs[0]) | set(runs[1]))
        rows = [r for r in rows if r[0] != 0][::-1]
        print(f"layer={args.layer}: {sum(r[0] for r in rows) / 1024:.1f} KiB "
              f"in {sum(r[1] for r in rows):.0f} blocks per connection")
        for b, k, site in rows[:25]:
            print(f"{b:9.0f} B {k:6.1f}  {site[:200]}")


if __name__ == "__main__":
    sys.exit(main())
