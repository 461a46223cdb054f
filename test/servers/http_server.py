#!/usr/bin/env python3
"""http_server.py - the loopback HTTP server of the io suite.

Serves the files under --root over HTTP/1.1 with keep-alive, single byte
ranges (206 / 416), strong ETags and If-Match (412), and logs one line per
request to --log:

    conn=<n> GET <path> range=<Range or -> if-match=<If-Match or -> auth=<Authorization or -> amzdate=<X-Amz-Date or ->

<n> numbers the TCP connections, so a test can tell reuse from reconnects.
When it is listening it writes its port to --portfile (written to a temp
name and renamed, so a reader never sees half of it).

Faults are asked for by a first path segment "@k=v,k=v" that is stripped
before the file is looked up; each counts requests per full path:
    cut=N      the first `times` responses (default 1) send all headers and
               N body bytes, then the connection is closed
    times=T    how many responses the fault applies to (999: always)
    status=S   the first `times` responses are status S with a short body
    change=1   every response after the first serves another version of the
               file (each byte xor 0x5a, another ETag)
    noifmatch=1  ignore If-Match (so the client must compare ETags itself)
    shrink=K   every response after the first serves only the file's first
               K bytes (another version: a resume past K is a 416)
    norange=1  ignore Range: always 200 with the whole body
    moved=D    302 to /D<the rest of the path> (a redirect: D has no '/')
    sametoken=1  listings (S3 and GCS) always say there is a next page and
               give the token "0" for it (a store that never ends one)

Emulated object-store endpoints (enough for the listing code):
    GET /storage/v1/b/<bucket>/o?prefix=&pageToken=&maxResults=  GCS JSON
        listing of <root>/<bucket>/, maxResults default 2 (forces pages)
    GET /<bucket>?list-type=2&prefix=&max-keys=&continuation-token=  S3
        ListObjectsV2 XML of <root>/<bucket>/
With --token T every request must carry "Authorization: Bearer T" (401
otherwise).

With --tls-cert PEM --tls-key PEM it serves HTTPS (TLS 1.2+) with that
certificate chain instead; the handshake runs in the connection's thread,
so a client that connects and sends nothing (the readiness probe) or
rejects the certificate stalls nobody.
"""
import argparse
import hashlib
import http.server
import itertools
import json
import os
import socket
import ssl
import sys
import threading
import urllib.parse
from xml.sax.saxutils import escape

LOCK = threading.Lock()
COUNTS = {}
CONN_IDS = itertools.count(1)


