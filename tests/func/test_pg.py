"""The PostgreSQL store's own faults, where the SQLite file's do not apply:
a server that crashes (kill -9 of the postmaster and its backends) and is
started again loses nothing it acknowledged and runs no completed step
again; a server that is away for a while gets every writer a clear 503 (or
exit 1), and the engine carries on once it is back; each reason a
connection fails is said, and a URL's password never shows. Run only
against PostgreSQL (MOONLOOP_TEST_BACKEND=pg: make test's func-pg/test_pg)."""
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import pgcluster  # noqa: E402
from mltest import PG, SkillsTestCase, TestCase, kill9, wait_until  # noqa: E402

pg_only = unittest.skipUnless(PG, "PostgreSQL only: run with MOONLOOP_TEST_BACKEND=pg "
                              "(make test runs it as func-pg/test_pg)")


def post(url, body, timeout=30):
    """(status, parsed JSON answer) of a POST; HTTP errors are answers too."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except OSError as e:  # no answer at all: the test says so
        return 0, {"error": {"message": "no answer: %s" % e}}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pg_only
class ConnectionTest(TestCase):
    def test_each_reason_a_connection_fails_is_said_without_the_password(self):
        user, pw, port = PG["user"], PG["password"], PG["port"]
        cases = [
            ("postgresql://%s:%s@127.0.0.1:%d/no_such_db" % (user, pw, port),
             'database "no_such_db" does not exist'),
            ("postgresql://%s:not-the-password@127.0.0.1:%d/%s" % (user, port, self.w.pgdb),
             'password authentication failed for user "%s"' % user),
            ("postgres://%s:%s@127.0.0.1:%d/%s" % (user, pw, free_port(), self.w.pgdb),
             "Connection refused"),
            # The password as a query parameter, last: hiding it looped for
            # ever (every command spun without a word); first, middle too.
            ("postgresql://%s@127.0.0.1:%d/%s?sslmode=disable&password=not-the-password" % (
                user, port, self.w.pgdb), 'password authentication failed for user "%s"' % user),
            ("postgresql://%s@127.0.0.1:%d/%s?password=not-the-password" % (user, port, self.w.pgdb),
             'password authentication failed for user "%s"' % user),
            ("postgresql://%s@127.0.0.1:%d/%s?password=not-the-password&sslmode=disable" % (
                user, port, self.w.pgdb), 'password authentication failed for user "%s"' % user),
        ]
        for url, words in cases:
            for args in (("runs",), ("send", "go"), ("serve", "--listen", "127.0.0.1:0")):
                r = self.w.ml(*args, "--db", url, timeout=60)
                self.assertEqual(r.returncode, 1, (args, url, r.stderr))
                self.assertIn("cannot connect to PostgreSQL", r.stderr)
                self.assertIn(words, r.stderr)
                self.assertNotIn(pw, r.stderr)
                self.assertNotIn("not-the-password", r.stderr)

    def test_serve_names_its_database_without_the_password(self):
        p = self.w.serve("--listen", "127.0.0.1:0")
        said = "".join(p.stderr_lines)
        self.assertIn("serving postgresql://%s@127.0.0.1:%d/%s" % (PG["user"], PG["port"], self.w.pgdb),
                      said)
        self.assertNotIn(PG["password"], said)


SKILL = """
return { id = "s", triggers = { { event = "go" } }, run = function(ctx)
  local a = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a/" .. ctx.run_id).n end)
  ctx.step.sleep("nap", "200ms")
  local b = ctx.step.run("b", function() return http.get_json(env.STANDIN .. "/b/" .. ctx.run_id).n end)
  return { i = ctx.event.data.i, sum = a + b }
end }"""


class OwnClusterCase(SkillsTestCase):
    """A cluster of the test's own, which it may kill and start again."""

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="mlpg-own-")
        os.chmod(self.tmp, 0o755)  # the server runs as postgres when the tests run as root
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.pg = pgcluster.start(os.path.join(self.tmp, "cluster"))
        self.addCleanup(pgcluster.stop, self.pg["dir"])
        pgcluster.psql(self.pg, "CREATE DATABASE t")
        self.w.db = self.pg["url"] + "/t"
        self.w.env["MOONLOOP_DB"] = self.w.db

    def postmaster(self):
        with open(os.path.join(self.pg["data"], "postmaster.pid")) as f:
            return int(f.readline())

    def server_processes(self):
        """The postmaster and every process it started."""
        pm = self.postmaster()
        kids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open("/proc/%s/stat" % d) as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pm:
                            kids.append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
        return [pm] + kids

    def crash(self):
        """kill -9 the postmaster and every process it started, as a crash of
        the server (the backends would go on their own, a moment later)."""
        os.kill(self.postmaster(), signal.SIGSTOP)  # no new backend from here on: they are all listed
        procs = self.server_processes()
        for pid in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        def gone():
            for pid in procs:
                try:
                    with open("/proc/%d/stat" % pid) as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            return False
                except OSError:
                    pass
            return True
        wait_until(gone, what="the server's processes to be gone")

    def restart(self):
        for _ in range(20):  # a backend of the old server may still be on its way out
            r = pgcluster.pg_ctl(self.pg, "start", "-w", "-t", "60", "-l",
                                 os.path.join(self.pg["dir"], "server.log"), "-o", self.pg["opts"])
            if r.returncode == 0:
                return
            time.sleep(0.5)
        with open(os.path.join(self.pg["dir"], "server.log")) as f:
            self.fail("the server did not start again: %s%s%s" % (r.stdout, r.stderr, f.read()[-2000:]))


