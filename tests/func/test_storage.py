"""Storage faults: a full disk (a small tmpfs filled up, then freed) and the
database file deleted or replaced under a running engine. Every writer
gets a clear error at once, nothing it was told is stored is lost, and the
engine neither spins nor writes where no one will read."""
import json
import re
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import mltest  # noqa: E402
from mltest import SkillsTestCase, kill9, sqlite_only, wait_until  # noqa: E402


def http(method, url, body=None, timeout=10):
    """(status, parsed JSON body) of a request; HTTP errors are answers too.
    A str body goes as it is (Lua source), anything else as JSON."""
    if isinstance(body, str):
        data, headers = body.encode(), {"Content-Type": "text/x-lua"}
    else:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no metric %s" % name)


SKILL = """
return { id = "s", triggers = { { event = "go" } }, run = function(ctx)
  local a = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a/" .. ctx.run_id).n end)
  ctx.step.sleep("nap", "1s")
  local b = ctx.step.run("b", function() return http.get_json(env.STANDIN .. "/b/" .. ctx.run_id).n end)
  return a + b
end }"""


@sqlite_only("a full tmpfs under the SQLite file (test_pg.py has PostgreSQL's own: the server "
             "killed, restarted, unreachable)")
class DiskCase(SkillsTestCase):
    """A workdir whose database lives on a 4 MB tmpfs that a test can fill."""

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.w.path, "disk")
        os.makedirs(self.disk)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", self.disk],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("cannot mount a small tmpfs to fill up (needs root): %s" % r.stderr.strip())
        self.addCleanup(self.unmount)
        self.w.db = os.path.join(self.disk, "moonloop.db")
        self.w.env["MOONLOOP_DB"] = self.w.db
        self.fill = os.path.join(self.disk, "fill")

    def unmount(self):
        for p in self.w.procs:  # nothing may hold the mount
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run(["umount", "-l", self.disk], capture_output=True)

    def fill_disk(self):
        with open(self.fill, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass

    def runs_by_status(self):
        out = {}
        for r in self.w.runs(skill="s"):
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


class FullDiskTest(DiskCase):
    config = {"lease": '"3s"'}

    def test_a_full_disk_refuses_writes_at_once_and_loses_nothing_when_space_returns(self):
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)
        p = self.serve()
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: self.runs_by_status() == {"completed": 1}, what="the first run")
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: self.runs_by_status().get("sleeping") == 1, what="a run asleep")

        self.fill_disk()
        wait_until(lambda: metric(p.url, "moonloop_writes_refused") == 1, timeout=20,
                   what="the engine to notice the full disk")
        # Every writer hears at once that nothing was stored.
        code, body = http("POST", p.url + "/v1/events", {"name": "go"})
        self.assertEqual(code, 503, body)
        self.assertIn("database or disk is full", body["error"]["message"])
        self.assertIn("nothing was stored", body["error"]["message"])
        code, body = http("POST", p.url + "/v1/skills/s/invoke", {"data": {}})
        self.assertEqual(code, 503, body)
        r = self.w.ml("send", "go")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("database or disk is full", r.stderr)
        r = self.w.ml("invoke", "s")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("database or disk is full", r.stderr)
        # Back-off, not a spin: a handful of tries in three seconds, one line.
        before = metric(p.url, "moonloop_commit_failures_total")
        time.sleep(3)
        tries = metric(p.url, "moonloop_commit_failures_total") - before
        self.assertLessEqual(tries, 10)
        said = [l for l in p.stderr_lines if "cannot write to the database" in l]
        self.assertEqual(len(said), 1, "".join(p.stderr_lines))
        self.assertEqual(http("GET", p.url + "/v1/runs?skill=s")[0], 200)  # reads go on

        os.remove(self.fill)
        wait_until(lambda: metric(p.url, "moonloop_writes_refused") == 0, timeout=20,
                   what="the engine to write again")
        wait_until(lambda: any("the database is writable again" in l for l in p.stderr_lines),
                   what="the engine to say so")
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: self.runs_by_status() == {"completed": 3}, timeout=30,
                   what="every accepted event's run to complete")
        for r in self.w.runs(skill="s"):
            self.assertEqual(r["output"], 3)
            # Each step body ran once: the failed commits were tried again, not the bodies.
            self.assertEqual((self.si.count("/a/" + r["id"]), self.si.count("/b/" + r["id"])), (1, 1))
        slept = [r for r in self.w.runs(skill="s") if any(
            "writing this run's journal failed" in l["msg"] for l in self.w.trace(r["id"])["logs"])]
        for r in slept:  # a line per failed group, not one per retry
            lines = [l for l in self.w.trace(r["id"])["logs"] if "journal failed" in l["msg"]]
            self.assertLessEqual(len(lines), 2)
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)
        db = sqlite3.connect(self.w.db)
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        db.close()


