"""Moving up: `moonloop db copy SRC DST` copies a SQLite database into an
empty PostgreSQL one. The history reads the same there (runs, trace, the
API), every table arrives row for row, and the runs left unfinished
(sleeping, waiting for an event, queued behind a concurrency limit) finish
on an engine serving the copy, without a completed step running again.
Refused, writing nothing: a destination with rows, at another schema
version, or a source an engine still holds; a copy that fails halfway
leaves the destination empty. Run only against PostgreSQL
(MOONLOOP_TEST_BACKEND=pg: make test's func-pg/test_db_copy)."""
import json
import os
import sqlite3
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import pgcluster  # noqa: E402
from mltest import PG, RUN_ENDED, SkillsTestCase, kill9, wait_until  # noqa: E402

pg_only = unittest.skipUnless(PG, "PostgreSQL only: run with MOONLOOP_TEST_BACKEND=pg "
                              "(make test runs it as func-pg/test_db_copy)")

# Every step body calls the stand-in once (/body/RUN_ID/STEP): a body that
# ran again after the copy shows as a second call.
SKILLS = {
    "done": """
return { id = "done", run = function(ctx)
  local n = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/body/" .. ctx.run_id .. "/a").n end)
  log.info("line\\twith\\\\odd\\ncharacters é")
  return { n = n, text = "tab\\there" }
end }""",
    "bad": """
return { id = "bad", run = function(ctx)
  ctx.step.run("boom", function() error("it broke") end, { retries = 0 })
end }""",
    "sleeper": """
return { id = "sleeper", run = function(ctx)
  local n = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/body/" .. ctx.run_id .. "/a").n end)
  ctx.step.sleep("nap", "8s")
  local m = ctx.step.run("b", function() return http.get_json(env.STANDIN .. "/body/" .. ctx.run_id .. "/b").n end)
  return { sum = n + m }
end }""",
    "waiter": """
return { id = "waiter", run = function(ctx)
  local n = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/body/" .. ctx.run_id .. "/a").n end)
  local ev = ctx.step.wait_for_event("w", { event = "resume", timeout = "300s" })
  return { n = n, got = ev.data.v }
end }""",
    # The first run's body hangs until the test lets it go: the engine is
    # killed with it in flight, holding the one slot; the second is queued.
    "limited": """
return { id = "limited", concurrency = { limit = 1 }, run = function(ctx)
  return ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/hold/" .. ctx.run_id).n end)
end }""",
    "once": """
return { id = "once", triggers = { { event = "once" } }, idempotency = "event.data.k",
  run = function(ctx) return { k = ctx.event.data.k } end }""",
}


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read() or b"null")