@pg_only
class ServerFaultTest(OwnClusterCase):
    """Each test has a cluster of its own: it is killed and started again."""

    def setUp(self):
        super().setUp()
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)

    def runs_by_i(self):
        out = {}
        for r in self.w.runs(skill="s"):
            out.setdefault(r["input"]["i"], []).append(r)
        return out

    def check_every_acknowledged_event_ran_once(self, acked, refused):
        def all_done():
            runs = self.runs_by_i()
            return all(len(runs.get(i, [])) == 1 and runs[i][0]["status"] == "completed"
                       for i in acked)
        wait_until(all_done, timeout=60, what=lambda: "every acknowledged event's run to complete: "
                   "%d acknowledged, %s" % (len(acked), {i: [r["status"] for r in rs]
                                                        for i, rs in self.runs_by_i().items()}))
        runs = self.runs_by_i()
        for i in acked:
            r = runs[i][0]
            self.assertEqual(r["output"], {"i": i, "sum": 3})
            # The engine tried its failed commits again, never the bodies.
            self.assertEqual((self.si.count("/a/" + r["id"]), self.si.count("/b/" + r["id"])), (1, 1),
                             self.w.trace(r["id"]))
        for i in refused:  # told nothing was stored: nothing was
            self.assertNotIn(i, runs)

    def test_a_crash_of_the_server_loses_nothing_acknowledged(self):
        # Commits linger a little, so that the crash often lands inside one.
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0",
                         env={"MOONLOOP_FAULT": "commit=30"})
        acked, refused, answers = [], [], []
        stop = threading.Event()
        lock = threading.Lock()

        def send(i):
            code, body = post(p.url + "/v1/events", {"name": "go", "data": {"i": i}}, timeout=120)
            with lock:
                (acked if code == 202 else refused).append(i)
                answers.append((code, body))

        # Each event is sent on a thread of its own: an event whose commit was
        # in flight when the server died is answered only once the restarted
        # server says whether it was stored, and must not hold the others.
        senders = []

        def sender():
            i = 0
            while not stop.is_set():
                s = threading.Thread(target=send, args=(i,), daemon=True)
                s.start()
                senders.append(s)
                i += 1
                time.sleep(0.02)
        t = threading.Thread(target=sender, daemon=True)
        t.start()
        wait_until(lambda: len(acked) >= 20, what="events accepted before the crash")
        self.crash()
        wait_until(lambda: len(refused) >= 3, timeout=30,
                   what=lambda: "writes refused while the server is down: %d answered, the last %s; "
                   "the engine said: %s" % (len(answers), answers[-3:], "".join(p.stderr_lines)))
        time.sleep(1)
        self.restart()
        n = len(acked)
        wait_until(lambda: len(acked) >= n + 20, timeout=30,
                   what=lambda: "events accepted after the restart: %s %s" % (
                       answers[-3:], "".join(p.stderr_lines)))
        stop.set()
        t.join(timeout=30)
        for s in senders:
            s.join(timeout=130)
        refusals = [b for c, b in answers if c != 202]
        self.assertTrue(all(c == 503 for c, _ in answers if c != 202), answers)
        for b in refusals:
            self.assertIn("nothing was stored", b["error"]["message"])
            self.assertIn("PostgreSQL", b["error"]["message"])
        self.check_every_acknowledged_event_ran_once(acked, refused)
        said = "".join(p.stderr_lines)
        self.assertIn("cannot write to the database", said)
        self.assertIn("the database is writable again", said)

    def test_a_server_away_for_a_while_refuses_writes_and_the_engine_carries_on(self):
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        self.assertEqual(post(p.url + "/v1/events", {"name": "go", "data": {"i": 0}})[0], 202)
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"],
                   what="the first run")
        r = pgcluster.pg_ctl(self.pg, "stop", "-m", "fast", "-w")
        self.assertEqual(r.returncode, 0, r.stderr)
        # Every writer hears at once, with the reason: the API, the CLI.
        code, body = post(p.url + "/v1/events", {"name": "go", "data": {"i": 1}})
        self.assertEqual(code, 503, body)
        self.assertIn("nothing was stored", body["error"]["message"])
        self.assertIn("PostgreSQL", body["error"]["message"])
        code, body = post(p.url + "/v1/skills/s/invoke", {"data": {"i": 2}})
        self.assertEqual(code, 503, body)
        r = self.w.ml("send", "go", "--data", '{"i": 3}')
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot connect to PostgreSQL", r.stderr)
        self.assertIn("Connection refused", r.stderr)
        # The engine waits with a back-off, saying so once per reason (the
        # connection lost, the server refusing new ones, the server starting
        # up), not once per try.
        time.sleep(3)
        self.restart()
        wait_until(lambda: any("the database is writable again" in l for l in p.stderr_lines),
                   timeout=30, what="the engine to write again")
        said = [l for l in p.stderr_lines if "cannot write to the database" in l]
        self.assertEqual(len(said), len(set(said)), "".join(p.stderr_lines))
        self.assertEqual(post(p.url + "/v1/events", {"name": "go", "data": {"i": 4}})[0], 202)
        self.w.ml("send", "go", "--data", '{"i": 5}', check=0)
        self.check_every_acknowledged_event_ran_once([0, 4, 5], [1, 2, 3])
        # Reads and notifications came back too: a run started from the CLI
        # was noticed by the engine (LISTEN after the reconnection).
        self.assertEqual(p.poll(), None)

    def signal_server(self, procs, sig):
        """Send sig to each of procs that is still there."""
        for pid in procs:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def test_a_read_of_a_stalled_server_gives_up_before_a_write_would(self):
        # The engine's loop makes the reads: while one waited the 30 s a
        # write may (MOONLOOP_PG_TIMEOUT's default), nothing else moved, not
        # /metrics nor the dashboard's files. A read gives up after 5 s.
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        self.assertEqual(post(p.url + "/v1/events", {"name": "go", "data": {"i": 0}})[0], 202)
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"],
                   what="the first run")
        procs = self.server_processes()
        self.signal_server(procs, signal.SIGSTOP)
        try:
            try:
                with urllib.request.urlopen(p.url + "/v1/runs", timeout=20) as r:
                    code, body = r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                code, body = e.code, json.loads(e.read())
            self.assertEqual(code, 503, body)
            self.assertIn("did not answer within 5 s", body["error"]["message"])
        finally:
            self.signal_server(procs, signal.SIGCONT)
        def reads():
            try:
                return urllib.request.urlopen(p.url + "/v1/runs", timeout=30).status == 200
            except urllib.error.HTTPError:
                return False  # 503 until the connection is opened again
        wait_until(reads, timeout=60, what="reads again")
        self.assertEqual(p.poll(), None)

    def test_a_server_that_stops_answering_gets_503s_not_a_stalled_engine(self):
        # A server stopped (SIGSTOP) keeps its connections open: the kernel
        # answers for it, so only a deadline on each round trip tells the
        # engine it is gone (MOONLOOP_PG_TIMEOUT: 2 s here, 30 by default).
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0",
                         env={"MOONLOOP_PG_TIMEOUT": "2"})
        self.assertEqual(post(p.url + "/v1/events", {"name": "go", "data": {"i": 0}})[0], 202)
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"],
                   what="the first run")
        procs = self.server_processes()
        self.signal_server(procs, signal.SIGSTOP)
        try:
            # Answered, with the reason, rather than held for as long as the
            # server is stopped (the client's 60 s only catches a hang).
            code, body = post(p.url + "/v1/events", {"name": "go", "data": {"i": 1}}, timeout=60)
            self.assertEqual(code, 503, body)
            self.assertIn("nothing was stored", body["error"]["message"])
            self.assertIn("PostgreSQL", body["error"]["message"])
            # The writer's first failure was the deadline (later tries may
            # find the server taking no new connection: "timeout expired").
            wait_until(lambda: any("did not answer within 2 s" in l for l in p.stderr_lines),
                       what=lambda: "the deadline said: %s" % "".join(p.stderr_lines))
            code, body = post(p.url + "/v1/events", {"name": "go", "data": {"i": 2}}, timeout=60)
            self.assertEqual(code, 503, body)
            # Reads too: the loop answers instead of waiting on the server.
            try:
                with urllib.request.urlopen(p.url + "/v1/runs", timeout=60) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
            self.assertEqual(code, 503)
        finally:
            self.signal_server(procs, signal.SIGCONT)
        wait_until(lambda: any("the database is writable again" in l for l in p.stderr_lines),
                   timeout=60, what=lambda: "the engine to write again: %s" % "".join(p.stderr_lines))
        wait_until(lambda: post(p.url + "/v1/events", {"name": "go", "data": {"i": 3}})[0] == 202,
                   timeout=30, what="an event accepted again")
        self.check_every_acknowledged_event_ran_once([0, 3], [1, 2])
        self.assertEqual(p.poll(), None)

    def test_a_commit_whose_answer_was_lost_is_answered_once_the_server_says_what_became_of_it(self):
        # The server is stopped (SIGSTOP) while the event's transaction waits
        # to commit (commit=1500: each commit holds 1.5 s before COMMIT):
        # the COMMIT goes out, no answer comes (the 2 s deadline closes the
        # connection), and the stopped backend still holds it. When the
        # server is continued it commits: the writer must then hear 202,
        # not "nothing was stored" for an event that runs.
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0",
                         env={"MOONLOOP_PG_TIMEOUT": "2", "MOONLOOP_FAULT": "commit=1500"})
        answers = []
        t = threading.Thread(target=lambda: answers.append(
            post(p.url + "/v1/events", {"name": "go", "data": {"i": 0}}, timeout=120)), daemon=True)
        t.start()

        def in_event_commit():
            rows = pgcluster.psql(self.pg, "SELECT count(*) FROM pg_stat_activity WHERE"
                                  " application_name LIKE 'moonloop writer%' AND state ="
                                  " 'idle in transaction' AND query LIKE '%events%'", db="t")
            return rows.strip() == "1"
        wait_until(in_event_commit, timeout=30, interval=0.01, what="the event's commit")
        procs = self.server_processes()
        self.signal_server(procs, signal.SIGSTOP)
        try:
            wait_until(lambda: any("in doubt" in l for l in p.stderr_lines), timeout=60,
                       what=lambda: "the commit in doubt: %s" % "".join(p.stderr_lines))
            self.assertEqual(answers, [])  # told nothing yet: it may have been stored
            # A new write meanwhile is refused, told that an earlier
            # commit is in doubt and that nothing of its own was stored.
            code, body = post(p.url + "/v1/events", {"name": "go", "data": {"i": 1}}, timeout=60)
            self.assertEqual(code, 503, body)
            msg = body["error"]["message"]
            self.assertIn("an earlier commit is in doubt", msg)
            self.assertIn("nothing was stored", msg)
        finally:
            self.signal_server(procs, signal.SIGCONT)
        t.join(timeout=120)
        self.assertEqual(answers and answers[0][0], 202, answers)
        self.check_every_acknowledged_event_ran_once([0], [1])

    def test_a_connection_that_cannot_be_opened_again_holds_no_answer_of_the_engine(self):
        # The postmaster is stopped (SIGSTOP) and the engine's backends end
        # (SIGTERM): its connections are lost, and a new one waits for
        # connect_timeout (60 s here, from the URL) for a server that
        # accepts it and never answers. Meanwhile the engine answers:
        # what needs no database as ever, reads and writes with a 503
        # saying the database cannot be reached, never after the whole
        # connect_timeout (the 20 s of each request only catch that).
        url = self.w.db + "?connect_timeout=60"
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", "--db", url)
        self.assertEqual(post(p.url + "/v1/events", {"name": "go", "data": {"i": 0}})[0], 202)
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"],
                   what="the first run")
        backends = [int(x) for x in pgcluster.psql(
            self.pg, "SELECT pid FROM pg_stat_activity WHERE application_name LIKE"
            " 'moonloop %% (pid %d on %%'" % p.pid, db="t").split()]
        self.assertEqual(len(backends), 2)  # the writer and the reader
        pm = self.postmaster()
        os.kill(pm, signal.SIGSTOP)
        try:
            self.signal_server(backends, signal.SIGTERM)

            def get(path):
                try:
                    with urllib.request.urlopen(p.url + path, timeout=20) as r:
                        return r.status, r.read().decode()
                except urllib.error.HTTPError as e:
                    return e.code, e.read().decode()
            # Reads: refused at once, saying why (the loop found its
            # connection lost and opens it again off the loop).
            wait_until(lambda: get("/v1/runs")[0] == 503, what="a read refused")
            code, body = get("/v1/runs")
            self.assertEqual(code, 503, body)
            self.assertIn("cannot connect to PostgreSQL", body)
            for _ in range(3):  # while connections are being tried, and after
                self.assertEqual(get("/metrics")[0], 200)
                self.assertEqual(get("/v1/runs")[0], 503)
                time.sleep(1)
            code, body = post(p.url + "/v1/events", {"name": "go", "data": {"i": 1}}, timeout=20)
            self.assertEqual(code, 503, body)
            self.assertIn("nothing was stored", body["error"]["message"])
            self.assertIn("PostgreSQL", body["error"]["message"])
            self.assertEqual(get("/metrics")[0], 200)
        finally:
            os.kill(pm, signal.SIGCONT)
        # The server answers again: the engine carries on.
        wait_until(lambda: post(p.url + "/v1/events", {"name": "go", "data": {"i": 2}})[0] == 202,
                   timeout=90, what=lambda: "an event accepted again: %s" % "".join(p.stderr_lines))
        self.check_every_acknowledged_event_ran_once([0, 2], [1])
        self.assertEqual(p.poll(), None)

    def test_a_claim_whose_answer_was_lost_still_starts_its_runs(self):
        # The server is stopped (SIGSTOP) while the claim that took the
        # event's run waits to commit (claim=1500 holds each claim that
        # long before COMMIT): the COMMIT goes out, no answer comes (the 2 s
        # deadline closes the connection), and the stopped backend still
        # has it. Continued, the server commits the claim: the run is the
        # engine's in the database, though the engine heard the claim
        # fail. It must start all the same, not stay queued under a live
        # lease that no other engine may take it from (found by the three
        # engines' crash test: six runs queued for good).
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0",
                         env={"MOONLOOP_PG_TIMEOUT": "2", "MOONLOOP_FAULT": "claim=1500"})
        self.assertEqual(post(p.url + "/v1/events", {"name": "go", "data": {"i": 0}})[0], 202)

        def claim_holds_the_run():
            # Queued and unowned as committed, yet locked: a claim has it.
            rows = pgcluster.psql(self.pg, "SELECT (SELECT count(*) FROM runs WHERE owner IS NULL"
                                  " AND status = 'queued'), (SELECT count(*) FROM (SELECT id FROM"
                                  " runs WHERE owner IS NULL AND status = 'queued'"
                                  " FOR UPDATE SKIP LOCKED) x)", db="t")
            return rows.strip() == "1|0"
        wait_until(claim_holds_the_run, timeout=30, interval=0.01, what="a claim holding the run")
        procs = self.server_processes()
        self.signal_server(procs, signal.SIGSTOP)
        try:
            wait_until(lambda: any("claiming runs failed" in l for l in p.stderr_lines), timeout=60,
                       what=lambda: "the claim to fail: %s" % "".join(p.stderr_lines))
        finally:
            self.signal_server(procs, signal.SIGCONT)
        # The claim committed after all (the engine holds the run in the
        # database), and the run starts and completes (60 s only catches a
        # run left queued).
        self.check_every_acknowledged_event_ran_once([0], [])
        self.assertEqual(p.poll(), None)


