"""Fencing: an engine frozen (SIGSTOP) past its lease while another takes
its runs over must never write over the new owner's journal, nor start a
step body or send a request once it resumes (SIGCONT)."""
import json
import os
import signal
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import PG, SkillsTestCase, sqlite_only, wait_until  # noqa: E402


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no metric %s" % name)


class FenceTest(SkillsTestCase):
    config = {"lease": '"2s"'}

    def freeze_with_a_commit_in_flight(self, p, hold=1.5):
        """SIGSTOP p while its commit thread waits for the database's write
        lock (held here for `hold` seconds), so that commit is in flight when
        p resumes, and what p wrote meanwhile waits in its open group."""
        release = self.w.hold_writes()
        time.sleep(hold)  # p renews its lease every 2s/3: its commit now waits for the lock
        os.kill(p.pid, signal.SIGSTOP)
        release()
        time.sleep(3)  # past p's lease

    def status_history(self, rid, seconds):
        seen = []
        end = time.time() + seconds
        while time.time() < end:
            st = self.w.trace(rid)["status"]
            if not seen or seen[-1] != st:
                seen.append(st)
            time.sleep(0.05)
        return seen

    def test_a_frozen_engines_result_and_next_request_never_land(self):
        self.skill("fence", """
return { id = "fence", retries = 0, run = function(ctx)
  local a = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a").n end)
  local b = ctx.step.run("b", function() return http.get_json(env.STANDIN .. "/b").n end)
  return { a = a, b = b }
end }""")
        release = threading.Event()

        def a(handler, body, n):
            if n == 1:  # engine A's call: answered only once A is frozen and fenced
                release.wait(60)
            return 200, {"n": n}
        self.si.routes["/a"] = a
        pa = self.serve()
        rid = self.w.ml("invoke", "fence", check=0).stdout.strip()
        wait_until(lambda: self.si.count("/a") == 1, what="A's call to /a")
        self.freeze_with_a_commit_in_flight(pa)
        pb = self.serve()  # B reaps A's expired lease and takes the run over
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30, what="B ends the run")
        release.set()  # A's answer to /a waits in its socket
        time.sleep(0.3)
        os.kill(pa.pid, signal.SIGCONT)
        wait_until(lambda: any("lease lost" in l.lower() for l in pa.stderr_lines), timeout=20, what="A fenced")
        history = self.status_history(rid, 2)
        t = self.w.trace(rid)
        self.assertEqual(t["output"], {"a": 2, "b": 1})
        self.assertEqual({s["id"]: s["output"] for s in t["steps"]}, {"a": 2, "b": 1})
        self.assertEqual(history, ["completed"])
        # A's body got its answer after SIGCONT, but never went on to /b.
        self.assertEqual((self.si.count("/a"), self.si.count("/b")), (2, 1))
        self.assertEqual(metric(pa.url, "moonloop_leases_lost_total"), 1)
        # A goes on serving under a new lease.
        rid2 = self.w.ml("invoke", "fence", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid2)["status"] == "completed", timeout=20, what="a new run")
        for p in (pa, pb):
            p.terminate()
            p.wait(timeout=20)

    def test_a_frozen_engines_pending_writes_are_dropped_with_its_runs(self):
        # A's sleep ends while its commit waits for the lock: its write (the
        # sleep completed, the run running again) is pending in its open
        # group when the lease turns out lost, and must not commit under the
        # new lease it takes.
        self.skill("nap", """
return { id = "nap", retries = 0, run = function(ctx)
  ctx.step.run("a", function() return 1 end)
  ctx.step.sleep("nap", "2s")
  return ctx.step.run("c", function() return http.get_json(env.STANDIN .. "/c").n end)
end }""")
        pa = self.serve()
        rid = self.w.ml("invoke", "nap", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the nap")
        self.freeze_with_a_commit_in_flight(pa, hold=2.5)
        pb = self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30, what="B ends the run")
        ended = self.w.trace(rid)["ended_at"]
        os.kill(pa.pid, signal.SIGCONT)
        history = self.status_history(rid, 3)
        self.assertTrue(any("lease lost" in l.lower() for l in pa.stderr_lines), "".join(pa.stderr_lines))
        self.assertEqual(history, ["completed"])
        t = self.w.trace(rid)
        self.assertEqual((t["ended_at"], t["output"]), (ended, 1))
        self.assertEqual(self.si.count("/c"), 1)
        for p in (pa, pb):
            p.terminate()
            p.wait(timeout=20)

    def test_a_run_cancelled_while_its_engine_was_frozen_stays_cancelled(self):
        # Nobody reaps A's lease here: A renews it when it resumes. But its
        # run was cancelled meanwhile (as unowned: A's lease had expired), so
        # the store refuses A's writes for that run, per run.
        self.skill("fence", """
return { id = "fence", retries = 0, run = function(ctx)
  local a = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a").n end)
  local b = ctx.step.run("b", function() return http.get_json(env.STANDIN .. "/b").n end)
  return { a = a, b = b }
end }""")
        release = threading.Event()

        def a(handler, body, n):
            release.wait(60)
            return 200, {"n": n}
        self.si.routes["/a"] = a
        pa = self.serve()
        rid = self.w.ml("invoke", "fence", check=0).stdout.strip()
        wait_until(lambda: self.si.count("/a") == 1, what="A's call to /a")
        for attempt in range(3):
            os.kill(pa.pid, signal.SIGSTOP)
            time.sleep(3)  # past A's lease
            # A freeze that caught A inside a commit (a lease renewal) holds
            # SQLite's write lock: the cancel cannot be written. Let A finish
            # that commit and freeze it again.
            r = self.w.ml("cancel", rid)
            if r.returncode == 0 or attempt == 2:
                break
            os.kill(pa.pid, signal.SIGCONT)
            time.sleep(0.3)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.w.trace(rid)["status"], "cancelled")
        release.set()
        os.kill(pa.pid, signal.SIGCONT)
        wait_until(lambda: any("fenced: run %s is cancelled" % rid in l for l in pa.stderr_lines),
                   timeout=20, what="A fenced for that run")
        history = self.status_history(rid, 2)
        self.assertEqual(history, ["cancelled"])
        t = self.w.trace(rid)
        self.assertNotEqual([s["status"] for s in t["steps"]], ["completed"])
        self.assertEqual(self.si.count("/b"), 0)
        # A keeps its lease and serves on.
        self.assertEqual(metric(pa.url, "moonloop_leases_lost_total"), 0)
        rid2 = self.w.ml("invoke", "fence", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid2)["status"] == "completed", timeout=20, what="a new run")
        pa.terminate()
        pa.wait(timeout=20)

    def test_an_engine_that_loses_its_lease_with_parallel_results_in_flight_serves_on(self):
        # The branches of a step.parallel end while A's commit waits for the
        # database's write lock: their results are in that commit when A is
        # frozen, and B takes the run over. When A resumes, the commit is
        # refused (lease lost) and A drops the run, branches included, while
        # their commit still reports back to them.
        self.skill("par", """
return { id = "par", retries = 0, run = function(ctx)
  return ctx.step.parallel("p", {
    function() return http.get_json(env.STANDIN .. "/p").n end,
    function() return http.get_json(env.STANDIN .. "/p").n end,
  })
end }""")
        go = threading.Event()

        def answer(handler, body, n):
            if n <= 2:  # A's calls: answered once the test holds the write lock
                go.wait(60)
            return 200, {"n": n}
        self.si.routes["/p"] = answer
        pa = self.serve()
        rid = self.w.ml("invoke", "par", check=0).stdout.strip()
        wait_until(lambda: self.si.count("/p") == 2, what="A's two calls")
        release = self.w.hold_writes()
        go.set()
        time.sleep(0.5)  # the branches' results wait in A's commit for the lock
        os.kill(pa.pid, signal.SIGSTOP)
        release()
        time.sleep(3)  # past A's lease
        pb = self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30, what="B ends the run")
        os.kill(pa.pid, signal.SIGCONT)
        wait_until(lambda: any("lease lost" in l.lower() for l in pa.stderr_lines), timeout=20,
                   what="A fenced")
        # A goes on serving under a new lease.
        rid2 = self.w.ml("invoke", "par", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid2)["status"] == "completed", timeout=20,
                   what=lambda: "a new run: %s" % "".join(pa.stderr_lines))
        self.assertIsNone(pa.poll(), "".join(pa.stderr_lines))
        # Each branch's result is one answer of the stand-in, none twice. On
        # PostgreSQL a commit A sent before it froze may still land (the
        # server runs it while A's lease holds): its branch keeps A's answer
        # (1 or 2) and B calls only for the other. Which branch's request
        # was counted first is scheduling, not the run's order.
        out = sorted(self.w.trace(rid)["output"])
        b_calls = self.si.count("/p") - 2 - 2  # less A's two and rid2's two
        self.assertEqual(len(set(out)), 2, out)
        self.assertEqual([n for n in out if n > 2], list(range(3, 3 + b_calls)), out)
        if not PG:  # A's process runs its commits itself: none left A stopped
            self.assertEqual(out, [3, 4])
        for p in (pa, pb):
            p.terminate()
            self.assertEqual(p.wait(timeout=20), 0)


