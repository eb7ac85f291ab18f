"""The dashboard: GET / of `moonloop serve`, a page built into the binary.

DashboardHttpTest: the page's files as HTTP serves them (content types, ETag
and 304, the headers that keep the page to its own origin), served without
the token while every API path still needs it, and the API paths the page
added: GET /v1/versions/{hash} (a version's source) and GET /v1/runs?parent=.

DashboardBrowserTest: tests/browser/dashboard.test.js drives the page in
Debian's headless Chromium through playwright-core (pinned in
tests/browser/package-lock.json, installed with `npm ci` into
tests/browser/node_modules once per lockfile). It needs /usr/bin/chromium and
node with npm: scripts/deps.sh installs them; this test tries apt-get when
they are missing, and is skipped, saying why, only when they cannot be
installed. Its screenshot goes to tests/artifacts/dashboard.png.

HealthBrowserTest: tests/browser/health.test.js drives the health views
(overview, a skill's charts, the window switch, deploy markers, invoke and
send from the page, the event stream) the same way; screenshots go to
tests/artifacts/health-overview.png, health-skill.png and events.png.
"""
import fcntl
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, SRC, Workdir, wait_until  # noqa: E402

TOKEN = "dashboard-test-token"
WEB = os.path.join(SRC, "web")
BROWSER = os.path.join(SRC, "tests", "browser")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

GREET = """
return {
  id = "greet", description = "says hello",
  run = function(ctx)
    return ctx.step.run("compose", function() return { text = "hello " .. tostring(ctx.input.who) } end)
  end,
}
"""

PARENT = """
return {
  id = "parent",
  run = function(ctx)
    return ctx.step.invoke("child", { skill = "greet", data = { who = "child" } })
  end,
}
"""


