"""moonloop serve's HTTP API: the read paths and their errors, the error shapes
(400/401/404/405/413), authentication, robustness (garbage, slowloris, 1,000
idle connections, a 9 MB body), /metrics, and the CLI's --server mode.

Each class starts one real `moonloop serve --listen 127.0.0.1:0` and reads the
port it prints. The write paths (events, invoke, cancel, rerun, PUT) need the
scheduler's control operations: their tests are in pending_api_write.py; only
the validation that happens before the scheduler is called is tested here.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, Workdir, kill9, wait_until  # noqa: E402

HELLO = """
return {
  id = "hello",
  description = "says hello",
  run = function(ctx)
    local a = ctx.step.run("greet", function() return { text = "hello " .. tostring(ctx.input and ctx.input.who) } end)
    return { greeting = a.text }
  end,
}
"""

NAP = """
return {
  id = "nap",
  run = function(ctx)
    ctx.step.run("before", function() return 1 end)
    ctx.step.sleep("nap", %s)
    return ctx.step.run("after", function() return "rested" end)
  end,
}
"""

BAD = """
return { id = "bad", retries = 0, run = function(ctx)
  ctx.step.run("explode", function() error("the disk is on fire") end)
end }
"""


class Serve:
    """A `moonloop serve` in workdir w, started on a free port.

    .url and .port once it printed "listening on"; .lines is its stderr.
    """

    def __init__(self, w, *args, listen="127.0.0.1:0", env=None):
        self.p = w.serve("--listen", listen, *args, env=env)
        self.url, self.port, self.lines = self.p.url, self.p.port, self.p.stderr_lines

    def stop(self, sig=signal.SIGTERM, timeout=15):
        self.p.send_signal(sig)
        return self.p.wait(timeout=timeout)


def request(port, method, path, body=None, headers=None, timeout=10):
    """One request on a fresh connection: (status, headers with lowercase names, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        headers = dict(headers or {})
        # The types the engine requires (docs/security.md): JSON for POST
        # bodies, Lua for PUT; a test of the check itself passes its own.
        if body and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "text/x-lua" if method == "PUT" else "application/json"
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def jrequest(port, method, path, body=None, headers=None, timeout=10):
    """As request, with the body parsed as JSON."""
    st, h, data = request(port, method, path, body, headers, timeout)
    return st, h, json.loads(data) if data else None


def raw(port, data, timeout=5.0):
    """Send raw bytes; return what the server answers until it closes (or the timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        s.sendall(data)
        end = time.time() + timeout
        while time.time() < end:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out and _complete(out):
                break
    finally:
        s.close()
    return out


def _complete(resp):
    head, _, body = resp.partition(b"\r\n\r\n")
    m = re.search(rb"content-length: *(\d+)", head, re.I)
    return m is not None and len(body) >= int(m.group(1))


def parse_raw(resp):
    """(status, headers, body) of a raw HTTP/1.1 response."""
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


class ApiTestBase(unittest.TestCase):
    """One workdir and one serve for the whole class."""
    config = {"limits": '{ event = "1KB" }'}
    serve_env = {"MOONLOOP_HTTP_TIMEOUT": "2s"}
    listen = "127.0.0.1:0"

    @classmethod
    def setUpClass(cls):
        cls.w = Workdir(config=cls.config)
        cls.w.write("skills/hello.lua", HELLO)
        cls.w.write("skills/bad.lua", BAD)
        cls.w.write("skills/nap.lua", NAP % "0.3")
        cls.prepare()
        cls.srv = Serve(cls.w, listen=cls.listen, env=cls.serve_env)
        cls.port = cls.srv.port

    @classmethod
    def prepare(cls):
        pass

    @classmethod
    def tearDownClass(cls):
        cls.w.close()

    def assertError(self, status, body, want_status, want_code, *words):
        self.assertEqual(status, want_status, body)
        self.assertIsInstance(body, dict, body)
        self.assertEqual(set(body), {"error"}, body)
        self.assertEqual(set(body["error"]), {"code", "message"}, body)
        self.assertEqual(body["error"]["code"], want_code, body)
        for w in words:
            self.assertIn(w, body["error"]["message"])

    def get(self, path, **kw):
        return jrequest(self.port, "GET", path, **kw)

    def post(self, path, body, **kw):
        return jrequest(self.port, "POST", path, body, **kw)


class ApiReadTest(ApiTestBase):
    @classmethod
    def prepare(cls):
        # History made by `moonloop run` before serving: two completed, one failed.
        r1 = cls.w.ml("run", "skills/hello.lua", "--data", '{"who":"ada"}', check=0)
        r2 = cls.w.ml("run", "skills/bad.lua", check=1)
        r3 = cls.w.ml("run", "skills/hello.lua", "--data", '{"who":"bo"}', check=0)
        cls.ids = [cls.run_id(r) for r in (r3, r2, r1)]  # newest first

    @staticmethod
    def run_id(r):
        return next(l.split()[1] for l in r.stderr.splitlines() if l.startswith("run "))

    # ---- runs ----

    def test_list_runs_newest_first_with_filters_and_paging(self):
        st, h, b = self.get("/v1/runs")
        self.assertEqual(st, 200)
        self.assertTrue(h["content-type"].startswith("application/json"))
        self.assertEqual(int(h["content-length"]), len(json.dumps(b, separators=(",", ":")).encode()))
        mine = [r["id"] for r in b["runs"] if r["id"] in self.ids]
        self.assertEqual(mine, self.ids)
        self.assertIsNone(b["next"])
        self.assertNotIn("steps", b["runs"][0])
        self.assertEqual([r["id"] for r in self.get("/v1/runs?skill=bad")[2]["runs"]], [self.ids[1]])
        self.assertEqual([r["id"] for r in self.get("/v1/runs?status=failed")[2]["runs"]], [self.ids[1]])
        self.assertEqual(len(self.get("/v1/runs?skill=hello&status=completed")[2]["runs"]), 2)
        self.assertEqual(len(self.get("/v1/runs?since=1h")[2]["runs"]), 3)
        self.assertEqual(len(self.get("/v1/runs?since=2000-01-01T00:00:00Z")[2]["runs"]), 3)
        self.assertEqual(self.get("/v1/runs?since=2999-01-01T00:00:00Z")[2]["runs"], [])
        self.assertEqual(self.get("/v1/runs?trigger=cron")[2]["runs"], [])
        # Paging: limit, then before=next until next is null.
        self.assertEqual(len(self.get("/v1/runs?skill=&status=")[2]["runs"]), 3)  # empty: no filter
        seen, path = [], "/v1/runs?limit=1"
        page = self.get("/v1/runs?limit=1")[2]
        self.assertEqual([r["id"] for r in page["runs"]], self.ids[:1])
        self.assertEqual(page["next"], self.ids[0])
        while True:
            page = self.get(path)[2]
            seen += [r["id"] for r in page["runs"]]
            if page["next"] is None:
                break
            path = "/v1/runs?limit=1&before=" + page["next"]
        self.assertEqual(seen, [i for i in self.ids])

    def test_list_runs_bad_parameters_are_400_naming_them(self):
        cases = {
            "limit=0": "limit", "limit=1001": "limit", "limit=ten": "limit",
            "status=done": "status", "since=yesterday": "since", "colour=red": "colour",
            "before=not-an-id!": "before", "skill=Bad%20Skill": "skill", "limit=%zz": "limit",
            "trigger=EVENT": "trigger", "trigger=bogus": "trigger", "before=zzzz": "before",
            "parent=01J0000000000000000000000I": "parent",
            # Given twice, a parameter is refused rather than one taken.
            "limit=1&limit=5": "'limit' is given twice", "status=failed&skill=hello&status=completed": "status",
        }
        for q, word in cases.items():
            st, _, b = self.get("/v1/runs?" + q)
            self.assertError(st, b, 400, "invalid", word)

    def test_get_run_is_the_design_record_with_steps(self):
        st, _, b = self.get("/v1/runs/" + self.ids[0])
        self.assertEqual(st, 200)
        for k in ("id", "skill", "version", "status", "trigger", "parent_id", "input", "output",
                  "error", "created_at", "started_at", "ended_at", "steps"):
            self.assertIn(k, b)
        self.assertEqual(b["output"], {"greeting": "hello bo"})
        self.assertEqual(b["steps"][0]["id"], "greet")
        # The same record `moonloop trace --json` prints from the file.
        self.assertEqual(b, self.w.json("trace", self.ids[0]))
        failed = self.get("/v1/runs/" + self.ids[1])[2]
        self.assertEqual(failed["status"], "failed")
        self.assertIn("the disk is on fire", failed["error"]["message"])

    def test_unknown_run_is_404(self):
        for rid in ("01J00000000000000000000000", "no-such-run", "%00x", "x" * 300):
            st, _, b = self.get("/v1/runs/" + rid)
            self.assertError(st, b, 404, "not_found", "no run")
        st, _, b = self.get("/v1/runs/%C3%A9t%C3%A9")  # non-ASCII is echoed as '?', valid JSON
        self.assertError(st, b, 404, "not_found")

    # ---- skills ----

    def test_skills_list_and_one(self):
        st, _, b = self.get("/v1/skills")
        self.assertEqual(st, 200)
        self.assertEqual([s["id"] for s in b["skills"]], ["bad", "hello", "nap"])
        st, _, s = self.get("/v1/skills/hello")
        self.assertEqual(st, 200)
        for k in ("id", "version", "description", "triggers", "versions", "error"):
            self.assertIn(k, s)
        self.assertEqual(s["description"], "says hello")
        self.assertEqual(len(s["version"]), 64)
        self.assertEqual(s["versions"][0]["version"], s["version"])
        self.assertIsNone(s["error"])
        st, _, b = self.get("/v1/skills/nosuch")
        self.assertError(st, b, 404, "not_found", "nosuch")
        st, _, b = self.get("/v1/skills/Not%20A%20Skill")
        self.assertError(st, b, 404, "not_found")

    # ---- the error shapes ----

    def test_unknown_paths_are_404(self):
        for path in ("/v2/runs", "/v1", "/v1/run", "/v1/runs/a/b/c/d", "/favicon.ico",
                     "/v1/skills/hello/invoke/now", "/v1/runs/x/pause"):
            st, h, b = self.get(path)
            self.assertError(st, b, 404, "not_found", "no such path")
            self.assertTrue(h["content-type"].startswith("application/json"))

    def test_wrong_method_is_405_with_allow(self):
        cases = [("DELETE", "/v1/runs", "GET"), ("POST", "/v1/runs", "GET"),
                 ("DELETE", "/v1/events", "POST"), ("PUT", "/v1/events", "GET"),
                 ("GET", "/v1/runs/01J00000000000000000000000/cancel", "POST"),
                 ("GET", "/v1/runs/01J00000000000000000000000/rerun", "POST"),
                 ("GET", "/v1/skills/hello/invoke", "POST"), ("PATCH", "/v1/skills/hello", "PUT"),
                 ("POST", "/metrics", "GET"), ("PATCH", "/", "GET")]
        for method, path, allowed in cases:
            st, h, b = jrequest(self.port, method, path)
            self.assertError(st, b, 405, "method_not_allowed", method)
            self.assertIn(allowed, h["allow"])

    def test_head_answers_headers_only(self):
        st, h, data = request(self.port, "HEAD", "/v1/skills")
        self.assertEqual(st, 200)
        self.assertEqual(data, b"")
        self.assertGreater(int(h["content-length"]), 10)
        # On a kept-alive connection no body follows the headers: the next
        # answer starts right after them.
        for path in ("/v1/skills/hello", "/metrics", "/"):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(b"HEAD %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                      b"GET /v1/skills HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                      % path.encode())
            out = b""
            while True:  # until the server closes, after the second answer
                b = s.recv(65536)
                if not b:
                    break
                out += b
            s.close()
            first, rest = out.split(b"\r\n\r\n", 1)
            self.assertTrue(first.startswith(b"HTTP/1.1 200"), first)
            self.assertTrue(rest.startswith(b"HTTP/1.1 200"), (path, rest[:80]))

    def test_events_bodies_are_validated_before_anything_is_written(self):
        bad = [
            ("{nope", 400, "malformed JSON"),
            ('{"name": "a"} x', 400, "malformed JSON"),
            ("", 400, "empty"),
            ("42", 400, "got a number"),
            ("[]", 400, "empty"),
            ('{"data": 1}', 400, "name"),
            ('{"name": ""}', 400, "name"),
            ('{"name": "%s"}' % ("n" * 257), 400, "name"),
            ('{"name": 7}', 400, "name"),
            ('{"name": "a", "id": ""}', 400, "id"),
            ('{"name": "a", "id": 5}', 400, "id"),
            ('{"name": "a", "colour": 1}', 400, "colour"),
            ('{"name": "a", "name": "b"}', 400, "twice"),
            ('[{"name": "a"}, {"name": ""}]', 400, "events[1]"),
            ('[{"name": "a"}, 3]', 400, "events[1]"),
            ('{"name": "a", "data": "%s"}' % ("x" * 2000), 413, "limits.event"),
            ('[{"name": "a"}, {"name": "b", "data": "%s"}]' % ("x" * 2000), 413, "events[1]"),
            # cJSON would cut the string at the NUL, and read 1e400 as infinity:
            # refused, rather than stored as something else than was sent.
            ('{"name": "a", "data": "x\\u0000y"}', 400, "\\u0000"),
            ('{"name": "a", "id": "k\\u0000a"}', 400, "\\u0000"),
            ('{"name": "a", "data": {"n": [1, 1e400]}}', 400, "$.data.n[2] is out of range"),
            ("{bad json", 400, "line 1 column"),
        ]
        for body, status, word in bad:
            st, _, b = self.post("/v1/events", body)
            self.assertError(st, b, status, "invalid" if status == 400 else "too_large", word)
        st, _, b = jrequest(self.port, "POST", "/v1/events", b'{"name": "caf\xff"}')
        self.assertError(st, b, 400, "invalid", "UTF-8")
        st, _, b = jrequest(self.port, "POST", "/v1/events", b'{"name": "a\x00"}')
        self.assertError(st, b, 400, "invalid", "NUL")
        many = json.dumps([{"name": "e"}] * 10001)
        st, _, b = self.post("/v1/events", many)
        self.assertError(st, b, 413, "too_large", "too many events")
        # Nothing of this reached the database.
        self.assertEqual(self.get("/v1/runs?trigger=event")[2]["runs"], [])

    def test_invoke_and_put_bodies_are_validated(self):
        bad = [
            ('{"wait": 301}', 400, "wait"), ('{"wait": -1}', 400, "wait"),
            ('{"wait": "soon"}', 400, "wait"), ('[1]', 400, "expected an object"),
            ('{"data": 1, "input": 2}', 400, "input"), ('{"data": ', 400, "malformed JSON"),
            ('{"data": "%s"}' % ("x" * 2000), 413, "limits.event"),
        ]
        for body, status, word in bad:
            st, _, b = self.post("/v1/skills/hello/invoke", body)
            self.assertError(st, b, status, "invalid" if status == 400 else "too_large", word)
        st, _, b = self.post("/v1/skills/NoSuch!/invoke", "{}")
        self.assertError(st, b, 404, "not_found")
        st, _, b = jrequest(self.port, "PUT", "/v1/skills/Bad.Id", "return {}")
        self.assertError(st, b, 400, "invalid", "bad skill id")
        st, _, b = jrequest(self.port, "PUT", "/v1/skills/hello", "")
        self.assertError(st, b, 400, "invalid", "empty")
        st, _, b = self.post("/v1/runs/not-a-run!/cancel", "")
        self.assertError(st, b, 404, "not_found")

    # ---- robustness ----

    def test_body_over_8mb_is_413_without_reading_it(self):
        # Content-Length says 9 MB; the server answers at once, without the body.
        t = time.time()
        resp = raw(self.port, b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"Content-Type: application/json\r\nContent-Length: 9437184\r\n\r\n{")
        self.assertLess(time.time() - t, 2)
        st, h, body = parse_raw(resp)
        self.assertEqual(st, 413)
        self.assertEqual(h["content-type"], "application/json")
        err = json.loads(body)
        self.assertError(st, err, 413, "too_large", "8.0 MB")
        # A chunked body is cut off once it passes 8 MB, before its end.
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"PUT /v1/skills/big HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (1 << 20, b"-" * (1 << 20))
        sent = 0
        try:
            for _ in range(12):
                s.sendall(chunk)
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
        s.settimeout(5)
        resp = b""
        try:
            while not _complete(resp):
                b = s.recv(65536)
                if not b:
                    break
                resp += b
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
        self.assertTrue(resp, "no answer to a 12 MB chunked body (sent %d MB)" % sent)
        st, _, body = parse_raw(resp)
        self.assertError(st, json.loads(body), 413, "too_large")
        self.assertEqual(self.get("/v1/skills")[0], 200)

    def test_garbage_does_not_stop_the_server(self):
        import random
        rnd = random.Random(7)
        payloads = [
            b"\x00\x01\x02garbage\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
            b"GET /v1/runs HTTP/1.1\r\nNo colon here\r\n\r\n",
            b"GET /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 200000 + b"\r\n\r\n",
            b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
            b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nContent-Length: 9\r\n\r\nabc",
            b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"G\xffT /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            b"GET /v1/runs/\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            b"GET http://example.com/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            b"GET /v1/runs?limit=" + b"9" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        ]
        payloads += [bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 400)))
                     for _ in range(150)]
        payloads += [b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" % (n, j)
                     for n, j in ((len(x), x) for x in (b"{" * 2000, b"[" * 5000, b'"\\u', b"\xc3"))]
        for p in payloads:
            out = raw(self.port, p, timeout=3)
            if out:
                self.assertTrue(out.startswith(b"HTTP/1.1 "), out[:80])
                st = int(out.split()[1])
                self.assertTrue(400 <= st < 500 or st == 200, out[:200])
        st, _, b = self.get("/v1/skills")
        self.assertEqual(st, 200)

    def test_slowloris_is_dropped_and_others_are_served(self):
        # The class's serve has MOONLOOP_HTTP_TIMEOUT=2s: a client trickling
        # its headers is cut off after 2 s, and the server answers others meanwhile.
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        req = b"GET /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"z" * 100
        t = time.time()
        closed_after = None
        for i, byte in enumerate(req):
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.time() - t
                break
            s.settimeout(0.15)
            try:
                d = s.recv(100)
                self.assertEqual(d, b"", "a trickling client was answered: %r" % d)
                closed_after = time.time() - t
                break
            except socket.timeout:
                pass
            if i == 3:
                self.assertEqual(self.get("/v1/skills")[0], 200)
        s.close()
        self.assertIsNotNone(closed_after, "the slow client was never dropped")
        self.assertGreater(closed_after, 1.5)
        self.assertLess(closed_after, 4.0)

    def test_thousand_idle_connections_do_not_block_others(self):
        socks = []
        try:
            for _ in range(1000):
                socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
            # Blocked, the request would time out (a bound on hangs only).
            st, _, b = self.get("/v1/skills", timeout=5)
            self.assertEqual(st, 200)

            def conns():
                text = request(self.port, "GET", "/metrics")[2]
                return int(re.search(rb"^moonloop_http_connections (\d+)$", text, re.M).group(1))
            # A loaded machine's engine may not have accepted the last few
            # from the listen backlog yet.
            wait_until(lambda: conns() >= 1000, timeout=10, what=lambda: "1000 connections, not %d" % conns())
        finally:
            for s in socks:
                s.close()
        # They are all closed by the server in time; it still answers.
        wait_until(lambda: int(re.search(rb"^moonloop_http_connections (\d+)$",
                                         request(self.port, "GET", "/metrics")[2], re.M).group(1)) < 10,
                   timeout=5, what="the closed connections to be gone")

    # ---- /metrics and / ----

    def test_metrics_is_prometheus_text(self):
        self.get("/v1/skills/nosuch")  # at least one 404 is counted
        st, h, text = request(self.port, "GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertEqual(h["content-type"], "text/plain; version=0.0.4; charset=utf-8")
        samples, types = {}, {}
        sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
                            r'(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*)?\})? (-?[0-9.]+(e[+-]?[0-9]+)?)$')
        for line in text.decode().splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                self.assertIn(kind, ("counter", "gauge", "histogram"))
                types[name] = kind
                continue
            if line.startswith("# HELP "):
                continue
            m = sample.match(line)
            self.assertIsNotNone(m, "not a Prometheus sample line: %r" % line)
            # A histogram's samples are NAME_bucket, NAME_sum and NAME_count.
            family = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
            family = family if types.get(family) == "histogram" else m.group(1)
            self.assertIn(family, types, "sample before its TYPE: %r" % line)
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(5))
        for name in ("moonloop_resumes_total", "moonloop_commits_total",
                     "moonloop_committed_entries_total", "moonloop_active_runs",
                     "process_start_time_seconds"):
            self.assertIn(name, samples)
        self.assertGreaterEqual(samples['moonloop_http_requests_total{code="404"}'], 1)
        self.assertLess(abs(samples["process_start_time_seconds"] - time.time()), 3600)
        before = samples.get('moonloop_http_requests_total{code="200"}', 0)
        request(self.port, "GET", "/v1/skills")
        after = re.search(rb'moonloop_http_requests_total\{code="200"\} (\d+)',
                          request(self.port, "GET", "/metrics")[2]).group(1)
        self.assertGreaterEqual(int(after), before + 2)

    def test_index_is_the_dashboard(self):
        # (The dashboard itself is tested in test_dashboard.py.)
        st, h, data = request(self.port, "GET", "/")
        self.assertEqual(st, 200)
        self.assertTrue(h["content-type"].startswith("text/html"))
        self.assertIn(b'src="/app.js"', data)

    # ---- the engine keeps working while it serves ----

    def test_runs_complete_while_serving_http(self):
        # A run queued by the CLI (file mode) is claimed by serve and
        # finishes, while HTTP requests keep being answered.
        r = self.w.ml("invoke", "nap", check=0)
        run_id = r.stdout.strip()
        answered, stop = [0], threading.Event()

        def hammer():
            while not stop.is_set():
                if request(self.port, "GET", "/v1/runs?limit=5")[0] == 200:
                    answered[0] += 1

        t = threading.Thread(target=hammer)
        t.start()
        try:
            rec = wait_until(lambda: (lambda b: b if b["status"] == "completed" else None)(
                self.get("/v1/runs/" + run_id)[2]), timeout=10, what="the queued run to complete")
        finally:
            stop.set()
            t.join()
        self.assertEqual(rec["output"], "rested")
        self.assertEqual([s["id"] for s in rec["steps"]], ["before", "nap", "after"])
        self.assertGreater(answered[0], 10)

    # ---- the CLI's --server mode ----

    def cli(self, *args, env=None, check=None):
        e = dict(self.w.env)
        e.update(env or {})
        r = subprocess.run([BIN] + list(args), cwd=self.w.path, env=e, capture_output=True,
                           text=True, timeout=60)
        if check is not None:
            self.assertEqual(r.returncode, check, r.stderr)
        return r

    def test_cli_server_mode_prints_what_the_file_mode_prints(self):
        url = self.srv.url
        # Another database path: the answers can only come from the server.
        env = {"MOONLOOP_DB": os.path.join(self.w.path, "elsewhere.db")}
        for args in (["runs", "--json"], ["runs", "--json", "--skill", "hello"],
                     ["runs", "--json", "--status", "failed", "--since", "1h", "--limit", "2"],
                     ["trace", self.ids[0], "--json"], ["skills", "--json"]):
            via = self.cli(*args, "--server", url, env=env, check=0).stdout
            direct = self.cli(*args, check=0).stdout
            self.assertEqual(json.loads(via), json.loads(direct), args)
        self.assertFalse(os.path.exists(env["MOONLOOP_DB"]))
        text = self.cli("trace", self.ids[0], env=dict(env, MOONLOOP_URL=url), check=0).stdout
        self.assertIn("run " + self.ids[0], text)
        self.assertIn("greet", text)
        table = self.cli("runs", "--server", url, env=env, check=0).stdout
        self.assertIn("RUN", table.splitlines()[0])
        self.assertIn(self.ids[1], table)
        self.assertIn("hello", self.cli("skills", "--server", url + "/", env=env, check=0).stdout)

    def test_cli_server_mode_errors_and_exit_statuses(self):
        url = self.srv.url
        r = self.cli("trace", "01J00000000000000000000000", "--server", url, check=1)
        self.assertIn("no run with id", r.stderr)
        r = self.cli("runs", "--status", "bogus", "--server", url, check=2)
        self.assertIn("status must be one of", r.stderr)
        r = self.cli("runs", "--limit", "5000", "--server", url, check=2)
        self.assertIn("limit", r.stderr)
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))
        port = dead.getsockname()[1]
        dead.close()
        for cmd in (["runs"], ["trace", "x"], ["skills"], ["invoke", "hello"]):
            r = self.cli(*cmd, "--server", "http://127.0.0.1:%d" % port, check=1)
            self.assertIn("cannot reach the engine at http://127.0.0.1:%d" % port, r.stderr)
        r = self.cli("runs", env={"MOONLOOP_URL": "http://127.0.0.1:%d" % port}, check=1)
        self.assertIn("cannot reach the engine", r.stderr)
        r = self.cli("runs", "--server", "ftp://x", check=2)
        self.assertIn("--server must be a URL", r.stderr)


class ApiNumbersTest(ApiTestBase):
    """Numbers go through the engine exactly as sent: cJSON's printer wrote
    15 significant digits whenever they came within an epsilon of the
    value, so a run got 0.3 for 0.30000000000000004, 9.00719925474099e+15
    for 2^53, and infinity's neighbour read back as infinity."""
    NUMS = {"a": 0.30000000000000004, "b": 9007199254740992, "c": 1.0000000000000002,
            "d": 1.7976931348623157e308, "e": 5e-324, "f": [12345.678901234567, -1e15, 0.1]}

    @classmethod
    def prepare(cls):
        cls.w.write("skills/echo.lua", 'return { id = "echo", run = function(ctx) return ctx.input end }\n')

    def test_numbers_in_data_and_events_are_kept_exactly(self):
        st, _, b = self.post("/v1/skills/echo/invoke", {"data": self.NUMS, "wait": 30})
        self.assertEqual(st, 200, b)
        self.assertEqual(b["output"], self.NUMS)
        st, _, rec = self.get("/v1/runs/" + b["run_id"])
        self.assertEqual((rec["input"], rec["output"]), (self.NUMS, self.NUMS))
        st, _, b = self.post("/v1/events", {"name": "numbers", "data": self.NUMS})
        self.assertEqual(st, 202, b)
        st, _, b = self.get("/v1/events?limit=1")
        self.assertEqual(b["events"][0]["data"], self.NUMS)
        # The CLI through the server: the request it sends, the answer it prints.
        r = subprocess.run([BIN, "invoke", "echo", "--data", json.dumps(self.NUMS), "--wait", "--server",
                            self.srv.url], cwd=self.w.path, env=self.w.env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), self.NUMS)