class ClaimTest(SkillsTestCase):
    config = {"lease": '"3s"'}

    def test_an_engine_whose_lease_is_gone_claims_nothing_under_its_dead_name(self):
        # Another process reaps this engine's lease behind its back (here:
        # by hand, as a reaper that found it expired would) and releases its
        # runs. The engine's next claim, due at once (the database changed),
        # comes before its next renewal: it must not take the run back under
        # the dead name, where no engine would ever run it.
        self.skill("w", """
return { id = "w", run = function(ctx)
  local ev = ctx.step.wait_for_event("go", { event = "go", timeout = "60s" })
  return ev and ev.data.v or "no event"
end }""")
        p = self.serve()
        rid = self.w.ml("invoke", "w", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "waiting", what="the wait")
        def owner_of():
            return self.w.sql("SELECT owner FROM runs WHERE id = ?", (rid,))[0][0]
        owner = owner_of()
        self.w.sql_tx([("DELETE FROM leases WHERE owner = ?", (owner,)),
                       ("UPDATE runs SET owner = NULL WHERE owner = ?", (owner,))])
        wait_until(lambda: any("lease lost" in l.lower() for l in p.stderr_lines), timeout=20,
                   what="the engine to find its lease gone")
        wait_until(lambda: (owner_of() or "") not in ("", owner), timeout=20,
                   what=lambda: "the run claimed under the new lease: %s" % "".join(p.stderr_lines))
        new = owner_of()
        self.assertEqual(self.w.sql("SELECT count(*) FROM leases WHERE owner = ?", (new,))[0][0], 1)
        self.w.ml("send", "go", "--data", '{"v": 5}', check=0)
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=20, what="the run's end")
        self.assertEqual(self.w.trace(rid)["output"], 5)
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)


