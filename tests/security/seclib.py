"""seclib: what the attacker-driven tests of tests/security share.

Requests are written byte for byte (raw sockets), so a test sends exactly
the headers a browser, a rebinding page or a skill would send, and nothing
a client library would add on its own. The engine is the real binary
(mltest's Workdir and serve).
"""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, SRC, StandIn, Workdir, wait_until  # noqa: E402,F401

# What Chromium 1xx sends with a cross-site request, besides the method's
# own headers (Sec-Fetch-Mode and -Dest depend on the request).
CHROME_UA = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
             "Chrome/120.0.0.0 Safari/537.36")


def http_raw(port, method, path, headers, body=b"", timeout=10.0):
    """Send one request with exactly these headers (a list of (name, value),
    in order; Content-Length is added when there is a body or the method is
    POST/PUT, as browsers do) and return (status, headers, body bytes)."""
    if isinstance(body, str):
        body = body.encode()
    lines = ["%s %s HTTP/1.1" % (method, path)]
    names = {k.lower() for k, _ in headers}
    hs = list(headers)
    if "content-length" not in names and (body or method in ("POST", "PUT")):
        hs.append(("Content-Length", str(len(body))))
    hs.append(("Connection", "close"))
    lines += ["%s: %s" % kv for kv in hs]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        s.sendall(data)
        end = time.time() + timeout
        while time.time() < end:
            try:
                b = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not b:
                break
            out += b
    finally:
        s.close()
    head, _, rest = out.partition(b"\r\n\r\n")
    hl = head.decode("latin-1").split("\r\n")
    if not hl or not hl[0].startswith("HTTP/"):
        raise AssertionError("no HTTP answer to %s %s: %r" % (method, path, out[:200]))
    status = int(hl[0].split()[1])
    rh = {}
    for line in hl[1:]:
        k, _, v = line.partition(":")
        rh.setdefault(k.strip().lower(), []).append(v.strip())
    return status, rh, rest


def jbody(body):
    return json.loads(body) if body else None


def host_of(port):
    return "127.0.0.1:%d" % port


def api(port, method, path, body=None, ctype="application/json"):
    """A well-formed request from a client that is not a browser (no Origin)."""
    h = [("Host", host_of(port)), ("Accept", "application/json")]
    if body is not None:
        if not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        h.append(("Content-Type", ctype))
    st, _, b = http_raw(port, method, path, h, body or b"")
    return st, jbody(b)


class Engine:
    """A Workdir with skills and a `moonloop serve` on a free port."""

    def __init__(self, skills, config=None, env=None):
        self.w = Workdir(config=config)
        os.makedirs(os.path.join(self.w.path, "skills"), exist_ok=True)
        for name, src in skills.items():
            self.w.write("skills/%s.lua" % name, src)
        try:
            self.p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", env=env)
        except BaseException:
            self.w.close()  # no process outlives a class whose setup failed
            raise
        self.port = self.p.port
        self.url = self.p.url

    def runs(self, skill, status=None):
        st, b = api(self.port, "GET", "/v1/runs?skill=%s%s" % (
            skill, "&status=" + status if status else ""))
        assert st == 200, b
        return b["runs"]

    def run(self, run_id):
        st, b = api(self.port, "GET", "/v1/runs/" + run_id)
        assert st == 200, b
        return b

    def wait_status(self, run_id, status, timeout=20):
        return wait_until(lambda: self.run(run_id)["status"] == status and self.run(run_id),
                          timeout=timeout, what="run %s %s" % (run_id, status))

    def skill(self, sid):
        st, b = api(self.port, "GET", "/v1/skills/" + sid)
        return b if st == 200 else None

    def close(self):
        self.w.close()


def assert_refused(tc, st, body, status, code, words=()):
    """An answer is a refusal with this status and code, and says why."""
    tc.assertEqual(st, status, body)
    tc.assertIsInstance(body, dict, body)
    tc.assertEqual(body["error"]["code"], code, body)
    for w in words:
        tc.assertIn(w, body["error"]["message"])

