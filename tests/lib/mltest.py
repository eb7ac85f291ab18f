"""mltest: helpers for moonloop's functional, crash and end-to-end tests.

The tests drive the real binary (MOONLOOP_BIN) in a fresh temporary folder
each, against a real SQLite file, and talk to small local HTTP stand-ins for
the outside world (StandIn below). Standard library only.

With MOONLOOP_TEST_BACKEND=pg (and MOONLOOP_TEST_PG, the folder of a
cluster that pgcluster.py started), each Workdir's database is instead a
fresh database of that PostgreSQL cluster: the same tests run against the
PostgreSQL store. Tests that cannot apply there skip with the reason
(sqlite_only).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pgcluster
from vocab import RUN_ENDED, RUN_ENDED_SQL, RUN_STATUSES  # noqa: F401 (for the tests)

BIN = os.environ.get("MOONLOOP_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "moonloop")
SRC = os.environ.get("MOONLOOP_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")

# The PostgreSQL cluster the tests run against (pgcluster.py's description),
# or None: SQLite files.
PG = pgcluster.load(os.environ["MOONLOOP_TEST_PG"]) \
    if os.environ.get("MOONLOOP_TEST_BACKEND") == "pg" else None


def sqlite_only(reason):
    """Skip a test (or a class) under PostgreSQL, saying why it applies to
    SQLite's file only."""
    return unittest.skipIf(PG is not None, "SQLite only: " + reason)


def ms(iso):
    """A record's time ("2026-12-02T06:40:00.123Z") in ms since the epoch."""
    from datetime import datetime
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000 + 0.5)


def wait_until(pred, timeout=10.0, interval=0.02, what="condition"):
    """Poll pred() until it returns a true value; fail after timeout. what
    names the condition in the failure (a callable: called then, to show the
    state at the time)."""
    end = time.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.time() > end:
            raise AssertionError("timed out after %.1fs waiting for %s" % (
                timeout, what() if callable(what) else what))
        time.sleep(interval)


def metrics(url):
    """The samples of a serve's /metrics (url: the serve's), by their name
    with labels ('moonloop_runs{status="failed"}') -> value."""
    import urllib.request
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