@sqlite_only("SQLite's write lock, found in its -shm file; PostgreSQL ends the idle transaction "
             "of a frozen holder itself (idle_in_transaction_session_timeout)")
class FrozenLockHolderTest(SkillsTestCase):
    def test_an_engine_waits_for_a_write_lock_held_by_a_frozen_one_and_says_so(self):
        import fcntl
        import struct
        self.skill("s", """
return { id = "s", run = function(ctx)
  return ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a").n end)
end }""")
        # A holds the write lock 3 s in every commit, and is frozen inside one.
        pa = self.w.serve("--workspace", "skills", env={"MOONLOOP_FAULT": "commit=3000"})
        shm = os.open(self.w.db + "-shm", os.O_RDONLY)
        self.addCleanup(os.close, shm)

        def holds_lock():
            probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 120, 1, 0)  # SQLite's WAL write lock
            return struct.unpack("hhqqi", fcntl.fcntl(shm, fcntl.F_GETLK, probe))[0] != fcntl.F_UNLCK
        def stopped():
            with open("/proc/%d/stat" % pa.pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "T"
        for _ in range(300):
            os.kill(pa.pid, signal.SIGSTOP)
            wait_until(stopped, what="A to stop")
            if holds_lock():
                break
            os.kill(pa.pid, signal.SIGCONT)
            time.sleep(0.05)
        else:
            self.fail("engine A never held the write lock")
        pb = self.w.start("serve", "--workspace", "skills", "--listen", "127.0.0.1:0")
        said = []
        threading.Thread(target=lambda: [said.append(l) for l in pb.stderr], daemon=True).start()
        wait_until(lambda: any("held by process %d (moonloop), which is stopped" % pa.pid in l
                               for l in said), timeout=40,
                   what=lambda: "B to say what it waits for: %s" % "".join(said))
        self.assertIsNone(pb.poll(), "".join(said))  # B waits; it does not give up
        os.kill(pa.pid, signal.SIGKILL)
        pa.wait()
        wait_until(lambda: any("listening on" in l for l in said), timeout=30, what="B to serve")
        rid = self.w.ml("invoke", "s", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=20,
                   what=lambda: "a run on B: %s %s" % ("".join(said), self.w.trace(rid)))
        pb.terminate()
        self.assertEqual(pb.wait(timeout=20), 0)
