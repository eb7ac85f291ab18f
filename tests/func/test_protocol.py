"""One op protocol: `moonloop run` and `moonloop test` take the same steps.

The ops a run yields are interpreted twice: by the core (`moonloop run`,
`serve`) and by `moonloop test`'s driver (virtual time, mocks), both from
the op table (engine/core/op.h). This test runs every skill of skills/ and
every skill file among the docs' examples under both, against the same
outside world, and compares their journals: step ids and kinds in order,
each step's status and attempts, the output of every completed step and
of the run (run and event ids, times and LLM usage left out: they differ
by nature).

The same outside world: one HTTP stand-in answers every request with the
same JSON document, and the LLM with the same text; `moonloop test` gets
both as c:http and c:llm mocks. Steps whose bodies read the engine itself
(runs.*, skills.*), which a skill test must mock, are mocked with what the
real run recorded. Long sleeps and wait timeouts are shortened to a second
in the source both sides run, so `moonloop run` ends in seconds; no event
is sent, so every wait ends at its timeout on both sides. An example that
is broken on purpose (agents.md shows `moonloop check` refusing drafts)
must be refused by both, with the same message.
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SRC, StandIn, TestCase, Workdir  # noqa: E402

# The document every HTTP request gets, and the LLM's text: enough for the
# skills to take their main path (healthy services, an item, an outcome).
ANSWER = {"ok": True, "services": [{"name": "api", "error_rate": 0.001, "latency_ms": 100,
                                    "memory": 0.5, "cpu": 0.5}],
          "items": [{"title": "release 1.2"}], "outcomes": [], "last": "v41"}
LLM_TEXT = json.dumps({"health": "normal", "affected": [], "reasons": [], "cause": "deploy",
                       "severity": "low", "summary": "all good"})
INPUT = {"service": "api", "amount": 40, "digest": "d-42", "text": "one two three",
         "target": "word-count"}


ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


# Examples whose path depends on the clock outside a step, on purpose: they
# show what a replay catches, so the two sides may rightly differ (the
# greeting's replay, an hour later on moonloop test's clock, takes the
# other branch between 11:00 and 12:00).
WRONG_ON_PURPOSE = {"examples/greeting.lua"}


def examples():
    """[(name, source)]: every skill of skills/ and every skill file of the
    docs' lua blocks (a block's first line names it, `-- NAME.lua`; a test
    file that follows in the same block is left out)."""
    out, wrong = [], set()
    for path in sorted(glob.glob(os.path.join(SRC, "skills", "*.lua"))):
        if not path.endswith("_test.lua"):
            with open(path) as f:
                out.append(("skills/" + os.path.basename(path), f.read()))
    for doc in sorted(glob.glob(os.path.join(SRC, "docs", "*.md"))):
        with open(doc) as f:
            text = f.read()
        for m in re.finditer(r"^```lua\n(.*?)^```", text, re.S | re.M):
            body = m.group(1)
            first = re.match(r"-- (\S+\.lua)\n", body)
            if not first or first.group(1).endswith("_test.lua"):
                continue
            cut = re.search(r"^-- \S+_test\.lua\n", body, re.M)
            src = body[:cut.start()] if cut else body
            if first.group(1) in WRONG_ON_PURPOSE:
                wrong.add(first.group(1))
                continue
            if re.search(r"^return \{", src, re.M) and "run = function" in src:
                out.append(("%s:%d %s" % (os.path.basename(doc), text.count("\n", 0, m.start()) + 1,
                                          first.group(1)), src))
    assert wrong == WRONG_ON_PURPOSE, "WRONG_ON_PURPOSE names examples the docs no longer have"
    return out


def shortened(src):
    """src with its sleeps and its waits' timeouts cut to one second."""
    src = re.sub(r'(step\.sleep\(\s*"[^"]*"\s*,\s*)"[^"]+"', r'\1"1s"', src)
    return re.sub(r'(wait_for_event\(.*?timeout\s*=\s*)"[^"]+"', r'\1"1s"', src, flags=re.S)


def norm(v):
    """A JSON value with ids and times replaced by placeholders."""
    if isinstance(v, str):
        return RFC3339.sub("<time>", ULID.sub("<id>", v))
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items() if k not in ("usage", "ts", "id", "run_id")}
    return v


def journal(rec):
    """What must be alike in two runs' records: the run's status and
    output, and per step its id, kind, status, attempts and output."""
    steps = []
    for s in rec.get("steps", []):
        out = norm(s.get("output")) if s.get("status") == "completed" else None
        steps.append((s["id"], s["kind"], s["status"], len(s.get("attempts") or []) or None, out))
    return {"status": rec["status"],
            "output": norm(rec.get("output")) if rec["status"] == "completed" else None,
            "steps": steps}


def lua_literal(v):
    """A JSON value as Lua source (json.decode of a long string)."""
    return "json.decode([==[%s]==])" % json.dumps(v)


