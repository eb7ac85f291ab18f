"""Web pages against a token-less engine on loopback (docs/security.md,
"Web pages").

Every attack is sent byte for byte as a browser sends it from a page on
another origin: a no-cors fetch (text/plain), a form with enctype
text/plain, an empty form POST, a sandboxed page (Origin: null), a page on
another port of the same machine (same-site), a preflight, and DNS
rebinding (the page's own name, rebound to 127.0.0.1, in Host). Each is
refused, and the test then checks that nothing happened: no run started,
the waiting run neither completed nor cancelled, and the idempotency key
the attacker tried to burn still accepts the real event.
"""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from seclib import (CHROME_UA, BIN, Engine, Workdir, api, assert_refused, http_raw,  # noqa: E402
                    jbody, wait_until)

STARTED = """
return { id = "started", triggers = { { event = "attack.start" } },
  run = function(ctx) return ctx.step.run("s", function() return "ran" end) end }
"""
HELLO = """
return { id = "hello", run = function(ctx) return ctx.step.run("s", function() return "hi" end) end }
"""
WAITER = """
return { id = "waiter", triggers = { { event = "review.requested" } },
  cancel_on = { { event = "abort", match = "data.request_id" } },
  run = function(ctx)
    local ev = ctx.step.wait_for_event("approval", { event = "approve", match = "data.request_id", timeout = "10m" })
    return ev and ev.data
  end }
"""
VICTIM = 'return { id = "victim", run = function(ctx) return "planted" end }\n'

EVIL = "http://evil.example:8000"


def cross_site(extra, mode="no-cors", dest="empty", origin=EVIL, site="cross-site"):
    """The headers Chromium sends with a request from a page at origin."""
    h = [("User-Agent", CHROME_UA), ("Accept", "*/*")]
    if origin is not None:
        h.append(("Origin", origin))
    h += [("Sec-Fetch-Site", site), ("Sec-Fetch-Mode", mode), ("Sec-Fetch-Dest", dest),
          ("Referer", (origin if origin and origin != "null" else EVIL) + "/")]
    return h + extra


