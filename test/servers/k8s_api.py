#!/usr/bin/env python3
"""k8s_api.py - a loopback stand-in for the Kubernetes API server's scale
subresource, for the provision suite.

It accepts exactly what cachew's kubernetes provisioner must send:

    PATCH /apis/apps/v1/namespaces/<ns>/deployments/<name>/scale
    Authorization: Bearer <--token>
    Content-Type: application/merge-patch+json
    {"spec":{"replicas":N}}

and answers like the API server: a Scale object (200) or a Status object
with a message (4xx/5xx). Anything else is refused with a Status naming
what was wrong (400, 404, 405 or 415) and logged with "bad=" so a test can
assert it never happened. A wrong or missing bearer token gets 401.

--script "409,200,429:1,500" scripts the answers to the first valid
requests, in order ("CODE" or "CODE:RETRY_AFTER_SECONDS"); a 2xx entry or
an exhausted script answers normally.

One line per request goes to --log:

    t=<monotonic seconds> PATCH <path> auth=<Authorization> ctype=<...> body=<body> status=<code> [bad=<why>]

When it is listening it writes its port to --portfile (written to a temp
name and renamed, so a reader never sees half of it). It serves HTTPS with
--tls-cert/--tls-key; the handshake runs in the connection's thread, so a
client that rejects the certificate stalls nobody.
"""
import argparse
import http.server
import json
import os
import ssl
import sys
import threading
import time

LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "cachew-k8s-test/1"

    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()

    def log_message(self, *args):
        pass

    def status_reply(self, code, reason, message, extra=None):
        doc = {"kind": "Status", "apiVersion": "v1", "metadata": {},
               "status": "Failure", "message": message, "reason": reason,
               "code": code}
        self.reply(code, doc, extra)

    def reply(self, code, doc, extra=None):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def record(self, body, code, bad=None):
        h = self.headers
        line = "t=%.3f %s %s auth=%s ctype=%s body=%s status=%d%s\n" % (
            time.monotonic(), self.command, self.path,
            h.get("Authorization", "-"), h.get("Content-Type", "-"),
            body.decode("utf-8", "replace") or "-", code,
            " bad=" + bad if bad else "")
        with LOCK:
            with open(self.server.log_path, "a") as f:
                f.write(line)

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def refuse(self, body, code, why):
        self.record(body, code, why.replace(" ", "_"))
        self.status_reply(code, "BadRequest", why)

    def do_GET(self):
        self.refuse(self.read_body(), 405, "method " + self.command)

    do_PUT = do_GET
    do_POST = do_GET
    do_DELETE = do_GET

    def do_PATCH(self):
        srv = self.server
        body = self.read_body()
        want = "/apis/apps/v1/namespaces/%s/deployments/%s/scale" % (
            srv.namespace, srv.deployment)
        if self.path != want:
            return self.refuse(body, 404, "path " + self.path)
        if self.headers.get("Content-Type") != \
                "application/merge-patch+json":
            return self.refuse(body, 415, "content type %s" %
                               self.headers.get("Content-Type"))
        try:
            doc = json.loads(body)
            replicas = doc["spec"]["replicas"]
            ok = doc == {"spec": {"replicas": replicas}} and \
                isinstance(replicas, int) and replicas >= 0
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            return self.refuse(body, 400, "body %r" % body)
        if self.headers.get("Authorization") != "Bearer " + srv.token:
            self.record(body, 401)
            return self.status_reply(401, "Unauthorized", "Unauthorized")
        with LOCK:
            step = srv.script.pop(0) if srv.script else None
        if step is not None and not 200 <= step[0] < 300:
            code, retry_after = step
            self.record(body, code)
            extra = {"Retry-After": str(retry_after)} \
                if retry_after is not None else None
            reasons = {403: "Forbidden", 409: "Conflict",
                       429: "TooManyRequests"}
            if code == 403:
                msg = ('deployments.apps "%s" is forbidden: User '
                       '"system:serviceaccount:%s:cachew-dispatcher" cannot '
                       'patch resource "deployments/scale" in API group '
                       '"apps" in the namespace "%s"' % (
                           srv.deployment, srv.namespace, srv.namespace))
            elif code == 409:
                msg = ('Operation cannot be fulfilled on deployments.apps '
                       '"%s": the object has been modified; please apply '
                       'your changes to the latest version and try again'
                       % srv.deployment)
            else:
                msg = "scripted %d" % code
            return self.status_reply(code, reasons.get(code, "InternalError"),
                                     msg, extra)
        self.record(body, 200)
        self.reply(200, {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": srv.deployment, "namespace": srv.namespace,
                         "labels": {"app": "cachew-worker"},
                         "annotations": {"note": "a \"quoted\" {value}"},
                         "resourceVersion": "12345"},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas + srv.status_offset,
                       "selector": "app=cachew-worker"}})


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # Clients that reject the certificate (the wrong-CA test) or close
        # early are part of the tests, not errors.
        if isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError,
                                          ssl.SSLError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def get_request(self):
        sock, addr = self.socket.accept()
        if self.tls is None:
            return sock, addr
        sock.settimeout(10)
        return self.tls.wrap_socket(sock, server_side=True,
                                    do_handshake_on_connect=False), addr


def parse_script(text):
    steps = []
    for item in filter(None, text.split(",")):
        code, _, ra = item.partition(":")
        steps.append((int(code), int(ra) if ra else None))
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--portfile", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--deployment", default="cachew-worker")
    ap.add_argument("--script", default="")
    ap.add_argument("--status-offset", type=int, default=0,
                    help="status.replicas = spec.replicas + this")
    ap.add_argument("--tls-cert", default="")
    ap.add_argument("--tls-key", default="")
    args = ap.parse_args()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.log_path = args.log
    srv.token = args.token
    srv.namespace = args.namespace
    srv.deployment = args.deployment
    srv.script = parse_script(args.script)
    srv.status_offset = args.status_offset
    srv.tls = None
    if args.tls_cert:
        srv.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        srv.tls.minimum_version = ssl.TLSVersion.TLSv1_2
        srv.tls.load_cert_chain(args.tls_cert, args.tls_key or None)
    open(args.log, "a").close()
    tmp = args.portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, args.portfile)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