class ProtocolTest(TestCase):
    def setUp(self):
        self.si = StandIn()
        self.si.route_prefix("/", (200, ANSWER))
        self.si.llm([LLM_TEXT])

    def tearDown(self):
        self.si.close()

    def workdir(self, src):
        """A Workdir whose configuration grants the skill's env names: the
        *_URL ones point at the stand-in, the others are left unset."""
        names = sorted(set(re.findall(r"\benv\.([A-Z_][A-Z0-9_]*)", src)))
        urls = {n: "%s/%s" % (self.si.url, n.lower()) for n in names
                if n.endswith(("_URL", "_WEBHOOK"))}
        # Backoffs capped at 50 ms (on both sides: the test driver reads
        # the same configuration), so failing steps retry at once here.
        w = Workdir(env_names=names, config={
            "llm": '{ base_url = "%s/v1", model = "test-model" }' % self.si.url,
            "retry": '{ max_backoff = "50ms" }'})
        w.env.update(urls)
        for n in names:
            if n not in urls:
                w.env.pop(n, None)
        return w, names, urls

    def under_run(self, src):
        """The record of the skill's run under `moonloop run`, or the
        message of a file it refuses to load."""
        w, _, _ = self.workdir(src)
        try:
            w.write("skill.lua", src)
            r = w.ml("run", "skill.lua", "--data", json.dumps(INPUT), timeout=120)
            ids = ULID.findall(r.stderr)
            if not ids and w.ml("check", "skill.lua").returncode != 0:
                return {"refused": r.stderr.strip().splitlines()[0]}
            self.assertTrue(ids, "moonloop run gave no run id: %s" % r.stderr)
            return w.trace(ids[0])
        finally:
            w.close()

    def under_test(self, src, mocks, at=None):
        """The record of the skill's run under `moonloop test`, with the
        same answers as mocks (and mocks for the steps in mocks), its
        virtual clock starting at `at` (the real run's start, so that os.date
        reads alike on both sides)."""
        w, names, urls = self.workdir(src)
        try:
            w.write("skill.lua", src)
            env = ", ".join('%s = %s' % (n, json.dumps(urls[n]) if n in urls else "false")
                            for n in names)
            lines = [
                'local t = test.skill("skill.lua", { env = { %s } })' % env,
                't:case("protocol", function(c)',
                '  c:http(%s, { json = %s })' % (json.dumps(self.si.url), lua_literal(ANSWER)),
                '  c:llm(%s)' % json.dumps(LLM_TEXT),
            ]
            for sid, value in mocks.items():
                lines.append('  c:mock(%s, %s)' % (json.dumps(sid), lua_literal(value)))
            if at:
                lines.append('  c:at(%s)' % json.dumps(at))
            lines += ['  c:run(%s)' % lua_literal(INPUT),
                      '  c:ok(false, "keep the database")',  # its run is read below
                      'end)', 'return t']
            w.write("skill_test.lua", "\n".join(lines) + "\n")
            r = w.ml("test", "skill_test.lua", "--json", timeout=120)
            doc = json.loads(r.stdout)
            case = doc["tests"][0]
            if case["name"] != "protocol" or "cannot load skill.lua" in case["message"]:
                return {"refused": case["message"]}
            self.assertEqual(case["message"].split("\n")[0].strip()[-17:], "keep the database",
                             "the case did not reach its end: %s" % case["message"])
            return w.json("trace", case["run_id"], "--db", doc["db"])
        finally:
            w.close()

    def test_every_skill_and_example_takes_the_same_steps(self):
        cases = examples()
        self.assertGreaterEqual(len(cases), 15)
        compared = refused = 0
        for name, src in cases:
            with self.subTest(example=name):
                src = shortened(src)
                real = self.under_run(src)
                if "refused" in real:
                    tested = self.under_test(src, {})
                    self.assertIn("refused", tested, "moonloop run refuses %s: %s" % (name, real["refused"]))
                    # The same reason ("skill.lua:5: ..."), whatever each adds around it.
                    reason = re.search(r"skill\.lua:\d+: .*", real["refused"]).group(0)
                    self.assertIn(reason, tested["refused"])
                    refused += 1
                    continue
                # The steps a skill test must mock (they read the engine,
                # and say so): mocked with what the real run recorded.
                recorded = {s["id"]: s for s in real.get("steps", [])}
                mocks = {}
                while True:
                    tested = self.under_test(src, mocks, real.get("started_at"))
                    more = {s["id"] for s in tested.get("steps", [])
                            if "is not available in skill tests" in str(s.get("error"))
                            and s["id"] not in mocks and recorded.get(s["id"], {}).get("status") == "completed"}
                    if not more:
                        break
                    for sid in more:
                        mocks[sid] = recorded[sid]["output"]
                self.assertEqual(journal(tested), journal(real),
                                 "moonloop test and moonloop run differ for %s" % name)
                compared += 1
        self.assertGreaterEqual(compared, 12)
        self.assertGreaterEqual(refused, 2)

    maxDiff = None

    def test_the_comparison_can_fail(self):
        # A journal that differs in one step's kind, status or output is seen.
        rec = {"status": "completed", "output": {"n": 1},
               "steps": [{"id": "a", "kind": "run", "status": "completed", "output": {"x": 1},
                          "attempts": [{"n": 1}]}]}
        for change in ({"kind": "sleep"}, {"status": "failed"}, {"output": {"x": 2}}):
            other = json.loads(json.dumps(rec))
            other["steps"][0].update(change)
            self.assertNotEqual(journal(rec), journal(other), change)
        same = json.loads(json.dumps(rec))
        same["steps"][0]["output"] = {"x": 1, "at": "2026-01-02T03:04:05.678Z"}
        rec["steps"][0]["output"] = {"x": 1, "at": "2026-05-06T07:08:09Z"}
        self.assertEqual(journal(rec), journal(same))


if __name__ == "__main__":
    import unittest
    unittest.main()
