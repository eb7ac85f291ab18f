"""Health figures: `moonloop stats`, GET /v1/stats, GET /v1/skills/{id}/stats,
runs.stats in a skill, and GET /v1/events (the event stream).

The runs are made by the test (moonloop run, in this process's database);
every figure is checked against the records of those runs, read back with
`moonloop runs --json` and `moonloop trace --json`: counts by outcome,
failure rate, nearest-rank percentiles of run and step durations, retries,
failed steps, LLM tokens (the stand-in LLM answers 18 tokens a call), the
slowest and most failing steps, the versions loaded (deploy markers), the
window and its intervals.
"""
import json
import math
import os
import sqlite3
import sys
import time
import unittest
import urllib.error
import urllib.request
from datetime import datetime, timezone

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, StandIn, TestCase, Workdir, ms, sqlite_only, wait_until  # noqa: E402
from pty_driver import Pty  # noqa: E402

OK = """return { id = "ok", description = "fetches and thinks", run = function(ctx)
  ctx.step.run("fetch", function() return { n = ctx.input.n } end)
  local a = ctx.step.run("think", function() return llm.chat({ prompt = "hi" }).text end)
  return a
end }
"""
OK2 = OK.replace("fetches and thinks", "fetches and thinks, version 2")
FLAKY = """return { id = "flaky", retries = 2, backoff = "5ms", run = function(ctx)
  ctx.step.run("call", function() if ctx.attempt < 2 then error("flake") end return 1 end)
end }
"""
BAD = """return { id = "bad", retries = 1, backoff = "5ms", run = function(ctx)
  ctx.step.run("prepare", function() return 1 end)
  ctx.step.run("boom", function() error("nope") end)
end }
"""
LOOP = """return { id = "loop", run = function(ctx)
  for i = 1, 3 do ctx.step.run("poll", function() return i end) end
end }
"""


