#!/usr/bin/env python3
"""httpc_peer.py: the HTTP server tests/unit/test_httpc.c talks to.

Listens on 127.0.0.1 with an OS-chosen port, prints the port on stdout and
serves until stdin closes (so it dies with the test process, even a crashed
one). Python 3 standard library only. Routes:

  /hello              200 "hello world", X-Test: yes, X-Mixed-Case: Value
  /echo               echoes the body; X-Method and X-Echo-<name> per request header
  /status/N           status N, body "status N"
  /sleep/MS           waits MS ms, then 200 "slept"
  /hang               never answers (until the server exits)
  /redirect/N         302 to /redirect/N-1 (with X-Hop: N); /redirect/0 is /hello
  /redirect-to?url=U  302 to U
  /big/N              N bytes of "x" with Content-Length
  /chunked/N          N bytes of "x", chunked, no Content-Length
  /gzip               a gzip-encoded body if the request accepts gzip
  /stats              "max_concurrent=N" since the last /stats/reset
"""
import gzip
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
inflight = 0
max_inflight = 0
marks = {}  # /mark/KEY counts


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def route(self):
        global inflight, max_inflight
        with lock:
            inflight += 1
            max_inflight = max(max_inflight, inflight)
        try:
            self.dispatch()
        finally:
            with lock:
                inflight -= 1

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = route

    def dispatch(self):
        global max_inflight
        u = urllib.parse.urlsplit(self.path)
        parts = u.path.strip("/").split("/")
        n = len(self.headers.get("Content-Length") or "") and int(self.headers["Content-Length"])
        body = self.rfile.read(n) if n else b""
        head = parts[0]
        arg = parts[1] if len(parts) > 1 else ""
        if head == "hello":
            self.send(200, b"hello world", [("X-Test", "yes"), ("X-Mixed-Case", "Value")])
        elif head == "echo":
            hs = [("X-Method", self.command)]
            hs += [("X-Echo-" + k, v) for k, v in self.headers.items()]
            self.send(200, body, hs)
        elif head == "status":
            self.send(int(arg), b"status " + arg.encode())
        elif head == "sleep":
            time.sleep(int(arg) / 1000.0)
            self.send(200, b"slept")
        elif head == "hang":
            time.sleep(3600)
        elif head == "redirect":
            hop = int(arg)
            if hop == 0:
                self.send(200, b"hello world", [("X-Test", "yes")])
            else:
                self.send(302, b"moved", [("Location", "/redirect/%d" % (hop - 1)), ("X-Hop", str(hop))])
        elif head == "redirect-to":
            target = urllib.parse.parse_qs(u.query)["url"][0]
            self.send(302, b"moved", [("Location", target)])
        elif head == "mark":  # count a request under a key; answer its count
            with lock:
                marks[arg] = marks.get(arg, 0) + 1
                n = marks[arg]
            self.send(200, str(n).encode())
        elif head == "seen":  # how many /mark/KEY requests arrived
            with lock:
                n = marks.get(arg, 0)
            self.send(200, str(n).encode())
        elif head == "big":
            self.send(200, b"x" * int(arg))
        elif head == "chunked":
            left = int(arg)
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while left:
                k = min(left, 4096)
                self.wfile.write(b"%x\r\n%s\r\n" % (k, b"x" * k))
                left -= k
            self.wfile.write(b"0\r\n\r\n")
        elif head == "gzip":
            text = b"hello gzip " * 100
            accept = self.headers.get("Accept-Encoding", "")
            if "gzip" in accept:
                self.send(200, gzip.compress(text), [("Content-Encoding", "gzip")])
            else:
                self.send(200, text)
        elif head == "stats":
            with lock:
                if arg == "reset":
                    max_inflight = 0
                out = "max_concurrent=%d" % (max_inflight - 1)  # minus this request
            self.send(200, out.encode())
        else:
            self.send(404, b"no such route")


class Server(ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True

    def handle_error(self, request, client_address):
        # Clients that cancel or time out hang up on us: that is expected.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main():
    srv = Server(("127.0.0.1", 0), Handler)
    sys.stdout.write("%d\n" % srv.server_address[1])
    sys.stdout.flush()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    sys.stdin.read()  # EOF: the test process is gone
    os._exit(0)


if __name__ == "__main__":
    main()
