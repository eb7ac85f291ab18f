"""The figures' rollup (store_rollup.c: per skill and hour of creation, the
ended runs' counts, step sums and duration histograms) agrees with the runs
it sums up: read back from the database and recomputed here from the runs
table, after runs complete, fail, retry and are cancelled; after the engine
is killed (SIGKILL) in the middle of runs; after retention deletes runs; and
when migration 10 builds it for a database from before it. `moonloop stats`
reads it: its totals are checked against the runs too.
"""
import collections
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import PG, RUN_ENDED, RUN_ENDED_SQL, RUN_STATUSES, TestCase, kill9, metrics, wait_until  # noqa: E402

OK = """return { id = "ok", run = function(ctx)
  ctx.step.run("fetch", function() return { n = ctx.input.n } end)
  ctx.step.sleep("nap", "30ms")
  ctx.step.run("done", function() return 1 end)
end }
"""
FLAKY = """return { id = "flaky", retries = 2, backoff = "5ms", run = function(ctx)
  ctx.step.run("call", function() if ctx.attempt < 2 then error("flake") end return 1 end)
end }
"""
BAD = """return { id = "bad", retries = 1, backoff = "5ms", run = function(ctx)
  ctx.step.run("prepare", function() return 1 end)
  ctx.step.run("boom", function() error("nope") end)
end }
"""
ONCE = """return { id = "once", rate_limit = { limit = 1, period = "1h" }, run = function(ctx)
  ctx.step.run("only", function() return 1 end)
end }
"""
NAP = """return { id = "nap", run = function(ctx)
  ctx.step.sleep("long", "1h")
end }
"""
STEPS = """return { id = "steps", run = function(ctx)
  for i = 1, 8 do
    ctx.step.run("s" .. i, function() return i end)
    ctx.step.sleep("z" .. i, "40ms")
  end
end }
"""
HOUR = 3600000
ENDED = RUN_ENDED  # in the rollup's column order (store_rollup.c asserts it)


def hist_key(v):
    """store__hist_key: the value's 7 highest bits (exact below 128)."""
    if v < 128:
        return max(v, 0)
    e = v.bit_length() - 7
    return e * 64 + (v >> e)


def parse_hist(text):
    coarse = text.startswith("~")
    c = collections.Counter()
    for part in text.lstrip("~").split():
        k, n = part.split(":")
        c[int(k)] += int(n)
    return coarse, +c