class FullDiskRequestsTest(DiskCase):
    """Each kind of HTTP write arriving just as the disk fills: its commit
    fails, it is answered 503 at once, and nothing of it is stored, also
    once space returns. (The default lease: no renewal comes first.)"""
    config = None

    def test_writers_told_nothing_was_stored_find_nothing_stored(self):
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)
        p = self.serve()
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: self.runs_by_status() == {"completed": 1}, what="the first run")
        done = self.w.runs(skill="s")[0]["id"]
        version = http("GET", p.url + "/v1/skills/s")[1]["version"]
        refused = 0
        for method, path, body in [
            ("POST", "/v1/events", {"name": "go", "id": "key-1"}),
            ("POST", "/v1/skills/s/invoke", {"data": {}}),
            ("POST", "/v1/skills/s/invoke", {"data": {}, "wait": 5}),
            ("POST", "/v1/runs/%s/rerun" % done, None),
            ("PUT", "/v1/skills/s?file=skills/other.lua", SKILL.replace("a + b", "a + b + 1")),
        ]:
            self.fill_disk()
            code, answer = http(method, p.url + path, body)
            self.assertEqual(code, 503, (path, answer))
            self.assertIn("nothing was stored", answer["error"]["message"])
            refused += 1
            os.remove(self.fill)
            wait_until(lambda: metric(p.url, "moonloop_writes_refused") == 0, timeout=30,
                       what="the engine to write again")
        # One line per episode (per fill), not one per try.
        said = [l for l in p.stderr_lines if "cannot write to the database" in l]
        self.assertEqual(len(said), refused, "".join(p.stderr_lines))
        time.sleep(1)
        # Not one of them landed after the space came back.
        self.assertEqual(len(self.w.runs(skill="s")), 1)
        self.assertEqual(http("GET", p.url + "/v1/skills/s")[1]["version"], version)
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go", "id": "key-1"})[0], 202)
        wait_until(lambda: self.runs_by_status() == {"completed": 2}, timeout=20, what="the retried event's run")
        self.assertGreaterEqual(metric(p.url, "moonloop_commit_failures_total"), refused)
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)


@sqlite_only("the SQLite file's owner and mode; PostgreSQL's roles are its own")
class PermissionTest(SkillsTestCase):
    def test_a_database_the_engines_user_cannot_write_names_the_user_the_owner_and_the_fix(self):
        # A restore done as root, then the service (another user) starts:
        # SQLite says "attempt to write a readonly database", naming nothing.
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            self.skipTest("needs root and setpriv to run the engine as another user")
        self.w.ml("send", "x", check=0)  # the database, as root
        os.chmod(self.w.db, 0o644)
        os.chmod(self.w.path, 0o777)
        binary = os.path.join(self.w.path, "ml")
        shutil.copy(mltest.BIN, binary)
        os.chmod(binary, 0o755)
        r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", binary,
                            "send", "x", "--db", self.w.db], capture_output=True, text=True, timeout=60,
                           cwd=self.w.path, env=self.w.env)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("readonly database (on %s); this process runs as nobody (uid 65534), and '%s' "
                      "belongs to root with mode 0644: give it to that user (chown)" % (self.w.db, self.w.db),
                      r.stderr)


@sqlite_only("the SQLite file deleted or moved under a running engine; a PostgreSQL database is "
             "not a file the engine has open")