def request(port, method, path, headers=None, token=TOKEN):
    """One request: (status, headers with lowercase names, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = dict(headers or {})
    if token:
        h["Authorization"] = "Bearer " + token
    try:
        c.request(method, path, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def jget(port, path):
    st, _, body = request(port, "GET", path)
    return st, json.loads(body) if body else None


def web_file(name):
    with open(os.path.join(WEB, name), "rb") as f:
        return f.read()


class DashboardHttpTest(unittest.TestCase):
    """One serve with a token for the class."""

    @classmethod
    def setUpClass(cls):
        cls.w = Workdir()
        cls.w.write("skills/greet.lua", GREET)
        cls.w.write("skills/parent.lua", PARENT)
        cls.w.env["MOONLOOP_TOKEN"] = TOKEN
        cls.p = cls.w.start("serve", "--listen", "127.0.0.1:0", "--workspace", "skills")
        cls.lines = []

        def read():
            for line in cls.p.stderr:
                cls.lines.append(line)
        threading.Thread(target=read, daemon=True).start()

        def url():
            for line in list(cls.lines):
                m = re.search(r"listening on http://[0-9.]+:(\d+)", line)
                if m:
                    return int(m.group(1))
            if cls.p.poll() is not None:
                raise AssertionError("serve exited: " + "".join(cls.lines))
            return None
        cls.port = wait_until(url, timeout=20, what="serve to print its address")

    @classmethod
    def tearDownClass(cls):
        cls.w.close()

    def test_files_are_served_without_the_token(self):
        for path, name, ctype in (("/", "index.html", "text/html; charset=utf-8"),
                                  ("/?from=bookmark", "index.html", "text/html; charset=utf-8"),
                                  ("/app.js", "app.js", "text/javascript; charset=utf-8"),
                                  ("/style.css", "style.css", "text/css; charset=utf-8"),
                                  ("/charts.js", "charts.js", "text/javascript; charset=utf-8"),
                                  ("/health.js", "health.js", "text/javascript; charset=utf-8"),
                                  ("/health.css", "health.css", "text/css; charset=utf-8")):
            st, h, body = request(self.port, "GET", path, token=None)
            self.assertEqual(st, 200, path)
            self.assertEqual(h["content-type"], ctype, path)
            self.assertEqual(body, web_file(name), path)
            self.assertEqual(int(h["content-length"]), len(body))
            self.assertRegex(h["etag"], r'^"[0-9a-f]{16}"$')
            self.assertEqual(h["cache-control"], "no-cache")
            self.assertEqual(h["x-content-type-options"], "nosniff")
            self.assertIn("default-src 'self'", h["content-security-policy"])

    def test_the_dashboard_words_are_the_engines(self):
        # vocab.js is written at build time from engine/base/vocab.h, and
        # loaded before app.js, which has no list of its own.
        st, h, body = request(self.port, "GET", "/vocab.js", token=None)
        self.assertEqual(st, 200)
        self.assertEqual(h["content-type"], "text/javascript; charset=utf-8")
        text = body.decode()
        self.assertIn("runStatuses: ['queued', 'running', 'sleeping', 'waiting', 'completed', 'failed', "
                      "'cancelled', 'skipped']", text)
        self.assertIn("triggerKinds: ['event', 'cron', 'invoke', 'rerun', 'on_failure']", text)
        self.assertIn("ended: ['completed', 'failed', 'cancelled', 'skipped']", text)
        page = web_file("index.html").decode()
        self.assertLess(page.index('"/vocab.js"'), page.index('"/app.js"'))
        app = web_file("app.js").decode()
        self.assertIn("VOCAB.runStatuses", app)
        self.assertNotIn("'sleeping'", app)

    def test_the_page_loads_its_own_files_only(self):
        page = web_file("index.html").decode()
        self.assertIn('src="/app.js"', page)
        self.assertIn('href="/style.css"', page)
        for name in ("charts.js", "health.js", "health.css"):
            self.assertIn('"/%s"' % name, page)
        for name in sorted(os.listdir(WEB)):
            text = web_file(name).decode()
            # SVG's namespace name is a name, not an address anything is fetched from.
            text = text.replace("'http://www.w3.org/2000/svg'", "")
            self.assertNotRegex(text, r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", name)
            self.assertNotIn("@import", text, name)

    def test_etag_revalidation(self):
        st, h, _ = request(self.port, "GET", "/app.js", token=None)
        etag = h["etag"]
        for value in (etag, "W/" + etag, '"other", ' + etag, "*"):
            st, h2, body = request(self.port, "GET", "/app.js", {"If-None-Match": value}, token=None)
            self.assertEqual(st, 304, value)
            self.assertEqual(body, b"")
            self.assertEqual(h2["etag"], etag)
            self.assertNotIn("content-length", h2)
        st, _, body = request(self.port, "GET", "/app.js", {"If-None-Match": '"0000000000000000"'},
                              token=None)
        self.assertEqual(st, 200)
        self.assertEqual(body, web_file("app.js"))

    def test_head_answers_headers_only(self):
        st, h, body = request(self.port, "HEAD", "/style.css", token=None)
        self.assertEqual(st, 200)
        self.assertEqual(body, b"")
        self.assertEqual(int(h["content-length"]), len(web_file("style.css")))

    def test_everything_else_still_needs_the_token(self):
        for method, path in (("GET", "/v1/runs"), ("GET", "/v1/skills"), ("GET", "/metrics"),
                             ("GET", "/index.html"), ("GET", "/app.js/x"), ("POST", "/"),
                             ("GET", "/v1/versions/" + "0" * 64)):
            st, h, body = request(self.port, method, path, token=None)
            self.assertEqual(st, 401, (method, path, body))
            self.assertEqual(json.loads(body)["error"]["code"], "unauthenticated")
        st, h, _ = request(self.port, "POST", "/")
        self.assertEqual(st, 405)
        self.assertIn("GET", h["allow"])

    def test_version_source(self):
        st, skill = jget(self.port, "/v1/skills/greet")
        self.assertEqual(st, 200, skill)
        st, v = jget(self.port, "/v1/versions/" + skill["version"])
        self.assertEqual(st, 200, v)
        self.assertEqual(set(v), {"version", "skill", "file", "source"})
        self.assertEqual(v["version"], skill["version"])
        self.assertEqual(v["skill"], "greet")
        self.assertTrue(v["file"].endswith("greet.lua"), v["file"])
        self.assertEqual(v["source"], GREET)
        self.assertEqual(hashlib.sha256(v["source"].encode()).hexdigest(), v["version"])

    def test_version_errors(self):
        for bad in ("abc", "A" * 64, "g" * 64, "0" * 65):
            st, body = jget(self.port, "/v1/versions/" + bad)
            self.assertEqual(st, 404, bad)
            self.assertEqual(body["error"]["code"], "not_found")
            self.assertIn("64 lowercase hex digits", body["error"]["message"])
        st, body = jget(self.port, "/v1/versions/" + "0" * 64)
        self.assertEqual(st, 404)
        self.assertIn("no skill version '000000000000", body["error"]["message"])
        st, h, _ = request(self.port, "PUT", "/v1/versions/" + "0" * 64)
        self.assertEqual(st, 405)
        self.assertEqual(h["allow"], "GET, HEAD")

    def test_runs_of_a_parent(self):
        r = subprocess.run([BIN, "invoke", "parent", "--data", "{}"], cwd=self.w.path, env=self.w.env,
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        parent = r.stdout.strip()

        def done():
            st, run = jget(self.port, "/v1/runs/" + parent)
            return run if run["status"] in ("completed", "failed") else None
        self.assertEqual(wait_until(done, timeout=20, what="the parent run")["status"], "completed")
        st, body = jget(self.port, "/v1/runs?parent=" + parent)
        self.assertEqual(st, 200, body)
        self.assertEqual(len(body["runs"]), 1, body)
        kid = body["runs"][0]
        self.assertEqual((kid["skill"], kid["parent_id"]), ("greet", parent))
        # Combined with another filter, and for a run with no children.
        st, body = jget(self.port, "/v1/runs?parent=%s&status=failed" % parent)
        self.assertEqual(body["runs"], [])
        st, body = jget(self.port, "/v1/runs?parent=" + kid["id"])
        self.assertEqual((st, body["runs"], body["next"]), (200, [], None))
        st, body = jget(self.port, "/v1/runs?parent=not-a-run")
        self.assertEqual(st, 400)
        self.assertIn("parent: 'not-a-run' is not a run id", body["error"]["message"])


def _have(cmd):
    return shutil.which(cmd) is not None


def _apt_install(*pkgs):
    """Try to install Debian packages (as root only); True when it worked."""
    if os.geteuid() != 0 or not _have("apt-get"):
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + list(pkgs)
    for attempt in range(2):
        if attempt:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return False
        if r.returncode == 0:
            return True
    return False


def _npm_ci():
    """npm ci in tests/browser once per package-lock.json (a stamp in
    node_modules says which lockfile it installed), under a lock so two
    builds testing at once do not install over each other."""
    with open(os.path.join(BROWSER, "package-lock.json"), "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(BROWSER, "node_modules", ".moonloop-lockfile")
    lock_path = os.path.join(tempfile.gettempdir(),
                             "moonloop-npm-%s.lock" % hashlib.sha256(BROWSER.encode()).hexdigest()[:12])
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(stamp) as f:
                if f.read().strip() == want and os.path.isdir(
                        os.path.join(BROWSER, "node_modules", "playwright-core")):
                    return
        except OSError:
            pass
        r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=BROWSER,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError("npm ci in tests/browser failed:\n" + r.stdout + r.stderr)
        with open(stamp, "w") as f:
            f.write(want + "\n")


class DashboardBrowserTest(unittest.TestCase):
    """The page in headless Chromium: tests/browser/dashboard.test.js."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHROMIUM) and not _apt_install("chromium"):
            raise unittest.SkipTest("%s is missing and could not be installed (apt-get install "
                                    "chromium; scripts/deps.sh does it)" % CHROMIUM)
        if not os.path.exists(CHROMIUM):
            raise unittest.SkipTest("%s is missing after installing chromium" % CHROMIUM)
        missing = [c for c in ("node", "npm") if not _have(c)]
        if missing and not _apt_install(*["nodejs" if c == "node" else c for c in missing]):
            raise unittest.SkipTest("%s not found and could not be installed (apt-get install "
                                    "nodejs npm; scripts/deps.sh does it)" % " and ".join(missing))

    def test_dashboard_in_chromium(self):
        _npm_ci()
        artifacts = os.path.join(SRC, "tests", "artifacts")
        shot = os.path.join(artifacts, "dashboard.png")
        if os.path.exists(shot):
            os.unlink(shot)
        env = dict(os.environ, MOONLOOP_BIN=os.path.abspath(BIN), ARTIFACTS_DIR=artifacts,
                   CHROMIUM=CHROMIUM)
        env.pop("MOONLOOP_URL", None)
        env.pop("MOONLOOP_TOKEN", None)
        t0 = time.time()
        r = subprocess.run(["node", "dashboard.test.js"], cwd=BROWSER, env=env, capture_output=True,
                           text=True, timeout=240)
        sys.stderr.write(r.stdout)
        sys.stderr.write("(browser test took %.1f s)\n" % (time.time() - t0))
        self.assertEqual(r.returncode, 0, "the browser test failed:\n" + r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"(?m)^\d+ passed, 0 failed$")
        self.assertTrue(os.path.getsize(shot) > 10000, "no screenshot at " + shot)