@pg_only
class DbCopyTest(SkillsTestCase):
    def setUp(self):
        super().setUp()
        self.si.route_prefix("/body/", lambda h, b, n: (200, {"n": 1}))
        self.held = threading.Event()
        self.addCleanup(self.held.set)
        self.holding = []

        def hold(h, b, n):
            self.holding.append(h.path)
            self.held.wait(120)
            return 200, {"n": 1}
        self.si.route_prefix("/hold/", hold)
        for name, src in SKILLS.items():
            self.skill(name, src)
        self.src = os.path.join(self.w.path, "old.db")
        self.dst = self.w.db  # an empty database of the cluster

    def on_src(self, *args, check=0):
        return self.w.ml(*args, "--db", self.src, check=check)

    def src_json(self, *args):
        return json.loads(self.on_src(*args, "--json").stdout)

    def new_db(self):
        """A new empty database in the cluster, dropped at the end."""
        name = "mlc_" + os.urandom(6).hex()
        pgcluster.psql(PG, 'CREATE DATABASE "%s"' % name)
        self.addCleanup(pgcluster.drop_later, PG, name)
        return name, "%s/%s" % (PG["url"], name)

    def fill(self):
        """Runs of every kind on SQLite: completed, failed, sleeping, waiting
        for an event, running (a body in flight) and queued behind it;
        returns the engine, still serving."""
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", "--db", self.src)
        for skill in ("done", "done", "bad", "sleeper", "waiter", "limited"):
            self.on_src("invoke", skill, "--data", '{"x": 1}')
        wait_until(lambda: self.holding, what="the first limited run's body")
        self.on_src("invoke", "limited", "--data", '{"x": 1}')
        self.on_src("invoke", "done", "--key", "k-1")
        self.on_src("send", "once", "--data", '{"k": 1}', "--id", "e-1")
        self.on_src("send", "once", "--data", '{"k": 1}')  # skipped: idempotency

        def settled():
            by = {}
            for r in self.src_json("runs", "--limit", "1000"):
                by.setdefault(r["skill"], []).append(r["status"])
            want = {"done": ["completed"] * 3, "bad": ["failed"], "sleeper": ["sleeping"],
                    "waiter": ["waiting"], "limited": ["queued", "running"], "once": ["completed", "skipped"]}
            return all(sorted(by.get(k, [])) == v for k, v in want.items()) and by
        wait_until(settled, timeout=60, what=lambda: "runs of every kind: %s" % [
            (r["skill"], r["status"]) for r in self.src_json("runs")])
        return p

    def tables(self, con):
        return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                          " AND name NOT LIKE 'sqlite%' ORDER BY name")]

    def check_every_row_copied(self):
        """Every table of the SQLite file, row for row, in PostgreSQL."""
        con = sqlite3.connect(self.src)
        try:
            tables = self.tables(con)
            pg_tables = {r[0] for r in self.w.sql(
                "SELECT table_name FROM information_schema.tables WHERE table_schema ="
                " current_schema() AND table_name <> 'moonloop_schema'")}
            self.assertEqual(set(tables), pg_tables)
            nonempty = set()
            for t in tables:
                cols = [r[1] for r in con.execute("PRAGMA table_info(%s)" % t)]
                sel = "SELECT %s FROM %s" % (", ".join('"%s"' % c for c in cols), t)
                want = sorted(tuple(None if v is None else str(v) for v in row)
                              for row in con.execute(sel))
                got = sorted(tuple(None if v is None else str(v) for v in row)
                             for row in self.w.sql(sel))
                self.assertEqual(got, want, "table %s" % t)
                if want:
                    nonempty.add(t)
        finally:
            con.close()
        # The test fills what an engine relies on: it would not notice a
        # table dropped if it left it empty.
        for t in ("runs", "steps", "attempts", "logs", "versions", "skills", "events", "waits",
                  "slots", "slot_queue", "flow_once", "flow_skips"):
            self.assertIn(t, nonempty)

    def test_history_reads_the_same_and_unfinished_runs_finish_on_postgresql(self):
        p = self.fill()
        # While an engine holds the file, the copy is refused.
        r = self.w.ml("db", "copy", self.src, self.dst)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("is in use", r.stderr)
        self.assertIn("nothing was copied", r.stderr)
        self.assertEqual(self.w.sql("SELECT count(*) FROM runs"), [(0,)])
        # Killed with a body in flight: its lease is dead, the copy goes
        # ahead, and the engines of the copy take its runs over.
        kill9(p)

        runs = self.src_json("runs", "--limit", "1000")
        traces = {x["id"]: self.src_json("trace", x["id"]) for x in runs}
        r = self.w.ml("db", "copy", self.src, self.dst, "--json", check=0)
        counts = json.loads(r.stdout)
        self.assertEqual(counts["tables"]["runs"], len(runs))
        self.check_every_row_copied()

        # The history reads the same: the CLI, then the API of an engine
        # serving the copy.
        self.assertEqual(self.w.runs(), runs)
        for rid, t in traces.items():
            self.assertEqual(self.w.trace(rid), t)
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        for x in runs:
            if x["status"] in ("completed", "failed"):
                self.assertEqual(get(p.url + "/v1/runs/" + x["id"]), traces[x["id"]])

        # The unfinished runs finish there: the sleeper wakes, the waiter
        # gets its event, the run killed in its body takes it again, and
        # the queued one gets the slot when it ends.
        self.assertEqual(post(p.url + "/v1/events", {"name": "resume", "data": {"v": 7}})[0], 202)
        self.held.set()
        wait_until(lambda: all(x["status"] in RUN_ENDED for x in self.w.runs()),
                   timeout=60, what=lambda: [(x["skill"], x["status"]) for x in self.w.runs()])
        out = {x["skill"]: x["output"] for x in self.w.runs()}
        self.assertEqual(out["sleeper"], {"sum": 2})
        self.assertEqual(out["waiter"], {"n": 1, "got": 7})
        self.assertEqual([x["output"] for x in self.w.runs(skill="limited")], [1, 1])
        # No body ran twice: each step's call came once, on either side.
        for x in self.w.runs():
            for step in ("a", "b"):
                self.assertLessEqual(self.si.count("/body/%s/%s" % (x["id"], step)), 1)
        self.assertEqual(self.si.count("/body/%s/b" % [x for x in runs if x["skill"] == "sleeper"][0]["id"]), 1)

        # Keys kept: a repeat of the invoke key answers the first run, a
        # repeat of the event key is a duplicate, the skill's idempotency
        # key still skips.
        first = [x for x in runs if x["skill"] == "done"]
        n = len(self.w.runs())
        r = self.w.ml("invoke", "done", "--key", "k-1", check=0)
        self.assertIn(r.stdout.strip(), [x["id"] for x in first])
        got = json.loads(self.w.ml("send", "once", "--data", '{"k": 1}', "--id", "e-1", "--json",
                                   check=0).stdout)
        self.assertTrue(got["duplicate"])
        self.w.ml("send", "once", "--data", '{"k": 1}', check=0)
        wait_until(lambda: self.w.sql("SELECT count(*) FROM events WHERE dispatched = 0") == [(0,)],
                   what="the event dispatched")
        # The repeat of the invoke key made no run; the skill's key skipped
        # the new event's run (it ends skipped).
        self.assertEqual(len(self.w.runs(skill="done")), 3)
        self.assertEqual(sorted(x["status"] for x in self.w.runs(skill="once")),
                         ["completed", "skipped", "skipped"])
        self.assertEqual(len(self.w.runs()), n + 1)

        # Into a database with rows: refused.
        r = self.w.ml("db", "copy", self.src, self.dst)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is not empty", r.stderr)

    def test_refusals_and_a_failed_copy_write_nothing(self):
        kill9(self.fill())
        # Not a file, not into PostgreSQL: usage errors.
        self.assertEqual(self.w.ml("db", "copy", "nope.db", self.dst).returncode, 1)
        self.assertEqual(self.w.ml("db", "copy", self.src, "other.db").returncode, 2)
        self.assertFalse(os.path.exists(os.path.join(self.w.path, "nope.db")))
        # A destination at a schema version this moonloop does not know.
        name, url = self.new_db()
        pgcluster.psql(PG, "CREATE TABLE moonloop_schema(version INTEGER NOT NULL);"
                       " INSERT INTO moonloop_schema VALUES(99)", db=name)
        r = self.w.ml("db", "copy", self.src, url)
        self.assertEqual(r.returncode, 1)
        self.assertIn("schema version 99", r.stderr)
        # A table PostgreSQL has and SQLite has not: refused, naming it.
        name, url = self.new_db()
        self.w.ml("runs", "--db", url, check=0)  # makes the schema
        pgcluster.psql(PG, "CREATE TABLE extra(x INTEGER)", db=name)
        r = self.w.ml("db", "copy", self.src, url)
        self.assertEqual(r.returncode, 1)
        self.assertIn("table extra", r.stderr)
        # A value PostgreSQL refuses, in a table copied after others: the
        # copy fails there, and the tables copied before are not left.
        bad = os.path.join(self.w.path, "bad.db")
        con = sqlite3.connect(self.src)
        con.execute("VACUUM INTO ?", (bad,))
        con.close()
        con = sqlite3.connect(bad)
        with con:
            con.execute("UPDATE steps SET attempts = 'many' WHERE (run_id, seq) IN (SELECT run_id, seq FROM steps LIMIT 1)")
        con.close()
        name, url = self.new_db()
        r = self.w.ml("db", "copy", bad, url)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("copying table steps", r.stderr)
        for t in ("runs", "attempts", "events", "logs", "versions"):
            self.assertEqual(pgcluster.psql(PG, "SELECT count(*) FROM %s" % t, db=name).strip(), "0", t)
        # The same copy from the good file then goes through.
        r = self.w.ml("db", "copy", self.src, url, check=0)
        self.assertIn("copied", r.stdout)


if __name__ == "__main__":
    unittest.main()