def parse_faults(path):
    if not path.startswith("/@"):
        return {}, path
    seg, _, rest = path[2:].partition("/")
    faults = {}
    for kv in seg.split(","):
        k, _, v = kv.partition("=")
        faults[k] = int(v) if v.lstrip("-").isdigit() else v
    return faults, "/" + rest


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "cachew-test/1"

    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()
        self.conn_id = next(CONN_IDS)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def log_request_line(self):
        h = self.headers
        line = "conn=%d %s %s range=%s if-match=%s auth=%s amzdate=%s\n" % (
            self.conn_id, self.command, self.path, h.get("Range", "-"),
            h.get("If-Match", "-"), h.get("Authorization", "-"),
            h.get("X-Amz-Date", "-"))
        with LOCK:
            with open(self.server.log_path, "a") as f:
                f.write(line)

    def reply(self, status, body=b"", ctype="text/plain", extra=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        try:
            self.serve()
        except (BrokenPipeError, ConnectionResetError):
            # The client closed early (a file closed mid-body): expected.
            self.close_connection = True

    def serve(self):
        self.log_request_line()
        token = self.server.token
        if token and self.headers.get("Authorization") != "Bearer " + token:
            return self.reply(401, b"missing or wrong bearer token\n")
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        faults, path = parse_faults(urllib.parse.unquote(url.path))
        if path.startswith("/storage/v1/b/"):
            return self.gcs_list(path, query, faults)
        if "list-type" in query:
            return self.s3_list(path, query, faults)
        with LOCK:
            n = COUNTS.get(self.path.split("?")[0], 0)
            COUNTS[self.path.split("?")[0]] = n + 1
        times = faults.get("times", 1)
        if "status" in faults and n < times:
            return self.reply(int(faults["status"]),
                              b"injected failure\n")
        if "moved" in faults:
            return self.reply(302, b"moved\n", extra={
                "Location": "/%s%s" % (faults["moved"], path)})
        fs_path = os.path.join(self.server.root, path.lstrip("/"))
        if not os.path.isfile(fs_path):
            return self.reply(404, b"not found\n")
        with open(fs_path, "rb") as f:
            data = f.read()
        st = os.stat(fs_path)
        version = 0
        if faults.get("change") and n > 0:
            data = bytes(b ^ 0x5A for b in data)
            version = 1
        if "shrink" in faults and n > 0:
            data = data[:faults["shrink"]]
            version = 2
        etag = '"%x-%x-%d"' % (st.st_size, st.st_mtime_ns, version)
        im = self.headers.get("If-Match")
        if im is not None and not faults.get("noifmatch") and im != etag:
            return self.reply(412, b"precondition failed\n")
        start, end, status = 0, len(data), 200
        rng = self.headers.get("Range")
        if rng and not faults.get("norange") and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a)
            end = min(int(b) + 1, len(data)) if b else len(data)
            if start >= len(data):
                return self.reply(416, b"", extra={
                    "Content-Range": "bytes */%d" % len(data)})
            status = 206
        body = data[start:end]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (
                start, end - 1, len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = faults.get("cut")
        if cut is not None and n < times:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        view = memoryview(body)
        for i in range(0, len(view), 1 << 16):
            self.wfile.write(view[i:i + (1 << 16)])

    def objects(self, bucket, prefix):
        base = os.path.join(self.server.root, bucket)
        out = []
        for dirpath, _, files in os.walk(base):
            for name in files:
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, base)
                if key.startswith(prefix):
                    with open(full, "rb") as f:
                        md5 = hashlib.md5(f.read()).hexdigest()
                    out.append((key, os.path.getsize(full), md5))
        return sorted(out)

    def gcs_list(self, path, query, faults):
        parts = path.split("/")  # '', storage, v1, b, bucket, o
        bucket = parts[4]
        prefix = query.get("prefix", [""])[0]
        page = int(query.get("maxResults", ["2"])[0])
        token = int(query.get("pageToken", ["0"])[0] or 0)
        objs = self.objects(bucket, prefix)
        chunk = objs[token:token + page]
        doc = {"kind": "storage#objects", "items": [
            {"kind": "storage#object", "name": k, "bucket": bucket,
             "size": str(s), "etag": "E" + m, "metadata": {"a": [1, {}]}}
            for k, s, m in chunk]}
        if token + page < len(objs):
            doc["nextPageToken"] = str(token + page)
        if faults.get("sametoken"):
            doc["nextPageToken"] = "0"
        self.reply(200, json.dumps(doc).encode(), "application/json")

    def s3_list(self, path, query, faults):
        bucket = path.strip("/")
        prefix = query.get("prefix", [""])[0]
        page = int(query.get("max-keys", ["1000"])[0])
        token = int(query.get("continuation-token", ["0"])[0] or 0)
        objs = self.objects(bucket, prefix)
        chunk = objs[token:token + page]
        more = token + page < len(objs) or bool(faults.get("sametoken"))
        xml = ['<?xml version="1.0" encoding="UTF-8"?>',
               '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
               '2006-03-01/"><Name>%s</Name><Prefix>%s</Prefix>'
               % (escape(bucket), escape(prefix)),
               "<KeyCount>%d</KeyCount><MaxKeys>%d</MaxKeys>"
               % (len(chunk), page),
               "<IsTruncated>%s</IsTruncated>" % ("true" if more else
                                                  "false")]
        for k, s, m in chunk:
            xml.append("<Contents><Key>%s</Key><Size>%d</Size>"
                       "<ETag>&quot;%s&quot;</ETag></Contents>"
                       % (escape(k), s, m))
        if more:
            xml.append("<NextContinuationToken>%d</NextContinuationToken>"
                       % (0 if faults.get("sametoken") else token + page))
        xml.append("</ListBucketResult>")
        self.reply(200, "".join(xml).encode(), "application/xml")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # Clients that close early (probes, files closed mid-body) are
        # part of the tests, not errors.
        # So are TLS clients that reject the certificate (the untrusted-CA
        # test) and probes that close before the handshake.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--portfile", required=True)
    ap.add_argument("--token", default="")
    ap.add_argument("--tls-cert", default="")
    ap.add_argument("--tls-key", default="")
    args = ap.parse_args()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.root = args.root
    srv.log_path = args.log
    srv.token = args.token
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