class HealthBrowserTest(unittest.TestCase):
    """The health views in headless Chromium: tests/browser/health.test.js."""

    setUpClass = classmethod(DashboardBrowserTest.setUpClass.__func__)  # Chromium, node, npm

    def test_health_in_chromium(self):
        _npm_ci()
        artifacts = os.path.join(SRC, "tests", "artifacts")
        shots = [os.path.join(artifacts, n) for n in ("health-overview.png", "health-skill.png", "events.png")]
        for shot in shots:
            if os.path.exists(shot):
                os.unlink(shot)
        env = dict(os.environ, MOONLOOP_BIN=os.path.abspath(BIN), ARTIFACTS_DIR=artifacts,
                   CHROMIUM=CHROMIUM)
        env.pop("MOONLOOP_URL", None)
        env.pop("MOONLOOP_TOKEN", None)
        t0 = time.time()
        r = subprocess.run(["node", "health.test.js"], cwd=BROWSER, env=env, capture_output=True,
                           text=True, timeout=240)
        sys.stderr.write(r.stdout)
        sys.stderr.write("(browser test took %.1f s)\n" % (time.time() - t0))
        self.assertEqual(r.returncode, 0, "the browser test failed:\n" + r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"(?m)^\d+ passed, 0 failed$")
        for shot in shots:
            self.assertTrue(os.path.getsize(shot) > 10000, "no screenshot at " + shot)


if __name__ == "__main__":
    unittest.main()