# A run with every step kind: a body (an outside call), a sleep, parallel
# bodies, an event it sends itself and waits for, a child run.
PARENT = """
return { id = "p", triggers = { { event = "go" } }, run = function(ctx)
  local function call(path) return http.get_json(env.STANDIN .. path .. ctx.run_id).n end
  local a = ctx.step.run("a", function() return call("/a/") end)
  ctx.step.sleep("nap", "300ms")
  local pr = ctx.step.parallel("par", { function() return call("/p1/") end,
                                        function() return call("/p2/") end })
  ctx.step.send_event("ping", { name = "ping-" .. ctx.run_id, data = { v = 1 } })
  local ev = ctx.step.wait_for_event("w", { event = "ping-" .. ctx.run_id, timeout = "120s" })
  local kid = ctx.step.invoke("kid", { skill = "k", data = {} })
  return { i = ctx.event.data.i, sum = a + pr[1] + pr[2] + ev.data.v + kid }
end }"""
CHILD = """
return { id = "k", run = function(ctx)
  return ctx.step.run("c", function() return http.get_json(env.STANDIN .. "/c/" .. ctx.run_id).n end) * 10
end }"""
# The outside call of each step.run body and parallel branch, by step id.
BODY_PATHS = {"a": "/a/", "par/1": "/p1/", "par/2": "/p2/", "c": "/c/"}