class DatabaseFileGoneTest(SkillsTestCase):
    def test_a_deleted_database_refuses_writes_loudly_and_a_new_one_is_not_created_under_it(self):
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)
        p = self.serve()
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: [r for r in self.w.runs(skill="s") if r["status"] == "completed"], what="a run")
        os.remove(self.w.db)
        code, body = http("POST", p.url + "/v1/events", {"name": "go"})
        self.assertEqual(code, 503, body)
        self.assertIn("was deleted while this process had it open", body["error"]["message"])
        wait_until(lambda: any("DATABASE FILE GONE" in l for l in p.stderr_lines), what="the engine to say so")
        self.assertEqual(http("POST", p.url + "/v1/skills/s/invoke", {"data": {}})[0], 503)
        self.assertIn("/proc/%d/fd/" % p.pid, "".join(p.stderr_lines))  # where the data still is
        # A writer on the same path is not given a fresh file that engine never reads.
        r = self.w.ml("send", "go")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("but process %d (moonloop) still has a deleted file of that name open" % p.pid,
                      r.stderr)
        self.assertFalse(os.path.exists(self.w.db))
        p.terminate()
        self.assertEqual(p.wait(timeout=40), 0)
        # Stopped, it left the WAL beside the path (its last writes may be
        # there only), and no command starts a new database beside it: one
        # did, and SQLite threw the WAL away with every event it held.
        wal = self.w.db + "-wal"
        self.assertGreater(os.path.getsize(wal), 0)
        r = self.w.ml("runs")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("there is no database at '%s', but its WAL '%s' is there" % (self.w.db, wal), r.stderr)
        self.assertIn("move '%s' and '%s-shm' away first" % (wal, self.w.db), r.stderr)
        self.assertFalse(os.path.exists(self.w.db))

    def test_reading_commands_do_not_create_a_database_where_there_is_none(self):
        # A typo in --db, or the wrong folder at 3 a.m.: `runs` said "no
        # runs" as if all history were gone, and each command left an empty
        # database behind. They create none now and say why they show none.
        missing = os.path.join(self.w.path, "typo.db")
        note = "no database at '%s': nothing has run here yet" % missing
        for args, code, out in ((["runs", "--json"], 0, "[]"), (["skills", "--json"], 0, "[]"),
                                (["trace", "01M8XA0000000000000000000"], 1, ""), (["stats"], 1, "")):
            r = self.w.ml(*args, "--db", missing)
            self.assertEqual((r.returncode, r.stdout.strip()), (code, out), (args, r.stderr))
            self.assertIn(note if code == 0 else "no database at '%s'" % missing, r.stderr)
            self.assertFalse(os.path.exists(missing), args)

    def test_a_deleted_database_copied_back_while_its_engine_runs_keeps_every_write(self):
        # The recipe the engine prints: copy the file it still has open back,
        # kill -9 it, start again; the WAL beside the path brings the rest.
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)
        p = self.serve()
        for _ in range(4):
            self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        os.remove(self.w.db)
        wait_until(lambda: any("DATABASE FILE GONE" in l for l in p.stderr_lines), what="the engine to say so")
        m = re.search(r"cp (/proc/%d/fd/\d+) %s" % (p.pid, re.escape(self.w.db)), "".join(p.stderr_lines))
        self.assertIsNotNone(m, "".join(p.stderr_lines))
        shutil.copyfile(m.group(1), self.w.db)
        kill9(p)
        self.serve()
        self.assertEqual(self.w.sql("SELECT count(*) FROM events")[0][0], 4)
        wait_until(lambda: len([r for r in self.w.runs(skill="s") if r["status"] == "completed"]) == 4,
                   timeout=30, what="the four runs")

    def test_a_moved_database_refuses_writes_until_it_is_back_or_replaced(self):
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)
        p = self.serve()
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: self.w.runs(skill="s") and self.w.runs(skill="s")[0]["status"] == "completed",
                   what="a run")
        moved = self.w.db + ".moved"
        os.rename(self.w.db, moved)
        wait_until(lambda: any("DATABASE FILE GONE" in l for l in p.stderr_lines), what="the engine to say so")
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 503)
        os.rename(moved, self.w.db)  # back: the same file, writable again without a restart
        wait_until(lambda: http("POST", p.url + "/v1/events", {"name": "go"})[0] == 202, timeout=20,
                   what="writes to work again")
        wait_until(lambda: any("writable again" in l for l in p.stderr_lines), what="the engine to say so")
        wait_until(lambda: len([r for r in self.w.runs(skill="s") if r["status"] == "completed"]) == 2,
                   timeout=20, what="the second run")
        # Another file put in its place (a copy: another inode) is not this
        # engine's, while a run sleeps: the write of its wake-up is refused.
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        wait_until(lambda: [r for r in self.w.runs(skill="s") if r["status"] == "sleeping"], what="a nap")
        shutil.copy(self.w.db, moved)
        os.replace(moved, self.w.db)
        code, body = http("POST", p.url + "/v1/events", {"name": "go"})
        self.assertEqual(code, 503, body)
        self.assertIn("was replaced by another file", body["error"]["message"])
        time.sleep(1.5)  # the nap is over
        # Stopping does not wait forever for a store that refuses: after the
        # grace period it stops without those writes, and says so.
        p.terminate()
        self.assertEqual(p.wait(timeout=40), 0)
        self.assertTrue(any("stopping without" in l and "the next engine" in l for l in p.stderr_lines),
                        "".join(p.stderr_lines))

    def test_a_deleted_wal_refuses_writes_and_a_clean_stop_keeps_what_it_held(self):
        # The newest commits live in moonloop.db-wal: deleted while serving,
        # they went on being acknowledged into a file no one reads again,
        # and a kill -9 lost them (12 of 40 accepted events).
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)
        p = self.serve()
        for _ in range(5):
            self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        os.remove(self.w.db + "-wal")
        code, body = http("POST", p.url + "/v1/events", {"name": "go"})
        self.assertEqual(code, 503, body)
        self.assertIn("the database's write-ahead log '%s-wal' was deleted while this process had it open"
                      % self.w.db, body["error"]["message"])
        wait_until(lambda: any("DATABASE FILE GONE" in l for l in p.stderr_lines), what="the engine to say so")
        self.assertIn("/proc/%d/fd/" % p.pid, "".join(p.stderr_lines))
        # Stopped cleanly, it writes what the deleted file held into the
        # database: every accepted event is there, and its run goes on.
        p.terminate()
        self.assertEqual(p.wait(timeout=40), 0)
        self.assertEqual(self.w.sql("SELECT count(*) FROM events")[0][0], 5)
        self.serve()
        wait_until(lambda: len([r for r in self.w.runs(skill="s") if r["status"] == "completed"]) == 5,
                   timeout=30, what="the five runs")

    def test_a_write_the_system_refuses_says_what_the_system_said(self):
        # SQLite says only "disk I/O error": an operator needs the reason.
        self.skill("s", SKILL)
        p = self.serve()
        wal = self.w.db + "-wal"
        r = subprocess.run(["chattr", "+i", wal], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("chattr +i is not available here: %s" % r.stderr.strip())
        self.addCleanup(subprocess.run, ["chattr", "-i", wal], capture_output=True)
        code, body = http("POST", p.url + "/v1/events", {"name": "go"})
        self.assertEqual(code, 503, body)
        self.assertIn("(Operation not permitted, on %s or the files beside it)" % self.w.db,
                      body["error"]["message"])
        subprocess.run(["chattr", "-i", wal], capture_output=True)
        wait_until(lambda: http("POST", p.url + "/v1/events", {"name": "go"})[0] == 202, timeout=20,
                   what="writes to work again")

    def damage_in_place(self, length):
        """Serve, commit pages into the file itself, cut it to length, and
        return the answer to the next write."""
        self.si.route_prefix("/a/", lambda h, b, n: (200, {"n": 1}))
        self.si.route_prefix("/b/", lambda h, b, n: (200, {"n": 2}))
        self.skill("s", SKILL)
        p = self.serve()
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        with sqlite3.connect(self.w.db) as c:
            c.execute("PRAGMA wal_checkpoint(PASSIVE)")  # pages in the file itself
        self.assertGreater(os.path.getsize(self.w.db), 0)
        self.assertEqual(http("POST", p.url + "/v1/events", {"name": "go"})[0], 202)
        os.truncate(self.w.db, length)
        code, body = http("POST", p.url + "/v1/events", {"name": "go"})
        self.assertEqual(code, 503, body)
        wait_until(lambda: any("DATABASE FILE GONE" in l for l in p.stderr_lines), what="the engine to say so")
        return body["error"]["message"]

    def test_a_database_cut_short_in_place_refuses_writes(self):
        # The same inode, so the check of the path could not tell: writes
        # went on being answered 202 into a file left malformed.
        self.assertIn("the database file '%s' was cut short or overwritten while this process had it open "
                      "(1000 bytes now): writes are refused from now on" % self.w.db, self.damage_in_place(1000))

    def test_a_database_emptied_in_place_refuses_writes(self):
        self.assertIn("the database file '%s' was emptied while this process had it open (0 bytes now)"
                      % self.w.db, self.damage_in_place(0))


class UpgradeTest(SkillsTestCase):
    def test_an_upgrade_waits_for_every_engine_on_the_database_to_stop(self):
        # An engine started before an upgrade goes on with the old schema's
        # rules: a newer binary migrating the file under it left the old one
        # writing skills without the new columns (a changed concurrency
        # limit unwritten). The upgrade is refused while a process holds a
        # live lease, saying what to do; once it is gone, it goes through.
        self.skill("s", 'return { id = "s", run = function(ctx) return 1 end }')
        p = self.serve()
        p.terminate()
        self.assertEqual(p.wait(timeout=30), 0)
        self.w.rewind_schema(13)
        old = subprocess.Popen(["sleep", "60"])  # stands for an engine of the old binary
        self.addCleanup(lambda: (old.kill(), old.wait()))
        with open("/proc/%d/stat" % old.pid) as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        host = socket.gethostname()
        self.w.sql("INSERT INTO leases(owner, kind, host, pid, pid_start, started_at, expires_at)"
                   " VALUES('serve-old', 'serve', ?, ?, ?, 0, ?)",
                   (host, old.pid, start, int(time.time() * 1000) + 3600 * 1000))
        r = self.w.ml("runs")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("upgrades the database's schema from version 13 to", r.stderr)
        self.assertIn("a moonloop serve (pid %d on %s) is using it: stop every engine on the database "
                      "first" % (old.pid, host), r.stderr)
        self.assertEqual(self.w.sql("PRAGMA user_version"), [(13,)])
        old.kill()
        old.wait()
        r = self.w.ml("runs")
        self.assertEqual(r.returncode, 0, r.stderr)  # its lease is dead: the upgrade goes through
        self.assertGreater(self.w.sql("PRAGMA user_version")[0][0], 13)