def rfc(t):
    return datetime.fromtimestamp(t / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + \
        "%03dZ" % (t % 1000)


def pcts(values):
    """Nearest rank: the smallest value with at least p of the values at or below it."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    s = sorted(values)
    at = lambda p: s[math.ceil(p * len(s) / 1000) - 1]  # noqa: E731
    return {"p50": at(500), "p95": at(950), "p99": at(990), "n": len(s)}


class StatsFixture:
    """A workdir with four skills run a known number of times, in file mode."""

    @classmethod
    def make(cls, llm):
        w = Workdir(config={"llm": '{ base_url = "%s/v1", model = "m" }' % llm.url})
        w.write("skills/ok.lua", OK)
        for name, src in (("flaky", FLAKY), ("bad", BAD), ("loop", LOOP)):
            w.write("skills/%s.lua" % name, src)
        cls.t0 = int(time.time() * 1000)
        for i in range(5):
            w.ml("run", "skills/ok.lua", "--data", '{"n": %d}' % i, check=0)
        for _ in range(3):
            w.ml("run", "skills/flaky.lua", check=0)
        for _ in range(2):
            w.ml("run", "skills/bad.lua", check=1)
        w.ml("run", "skills/loop.lua", check=0)
        # A new version of ok: a second deploy marker in the window.
        time.sleep(0.01)
        w.write("skills/ok.lua", OK2)
        for i in range(2):
            w.ml("run", "skills/ok.lua", "--data", '{"n": %d}' % (10 + i), check=0)
        cls.t1 = int(time.time() * 1000) + 1
        return w

    def expected(self, skill):
        runs = [r for r in self.w.runs() if r["skill"] == skill]
        traces = [self.w.trace(r["id"]) for r in runs]
        return runs, traces


class StatsCliTest(unittest.TestCase, StatsFixture):
    @classmethod
    def setUpClass(cls):
        cls.llm = StandIn()
        cls.llm.llm(["an answer"])
        cls.w = cls.make(cls.llm)

    @classmethod
    def tearDownClass(cls):
        cls.w.close()
        cls.llm.close()

    def stats(self, *args):
        return self.w.json("stats", *args)

    def test_a_skill_matches_its_runs(self):
        runs, traces = self.expected("ok")
        self.assertEqual(len(runs), 7)
        st = self.stats("ok", "--since", "1h")
        t = st["totals"]
        self.assertEqual(st["skill"], "ok")
        self.assertEqual((t["started"], t["completed"], t["failed"], t["cancelled"], t["active"]),
                         (7, 7, 0, 0, 0))
        self.assertEqual(t["failure_rate"], 0)
        self.assertEqual(t["duration_ms"], pcts([ms(r["ended_at"]) - ms(r["started_at"]) for r in runs]))
        self.assertEqual(t["queue_wait_ms"],
                         pcts([ms(r["started_at"]) - ms(r["created_at"]) for r in runs]))
        steps = [s for tr in traces for s in tr["steps"]]
        self.assertEqual((t["steps"], t["retries"], t["failed_steps"]), (len(steps), 0, 0))
        self.assertEqual(t["tokens"], 18 * 7)
        self.assertEqual(t["step_duration_ms"],
                         pcts([ms(s["ended_at"]) - ms(s["started_at"]) for s in steps]))
        self.assertEqual(st["step_sample"], {"runs": 7, "of": 7, "failing_runs": 0, "of_failing": 0})
        by_step = {s["step"]: s for s in st["slowest_steps"]}
        self.assertEqual(set(by_step), {"fetch", "think"})
        for name, rec in by_step.items():
            d = pcts([ms(s["ended_at"]) - ms(s["started_at"]) for s in steps if s["id"] == name])
            self.assertEqual({k: rec[k] for k in ("p50", "p95", "p99", "n")}, d, name)
            self.assertEqual(rec["max"], max(ms(s["ended_at"]) - ms(s["started_at"])
                                             for s in steps if s["id"] == name))
        self.assertEqual(st["failing_steps"], [])
        # Both versions were loaded in the window, oldest first: the deploy markers.
        versions = [v["version"] for v in st["versions"]]
        self.assertEqual(versions, list(dict.fromkeys(r["version"] for r in sorted(runs, key=lambda r: r["id"]))))
        self.assertEqual(len(versions), 2)
        self.assertIsNone(st["version_before"])

    def test_the_series_adds_up_and_lines_up(self):
        runs, traces = self.expected("ok")
        st = self.stats("ok", "--since", "2h", "--interval", "10m")
        self.assertEqual(st["interval"], "10m")
        self.assertEqual(st["interval_ms"], 600000)
        since = ms(st["since"])
        self.assertEqual(since % 600000, 0)
        # The window (2 h back from when it was asked, rounded down to its
        # interval) holds every run the test made.
        self.assertLessEqual(since, min(ms(r["created_at"]) for r in runs))
        self.assertEqual(len(st["series"]), math.ceil((ms(st["until"]) - since) / 600000))
        for i, p in enumerate(st["series"]):
            self.assertEqual(ms(p["t"]), since + i * 600000)
            mine = [r for r in runs if since + i * 600000 <= ms(r["created_at"]) < since + (i + 1) * 600000]
            self.assertEqual(p["started"], len(mine), p["t"])
            self.assertEqual(p["completed"], len(mine))
            d = pcts([ms(r["ended_at"]) - ms(r["started_at"]) for r in mine])
            self.assertEqual((p["p50"], p["p95"], p["p99"]), (d["p50"], d["p95"], d["p99"]))
            self.assertEqual(p["tokens"], 18 * len(mine))
        self.assertEqual(sum(p["started"] for p in st["series"]), 7)

    def test_retries_and_failures(self):
        st = self.stats("flaky", "--since", "1h")
        t = st["totals"]
        self.assertEqual((t["started"], t["completed"], t["failed"], t["retries"], t["failed_steps"]),
                         (3, 3, 0, 3, 0))
        self.assertEqual(st["failing_steps"], [{"step": "call", "kind": "run", "failed": 0, "retries": 3}])
        st = self.stats("bad", "--since", "1h")
        t = st["totals"]
        self.assertEqual((t["started"], t["completed"], t["failed"], t["failure_rate"]), (2, 0, 2, 1))
        self.assertEqual((t["steps"], t["retries"], t["failed_steps"]), (4, 2, 2))
        self.assertEqual(st["failing_steps"], [{"step": "boom", "kind": "run", "failed": 2, "retries": 2}])
        self.assertEqual(sum(p["retries"] for p in st["series"]), 2)
        # Repeats of a step id count as the id: poll, poll#2, poll#3.
        st = self.stats("loop", "--since", "1h")
        self.assertEqual([(s["step"], s["n"]) for s in st["slowest_steps"]], [("poll", 3)])

    def test_the_overview(self):
        st = self.stats("--since", "1h")
        by = {s["skill"]: s for s in st["skills"]}
        # (test_runs_stats_in_a_skill may add its own skills' runs.)
        self.assertLessEqual({"bad", "flaky", "loop", "ok"}, set(by))
        for name, n, failed in (("ok", 7, 0), ("flaky", 3, 0), ("bad", 2, 2), ("loop", 1, 0)):
            runs = [r for r in self.w.runs() if r["skill"] == name]
            t = by[name]["totals"]
            self.assertEqual((t["started"], t["failed"]), (n, failed), name)
            self.assertEqual(t["duration_ms"], pcts([ms(r["ended_at"]) - ms(r["started_at"]) for r in runs]))
            self.assertEqual(sum(p["started"] for p in by[name]["series"]), n)
            self.assertEqual(by[name]["previous"]["started"], 0)
            self.assertFalse(by[name]["registered"])
        self.assertEqual(len(by["ok"]["versions"]), 2)

    def test_a_window_without_the_runs(self):
        st = self.stats("ok", "--since", rfc(self.t0 - 7200000), "--until", rfc(self.t0 - 3600000))
        self.assertEqual(st["totals"]["started"], 0)
        self.assertEqual(st["totals"]["duration_ms"], {"p50": None, "p95": None, "p99": None, "n": 0})
        self.assertEqual(st["versions"], [])
        # The window after it holds them, and says what changed since this one.
        st = self.stats("ok", "--since", rfc(self.t0 - 3600000), "--until", rfc(self.t1))
        self.assertEqual((st["totals"]["started"], st["previous"]["started"]), (7, 0))
        # The overview keeps skills with no runs in either window out.
        st = self.stats("--since", rfc(self.t0 - 7200000), "--until", rfc(self.t0 - 3600000))
        self.assertEqual(st["skills"], [])

    def test_errors(self):
        r = self.w.ml("stats", "nosuch", check=1)
        self.assertIn("no skill 'nosuch' is registered or has runs", r.stderr)
        r = self.w.ml("stats", "--since", "yesterday", check=2)
        self.assertIn("--since: expected a duration such as 7d", r.stderr)
        r = self.w.ml("stats", "--since", "30d", "--interval", "1s", check=2)
        self.assertIn("at most 1000", r.stderr)
        r = self.w.ml("stats", "--interval", "0", check=2)
        self.assertIn("--interval", r.stderr)
        r = self.w.ml("stats", "--since", "1h", "--until", "2h", check=2)
        self.assertIn("since must come before until", r.stderr)
        r = self.w.ml("stats", "ok", "bad", check=2)
        self.assertIn("unexpected argument 'bad'", r.stderr)

    def test_for_people(self):
        out = self.w.ml("stats", "--since", "1h", check=0).stdout
        self.assertNotIn("\x1b[", out)
        rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
        self.assertEqual(rows["ok"][1:3], ["7", "0"])
        self.assertEqual(rows["bad"][1:4], ["2", "2", "100.0%"])
        self.assertRegex(out, "[\u2581-\u2588]")
        out = self.w.ml("stats", "bad", "--since", "1h", check=0).stdout
        self.assertIn("2 started, 0 completed, 2 failed", out)
        self.assertRegex(out, r"(?m)^most failing steps\n.*\n  boom +2 +2$")
        self.assertRegex(out, r"(?m)^  deploys +\s*\u25b2")
        # On a terminal, in colour.
        env = dict(self.w.env)
        env.pop("NO_COLOR")
        t = Pty([os.path.abspath(BIN), "stats", "--since", "1h"], cwd=self.w.path, env=env)
        t.expect("RUNS PER INTERVAL")
        t.wait()
        self.assertIn(b"\x1b[", t.raw)

    def test_runs_stats_in_a_skill(self):
        self.w.write("review.lua", """return { id = "review", run = function(ctx)
  return ctx.step.run("read", function()
    local s = runs.stats{ skill = "ok", since = "1h" }
    local all = runs.stats{ since = "1h", interval = "10m" }
    local none, err = runs.stats{ skill = "nosuch" }
    local names = {}
    for _, x in ipairs(all.skills) do names[x.skill] = true end
    return { ok = s.totals.started, tokens = s.totals.tokens, bad = names.bad, loop = names.loop,
             interval = all.interval, none = none == nil, err = err }
  end)
end }
""")
        out = json.loads(self.w.ml("run", "review.lua", check=0).stdout)
        self.assertEqual(out, {"ok": 7, "tokens": 126, "bad": True, "loop": True, "interval": "10m", "none": True,
                               "err": "no skill 'nosuch' is registered or has runs"})
        self.w.write("typo.lua", """return { id = "typo", run = function(ctx)
  return ctx.step.run("read", function() return runs.stats{ skil = "ok" } end)
end }""")
        r = self.w.ml("run", "typo.lua", check=1)
        self.assertIn("runs.stats: unknown key 'skil' (did you mean 'skill'?)", r.stderr)
        self.w.write("outside.lua", """return { id = "outside", run = function(ctx)
  return runs.stats{ skill = "ok" }
end }""")
        r = self.w.ml("run", "outside.lua", check=1)
        self.assertIn("runs.stats must be called inside a step body", r.stderr)


class StatsServerTest(unittest.TestCase, StatsFixture):
    """The same figures through the API, and the event stream."""

    @classmethod
    def setUpClass(cls):
        cls.llm = StandIn()
        cls.llm.llm(["an answer"])
        cls.w = cls.make(cls.llm)
        cls.w.write("skills/greet.lua", """return { id = "greet", triggers = { { event = "order.created" } },
  run = function(ctx) return ctx.step.run("hi", function() return "hi" end) end }""")
        cls.w.write("skills/audit.lua", """return { id = "audit", triggers = { { event = "order.created" } },
  run = function(ctx) return 1 end }""")
        cls.w.env["MOONLOOP_TOKEN"] = "tok"
        cls.p = cls.w.serve("--workspace", "skills")

    @classmethod
    def tearDownClass(cls):
        cls.w.close()
        cls.llm.close()

    def get(self, path, token="tok"):
        req = urllib.request.Request(self.p.url + path, headers={"Authorization": "Bearer " + token})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def test_api_and_cli_agree(self):
        window = ["--since", rfc(self.t0 - 3600000), "--until", rfc(self.t1)]
        q = "?since=%s&until=%s" % (rfc(self.t0 - 3600000), rfc(self.t1))
        for path, args in (("/v1/stats", []), ("/v1/skills/ok/stats", ["ok"]),
                           ("/v1/skills/bad/stats", ["bad"])):
            st, body = self.get(path + q)
            self.assertEqual(st, 200, body)
            self.assertEqual(body, self.w.json("stats", *args, *window))
            self.assertEqual(body, self.w.json("stats", *args, *window, "--server", self.p.url))
            people = self.w.ml("stats", *args, *window, check=0).stdout
            self.assertEqual(people, self.w.ml("stats", *args, *window, "--server", self.p.url, check=0).stdout)
        st, body = self.get("/v1/stats?since=1h")
        by = {s["skill"]: s for s in body["skills"]}
        # Served skills are registered, with their live version.
        self.assertTrue(by["greet"]["registered"])
        self.assertEqual(len(by["greet"]["version"]), 64)
        self.assertEqual(by["ok"]["totals"]["started"], 7)

    def test_api_errors(self):
        for path, code, words in (("/v1/stats?since=soon", 400, "since: expected a duration"),
                                  ("/v1/stats?window=1h", 400, "unknown parameter 'window'"),
                                  ("/v1/stats?since=1h&interval=10s&until=", 200, None),
                                  ("/v1/stats?since=1d&interval=1s", 400, "at most 1000"),
                                  ("/v1/stats?since=1h&until=2h", 400, "since must come before until"),
                                  ("/v1/skills/nosuch/stats", 404, "no skill 'nosuch'"),
                                  ("/v1/events?limit=0", 400, "limit must be a number from 1 to 500"),
                                  ("/v1/events?before=x", 400, "before: 'x' is not an event id"),
                                  ("/v1/events?name=x", 400, "unknown parameter 'name'")):
            st, body = self.get(path)
            self.assertEqual(st, code, (path, body))
            if words:
                self.assertIn(words, body["error"]["message"], path)
        st, body = self.get("/v1/stats", token="wrong")
        self.assertEqual(st, 401)

    def test_the_event_stream(self):
        ids = []
        for n in range(3):
            r = self.w.ml("send", "order.created", "--data", '{"order": %d}' % n, check=0)
            ids.append(r.stdout.strip())
        ids.append(self.w.ml("send", "nobody.listens", "--data", '{"x": 1}', check=0).stdout.strip())

        def all_started():
            st, body = self.get("/v1/events?limit=10")
            evs = {e["id"]: e for e in body["events"]}
            return body if all(evs.get(i, {}).get("dispatched") for i in ids) and \
                all(len(evs[i]["runs"]) == 2 for i in ids[:3]) else None
        body = wait_until(all_started, timeout=20, what="the events to start their runs")
        events = body["events"]
        self.assertEqual([e["id"] for e in events[:4]], ids[::-1])  # newest first
        self.assertEqual(events[0]["runs"], [])
        self.assertEqual((events[0]["name"], events[0]["data"]), ("nobody.listens", {"x": 1}))
        runs = {r["id"]: r for r in self.w.runs()}
        for e in events[1:4]:
            self.assertEqual(sorted(r["skill"] for r in e["runs"]), ["audit", "greet"])
            for r in e["runs"]:
                self.assertEqual(runs[r["id"]]["trigger"]["event"]["id"], e["id"])
        # Paging: one at a time, by before=.
        st, page = self.get("/v1/events?limit=1")
        self.assertEqual([e["id"] for e in page["events"]], [ids[3]])
        self.assertEqual(page["next"], ids[3])
        st, page = self.get("/v1/events?limit=2&before=" + page["next"])
        self.assertEqual([e["id"] for e in page["events"]], [ids[2], ids[1]])


@sqlite_only("a file from before the figures (schema 3) gets its ended runs summed up when it "
             "is migrated; no PostgreSQL database predates them")
class StatsMigrationTest(TestCase):
    """A database from before the figures gets its runs' step summaries."""

    def test_older_runs_are_summed_up(self):
        self.w.write("bad.lua", BAD)
        self.w.ml("run", "bad.lua", check=1)
        self.w.ml("run", "bad.lua", check=1)
        # Take the database back to schema 3, from before the figures.
        self.w.rewind_schema(3)
        t = self.w.json("stats", "bad", "--since", "1h")["totals"]
        self.assertEqual((t["started"], t["failed"], t["steps"], t["retries"], t["failed_steps"]),
                         (2, 2, 4, 2, 2))
        con = sqlite3.connect(self.w.db)
        self.assertGreaterEqual(con.execute("PRAGMA user_version").fetchone()[0], 5)
        con.close()


if __name__ == "__main__":
    unittest.main()