class BrowserAttackTest(unittest.TestCase):
    """One engine with a run waiting for an approval; every attack against it."""

    @classmethod
    def setUpClass(cls):
        cls.e = Engine({"started": STARTED, "hello": HELLO, "waiter": WAITER})
        cls.addClassCleanup(cls.e.close)
        cls.port = cls.e.port
        cls.host = "127.0.0.1:%d" % cls.port
        cls.e.w.ml("send", "review.requested", "--data", '{"request_id": "r1"}', check=0)
        cls.e.w.ml("send", "review.requested", "--data", '{"request_id": "r2"}', check=0)
        wait_until(lambda: len(cls.e.runs("waiter", "waiting")) == 2, timeout=20,
                   what="two waiting runs")


    def waiter_of(self, rid):
        for r in self.e.runs("waiter"):
            if r["trigger"]["event"]["data"]["request_id"] == rid:
                return r
        raise AssertionError("no waiter for " + rid)

    def assert_nothing_happened(self):
        self.assertEqual(self.e.runs("started"), [])
        self.assertEqual(self.e.runs("hello"), [])
        self.assertEqual(self.waiter_of("r1")["status"], "waiting")
        self.assertEqual(self.waiter_of("r2")["status"], "waiting")
        self.assertIsNone(self.e.skill("victim"))

    # ---- the attacks, as Chromium sends them from http://evil.example:8000 ----

    def attacks(self, host):
        """(what, method, path, headers, body) of every cross-site attack."""
        approve = json.dumps({"name": "approve", "data": {"request_id": "r1"}, "id": "key1"})
        abort = json.dumps({"name": "abort", "data": {"request_id": "r2"}})
        start = json.dumps([{"name": "attack.start"}])
        # <form method=post enctype=text/plain> with one field whose name and
        # value make a JSON text around the '=' the browser puts between them.
        form_name = '{"name":"approve","data":{"request_id":"r1","p":"'
        form_value = '"},"id":"key1"}'
        form_body = form_name + "=" + form_value + "\r\n"
        plain = ("Content-Type", "text/plain;charset=UTF-8")
        out = []
        for what, body in (("approve (burns key1)", approve), ("abort (cancel_on)", abort),
                           ("start runs", start)):
            out.append(("no-cors fetch: " + what, "POST", "/v1/events",
                        cross_site([("Host", host), plain]), body))
        out.append(("form enctype=text/plain", "POST", "/v1/events",
                    cross_site([("Host", host), ("Content-Type", "text/plain")], mode="navigate",
                               dest="document") + [("Upgrade-Insecure-Requests", "1")], form_body))
        out.append(("empty form POST to invoke", "POST", "/v1/skills/hello/invoke",
                    cross_site([("Host", host), ("Content-Type", "application/x-www-form-urlencoded")],
                               mode="navigate", dest="document"), ""))
        out.append(("no-cors fetch without a body to invoke", "POST", "/v1/skills/hello/invoke",
                    cross_site([("Host", host)]), ""))
        out.append(("cancel through no-cors fetch", "POST",
                    "/v1/runs/%s/cancel" % self.waiter_of("r2")["id"],
                    cross_site([("Host", host)]), ""))
        out.append(("sandboxed page (Origin: null)", "POST", "/v1/events",
                    cross_site([("Host", host), plain], origin="null"), approve))
        out.append(("page on another port of this machine (same-site)", "POST", "/v1/events",
                    cross_site([("Host", host), plain], origin="http://127.0.0.1:9999",
                               site="same-site"), approve))
        out.append(("a browser without Sec-Fetch-* (Origin only)", "POST", "/v1/events",
                    [("Host", host), ("Origin", EVIL), plain], approve))
        out.append(("a browser without Origin (Sec-Fetch-Site only)", "POST", "/v1/events",
                    [("Host", host), ("Sec-Fetch-Site", "cross-site"), plain], approve))
        out.append(("two Origin headers", "POST", "/v1/events",
                    [("Host", host), ("Origin", "http://" + host), ("Origin", EVIL),
                     ("Content-Type", "application/json")], approve))
        out.append(("PUT of a skill (after a preflight it would not get)", "PUT",
                    "/v1/skills/victim", cross_site([("Host", host), ("Content-Type", "text/x-lua")],
                                                    mode="cors"), VICTIM))
        return out

    def test_cross_site_requests_are_refused_and_change_nothing(self):
        for what, method, path, headers, body in self.attacks(self.host):
            with self.subTest(what):
                st, _, b = http_raw(self.port, method, path, headers, body)
                assert_refused(self, st, jbody(b), 403, "forbidden", ["cross-origin request refused"])
        self.assert_nothing_happened()

    def test_the_same_attacks_with_a_localhost_name(self):
        # The page addressed the engine as localhost: same answers.
        for what, method, path, headers, body in self.attacks("localhost:%d" % self.port):
            with self.subTest(what):
                st, _, b = http_raw(self.port, method, path, headers, body)
                self.assertEqual(st, 403, (what, b))
        self.assert_nothing_happened()

    def test_a_simple_request_with_a_matching_origin_still_needs_json(self):
        # Were the Origin check ever bypassed (a browser bug, a proxy that
        # drops Origin), the body type alone keeps simple requests out: a
        # text/plain or form body is refused before anything is stored.
        approve = json.dumps({"name": "approve", "data": {"request_id": "r1"}, "id": "key1"})
        for ctype in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                      "multipart/form-data; boundary=x"):
            with self.subTest(ctype):
                st, _, b = http_raw(self.port, "POST", "/v1/events",
                                    [("Host", self.host), ("Content-Type", ctype)], approve)
                assert_refused(self, st, jbody(b), 415, "unsupported_media_type",
                               ["Content-Type: application/json"])
        st, _, b = http_raw(self.port, "POST", "/v1/skills/hello/invoke",
                            [("Host", self.host), ("Content-Type", "application/x-www-form-urlencoded")])
        assert_refused(self, st, jbody(b), 415, "unsupported_media_type")
        st, _, b = http_raw(self.port, "PUT", "/v1/skills/victim",
                            [("Host", self.host), ("Content-Type", "text/plain")], VICTIM)
        assert_refused(self, st, jbody(b), 415, "unsupported_media_type", ["text/x-lua"])
        self.assert_nothing_happened()

    def test_preflights_from_other_origins_are_refused(self):
        for method, hdrs in (("PUT", "content-type"), ("POST", "content-type"),
                             ("DELETE", ""), ("POST", "authorization")):
            with self.subTest(method=method, headers=hdrs):
                h = cross_site([("Host", self.host), ("Access-Control-Request-Method", method)],
                               mode="cors")
                if hdrs:
                    h.append(("Access-Control-Request-Headers", hdrs))
                st, rh, b = http_raw(self.port, "OPTIONS", "/v1/skills/victim", h)
                assert_refused(self, st, jbody(b), 403, "forbidden")
                self.assertFalse([k for k in rh if k.startswith("access-control-")], rh)
        self.assert_nothing_happened()

    def test_the_attacker_cannot_read_answers(self):
        # Reads answer (GET is no state change) but never with CORS headers,
        # so the page's script cannot read them.
        st, rh, _ = http_raw(self.port, "GET", "/v1/runs",
                             cross_site([("Host", self.host)], mode="cors"))
        self.assertEqual(st, 200)
        self.assertFalse([k for k in rh if k.startswith("access-control-")], rh)
        self.assertEqual(rh["x-content-type-options"], ["nosniff"])

    def test_zz_the_real_event_is_still_accepted_after_the_attacks(self):
        # Run last (zz): after every attack above, key1 is unburnt, r1 is
        # still waiting, and the operator's own approval completes it.
        self.test_cross_site_requests_are_refused_and_change_nothing()
        r = self.e.w.ml("send", "approve", "--data", '{"request_id": "r1"}', "--id", "key1", "--json",
                        check=0)
        self.assertFalse(json.loads(r.stdout)["duplicate"], r.stdout)
        run = self.e.wait_status(self.waiter_of("r1")["id"], "completed")
        self.assertEqual(run["output"], {"request_id": "r1"})
        self.assertEqual(self.waiter_of("r2")["status"], "waiting")


