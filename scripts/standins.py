#!/usr/bin/env python3
"""Local stand-ins for the outside services the demo needs.

  GET  /metrics   service metrics; the first request answers 503 (a flaky API)
  POST /chat      a chat webhook that records the messages it receives
  GET  /chat      the recorded messages

Prints its port on stdout, then serves until killed. Standard library only.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
state = {"metrics_calls": 0, "messages": []}

SERVICES = [
    {"name": "api", "error_rate": 0.01, "latency_ms": 120, "memory": 0.61, "cpu": 0.40},
    {"name": "checkout", "error_rate": 0.09, "latency_ms": 840, "memory": 0.72, "cpu": 0.88},
    {"name": "search", "error_rate": 0.00, "latency_ms": 95, "memory": 0.55, "cpu": 0.30},
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def reply(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/metrics":
            with lock:
                state["metrics_calls"] += 1
                n = state["metrics_calls"]
            if n == 1:
                return self.reply(503, {"error": "metrics backend warming up"})
            return self.reply(200, {"services": SERVICES})
        if self.path == "/chat":
            with lock:
                return self.reply(200, state["messages"])
        self.reply(404, {"error": "no such path"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"null")
        if self.path == "/chat":
            with lock:
                state["messages"].append(body)
            return self.reply(200, {"ok": True})
        self.reply(404, {"error": "no such path"})


class Server(ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True


if __name__ == "__main__":
    srv = Server(("127.0.0.1", 0), Handler)
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