class ApiAuthTest(ApiTestBase):
    """A token is set: every path needs it; binding 0.0.0.0 is then allowed."""
    token = "s3cret-t0ken-value"
    serve_env = {"MOONLOOP_TOKEN": token}
    listen = "0.0.0.0:0"

    def test_every_path_needs_the_token(self):
        # But the dashboard's static files (GET /, /app.js, /style.css: no
        # data in them; the page asks for the token): see test_dashboard.py.
        for method, path in (("GET", "/v1/runs"), ("GET", "/metrics"), ("POST", "/"),
                             ("GET", "/nowhere"), ("POST", "/v1/events"),
                             ("PUT", "/v1/skills/x"), ("GET", "/v1/skills")):
            st, h, b = jrequest(self.port, method, path)
            self.assertError(st, b, 401, "unauthenticated", "token")
            self.assertTrue(h["www-authenticate"].startswith("Bearer"))

    def test_wrong_tokens_are_refused(self):
        t = self.token
        for value in ("Bearer", "Bearer ", "Bearer " + t[:-1], "Bearer " + t + "x",
                      "Bearer " + t[:-1] + "X", "Bearer X" + t[1:], "Bearer " + t.upper(),
                      "Basic " + t, t, "Bearer  " + t + " extra", "Bearer " + "a" * 5000):
            st, h, b = self.get("/v1/skills", headers={"Authorization": value})
            self.assertError(st, b, 401, "unauthenticated", "wrong token")
            self.assertIn("www-authenticate", h)

    def test_right_token_is_accepted(self):
        for value in ("Bearer " + self.token, "bearer " + self.token, "Bearer   " + self.token):
            st, _, b = self.get("/v1/skills", headers={"Authorization": value})
            self.assertEqual(st, 200, b)
        st, _, _ = request(self.port, "GET", "/metrics",
                           headers={"Authorization": "Bearer " + self.token})
        self.assertEqual(st, 200)

    def test_cli_sends_the_token_from_its_variable(self):
        url = "http://127.0.0.1:%d" % self.port
        env = dict(self.w.env, MOONLOOP_TOKEN=self.token)
        r = subprocess.run([BIN, "skills", "--json", "--server", url], cwd=self.w.path, env=env,
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("hello", r.stdout)
        env.pop("MOONLOOP_TOKEN")
        r = subprocess.run([BIN, "skills", "--server", url], cwd=self.w.path, env=env,
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("MOONLOOP_TOKEN", r.stderr)


class ApiStartTest(unittest.TestCase):
    """Starting and stopping serve: refused addresses, shutdown, resuming runs."""

    def setUp(self):
        self.w = Workdir()
        self.w.write("skills/hello.lua", HELLO)

    def tearDown(self):
        self.w.close()

    def test_no_token_refuses_non_loopback_addresses(self):
        for addr in ("0.0.0.0:0", "[::]:0"):
            r = self.w.ml("serve", "--listen", addr, timeout=30, check=2)
            self.assertIn("MOONLOOP_TOKEN", r.stderr)
            self.assertIn("refusing to listen on " + addr, r.stderr)
        self.w.write("moonloop.conf.lua", 'return { token_env = "MY_API_TOKEN" }')
        r = self.w.ml("serve", "--listen", "0.0.0.0:0", timeout=30, check=2)
        self.assertIn("MY_API_TOKEN", r.stderr)
        self.assertEqual(self.w.ml("serve", "--listen", "nonsense", timeout=30).returncode, 2)
        self.assertEqual(self.w.ml("serve", "--listen", "127.0.0.1:99999", timeout=30).returncode, 2)

    def test_loopback_names_bind_and_a_busy_port_fails(self):
        s = Serve(self.w, listen="localhost:0")
        self.assertTrue(s.url.startswith("http://127.0.0.1:"))
        r = self.w.ml("serve", "--listen", "127.0.0.1:%d" % s.port, "--db", "other.db",
                      timeout=30, check=1)
        self.assertIn("cannot listen on", r.stderr)
        self.assertEqual(s.stop(), 0)

    def test_sigterm_with_many_connections_exits_cleanly(self):
        s = Serve(self.w)
        socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(300)]
        half = socket.create_connection(("127.0.0.1", s.port))
        half.sendall(b"GET /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a request half sent
        t = time.time()
        self.assertEqual(s.stop(), 0)
        self.assertLess(time.time() - t, 6)
        for x in socks + [half]:
            x.close()

    def test_serve_resumes_a_crashed_run_and_serves_meanwhile(self):
        self.w.write("nap.lua", NAP % "1")
        p = self.w.start("run", "nap.lua")
        run_id = wait_until(lambda: next((r["id"] for r in self.w.runs(status="sleeping")), None),
                            timeout=10, what="the run to sleep")
        kill9(p)
        s = Serve(self.w)
        st, _, b = jrequest(s.port, "GET", "/v1/runs/" + run_id)
        self.assertEqual(st, 200)
        self.assertIn(b["status"], ("sleeping", "running", "queued", "completed"))
        rec = wait_until(lambda: (lambda b: b if b["status"] == "completed" else None)(
            jrequest(s.port, "GET", "/v1/runs/" + run_id)[2]), timeout=15,
            what="the resumed run to complete")
        self.assertEqual(rec["output"], "rested")
        self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main()
