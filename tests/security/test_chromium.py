"""Hostile pages in a real browser (docs/security.md, "Web pages").

tests/browser/attack.test.js drives Debian's headless Chromium (through
playwright-core, as tests/func/test_dashboard.py does) to tests/browser/
attack.html, served by a second local HTTP server: from another site
(evil.test), from another port of this host (same-site), and from a rebound
name (rebind.test on the engine's own port). The page tries no-cors fetches,
sendBeacon, preflighted fetches, a DELETE, forms (text/plain, urlencoded,
multipart) and a read. Afterwards nothing has started, nothing is deployed,
the waiting run is still waiting and the idempotency key the page tried to
burn still takes the real event. Skipped, saying why, only when Chromium or
node cannot be installed.
"""
import json
import os
import subprocess
import sys
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "func"))
from seclib import SRC, Engine, wait_until  # noqa: E402
from test_browser import HELLO, STARTED, WAITER  # noqa: E402
from test_dashboard import CHROMIUM, _apt_install, _have, _npm_ci  # noqa: E402

BROWSER = os.path.join(SRC, "tests", "browser")


class PageServer:
    """The attacker's site: serves attack.html, on 127.0.0.1 (evil.test)."""

    def __init__(self):
        with open(os.path.join(BROWSER, "attack.html"), "rb") as f:
            page = f.read()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = page if self.path.startswith("/attack.html") else b"not here"
                self.send_response(200 if body is page else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class ChromiumAttackTest(unittest.TestCase):
    @staticmethod
    def refused(e):
        """How many requests the engine refused with 403 or 415 (/metrics)."""
        from seclib import http_raw
        st, _, body = http_raw(e.port, "GET", "/metrics", [("Host", "127.0.0.1")])
        n = 0
        for line in body.decode().splitlines():
            if line.startswith(('moonloop_http_requests_total{code="403"}',
                                'moonloop_http_requests_total{code="415"}')):
                n += int(float(line.rsplit(" ", 1)[1]))
        return n

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHROMIUM) and not _apt_install("chromium"):
            raise unittest.SkipTest("%s is missing and could not be installed (apt-get install "
                                    "chromium; scripts/deps.sh does it)" % CHROMIUM)
        missing = [c for c in ("node", "npm") if not _have(c)]
        if missing and not _apt_install(*["nodejs" if c == "node" else c for c in missing]):
            raise unittest.SkipTest("%s not found and could not be installed" % " and ".join(missing))

    def test_hostile_pages_change_nothing(self):
        _npm_ci()
        e = Engine({"started": STARTED, "hello": HELLO, "waiter": WAITER})
        site = PageServer()
        try:
            e.w.ml("send", "review.requested", "--data", '{"request_id": "r1"}', check=0)
            e.w.ml("send", "review.requested", "--data", '{"request_id": "r2"}', check=0)
            waiting = wait_until(lambda: len(e.runs("waiter", "waiting")) == 2 and e.runs("waiter"),
                                 timeout=20, what="two waiting runs")
            r2 = [r["id"] for r in waiting if r["trigger"]["event"]["data"]["request_id"] == "r2"][0]
            refused_before = self.refused(e)
            env = dict(os.environ, ENGINE_URL=e.url, PAGE_PORT=str(site.port), WAITER_ID=r2,
                       CHROMIUM=CHROMIUM)
            t0 = time.time()
            r = subprocess.run(["node", "attack.test.js"], cwd=BROWSER, env=env, capture_output=True,
                               text=True, timeout=240)
            sys.stderr.write("(the attack pages took %.1f s)\n" % (time.time() - t0))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("3 pages", r.stdout)
            seen = {}
            for line in r.stdout.splitlines():
                if line.startswith("page "):
                    _, name, js = line.split(" ", 2)
                    seen[name] = json.loads(js)
            sys.stderr.write(json.dumps(seen, indent=1) + "\n")
            # What the pages could see: no answer they could read, no
            # preflighted request that went through.
            for name in ("cross-site", "same-site"):
                res = seen[name]
                for k in ("cors POST application/json: approve", "cors PUT text/x-lua: deploy victim",
                          "cors DELETE: unregister hello", "cors GET /v1/runs (read)",
                          "no-cors PUT (not a simple method)"):
                    self.assertTrue(res[k].startswith("blocked: "), (name, k, res[k]))
            for k, v in seen["rebinding"].items():
                # Same-origin to the page, so it reads statuses: all refusals.
                if v.startswith(("403", "blocked", "submitted", "queued", "no load")):
                    continue
                self.fail("rebinding page saw %s: %s" % (k, v))
            self.assertTrue(seen["rebinding"]["cors GET /v1/runs (read)"].startswith("403"))
            self.assertTrue(seen["rebinding"]["cors PUT text/x-lua: deploy victim"].startswith("403"))
            # What the engine did: nothing. Every attempt reached it (so this
            # is the engine's doing, not the browser's): per page, the five
            # no-cors fetches, the beacon, the three forms and the three
            # preflights (the rebound page sends its requests, not preflights).
            wait_until(lambda: self.refused(e) - refused_before >= 3 * 12, timeout=10,
                       what="every attempt to reach the engine and be refused")
            sys.stderr.write("(the engine refused %d requests)\n" % (self.refused(e) - refused_before))
            self.assertEqual(e.runs("started"), [])
            self.assertEqual(e.runs("hello"), [])
            self.assertIsNone(e.skill("victim"))
            self.assertIsNotNone((e.skill("hello") or {}).get("version"))
            self.assertEqual(len(e.runs("waiter", "waiting")), 2)
            # The key the pages tried to burn takes the real approval.
            r = e.w.ml("send", "approve", "--data", '{"request_id": "r1"}', "--id", "key1", "--json",
                       check=0)
            self.assertFalse(json.loads(r.stdout)["duplicate"])
            wait_until(lambda: len(e.runs("waiter", "completed")) == 1, timeout=20,
                       what="the approved run")
        finally:
            site.close()
            e.close()


if __name__ == "__main__":
    unittest.main()