class StandIn:
    """A scriptable local HTTP server standing in for an outside service.

    Every request is counted per path. Routes map a path to a handler
    returning (status, body, headers), or None when it dropped the
    connection without an answer, or to a fixed (status, body). The
    in-flight gauge records the highest number of concurrent requests per key.
    """

    def __init__(self):
        self.calls = {}
        self.bodies = {}
        self.routes = {}
        self.prefixes = []
        self.lock = threading.Lock()
        self.inflight = {}
        self.max_inflight = {}
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def handle_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                path = self.path.split("?")[0]
                with standin.lock:
                    standin.calls[path] = standin.calls.get(path, 0) + 1
                    standin.bodies.setdefault(path, []).append(body)
                    count = standin.calls[path]
                route = standin.routes.get(path)
                if route is None:
                    for prefix, fn in standin.prefixes:
                        if path.startswith(prefix):
                            route = fn
                            break
                status, out, headers = 200, {"ok": True, "path": path, "n": count}, {}
                if callable(route):
                    r = route(self, body, count)
                    if r is None:  # no answer: the route dropped the connection
                        self.close_connection = True
                        return
                    status, out = r[0], r[1]
                    headers = r[2] if len(r) > 2 else {}
                elif route is not None:
                    status, out = route
                data = out if isinstance(out, (bytes, str)) else json.dumps(out)
                if isinstance(data, str):
                    data = data.encode()
                self.send_response(status)
                self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the engine was killed mid-request: that is the test

            def handle(self):
                try:
                    super().handle()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = handle_any

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def llm(self, answers, path="/v1/chat/completions"):
        """Answer an OpenAI-compatible chat endpoint with scripted answers, in
        order (the last one repeats): a string is the model's text; an int is
        an error status; (status, headers) adds headers such as Retry-After."""
        standin = self

        def chat(handler, body, n):
            a = answers[min(n, len(answers)) - 1]
            if isinstance(a, int):
                return a, {"error": {"message": "scripted %d" % a}}
            if isinstance(a, tuple):
                return a[0], {"error": {"message": "scripted"}}, dict(a[1])
            req = json.loads(body or b"{}")
            standin.last_llm_request = req
            standin.last_llm_auth = handler.headers.get("Authorization")
            return 200, {"id": "chatcmpl-%d" % n, "model": req.get("model"),
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": a},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}
        self.routes[path] = chat

    def route_prefix(self, prefix, fn):
        """Answer every path that starts with prefix with fn (or a fixed (status, body))."""
        self.prefixes.append((prefix, fn))

    def count(self, path):
        with self.lock:
            return self.calls.get(path, 0)

    def all_calls(self):
        """A copy of {path: calls so far}: the server's threads add to the
        live one while a test reads it."""
        with self.lock:
            return dict(self.calls)

    def track(self, key):
        """Context for a handler: counts requests in flight under key."""
        standin = self

        class Gauge:
            def __enter__(self):
                with standin.lock:
                    standin.inflight[key] = standin.inflight.get(key, 0) + 1
                    standin.max_inflight[key] = max(standin.max_inflight.get(key, 0),
                                                    standin.inflight[key])

            def __exit__(self, *a):
                with standin.lock:
                    standin.inflight[key] -= 1
        return Gauge()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Workdir:
    """A temporary folder with a database, a config and skill files."""

    def __init__(self, env_names=(), config=None):
        self.path = tempfile.mkdtemp(prefix="mltest-")
        self.pgdb = None
        if PG:
            # A database of its own in the shared cluster (tests run side by side).
            self.pgdb = "ml_" + uuid.uuid4().hex[:16]
            pgcluster.psql(PG, 'CREATE DATABASE "%s"' % self.pgdb)
            self.db = "%s/%s" % (PG["url"], self.pgdb)
        else:
            self.db = os.path.join(self.path, "moonloop.db")
        self.env = dict(os.environ)
        self.env.pop("MOONLOOP_URL", None)
        self.env["MOONLOOP_DB"] = self.db
        # Every `serve` a test starts binds a free port, so tests run side by side.
        self.env.setdefault("MOONLOOP_LISTEN", "127.0.0.1:0")
        self.env["NO_COLOR"] = "1"
        # Under the ASan+UBSan build every moonloop process writes what the
        # sanitizers find to a file here; close() fails the test with it.
        self.reports = os.path.join(self.path, ".sanitizer")
        os.makedirs(self.reports)
        for name in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
            opts = [o for o in self.env.get(name, "").split(":") if o and not o.startswith("log_path=")]
            self.env[name] = ":".join(opts + ["log_path=" + os.path.join(self.reports, "report")])
        self.procs = []
        conf = config or {}
        lines = ["return {"]
        if env_names:
            lines.append("  env = {%s}," % ", ".join('"%s"' % n for n in env_names))
        for k, v in conf.items():
            lines.append("  %s = %s," % (k, v))
        lines.append("}")
        self.write("moonloop.conf.lua", "\n".join(lines) + "\n")

    def sql(self, query, params=()):
        """Run one SQL statement on the workdir's database, whichever the
        backend (for tests that set up or look at rows directly); ? marks a
        parameter. Returns the rows as tuples; under PostgreSQL whole
        numbers come back as ints, other values as strings, NULL as None."""
        if not PG:
            import sqlite3
            con = sqlite3.connect(self.db, timeout=10)
            try:
                with con:
                    return [tuple(r) for r in con.execute(query, params)]
            finally:
                con.close()
        return pgcluster.query(PG, query, params, db=self.pgdb)

    def rewind_schema(self, to):
        """Take the workdir's database back to schema version to, for a
        test of the migrations after it (tests/lib/schema.py undoes them)."""
        import schema
        if not PG:
            import sqlite3
            con = sqlite3.connect(self.db, timeout=10)
            try:
                schema.sqlite_rewind(con, to)
            finally:
                con.close()
            return
        ((current,),) = self.sql("SELECT max(version) FROM moonloop_schema")
        self.sql("BEGIN; " + schema.rewind_sql("pg", current, to) + " COMMIT")

    def sql_tx(self, statements):
        """Run [(query, params)] on the workdir's database in one
        transaction, as sql() runs one."""
        if not PG:
            import sqlite3
            con = sqlite3.connect(self.db, timeout=10, isolation_level=None)
            try:
                con.execute("BEGIN IMMEDIATE")
                for q, params in statements:
                    con.execute(q, params)
                con.execute("COMMIT")
            finally:
                con.close()
            return
        self.sql("BEGIN; " + "; ".join(q for q, _ in statements) + "; COMMIT",
                 tuple(v for _, params in statements for v in params))

    def hold_writes(self):
        """Take the database's write lock from outside, as a process inside a
        commit holds it (SQLite: BEGIN IMMEDIATE; PostgreSQL: the store's
        advisory lock); returns a function that lets it go."""
        if not PG:
            import sqlite3
            con = sqlite3.connect(self.db, timeout=10, isolation_level=None)
            con.execute("BEGIN IMMEDIATE")

            def release():
                con.execute("ROLLBACK")
                con.close()
            return release
        p = subprocess.Popen([os.path.join(PG["bindir"], "psql"), "-X", "-q", "-h", "127.0.0.1",
                              "-p", str(PG["port"]), "-U", PG["user"], "-d", self.pgdb,
                              "-A", "-t", "-v", "ON_ERROR_STOP=1"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=pgcluster.env_of(PG))
        # store_pg_db.h's PG_WRITE_LOCK; the echo says the lock is held.
        p.stdin.write("BEGIN; SELECT pg_advisory_xact_lock(%d); \\echo held\n" % 0x6d6c6f6f70)
        p.stdin.flush()
        for line in p.stdout:
            if line.strip() == "held":
                break
        else:
            raise AssertionError("could not take PostgreSQL's write lock")

        def release():
            p.stdin.write("ROLLBACK;\n")
            p.stdin.close()
            p.wait(timeout=10)
            p.stdout.close()
        return release

    def write(self, name, text):
        p = os.path.join(self.path, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
        return p

    def ml(self, *args, timeout=60, check=None, input=None):
        """Run moonloop to completion; returns CompletedProcess (text)."""
        r = subprocess.run([BIN] + list(args), cwd=self.path, env=self.env, capture_output=True,
                           text=True, timeout=timeout, input=input)
        if check is not None and r.returncode != check:
            raise AssertionError("moonloop %s exited %d, expected %d\nstdout: %s\nstderr: %s" % (
                " ".join(args), r.returncode, check, r.stdout, r.stderr))
        return r

    def start(self, *args, stdout=subprocess.PIPE, env=None):
        """Start moonloop in the background (serve, run), with env added to
        the workdir's environment; returns Popen."""
        e = dict(self.env)
        e.update(env or {})
        p = subprocess.Popen([BIN] + list(args), cwd=self.path, env=e, stdout=stdout,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def serve(self, *args, timeout=30, env=None, stdout=subprocess.PIPE):
        """Start `moonloop serve` (with args) and wait until it listens: by
        then its workspace is registered. Returns the Popen; its URL is in
        .url, its port in .port, what it said on stderr in .stderr_lines.
        Fails with serve's own stderr if it exits first."""
        p = self.start("serve", *args, env=env, stdout=stdout)
        seen = []
        end = time.time() + timeout
        while time.time() < end:
            line = p.stderr.readline()
            if not line:
                raise AssertionError("moonloop serve exited (%s): %s" % (p.wait(), "".join(seen)))
            seen.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                p.url = m.group(1)
                p.port = int(p.url.rsplit(":", 1)[1])
                # Keep draining stderr so serve never blocks on a full pipe;
                # what it says stays in p.stderr_lines.
                p.stderr_lines = seen

                def drain():
                    for line in p.stderr:
                        seen.append(line)
                threading.Thread(target=drain, daemon=True).start()
                return p
        raise AssertionError("moonloop serve did not listen within %ds: %s" % (timeout, "".join(seen)))

    def json(self, *args, timeout=60):
        r = self.ml(*args, "--json", timeout=timeout)
        if r.returncode != 0:
            raise AssertionError("moonloop %s failed: %s" % (" ".join(args), r.stderr))
        return json.loads(r.stdout)

    def runs(self, **filters):
        args = ["runs", "--limit", "1000"]
        for k, v in filters.items():
            args += ["--" + k, str(v)]
        return self.json(*args)

    def trace(self, run_id):
        return self.json("trace", run_id)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        if self.pgdb:
            # Dropped in the background: the cluster goes at the end anyway.
            pgcluster.drop_later(PG, self.pgdb)
        found = []
        for name in sorted(os.listdir(self.reports)):
            with open(os.path.join(self.reports, name), errors="replace") as f:
                found.append("== %s\n%s" % (name, f.read()))
        shutil.rmtree(self.path, ignore_errors=True)
        if found:
            raise AssertionError("the sanitizers reported:\n" + "\n".join(found))


def kill9(p):
    """SIGKILL a started process and reap it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


# The key of the PostgreSQL store's write lock (store_pg_db.h's PG_WRITE_LOCK).
PG_WRITE_LOCK = 0x6d6c6f6f70


def _write_lock_free(db):
    """Whether the database db's write lock is free at this moment: SQLite's
    (BEGIN IMMEDIATE succeeds at once), or PostgreSQL's (the store's
    advisory lock can be taken whole: no transaction holds it, shared or
    whole)."""
    if PG and db.startswith(("postgresql://", "postgres://")):
        got = pgcluster.psql(PG, "SELECT pg_try_advisory_xact_lock(%d)" % PG_WRITE_LOCK,
                             db=db.rsplit("/", 1)[1])
        return got.strip() == "t"
    import sqlite3
    con = sqlite3.connect(db, timeout=0)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def freeze_between_commits(pid, db, timeout=10.0):
    """SIGSTOP a process at a moment it holds no write transaction on db
    (a SQLite file or a PostgreSQL URL), so a test that stops an engine to
    see another take over never stops it in the middle of a commit (which
    would hold the write lock until it is continued, and stall every other
    writer)."""
    deadline = time.time() + timeout
    while True:
        os.kill(pid, signal.SIGSTOP)
        if _write_lock_free(db):
            return
        os.kill(pid, signal.SIGCONT)
        if time.time() > deadline:
            raise AssertionError("the process kept its write lock for %ds" % timeout)
        time.sleep(0.02)


class TestCase(unittest.TestCase):
    """Base class: self.w is a fresh Workdir, self.si a fresh StandIn."""
    env_names = ("STANDIN",)
    config = None

    def setUp(self):
        self.si = StandIn()
        self.w = Workdir(env_names=self.env_names, config=self.config)
        self.w.env["STANDIN"] = self.si.url

    def tearDown(self):
        self.w.close()
        self.si.close()

    def run_id_of(self, r):
        """The run id that `moonloop run` printed first on stderr."""
        for line in r.stderr.splitlines():
            if line.startswith("run "):
                return line.split()[1]
        raise AssertionError("no run id in stderr: %r" % r.stderr)


class SkillsTestCase(TestCase):
    """A TestCase whose workdir has a skills/ workspace that serve loads."""

    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))

    def skill(self, name, src):
        self.w.write("skills/%s.lua" % name, src)

    def serve(self):
        return self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")

    def runs_of(self, skill, status=None):
        kw = {"skill": skill}
        if status:
            kw["status"] = status
        return self.w.runs(**kw)


def _line_re(pattern):
    return re.compile(".*".join(re.escape(p) for p in pattern.split("...")) + r"\Z")


def lines_match(expected, actual, normalize=str.rstrip):
    """Whether actual output lines match the expected lines of a doc example:
    "..." inside a line matches any text, a line of just "..." any number of
    lines; both sides pass through normalize; trailing blank lines are ignored."""
    exp = [normalize(e) for e in expected]
    act = [normalize(a) for a in actual]
    while exp and not exp[-1]:
        exp.pop()
    while act and not act[-1]:
        act.pop()

    def go(i, j):
        if i == len(exp):
            return j == len(act)
        if exp[i] == "...":
            return any(go(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and _line_re(exp[i]).match(act[j]) is not None and go(i + 1, j + 1)
    return go(0, 0)