class DnsRebindingTest(unittest.TestCase):
    """A page whose own name now resolves to 127.0.0.1: the browser sends that
    name in Host and calls every request same-origin."""

    @classmethod
    def setUpClass(cls):
        cls.e = Engine({"hello": HELLO, "target": HELLO.replace('"hello"', '"target"')},
                       config={"allowed_hosts": '{ "loop.example.com", "[fd00::5]" }'})
        cls.addClassCleanup(cls.e.close)
        cls.port = cls.e.port


    def rebound(self, name, method, path, extra=(), body=""):
        origin = "http://%s" % name
        h = [("Host", name), ("User-Agent", CHROME_UA), ("Origin", origin),
             ("Sec-Fetch-Site", "same-origin"), ("Sec-Fetch-Mode", "cors")] + list(extra)
        st, _, b = http_raw(self.port, method, path, h, body)
        return st, jbody(b) if b[:1] == b"{" else b

    def test_rebound_names_are_refused_on_every_path(self):
        for name in ("rebind.attacker.example:%d" % self.port, "attacker.example",
                     "127.0.0.1.attacker.example:%d" % self.port, "localhost.attacker.example",
                     "loop.example.com.evil.example", "xn--loop-9qa.example.com",
                     "10.0.0.1:%d" % self.port, "[fd00::6]:%d" % self.port):
            for method, path, extra, body in (
                    ("GET", "/v1/runs", (), ""), ("GET", "/v1/skills/hello", (), ""),
                    ("GET", "/metrics", (), ""), ("GET", "/", (), ""), ("GET", "/app.js", (), ""),
                    ("POST", "/v1/skills/target/invoke", [("Content-Type", "application/json")], "{}"),
                    ("PUT", "/v1/skills/victim", [("Content-Type", "text/x-lua")], VICTIM)):
                with self.subTest(host=name, method=method, path=path):
                    st, b = self.rebound(name, method, path, extra, body)
                    host = name[:name.index("]") + 1] if name.startswith("[") else name.split(":")[0]
                    assert_refused(self, st, b, 403, "forbidden",
                                   ["is not a name of this engine",
                                    'add it: allowed_hosts = { "%s" }' % host])
        self.assertEqual(self.e.runs("target"), [])
        self.assertIsNone(self.e.skill("victim"))

    def test_loopback_names_listen_address_and_allowed_hosts_are_answered(self):
        p = self.port
        for name in ("127.0.0.1:%d" % p, "127.0.0.1", "localhost:%d" % p, "localhost",
                     "LOCALHOST:%d" % p, "localhost.:%d" % p, "[::1]:%d" % p, "[::1]",
                     "127.0.0.2:%d" % p, "[::ffff:127.0.0.1]:%d" % p,
                     "loop.example.com", "Loop.Example.COM:443", "loop.example.com:%d" % p,
                     "[fd00::5]:%d" % p):
            with self.subTest(host=name):
                st, b = self.rebound(name, "GET", "/v1/skills")
                self.assertEqual(st, 200, b)
        # The dashboard's own requests through an allowed name: same origin,
        # behind a proxy that ends TLS too (Origin https://, Host without port).
        for host, origin in (("loop.example.com", "https://loop.example.com"),
                             ("loop.example.com:%d" % p, "http://loop.example.com:%d" % p),
                             ("127.0.0.1:%d" % p, "http://127.0.0.1:%d" % p)):
            with self.subTest(origin=origin):
                h = [("Host", host), ("Origin", origin), ("Sec-Fetch-Site", "same-origin"),
                     ("Content-Type", "application/json")]
                st, _, b = http_raw(self.port, "POST", "/v1/skills/hello/invoke", h, "{}")
                self.assertEqual(st, 202, b)
        # An allowed name on another port, or the other scheme's default, is another origin.
        for host, origin in (("loop.example.com", "http://loop.example.com:8080"),
                             ("loop.example.com:443", "http://loop.example.com"),
                             ("127.0.0.1:%d" % p, "http://localhost:%d" % p)):
            with self.subTest(foreign_origin=origin):
                h = [("Host", host), ("Origin", origin), ("Content-Type", "application/json")]
                st, _, b = http_raw(self.port, "POST", "/v1/skills/hello/invoke", h, "{}")
                self.assertEqual(st, 403, b)

    def test_malformed_and_missing_host(self):
        for name in ("", "evil.example:99999", "a b", "[::1", "loc@lhost", "localhost:80:80"):
            with self.subTest(host=name):
                st, b = self.rebound(name, "GET", "/v1/skills")
                self.assertEqual(st, 403, b)
        st, _, b = http_raw(self.port, "GET", "/v1/skills", [], b"")  # no Host at all
        self.assertEqual(st, 400, b)
        self.assertIn("no Host header", jbody(b)["error"]["message"])


