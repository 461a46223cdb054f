#!/usr/bin/python3
"""HTTP - single-stream read of a 64 MiB object from a loopback HTTP server.

cachew: `cachew run --json` of fixed_length_records(URL, record_bytes=1 MiB)
(streaming through 1 MiB blocks) and of from_list([URL]) | read_file (one
64 MiB element), threads 1.
peer: `curl -s -o /dev/null URL` (the curl CLI on the same libcurl).
Server: nginx (Debian's nginx-light, sendfile on) with a private config on
an ephemeral port; Python's http.server with sendfile when nginx is absent.
Unit: MB/s (10^6 bytes per second) of object bytes on both sides.
Target: cachew >= 1 GB/s.

Usage: /usr/bin/python3 bench/w_http.py [--quick] [--reps R]  (or bench/run HTTP)
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

WID = "HTTP"
SIZE = 64 << 20
RECORD = 1 << 20
TARGET_MBPS = 1000.0

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    client_body_temp_path {dir}/tmp;
    proxy_temp_path {dir}/tmp;
    fastcgi_temp_path {dir}/tmp;
    uwsgi_temp_path {dir}/tmp;
    scgi_temp_path {dir}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/www;
    }}
}}
"""

PY_SERVER = r"""
import http.server, os, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def copyfile(self, src, dst):
        self.connection.sendfile(src)
os.chdir(sys.argv[1])
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def await_port(port, proc):
    for _ in range(200):
        if proc.poll() is not None:
            raise h.BenchError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise h.BenchError("server did not start")


def start_server(tmp):
    port = free_port()
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access(
        "/usr/sbin/nginx", os.X_OK) else None)
    if nginx:
        os.makedirs(os.path.join(tmp, "tmp"), exist_ok=True)
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(dir=tmp, port=port))
        proc = subprocess.Popen([nginx, "-p", tmp, "-c", conf],
                                stderr=subprocess.DEVNULL)
        name = "nginx"
    else:
        proc = subprocess.Popen([sys.executable, "-c", PY_SERVER,
                                 os.path.join(tmp, "www"), str(port)])
        name = "python http.server (sendfile)"
    await_port(port, proc)
    return proc, port, name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="same runs (they take a second each)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    mode = "quick" if args.quick else "full"
    h.check_tools()
    binary = h.cachew_bin()
    curl = shutil.which("curl")
    if curl is None:
        raise h.BenchError("curl missing: apt-get install curl")
    info = h.machine_info()
    tmp = tempfile.mkdtemp(prefix="cachew-http-")
    proc = None
    try:
        os.makedirs(os.path.join(tmp, "www"))
        with open(os.path.join(tmp, "www", "obj.bin"), "wb") as f:
            f.write(os.urandom(SIZE))
        proc, port, server = start_server(tmp)
        url = f"http://127.0.0.1:{port}/obj.bin"
        h.log(f"HTTP ({mode}): {info['cpus']} CPUs, {info['cpu']}, "
              f"server {server}, cachew {binary}")

        def check_bytes(obj):
            if obj.get("bytes") != SIZE:
                raise h.BenchError(f"cachew read {obj.get('bytes')} bytes, "
                                   f"expected {SIZE}")

        def cachew(label, pipeline):
            argv = [binary, "run", "--json", "--quiet", "--threads", "1",
                    pipeline]
            return h.Config("cachew", label, 1, argv, SIZE / 1e6,
                            check=check_bytes)

        stream = cachew("fixed_length_records 1 MiB",
                        f'fixed_length_records("{url}", '
                        f'record_bytes={RECORD})')
        whole = cachew("read_file (one element)",
                       f'from_list(["{url}"]) | read_file')

        def check_curl(obj):
            if int(obj.get("bytes", 0)) != SIZE:
                raise h.BenchError(f"curl read {obj.get('bytes')} bytes")

        peer = h.Config("curl", "curl -o /dev/null", 1,
                        [curl, "-s", "-o", "/dev/null", "-w",
                         '\n{"seconds": %{time_total}, '
                         '"bytes": %{size_download}}\n', url],
                        SIZE / 1e6, check=check_curl)
        configs = [stream, peer, whole]
        h.run_interleaved(configs, args.reps)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    info["loadavg_end"] = h.loadavg()
    ratio = stream.median() / peer.median()
    header = ["side", "config", "threads", "median MB/s", "min", "max",
              "peak RSS MiB"]
    rows = h.table_rows(configs)
    verdict = "met" if stream.median() >= TARGET_MBPS else "MISSED"
    lines = [f"server: {server}; object {SIZE >> 20} MiB; "
             f"cachew streaming / curl = {ratio:.2f}x; target cachew >= "
             f"{TARGET_MBPS:.0f} MB/s: {verdict}"]
    raw = {"workload": WID, "mode": mode, "reps": args.reps, "machine": info,
           "server": server,
           "configs": [{"side": c.side, "label": c.label, "argv": c.argv,
                        "units": c.units, "runs": c.runs} for c in configs]}
    raw_path = h.write_raw("w_http" if mode == "full" else "w_http-quick",
                           raw)
    if mode == "full":
        md = [f"## HTTP - single-stream read of a {SIZE >> 20} MiB object "
              "from a loopback server", "",
              f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), commit "
              f"{info['commit']}, {args.reps} reps each, interleaved; server "
              f"{server}; MB/s = 10^6 bytes/s.", "",
              h.md_table(header, rows), ""] + [f"- {l}" for l in lines]
        h.write_section(WID, "\n".join(md) + "\n")
    print(f"HTTP ({mode}, {args.reps} reps, {info['cpus']} CPUs, "
          f"{info['date']}, commit {info['commit']}); raw: "
          f"{os.path.relpath(raw_path, h.REPO_DIR)}")
    print(h.text_table(header, rows))
    for line in lines:
        print(line)
    print(f"HTTP ratio={ratio:.2f} cachew={stream.median():.0f}MB/s "
          f"peer={peer.median():.0f}MB/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        print(f"HTTP: {e}", file=sys.stderr)
        sys.exit(1)