def expected(w):
    """The rollup recomputed from the runs table: {(skill, hour): (counts, durations, waits)}."""
    out = {}
    for (skill, created, started, ended, status, steps, fsteps, retries, tokens) in w.sql(
            "SELECT skill, created_at, started_at, ended_at, status, steps, failed_steps, retries,"
            " tokens FROM runs WHERE status IN " + RUN_ENDED_SQL):
        key = (skill, created // HOUR * HOUR)
        c, d, wt = out.setdefault(key, ([0] * 9, [], []))
        c[ENDED.index(status)] += 1
        c[4] += not started
        for i, x in enumerate((steps, fsteps, retries, tokens)):
            c[5 + i] += int(x or 0)
        if started and ended and ended >= started:
            d.append(ended - started)
        if started and started >= created:
            wt.append(started - created)
    return out


class RollupTest(TestCase):
    def assert_rollup_agrees(self):
        """Every row of stats_rollup is what the runs make of it."""
        want = expected(self.w)
        got = {}
        for row in self.w.sql("SELECT skill, hour, completed, failed, cancelled, skipped, unstarted,"
                              " steps, failed_steps, retries, tokens, dur, wait FROM stats_rollup"):
            got[(row[0], int(row[1]))] = ([int(x) for x in row[2:11]], row[11], row[12])
        for key in set(want) | set(got):
            c, d, wt = want.get(key, ([0] * 9, [], []))
            gc, gd, gw = got.get(key, ([0] * 9, "", ""))
            self.assertEqual(gc, c, "counts of %s" % (key,))
            for text, values in ((gd, d), (gw, wt)):
                coarse, hist = parse_hist(text)
                self.assertEqual(hist, +collections.Counter(hist_key(v) if coarse else v for v in values),
                                 "histogram of %s (%s)" % (key, text))
        return want

    def assert_stats_agree(self, skills):
        """`moonloop stats SKILL --since 30d` counts what the runs table holds."""
        want = expected(self.w)
        for skill in skills:
            t = self.w.json("stats", skill, "--since", "30d")["totals"]
            c = [sum(v[0][i] for k, v in want.items() if k[0] == skill) for i in range(9)]
            self.assertEqual([t[k] for k in ("completed", "failed", "cancelled", "skipped", "steps",
                                             "failed_steps", "retries", "tokens")], c[:4] + c[5:], skill)
            durs = sorted(v for k, x in want.items() if k[0] == skill for v in x[1])
            self.assertEqual(t["duration_ms"]["n"], len(durs), skill)

    def assert_metrics_agree(self, p):
        """/metrics' moonloop_runs{status} (the ended statuses summed from the
        rollup) is the runs table's count of each status."""
        samples = metrics(p.url)
        got = {k.split('"')[1]: int(v) for k, v in samples.items() if k.startswith("moonloop_runs{status=")}
        want = dict.fromkeys(RUN_STATUSES, 0)
        for status, n in self.w.sql("SELECT status, count(*) FROM runs GROUP BY status"):
            want[status] = int(n)
        self.assertEqual(got, want, samples)

    def test_runs_that_end_every_way(self):
        for name, src in (("ok", OK), ("flaky", FLAKY), ("bad", BAD), ("nap", NAP), ("once", ONCE)):
            self.w.write("skills/%s.lua" % name, src)
        for i in range(3):
            self.w.ml("run", "skills/ok.lua", "--data", '{"n": %d}' % i, check=0)
        for _ in range(2):
            self.w.ml("run", "skills/flaky.lua", check=0)
            self.w.ml("run", "skills/bad.lua", check=1)
        p = self.w.serve("--workspace", "skills")
        # One run of "once" an hour: the other two are skipped (rate_limit).
        for _ in range(3):
            self.w.ml("invoke", "once", check=0)
        wait_until(lambda: sorted(r["status"] for r in self.w.runs(skill="once")) ==
                   ["completed", "skipped", "skipped"], what="one run of once, two skipped")
        ids = [self.w.ml("invoke", "nap", check=0).stdout.strip() for _ in range(2)]
        wait_until(lambda: all(r["status"] == "sleeping" for r in self.w.runs(skill="nap")) and
                   len(self.w.runs(skill="nap")) == 2, what="the naps to sleep")
        for i in ids:
            self.w.ml("cancel", i, check=0)
        wait_until(lambda: all(r["status"] == "cancelled" for r in self.w.runs(skill="nap")),
                   what="the naps to be cancelled")
        want = self.assert_rollup_agrees()
        self.assertEqual(sum(v[0][2] for v in want.values()), 2)  # the cancelled ones are there
        self.assert_stats_agree(["ok", "flaky", "bad", "nap", "once"])
        self.w.ml("invoke", "nap", check=0)  # and one run not ended
        wait_until(lambda: "sleeping" in [r["status"] for r in self.w.runs(skill="nap")],
                   what="a nap to sleep")
        self.assert_metrics_agree(p)

    def test_kill9_in_the_middle_of_runs(self):
        self.w.write("skills/steps.lua", STEPS)
        p = self.w.serve("--workspace", "skills")
        for i in range(8):
            self.w.ml("invoke", "steps", "--data", json.dumps({"i": i}), check=0)
        for _ in range(3):
            time.sleep(0.25)
            kill9(p)
            p = self.w.serve("--workspace", "skills")
        wait_until(lambda: len(self.w.runs(skill="steps")) == 8 and
                   all(r["status"] == "completed" for r in self.w.runs(skill="steps")),
                   timeout=60, what="every run to complete")
        want = self.assert_rollup_agrees()
        self.assertEqual(sum(v[0][0] for v in want.values()), 8)
        self.assert_stats_agree(["steps"])
        self.assert_metrics_agree(p)

    def test_retention_takes_runs_out(self):
        for name, src in (("flaky", FLAKY), ("bad", BAD)):
            self.w.write("skills/%s.lua" % name, src)
        for _ in range(3):
            self.w.ml("run", "skills/flaky.lua", check=0)
            self.w.ml("run", "skills/bad.lua", check=1)
        time.sleep(2.5)
        self.w.ml("run", "skills/flaky.lua", check=0)
        self.w.ml("run", "skills/bad.lua", check=1)
        out = self.w.ml("prune", "--older-than", "2s", check=0).stdout
        # The first six at least (the last two too on a slow machine).
        pruned = int(out.split()[1])
        self.assertGreaterEqual(pruned, 6, out)
        want = self.assert_rollup_agrees()
        self.assertEqual(sum(sum(v[0][:3]) for v in want.values()), 8 - pruned)
        # A skill whose runs were all pruned (a slow machine) is unknown to
        # `moonloop stats`: these runs never registered it.
        self.assert_stats_agree([k for k in ("flaky", "bad") if self.w.runs(skill=k)])
        self.assert_metrics_agree(self.w.serve("--workspace", "skills"))

    def test_migration_builds_it_for_an_older_database(self):
        for name, src in (("ok", OK), ("flaky", FLAKY), ("bad", BAD)):
            self.w.write("skills/%s.lua" % name, src)
        for i in range(4):
            self.w.ml("run", "skills/ok.lua", "--data", '{"n": %d}' % i, check=0)
            self.w.ml("run", "skills/flaky.lua", check=0)
        self.w.ml("run", "skills/bad.lua", check=1)
        # Half the runs made hours older, then the database taken back to
        # schema 9, from before the rollup.
        self.w.sql("UPDATE runs SET created_at = created_at - 5 * 3600000, started_at = started_at"
                   " - 5 * 3600000, ended_at = ended_at - 5 * 3600000 WHERE skill = 'flaky'")
        self.w.rewind_schema(9)
        self.assert_stats_agree(["ok", "flaky", "bad"])  # migrates
        want = self.assert_rollup_agrees()
        self.assertEqual(len({k[1] for k in want}), 2)
        # And runs that end after it go on adding to it.
        self.w.ml("run", "skills/bad.lua", check=1)
        self.assert_rollup_agrees()


if __name__ == "__main__":
    unittest.main()
