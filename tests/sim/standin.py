"""standin: the counting HTTP server that the simulation's step bodies call.

Every body posts {key = ctx.step_key, x, f, d, fatal, a, e} to /call. The
stand-in counts calls per key and answers {k, c, n, v, fail, fatal}:

  k      the key (run id and step id)
  c      a number unique to this call, across the whole case
  n      how many calls of this key it has seen, this one included
  v      (x * 37 + 11) mod 997: depends only on what the body sent
  fail   true while n <= f: the body then raises (fatal() when `fatal`)

after waiting d milliseconds (so that kills land while bodies are in
flight). Each call is logged with when it arrived and which engine process
made it (e, the engine's SIM_ENGINE), for the checks.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Call:
    __slots__ = ("c", "key", "n", "t", "engine", "attempt", "answer")

    def __init__(self, c, key, n, t, engine, attempt, answer):
        self.c, self.key, self.n, self.t = c, key, n, t
        self.engine, self.attempt, self.answer = engine, attempt, answer

    def __repr__(self):
        return "call %d of %s (#%d, %s, attempt %s, %s) at %.3f" % (
            self.c, self.key, self.n, self.engine, self.attempt,
            "fails" if self.answer["fail"] else "ok", self.t)


def answer_value(x):
    return (int(x) * 37 + 11) % 997


class StandIn:
    def __init__(self, clock):
        self.clock = clock
        self.lock = threading.Lock()
        self.counts = {}
        self.calls = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    req = json.loads(self.rfile.read(n) or b"{}")
                except ValueError:
                    req = {}
                if self.path != "/call" or not isinstance(req, dict) or "key" not in req:
                    return self.reply(400, {"error": "bad call"})
                ans = standin.record(req)
                d = req.get("d") or 0
                if d:
                    time.sleep(d / 1000.0)
                self.reply(200, ans)

            def reply(self, status, obj):
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the engine was killed while the body waited: that is the point

            def handle(self):
                try:
                    super().handle()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def record(self, req):
        key = str(req["key"])
        with self.lock:
            n = self.counts.get(key, 0) + 1
            self.counts[key] = n
            c = len(self.calls) + 1
            fail = n <= int(req.get("f") or 0)
            ans = {"k": key, "c": c, "n": n, "v": answer_value(req.get("x") or 0), "fail": fail,
                   "fatal": bool(fail and req.get("fatal"))}
            self.calls.append(Call(c, key, n, self.clock(), req.get("e"), req.get("a"), ans))
        return ans

    def snapshot(self):
        with self.lock:
            return list(self.calls)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
