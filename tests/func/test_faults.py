"""Injected faults (engine/base/fault.h): each fault point of the test build
made to fail where the engine meets the outside world, and the engine's
answer checked: it tries again, or gives a clear error, and loses nothing
it acknowledged. A run arms a point with a log line "fault: point=value"
(MOONLOOP_FAULT set), so the fault lands exactly between two of its steps.

Skipped on a binary built without the points (a packager's build)."""
import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, PG, SkillsTestCase, kill9, sqlite_only, wait_until  # noqa: E402


def faults_compiled():
    out = subprocess.run([BIN, "version", "--json"], capture_output=True, text=True).stdout
    return json.loads(out).get("faults") is True


def http_h(method, url, body=None, timeout=10):
    """(status, headers, parsed JSON body); HTTP errors are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"null")


def http(method, url, body=None, timeout=10):
    """(status, parsed JSON body)."""
    st, _, b = http_h(method, url, body, timeout)
    return st, b


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no metric %s" % name)


# Three steps, each counted by the stand-in per run; the middle one arms
# FAULT (the skill's text has it) the first time it runs for a run.
SKILL = """
return { id = "s", triggers = { { event = "go" } }, run = function(ctx)
  local a = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a/" .. ctx.run_id).n end)
  local b = ctx.step.run("b", function()
    local n = http.get_json(env.STANDIN .. "/b/" .. ctx.run_id).n
    if n == 1 then log.info("fault: FAULT") end
    return 10
  end)
  local c = ctx.step.run("c", function() return http.get_json(env.STANDIN .. "/c/" .. ctx.run_id).n end)
  return a + b + c
end }"""


@unittest.skipUnless(faults_compiled(), "the binary has no fault points (built without MOONLOOP_FAULTS)")
class FaultCase(SkillsTestCase):
    def serve_with(self, fault, skill=SKILL, **env):
        self.skill("s", skill.replace("FAULT", fault))
        e = {"MOONLOOP_FAULT": ""}
        e.update(env)
        return self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", env=e)

    def said(self, p, text):
        return any(text in line for line in p.stderr_lines)

    def counts(self, rid):
        return tuple(self.si.count("/%s/%s" % (k, rid)) for k in "abc")

    def check_integrity(self):
        if PG:
            return  # (PostgreSQL checks its pages itself: data_checksums, WAL replay)
        db = sqlite3.connect(self.w.db)
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        db.close()


class CommitFaultTest(FaultCase):
    def test_a_failed_commit_is_tried_again_and_each_step_body_runs_once(self):
        p = self.serve_with("commit_fail=2")
        rid = self.w.ml("invoke", "s", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30, what="the run")
        t = self.w.trace(rid)
        self.assertEqual(t["output"], 12)
        # The group that failed was committed again, not the step bodies run again.
        self.assertEqual(self.counts(rid), (1, 1, 1))
        self.assertEqual(metric(p.url, "moonloop_commit_failures_total"), 2)
        self.assertTrue(self.said(p, "cannot write to the database: store: committing: the "
                                  "transaction failed (fault injected: commit_fail)"), p.stderr_lines)
        wait_until(lambda: self.said(p, "the database is writable again (2 failed attempts"),
                   what="the engine to say it writes again")
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)
        self.check_integrity()

    @sqlite_only("fsync_fail fails the fsyncs of SQLite's files (a VFS); PostgreSQL's are the "
                 "server's")
    def test_a_failed_fsync_fails_the_commit_which_is_tried_again(self):
        p = self.serve_with("fsync_fail=2")
        rid = self.w.ml("invoke", "s", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30, what="the run")
        self.assertEqual(self.w.trace(rid)["output"], 12)
        self.assertEqual(self.counts(rid), (1, 1, 1))
        self.assertGreaterEqual(metric(p.url, "moonloop_commit_failures_total"), 1)
        self.assertTrue(self.said(p, "cannot write to the database: store: committing: disk I/O error"),
                        p.stderr_lines)
        wait_until(lambda: self.said(p, "the database is writable again"), what="the engine to write again")
        # Another process sees every step: the retried group landed whole.
        self.assertEqual([s["output"] for s in self.w.trace(rid)["steps"]], [1, 10, 1])
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)
        self.check_integrity()


class DispatchFaultTest(FaultCase):
    def test_a_failed_dispatch_is_tried_again_and_the_event_starts_its_run(self):
        # An engine alone and idle: no other process's write wakes it to
        # look at the events again (on PostgreSQL, not even its own lease
        # renewals do), so the dispatch that failed must be tried again.
        # Twice: the event's own commit may wake it once more (its NOTIFY).
        p = self.serve_with("", MOONLOOP_FAULT="dispatch_fail=2")
        code, body = http("POST", p.url + "/v1/events", {"name": "go", "data": {}})
        self.assertEqual(code, 202, body)
        wait_until(lambda: self.said(p, "dispatching events failed: store: dispatching events: the "
                                     "transaction failed (fault injected: dispatch_fail)"),
                   what=lambda: "the dispatch to fail: %s" % "".join(p.stderr_lines))
        # (60 s only catches an event left undispatched)
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"], timeout=60,
                   what=lambda: "the event's run: %s" % self.w.runs(skill="s"))
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)


@sqlite_only("disk_full fails the writes of SQLite's files (a VFS); PostgreSQL's are the server's")
class DiskFullTest(FaultCase):
    def test_writers_hear_the_disk_is_full_at_once_and_nothing_is_lost(self):
        p = self.serve_with("disk_full=3000")
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: self.said(p, "cannot write to the database"), timeout=20,
                   what="the engine to find the disk full")
        # While it is full, every writer is told at once that nothing was stored.
        code, body = http("POST", p.url + "/v1/events", {"name": "go", "id": "refused"})
        self.assertEqual(code, 503, body)
        self.assertIn("database or disk is full", body["error"]["message"])
        self.assertIn("nothing was stored", body["error"]["message"])
        code, headers, body = http_h("POST", p.url + "/v1/skills/s/invoke", {"data": {}})
        self.assertEqual(code, 503, body)
        self.assertEqual((body["error"]["code"], headers["Retry-After"]), ("busy", "1"))
        wait_until(lambda: self.said(p, "the database is writable again"), timeout=30,
                   what="the disk to have room again")
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"], timeout=30,
                   what="the accepted event's run")
        rid = self.w.runs(skill="s")[0]["id"]
        self.assertEqual(self.w.trace(rid)["output"], 12)
        self.assertEqual(self.counts(rid), (1, 1, 1))
        # The refused writes never landed, also once there was room.
        self.assertEqual(len(self.w.runs(skill="s")), 1)
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go", "id": "refused"})[0], 202)
        wait_until(lambda: len(self.w.runs(skill="s", status="completed")) == 2, timeout=30,
                   what="the event sent again")
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)
        self.check_integrity()


class LeaseFaultTest(FaultCase):
    config = {"lease": '"2s"'}

    def test_a_refused_renewal_drops_the_runs_and_they_resume_from_their_journal(self):
        # The renewal in the commit of step b's result is refused: the
        # engine must act as if another process had taken its runs
        # (lease_lost): drop them and every write for them not yet
        # committed, take a new lease, and (its old lease expired) claim
        # them again and replay them.
        p = self.serve_with("lease_refused=1")
        rid = self.w.ml("invoke", "s", check=0).stdout.strip()
        wait_until(lambda: self.said(p, "LEASE LOST"), timeout=20, what="the lease lost")
        self.assertTrue(self.said(p, "fault injected: lease_refused"), p.stderr_lines)
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=40, what="the run")
        t = self.w.trace(rid)
        self.assertEqual(t["output"], 12)
        # a was durable before the fault: not run again. b's result was
        # dropped with the lease (never acknowledged): b ran again.
        self.assertEqual(self.counts(rid), (1, 2, 1))
        self.assertEqual(metric(p.url, "moonloop_leases_lost_total"), 1)
        self.assertTrue(self.said(p, "took a new lease"), p.stderr_lines)
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)

    def test_a_lease_refused_at_once_is_asked_for_again_after_a_pause(self):
        # PostgreSQL at its connection limit refuses at once: the engine
        # asked again at once, ~280 times a second, each a line on stderr
        # and in the server's log. Refused 5 times, it now pauses 200 ms,
        # 400 ms, ... between asks, and starts once the lease is free.
        self.skill("s", SKILL.replace("FAULT", "none=0"))
        env = dict(self.w.env, MOONLOOP_FAULT="lease_busy=5")
        p = subprocess.Popen([BIN, "serve", "--workspace", "skills", "--listen", "127.0.0.1:0"],
                             cwd=self.w.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        self.addCleanup(lambda: (p.kill(), p.wait(), p.stderr.close()))
        lines = []
        for line in p.stderr:
            lines.append(line)
            if "listening on" in line:
                break
        waits = [ln for ln in lines if "so far to take a lease" in ln]
        self.assertEqual(len(waits), 5, lines)
        self.assertIn("the database is busy (fault injected: lease_busy)", waits[0])
        # What each line says it waited so far grows as the pauses double
        # (200 + 400 + 800 + 1600 ms before the fifth ask).
        self.assertRegex(waits[-1], r"waiting (2\.|[3-9]\.|\d\d\.)\d*s so far", waits)


# A run that naps after arming a fault, and one that waits for an event.
NAPPER = """
return { id = "s", run = function(ctx)
  local a = ctx.step.run("a", function()
    log.info("fault: FAULT")
    return http.get_json(env.STANDIN .. "/a/" .. ctx.run_id).n
  end)
  ctx.step.sleep("nap", "2s")
  local c = ctx.step.run("c", function() return http.get_json(env.STANDIN .. "/c/" .. ctx.run_id).n end)
  return a + c
end }"""

WAITER = """
return { id = "w", run = function(ctx)
  local ev = ctx.step.wait_for_event("ev", { event = "ping", timeout = "60s" })
  return ev.data.n
end }"""


class ReaderBusyTest(FaultCase):
    config = {"limits": "{ parked_runs = 1 }"}

    def test_reads_the_database_refuses_are_answered_503_and_parked_runs_wake_later(self):
        self.skill("w", WAITER)
        p = self.serve_with("reader_busy=5000", skill=NAPPER)
        waiter = self.w.ml("invoke", "w", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(waiter)["status"] == "waiting", what="the waiter to park")
        # The napper parks past the limit of one parked run (for 2 s: a
        # shorter nap is not worth an eviction): evicted, it is
        # replayed from its journal when its nap ends, which it cannot
        # read while the reader is busy.
        rid = self.w.ml("invoke", "s", check=0).stdout.strip()
        wait_until(lambda: self.said(p, "fault armed by a run: reader_busy"), what="the fault armed")
        code, body = http("GET", p.url + "/v1/runs/" + rid)
        self.assertEqual(code, 503, body)
        self.assertIn("database is locked", body["error"]["message"])
        # A start that needs a read first says, as every refused write does,
        # that nothing was stored (it gave the read's reason alone).
        code, body = http("POST", p.url + "/v1/skills/w/invoke", {"data": {}})
        self.assertEqual(code, 503, body)
        self.assertIn("nothing was stored, try again later", body["error"]["message"])
        # An event delivered meanwhile reaches its waiting run once the poll can read.
        self.w.ml("send", "ping", "--data", '{"n": 7}', check=0)
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=40, what="the napper")
        self.assertEqual(self.w.trace(rid)["output"], 2)
        self.assertEqual(self.counts(rid)[::2], (1, 1))
        self.assertTrue(self.said(p, "run %s: reading its journal failed, trying again" % rid),
                        p.stderr_lines)
        wait_until(lambda: self.w.trace(waiter)["status"] == "completed", timeout=20, what="the waiter")
        self.assertEqual(self.w.trace(waiter)["output"], 7)
        self.assertEqual(http("GET", p.url + "/v1/runs/" + rid)[0], 200)
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)


SLEEPER = """
return { id = "s", run = function(ctx)
  ctx.step.sleep("nap", "1s")
  return "VERSION"
end }"""


class TakeoverReaderBusyTest(FaultCase):
    def test_a_run_taken_over_while_its_version_cannot_be_read_starts_later_not_failed(self):
        # The first engine dies while the run sleeps; the next has another
        # version of the skill in its workspace, so it reads the run's own
        # version from the database to take the run over, and its reads
        # fail for the first 5 s (reader_busy): the database's moment, not
        # the version's fault. The run is taken over a second later, where
        # it used to be failed ("cannot load version").
        self.skill("s", SLEEPER.replace("VERSION", "one"))
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        rid = self.w.ml("invoke", "s", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the run to sleep")
        kill9(p)
        self.skill("s", SLEEPER.replace("VERSION", "two"))
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0",
                         env={"MOONLOOP_FAULT": "reader_busy=5000"})
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=60,
                   what="the run to end")
        t = self.w.trace(rid)
        self.assertEqual((t["status"], t["output"]), ("completed", "one"), t)
        self.assertTrue(self.said(p, "cannot resume run %s yet, trying again in 1s" % rid),
                        p.stderr_lines)
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)


HTTP_SKILL = """
return { id = "s", retries = 2, backoff = "10ms", run = function(ctx)
  return ctx.step.run("call", function()
    log.info("fault: FAULT")
    return http.get_json(env.STANDIN .. "/x").n
  end)
end }"""


class HttpFaultTest(FaultCase):
    def test_a_failed_transfer_fails_the_attempt_and_the_step_tries_again(self):
        # The log line arms the point again on every attempt: two failures
        # in a row would exhaust the retries, one leaves the second attempt.
        p = self.serve_with("http_fail=1", skill=HTTP_SKILL.replace('log.info("fault: FAULT")',
                            'if ctx.attempt == 1 then log.info("fault: FAULT") end'))
        rid = self.w.ml("invoke", "s", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30, what="the run")
        t = self.w.trace(rid)
        # The first request was answered, but the transfer failed on the way back.
        self.assertEqual(t["output"], 2)
        self.assertEqual(self.si.count("/x"), 2)
        atts = t["steps"][0]["attempts"]
        self.assertEqual(len(atts), 2, atts)
        self.assertEqual(atts[0]["status"], "failed")
        self.assertIn("connection reset by peer (fault injected: http_fail)", json.dumps(atts[0]))
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)


class AllocFaultTest(FaultCase):
    def test_an_allocation_the_system_refuses_stops_the_engine_and_a_restart_loses_nothing(self):
        # The out-of-memory policy (base/mem.h): abort with a message; every
        # acknowledged write is durable, and the next engine resumes the run.
        p = self.serve_with("alloc_fail=1")
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        self.assertEqual(p.wait(timeout=30), -signal.SIGABRT)
        wait_until(lambda: self.said(p, "moonloop: out of memory (the system refused"),
                   what="the message")
        [run] = self.w.runs(skill="s")
        done = {s["id"]: s["output"] for s in self.w.trace(run["id"])["steps"] if s["status"] == "completed"}
        self.assertEqual(done, {"a": 1})  # a was acknowledged (b went on past it)
        q = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        wait_until(lambda: self.w.trace(run["id"])["status"] == "completed", timeout=30,
                   what="the run resumed by the next engine")
        self.assertEqual(self.w.trace(run["id"])["output"], 12)
        # a's result came from the journal; b, never acknowledged, ran again.
        self.assertEqual(self.counts(run["id"]), (1, 2, 1))
        q.terminate()
        self.assertEqual(q.wait(timeout=20), 0)
        self.check_integrity()


if __name__ == "__main__":
    unittest.main()


class DescriptorsTest(FaultCase):
    """Connections cannot take the descriptors the engine needs. A client
    holding 1,100 idle connections under the common limit of 1,024 open
    files made accept fail with EMFILE: libuv tried again at once, for
    ever, holding the loop (the lease was lost, once the engine never
    answered again). Now the engine raises its soft limit to the hard one,
    takes at most that limit less a reserve at once (the rest wait in the
    backlog until idle ones are closed), and when accept still finds no
    descriptor it stops listening for a second instead of spinning."""

    def serve_limited(self, nofile, fault=""):
        """serve under a limit of nofile open files (soft and hard): the
        Popen, its URL, and the lines it writes on stderr (as they come)."""
        self.skill("s", SKILL.replace("FAULT", "none=0"))
        env = dict(self.w.env, MOONLOOP_FAULT=fault, MOONLOOP_HTTP_TIMEOUT="2s")
        p = subprocess.Popen([BIN, "serve", "--workspace", "skills", "--listen", "127.0.0.1:0"],
                             cwd=self.w.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
        self.addCleanup(lambda: (p.kill(), p.wait(), p.stderr.close()))
        lines = []

        def read():
            for line in p.stderr:
                lines.append(line)
        threading.Thread(target=read, daemon=True).start()
        wait_until(lambda: any("listening on" in ln for ln in lines), what="serve to listen")
        url = next(ln for ln in lines if "listening on" in ln).split("listening on ")[1].strip()
        return p, url, lines

    def test_idle_connections_past_the_limit_wait_and_the_engine_keeps_serving(self):
        p, url, lines = self.serve_limited(256)  # at most 192 connections at once
        port = int(url.rsplit(":", 1)[1])
        socks = []
        try:
            for _ in range(300):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            # This request waits in the backlog until idle ones are closed (2 s).
            code, body = http("GET", url + "/v1/skills", timeout=30)
            self.assertEqual(code, 200, body)
            code, body = http("POST", url + "/v1/events", {"name": "go"}, timeout=30)
            self.assertEqual(code, 202, body)
        finally:
            for s in socks:
                s.close()
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"], timeout=60,
                   what="the event's run")
        self.assertTrue(any("the most this engine takes at once" in ln for ln in lines), lines)
        self.assertFalse(any("LEASE LOST" in ln or "too many open files" in ln.lower() for ln in lines), lines)

    def test_accept_without_a_descriptor_pauses_listening_instead_of_spinning(self):
        p, url, lines = self.serve_limited(1024, "accept_emfile=1")

        def answered():
            try:
                return http("GET", url + "/v1/skills", timeout=5)[0] == 200
            except OSError:
                return False  # refused while it does not listen
        wait_until(answered, timeout=30, what="serve to listen again")
        self.assertTrue(any("cannot accept connections: too many open files" in ln for ln in lines), lines)
        self.assertTrue(any("listening again on " + url in ln for ln in lines), lines)
        code, _ = http("POST", url + "/v1/events", {"name": "go"})
        self.assertEqual(code, 202)
        wait_until(lambda: [r["status"] for r in self.w.runs(skill="s")] == ["completed"], timeout=60,
                   what="the event's run")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=20), 0)