class AllowedHostsConfigTest(unittest.TestCase):
    """allowed_hosts is validated like every other key."""

    def test_bad_entries_are_refused_with_the_line(self):
        for value, words in (('"loop.example.com"', "must be a list of strings"),
                             ('{ "http://loop.example.com" }', "without a scheme, port or path"),
                             ('{ "loop.example.com:8288" }', "without a scheme, port or path"),
                             ('{ "loop.example.com/x" }', "without a scheme, port or path"),
                             ('{ "" }', "without a scheme, port or path"),
                             ('{ 5 }', "must be a list of strings")):
            with self.subTest(value):
                w = Workdir(config={"allowed_hosts": value})
                try:
                    r = w.ml("runs")
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn("moonloop.conf.lua:2:", r.stderr)
                    self.assertIn(words, r.stderr)
                finally:
                    w.close()
        w = Workdir(config={"alowed_hosts": '{ "x" }'})
        try:
            r = w.ml("runs")
            self.assertEqual(r.returncode, 2)
            self.assertIn("did you mean 'allowed_hosts'", r.stderr)
        finally:
            w.close()


class ClientsThatAreNotBrowsersTest(unittest.TestCase):
    """The CLI, the sidecar and scripts send no Origin: they keep working."""

    def test_cli_over_http_and_plain_requests(self):
        e = Engine({"hello": HELLO})
        try:
            env = dict(e.w.env, MOONLOOP_URL=e.url)
            r = subprocess.run([BIN, "invoke", "hello", "--wait"], cwd=e.w.path, env=env,
                               capture_output=True, text=True, timeout=30)
            self.assertEqual((r.returncode, r.stdout.strip()), (0, '"hi"'), r.stderr)
            st, b = api(e.port, "POST", "/v1/skills/hello/invoke", {"data": {}})
            self.assertEqual(st, 202, b)
            # An empty POST without a type (curl -X POST .../cancel) is fine.
            st, _, b = http_raw(e.port, "POST", "/v1/runs/%s/cancel" % b["run_id"],
                                [("Host", "localhost:%d" % e.port)])
            self.assertIn(st, (200, 409), b)
            st, b = api(e.port, "POST", "/v1/events", {"name": "x"}, ctype="application/json; charset=utf-8")
            self.assertEqual(st, 202, b)
            st, b = api(e.port, "PUT", "/v1/skills/planted", 'return { id = "planted", run = function() end }',
                        ctype="text/x-lua; charset=utf-8")
            self.assertEqual(st, 200, b)
        finally:
            e.close()


if __name__ == "__main__":
    unittest.main()