@pg_only
class EnginesCrashTest(OwnClusterCase):
    """Three engines on one database, killed (SIGKILL), frozen past their
    lease (SIGSTOP, SIGCONT) and left without the server (kill -9 of the
    postmaster) while runs with every step kind are in flight: every
    acknowledged event starts its run exactly once, no step whose
    completion was durable runs again, and every run finishes."""
    config = {"lease": '"4s"'}

    def setUp(self):
        super().setUp()
        for path in BODY_PATHS.values():
            self.si.route_prefix(path, lambda h, b, n: (200, {"n": 1}))
        self.skill("p", PARENT)
        self.skill("k", CHILD)

    def engine(self):
        return self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", timeout=60)

    def completed_bodies(self):
        """{(run id, step id): calls made so far} of every body whose
        completion is durable now."""
        rows = pgcluster.psql(self.pg, "SELECT run_id, id FROM steps WHERE kind = 'run'"
                              " AND status = 'completed'", db="t").split()
        out = {}
        for run_id, step in (r.split("|") for r in rows):
            path = BODY_PATHS.get(step)
            if path:
                out[(run_id, step)] = self.si.count(path + run_id)
        return out

    def test_three_engines_kills_freezes_and_a_server_crash_lose_and_repeat_nothing(self):
        import random
        rnd = random.Random(int(os.environ.get("MOONLOOP_TEST_SEED", "0")) or None)
        engines = [self.engine() for _ in range(3)]
        acked, unknown, refused = [], [], []
        lock = threading.Lock()
        stop = threading.Event()

        def sender():
            i = 0
            while not stop.is_set():
                with lock:
                    live = [e for e in engines if e.poll() is None]
                if live:
                    code, _ = post(rnd.choice(live).url + "/v1/events", {"name": "go", "data": {"i": i}},
                                   timeout=20)
                    (acked if code == 202 else refused if code == 503 else unknown).append(i)
                    i += 1
                time.sleep(0.05)
        t = threading.Thread(target=sender, daemon=True)
        t.start()
        seen = {}  # bodies seen completed (durable), with their calls then
        actions = ["kill", "kill", "freeze", "kill", "server", "freeze", "kill"]
        for what in actions:
            time.sleep(rnd.uniform(1.0, 2.5))
            seen.update(self.completed_bodies())
            k = rnd.randrange(3)
            if what == "kill":
                kill9(engines[k])
                with lock:
                    engines[k] = self.engine()
            elif what == "freeze":
                os.kill(engines[k].pid, signal.SIGSTOP)
                time.sleep(6)  # past its lease: the others take its runs over
                os.kill(engines[k].pid, signal.SIGCONT)
            else:
                self.crash()
                time.sleep(1)
                self.restart()
        time.sleep(2)
        stop.set()
        t.join(timeout=60)
        self.assertGreater(len(acked), 20)

        def by_i():
            out = {}
            for r in self.w.runs(skill="p"):
                out.setdefault(r["input"]["i"], []).append(r)
            return out

        def all_done():
            runs = by_i()
            return all(len(runs.get(i, [])) == 1 and runs[i][0]["status"] == "completed" for i in acked)
        wait_until(all_done, timeout=180, what=lambda: "every acknowledged event's run to end: %s; %s" % (
            {i: [(r["status"], r["error"]) for r in rs] for i, rs in by_i().items() if i in acked and
             (len(rs) != 1 or rs[0]["status"] != "completed")},
            [l for e in engines for l in e.stderr_lines][-20:]))
        runs = by_i()
        for i in acked:
            self.assertEqual(runs[i][0]["output"], {"i": i, "sum": 14}, runs[i][0])
        for i in refused:  # told nothing was stored: nothing was
            self.assertNotIn(i, runs)
        for i in unknown:  # no answer (its engine was killed): once at most
            self.assertLessEqual(len(runs.get(i, [])), 1)
        self.assertEqual(len(self.w.runs(skill="k")), sum(len(v) for v in runs.values()))
        # No body whose completion was durable ran again, on any engine.
        seen.update(self.completed_bodies())
        again = {k: (n, self.si.count(BODY_PATHS[k[1]] + k[0])) for k, n in seen.items()
                 if self.si.count(BODY_PATHS[k[1]] + k[0]) != n}
        self.assertEqual(again, {})
        for e in engines:
            self.assertIsNone(e.poll(), "".join(e.stderr_lines[-20:]))
            e.terminate()
            self.assertEqual(e.wait(timeout=30), 0, "".join(e.stderr_lines[-20:]))


@pg_only
class SharedDeployTest(SkillsTestCase):
    def test_a_skill_put_through_one_engine_runs_on_another_and_new_versions_reach_both(self):
        # Two engines on one database, an empty workspace each: a version
        # PUT through A is live on B too, and B's runs use the newest.
        a, b = self.serve(), self.serve()

        def put(p, src):
            req = urllib.request.Request(p.url + "/v1/skills/d", data=src.encode(), method="PUT",
                                         headers={"Content-Type": "text/x-lua"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())["version"]
        src = 'return { id = "d", run = function(ctx) return ctx.step.run("x", function() return %d end) end }'
        for n, via in ((1, a), (2, b)):
            version = put(via, src % n)
            for p in (a, b):
                def live():
                    with urllib.request.urlopen(p.url + "/v1/skills/d", timeout=10) as r:
                        return json.loads(r.read()).get("version") == version
                wait_until(live, what="version %d live on every engine" % n)
                code, body = post(p.url + "/v1/skills/d/invoke", {"data": {}, "wait": True})
                self.assertEqual((code, body.get("output")), (200, n), body)


if __name__ == "__main__":
    unittest.main()
