"""moonloop test: skill tests with mocks, supplied events and a virtual clock.

Runs the tests of every skill in skills/, the examples of docs/testing.md
(and checks the documented failure output word for word), and checks that
a wrong expectation fails at its line, that a day-long sleep plus an
hour-long wait pass at once on the virtual clock, and that tests are
hermetic (an unmocked request never leaves the process).
"""
import glob
import json
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SRC, TestCase, wait_until  # noqa: E402

DIGEST = """return {
  id = "digest",
  timeout = "3d",
  run = function(ctx)
    local t0 = time.now()
    local items = ctx.step.run("collect", function() return http.get_json(env.FEED .. "/items") end)
    ctx.step.sleep("cool-off", "1d")
    local ok = ctx.step.wait_for_event("approval", { event = "digest.approved", timeout = "1h" })
    ctx.step.run("post", function() return http.post_json(env.FEED .. "/post", { n = #items }) end)
    return { approved = ok ~= nil, waited = time.now() - t0 }
  end,
}
"""

DIGEST_TEST = """local t = test.skill("digest.lua", { env = { FEED = "http://feed.test" } })
t:before_each(function(c)
  c:mock("collect", { 1, 2 })
  c:http("POST http://feed.test/post", { json = { ok = true } })
end)
t:case("approved after the sleep", function(c)
  c:event("digest.approved", { ok = true }, { after = "1d10m" })
  local out = c:run({})
  c:eq(out, { approved = true, waited = 86400 + 600 })
  c:eq(c:step("cool-off").duration, 86400)
end)
t:case("not approved: the wait times out after an hour", function(c)
  local out = c:run({})
  c:eq(out, { approved = false, waited = 86400 + 3600 })
  c:eq(c:step("approval").duration, 3600)
  c:steps({ "collect", "cool-off", "approval", "post" })
end)
return t
"""


def doc_examples():
    """The example files of docs/testing.md: {path: text}, and the documented failure output."""
    with open(os.path.join(SRC, "docs", "testing.md")) as f:
        doc = f.read()
    files = {}
    for m in re.finditer(r"```lua\n(-- (examples/[\w./-]+\.lua)\n.*?)```", doc, re.S):
        files[m.group(2)] = m.group(1)
    out = re.search(r"```text\n\$ moonloop test examples/failing/\n(.*?)```", doc, re.S)
    return files, out.group(1) if out else None


class SkillTestsTest(TestCase):
    def copy_skills(self):
        dst = os.path.join(self.w.path, "skills")
        shutil.copytree(os.path.join(SRC, "skills"), dst)
        return dst

    def test_skills_dir_passes(self):
        self.copy_skills()
        r = self.w.ml("test", "skills/", check=0)
        m = re.search(r"^(\d+) passed, 0 failed$", r.stdout, re.M)
        self.assertTrue(m and int(m.group(1)) > 0, r.stdout + r.stderr)
        doc = self.w.json("test", "skills/")
        self.assertEqual(doc["failed"], 0)
        self.assertIsNone(doc["db"])  # removed: everything passed
        self.assertTrue(all(t["ok"] and t["file"].startswith("skills/") for t in doc["tests"]))

    def test_every_skill_has_a_test_file(self):
        missing = []
        for path in sorted(glob.glob(os.path.join(SRC, "skills", "*.lua"))):
            if path.endswith("_test.lua"):
                continue
            test = path[:-len(".lua")] + "_test.lua"
            name = os.path.basename(path)
            if not os.path.exists(test):
                missing.append("skills/%s has no test file skills/%s (see docs/testing.md)"
                               % (name, os.path.basename(test)))
                continue
            with open(test) as f:
                if 'test.skill("%s"' % name not in f.read():
                    missing.append("skills/%s does not call test.skill(\"%s\")"
                                   % (os.path.basename(test), name))
        self.assertEqual(missing, [])

    def test_wrong_expectation_fails_at_its_line(self):
        self.copy_skills()
        self.w.write("skills/wrong_test.lua", "\n".join([
            'local t = test.skill("service_check.lua")',
            't:case("right", function(c)',
            '  c:mock("fetch-metrics", { services = { { name = "api", error_rate = 0.5, latency_ms = 1 } } })',
            '  c:mock("confirm", { "api" })',
            '  c:mock("post-summary", { ok = true })',
            '  local out = c:run({})',
            '  c:eq(out.unhealthy, { "api" })',
            '  c:eq(out.unhealthy, { "db" })   -- line 8: wrong on purpose',
            'end)',
            'return t', ""]))
        r = self.w.ml("test", "skills/wrong_test.lua", check=1)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], 'skills/wrong_test.lua:8: FAIL right: values differ at [1]: '
                                   'expected "db", got "api"', r.stdout)
        self.assertEqual(lines[-1], "0 passed, 1 failed")
        doc = json.loads(self.w.ml("test", "skills/wrong_test.lua", "--json", check=1).stdout)
        self.assertEqual((doc["tests"][0]["line"], doc["failed"]), (8, 1))
        # The failed case's run stays in the kept database, as `moonloop trace` shows it.
        trace = self.w.json("trace", doc["tests"][0]["run_id"], "--db", doc["db"])
        self.assertEqual([s["id"] for s in trace["steps"]],
                         ["fetch-metrics", "settle", "confirm", "post-summary"])
        self.assertEqual(trace["status"], "completed")
        shutil.rmtree(os.path.dirname(doc["db"]), ignore_errors=True)
        # An assertion that fails inside the run (in a mock) stops the case
        # there: its run is kept as far as it went, under the id the
        # report names (it said null, and the run was not kept).
        self.w.write("skills/mock_test.lua", "\n".join([
            'local t = test.skill("service_check.lua")',
            't:case("in a mock", function(c)',
            '  c:mock("fetch-metrics", function() c:eq(1, 2) return { services = {} } end)',
            '  c:run({})',
            'end)',
            'return t', ""]))
        doc = json.loads(self.w.ml("test", "skills/mock_test.lua", "--json", check=1).stdout)
        case = doc["tests"][0]
        self.assertEqual((case["ok"], case["message"]), (False, "values differ: expected 2, got 1"))
        trace = self.w.json("trace", case["run_id"], "--db", doc["db"])
        self.assertEqual(trace["status"], "failed")
        self.assertEqual(trace["error"]["message"], "stopped by the test: values differ: expected 2, got 1")
        shutil.rmtree(os.path.dirname(doc["db"]), ignore_errors=True)

    def test_day_long_sleep_and_hour_wait_take_no_wall_time(self):
        self.w.write("t/digest.lua", DIGEST)
        self.w.write("t/digest_test.lua", DIGEST_TEST)
        t0 = time.monotonic()
        r = self.w.ml("test", "t", "-v", check=0)
        wall = time.monotonic() - t0
        self.assertIn("2 passed, 0 failed", r.stdout)
        print("\n  a day's sleep and an hour's wait, 2 cases: %.3fs of wall time" % wall,
              file=sys.stderr)
        self.assertLess(wall, 5.0)

    def test_docs_examples(self):
        files, failing_out = doc_examples()
        self.assertGreaterEqual(len(files), 4)
        self.assertIsNotNone(failing_out)
        self.copy_skills()
        for path, text in files.items():
            self.w.write(path, text)
        tests = sorted(p for p in files if p.endswith("_test.lua") and "/failing/" not in p)
        r = self.w.ml("test", *tests, check=0)
        self.assertRegex(r.stdout, r"^\d+ passed, 0 failed$")
        r = self.w.ml("test", "examples/failing/", check=1)
        self.assertEqual(r.stdout, failing_out)

    def test_hermetic_unmocked_request_never_leaves(self):
        self.w.write("h/call.lua", 'return { run = function(ctx)\n'
                     '  return ctx.step.run("call", function() return http.get_json(env.URL .. "/x") end)\n'
                     'end }\n')
        self.w.write("h/call_test.lua", 'local t = test.skill("call.lua", { env = { URL = %s } })\n'
                     't:case("unmocked", function(c)\n'
                     '  c:run()\n'
                     '  c:err("GET " .. %s .. "/x is not mocked in this test")\n'
                     '  c:eq(c:step("call").attempts, 4)\n'
                     'end)\nreturn t\n' % (json.dumps(self.si.url), json.dumps(self.si.url)))
        r = self.w.ml("test", "h", check=0)
        self.assertIn("1 passed, 0 failed", r.stdout)
        self.assertEqual(self.si.count("/x"), 0)

    def test_an_unmocked_llm_call_names_c_llm(self):
        self.w.write("l/ask.lua", 'return { retries = 0, run = function(ctx)\n'
                     '  return ctx.step.run("ask", function() return llm.chat({ prompt = "hi" }) end)\n'
                     'end }\n')
        self.w.write("l/ask_test.lua", 'local t = test.skill("ask.lua")\n'
                     't:case("unmocked", function(c)\n'
                     '  c:run()\n'
                     '  c:err("/chat/completions (the LLM) is not mocked in this test: give the model\'s answer '
                     'with c:llm(answer), or mock the step \'ask\' with c:mock")\n'
                     'end)\n'
                     't:case("mocked", function(c)\n'
                     '  c:llm("hello")\n'
                     '  c:eq(c:run().text, "hello")\n'
                     'end)\nreturn t\n')
        r = self.w.ml("test", "l", check=0)
        self.assertIn("2 passed, 0 failed", r.stdout, r.stdout + r.stderr)

    def test_the_engine_modules_ask_for_a_mock(self):
        # runs.cancel, like runs.list, would reach outside the test: the
        # step fails asking for its mock, and works mocked.
        self.w.write("m/stop.lua", 'return { retries = 0, run = function(ctx)\n'
                     '  return ctx.step.run("stop", function() local r = runs.cancel(ctx.input.id) return r end)\n'
                     'end }\n')
        self.w.write("m/stop_test.lua", 'local t = test.skill("stop.lua")\n'
                     't:case("unmocked", function(c)\n'
                     '  c:run({ id = "01AAAAAAAAAAAAAAAAAAAAAAAA" })\n'
                     '  c:err("runs.cancel is not available in skill tests: mock the step \'stop\' with c:mock")\n'
                     'end)\n'
                     't:case("mocked", function(c)\n'
                     '  c:mock("stop", { status = "cancelled" })\n'
                     '  c:eq(c:run({ id = "x" }), { status = "cancelled" })\n'
                     'end)\nreturn t\n')
        r = self.w.ml("test", "m", check=0)
        self.assertIn("2 passed, 0 failed", r.stdout)

    def test_the_env_a_test_gives_is_what_is_granted(self):
        # A name the test does not give raises, saying how a test gives it;
        # false is granted but not set (nil, so the skill's default).
        self.w.write("e/sync.lua", 'return { retries = 0, run = function(ctx)\n'
                     '  local base = env.CRM_URL .. (env.CRM_PATH or "/sync")\n'
                     '  return ctx.step.run("sync", function() return http.get_json(base) end)\n'
                     'end }\n')
        self.w.write("e/sync_test.lua", 'local t = test.skill("sync.lua")\n'
                     't:case("not given", function(c)\n'
                     '  c:run()\n'
                     '  c:err(%s)\n'
                     'end)\n'
                     't:case("given", function(c)\n'
                     '  c:env{ CRM_URL = "http://crm.test", CRM_PATH = false }\n'
                     '  c:http("GET http://crm.test/sync", { json = { n = 2 } })\n'
                     '  c:eq(c:run(), { n = 2 })\n'
                     'end)\nreturn t\n' % json.dumps(
                         'e/sync.lua:2: env.CRM_URL is not granted to this skill in this test: give it with '
                         'test.skill(path, { env = { CRM_URL = "..." } }) or c:env{ CRM_URL = "..." }'))
        r = self.w.ml("test", "e", check=0)
        self.assertIn("2 passed, 0 failed", r.stdout)

    def test_mocks_of_steps_that_are_not_step_run_work_or_say_what_to_use(self):
        # (c:mock of a wait step used to do nothing at all.)
        self.w.write("k/flow.lua", """return { id = "flow", run = function(ctx)
  local checks = ctx.step.parallel("checks", { function() return 1 end, function() return 2 end })
  local child = ctx.step.invoke("review", { skill = "reviewer", data = { n = checks[1] } })
  ctx.step.sleep("pause", "10m")
  ctx.step.send_event("tell", { name = "flow.done", data = { n = 1 } })
  local ans = ctx.step.wait_for_event("approval", { event = "flow.approved", timeout = "1h" })
  return { by = ans and ans.data.by or "nobody", name = ans and ans.name, checks = checks, child = child }
end }
""")
        self.w.write("k/flow_test.lua", """local t = test.skill("flow.lua")
t:case("a wait mocked with its event, a parallel with its results, an invoke with its output", function(c)
  c:mock("approval", { data = { by = "ada" } })
  c:mock("checks", { 10, 20 })
  c:mock("review", { ok = true })
  local out = c:run({})
  c:eq(out, { by = "ada", name = "flow.approved", checks = { 10, 20 }, child = { ok = true } })
  c:eq(c:step("approval").duration, 0)
end)
t:case("a wait mocked with nil times out", function(c)
  c:mock("approval", nil)
  c:mock("review", function(attempt, id) return { id = id } end)
  local out = c:run({})
  c:eq(out.by, "nobody")
  c:eq(out.child, { id = "review" })
  c:eq(c:step("approval").duration, 3600)
end)
t:case("an invoke mocked with an error fails as a child", function(c)
  c:mock_error("review", "reviewer down")
  c:run({})
  c:err("reviewer down")
end)
t:case("sleep", function(c) c:mock("review", {}) c:mock("pause", 1) c:run({}) end)
t:case("send", function(c) c:mock("review", {}) c:mock("tell", {}) c:run({}) end)
t:case("wait error", function(c) c:mock("review", {}) c:mock_error("approval", "x") c:run({}) end)
t:case("wait value", function(c) c:mock("review", {}) c:mock("approval", true) c:run({}) end)
t:case("parallel value", function(c) c:mock("checks", "x") c:run({}) end)
return t
""")
        doc = json.loads(self.w.ml("test", "k", "--json", check=1).stdout)
        res = {t["name"]: t for t in doc["tests"]}
        for name in ("a wait mocked with its event, a parallel with its results, an invoke with its output",
                     "a wait mocked with nil times out", "an invoke mocked with an error fails as a child"):
            self.assertTrue(res[name]["ok"], res[name])
        want = {
            "sleep": 'c:mock("pause"): step \'pause\' is a sleep: sleeps pass at once on the virtual clock, so there '
                     'is nothing to mock (remove the mock; c:step("pause").duration is how long it slept)',
            "send": 'c:mock("tell"): step \'tell\' sends events: in a test they are recorded, not sent, so there is '
                    'nothing to mock (remove the mock; c:sent() lists them, and a wait of the run can take them)',
            "wait error": 'c:mock_error("approval"): step \'approval\' waits for an event, which does not fail: mock '
                          'it with the event it gets, c:mock("approval", { data = {...} }), or with nil for its '
                          'timeout',
            "wait value": 'c:mock("approval"): step \'approval\' waits for an event: mock it with the event, a table '
                          'such as { data = {...} }, or with nil for its timeout; got true',
            "parallel value": 'c:mock("checks"): step \'checks\' is a parallel step: mock it with the list of its '
                              'functions\' results, or mock each function as "checks/1", "checks/2", ...; got "x"',
        }
        for name, msg in want.items():
            self.assertFalse(res[name]["ok"], name)
            self.assertEqual(res[name]["message"].split("\n")[0], msg, name)

    def test_an_event_named_after_the_run_id_is_supplied_by_a_function_of_the_run(self):
        self.w.write("r/approve.lua", """return { id = "approve", run = function(ctx)
  local ans = ctx.step.wait_for_event("approval", { event = "approve." .. ctx.run_id, timeout = "1h" })
  return ans and ans.data or "timed out"
end }
""")
        self.w.write("r/approve_test.lua", """local t = test.skill("approve.lua")
t:case("approved", function(c)
  c:event(function(run) return "approve." .. run.id end,
          function(run) return { by = "ada", amount = run.input.amount } end, { after = "5m" })
  c:eq(c:run({ amount = 5 }), { by = "ada", amount = 5 })
  c:eq(c:step("approval").duration, 300)
end)
t:case("an event of another run's id does not count", function(c)
  c:event("approve.01AAAAAAAAAAAAAAAAAAAAAAAA", { by = "eve" })
  c:eq(c:run({}), "timed out")
end)
t:case("a function that raises fails the case", function(c)
  c:event(function(run) error("no id") end, {})
  c:run({})
end)
return t
""")
        doc = json.loads(self.w.ml("test", "r", "--json", check=1).stdout)
        res = {t["name"]: t for t in doc["tests"]}
        self.assertTrue(res["approved"]["ok"], res["approved"])
        self.assertTrue(res["an event of another run's id does not count"]["ok"])
        bad = res["a function that raises fails the case"]
        self.assertFalse(bad["ok"])
        self.assertIn("c:event: the function giving the event's name raised: ", bad["message"])
        self.assertIn("no id", bad["message"])

    def test_every_run_is_replayed_and_a_replay_that_goes_its_own_way_fails(self):
        # Outside steps: an extra step when the clock says so, an output read
        # from the clock, a random step id; and a deterministic skill that passes.
        self.w.write("r/extra.lua", 'return { run = function(ctx)\n'
                     '  local a = ctx.step.run("a", function() return 1 end)\n'
                     '  if os.time() > 1767614400 + 1800 then\n'
                     '    ctx.step.run("extra", function() return 2 end)\n'
                     '  end\n'
                     '  return a\n'
                     'end }\n')
        self.w.write("r/clock.lua", 'return { run = function(ctx)\n'
                     '  ctx.step.run("a", function() return 1 end)\n'
                     '  return { at = os.time() }\n'
                     'end }\n')
        self.w.write("r/fine.lua", 'return { retries = 1, backoff = "1s", run = function(ctx)\n'
                     '  local t = ctx.step.run("t", function() return os.time() end)\n'
                     '  local ok = pcall(ctx.step.run, "flaky", function() error("no") end)\n'
                     '  local p = ctx.step.parallel("p", { function() return t end, function() return 2 end })\n'
                     '  ctx.step.sleep("nap", "1h")\n'
                     '  return { t = t, ok = ok, p = p }\n'
                     'end }\n')
        # A flag set in a step body (which a replay does not run) and read
        # outside it: the replay returns before the journal's last step.
        self.w.write("r/short.lua", 'return { run = function(ctx)\n'
                     '  local seen = {}\n'
                     '  ctx.step.run("collect", function() seen[#seen + 1] = "a"; return true end)\n'
                     '  if #seen > 0 then ctx.step.run("process", function() return #seen end) end\n'
                     '  return "done"\n'
                     'end }\n')
        for name in ("extra", "clock", "fine", "short"):
            self.w.write("r/%s_test.lua" % name, 'local t = test.skill("%s.lua")\n'
                         't:case("%s", function(c)\n'
                         '  c:at("2026-01-05T12:00:00Z")\n'
                         '  c:run({})\n'
                         'end)\nreturn t\n' % (name, name))
        r = self.w.ml("test", "r", check=1)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[-1], "1 passed, 3 failed", r.stdout)
        self.assertIn("r/short_test.lua:4: FAIL short: replaying the run from its journal (as an engine does "
                      "after a crash): r/short.lua:3: the code no longer matches this run's journal: the run "
                      "returned after step 1 'collect' (the last step it reached, at this line), but the journal "
                      "goes on to step 2 'process' (run).", r.stdout)
        self.assertIn('r/clock_test.lua:4: FAIL clock: replaying the run from its journal (as an engine '
                      'does after a crash): the run completed with {"at":1767614400}, the replay '
                      'completed with {"at":1767618000}. Code outside step bodies', r.stdout)
        self.assertIn("r/extra_test.lua:4: FAIL extra: r/extra.lua:4: replaying the run from its journal "
                      "(as an engine does after a crash) reached step 'extra' and would run it: the run "
                      "had not taken that step there.", r.stdout)

    def test_a_failed_assertion_caught_by_pcall_still_fails_its_case(self):
        self.w.write("p/s.lua", 'return { run = function(ctx) return 1 end }\n')
        self.w.write("p/s_test.lua", 'local t = test.skill("s.lua")\n'
                     't:case("eq caught", function(c) pcall(function() c:eq(1, 2) end) end)\n'
                     't:case("fail caught", function(c)\n'
                     '  pcall(c.fail, c, "first")\n'
                     '  c:fail("second")\n'
                     'end)\n'
                     't:case("fine", function(c) c:eq(c:run({}), 1) end)\n'
                     'return t\n')
        r = self.w.ml("test", "p", check=1)
        self.assertEqual(r.stdout.splitlines()[-1], "1 passed, 2 failed", r.stdout)
        self.assertIn("p/s_test.lua:2: FAIL eq caught: values differ: expected 2, got 1", r.stdout)
        self.assertIn("p/s_test.lua:4: FAIL fail caught: first", r.stdout)

    def test_registered_skill_by_id(self):
        self.w.write("ws/greet.lua", 'return { id = "greet", run = function(ctx)\n'
                     '  return ctx.step.run("hello", function() return "hi " .. ctx.input.name end)\n'
                     'end }\n')
        # A test file beside the skill in a live workspace is not taken for a skill.
        self.w.write("ws/greet_test.lua", 'local t = test.skill("greet.lua")\n'
                     't:case("x", function(c) c:eq(c:run({ name = "bo" }), "hi bo") end)\nreturn t\n')
        p = self.w.start("serve", "--workspace", "ws", "--listen", "127.0.0.1:0")
        try:
            wait_until(lambda: any(s["id"] == "greet" for s in self.w.json("skills")),
                       what="greet registered")
            time.sleep(1.5)  # past the watcher's debounce: a rejected test file would show by now
            self.assertEqual([s["id"] for s in self.w.json("skills")], ["greet"])
        finally:
            p.terminate()
            p.wait(timeout=20)
        r = self.w.ml("test", "ws", check=0)
        self.assertIn("1 passed, 0 failed", r.stdout)
        self.w.write("byid/greet_test.lua", 'local t = test.skill("greet")\n'
                     't:case("by id", function(c)\n'
                     '  c:eq(c:run({ name = "ana" }), "hi ana")\n'
                     'end)\nreturn t\n')
        r = self.w.ml("test", "byid", check=0)
        self.assertIn("1 passed, 0 failed", r.stdout)
        self.w.write("byid2/x_test.lua", 'local t = test.skill("nope")\nreturn t\n')
        r = self.w.ml("test", "byid2", check=1)
        self.assertIn("byid2/x_test.lua:1: FAIL loading the test file: no skill file 'nope'", r.stdout)

    def test_bad_input(self):
        os.makedirs(os.path.join(self.w.path, "empty"))
        r = self.w.ml("test", "empty", check=2)
        self.assertIn("no test files", r.stderr)
        r = self.w.ml("test", "no/such/dir", check=2)
        self.assertIn("no such file or directory: no/such/dir", r.stderr)
        self.copy_skills()
        self.w.write("skills/syntax_test.lua", 'local t = test.skill("service_check.lua")\n'
                     't:case("x", function(c)\n  local = 1\nend)\nreturn t\n')
        r = self.w.ml("test", "skills/syntax_test.lua", check=1)
        self.assertTrue(r.stdout.startswith("skills/syntax_test.lua:3: FAIL loading the test file:"),
                        r.stdout)
        self.w.write("skills/err_test.lua", 'local t = test.skill("service_check.lua")\n'
                     't:case("x", function(c)\n  local v\n  c:eq(v.field, 1)\nend)\nreturn t\n')
        r = self.w.ml("test", "skills/err_test.lua", check=1)
        self.assertIn("skills/err_test.lua:4: FAIL x: attempt to index local 'v' (a nil value)", r.stdout)

    def test_test_files_are_sandboxed(self):
        self.copy_skills()
        self.w.write("skills/evil_test.lua", 'local t = test.skill("service_check.lua")\n'
                     't:case("io", function(c) io.open("/tmp/x", "w") end)\n'
                     't:case("os", function(c) os.execute("true") end)\n'
                     'return t\n')
        r = self.w.ml("test", "skills/evil_test.lua", check=1)
        self.assertIn("evil_test.lua:2: FAIL io: undefined global 'io'", r.stdout)
        self.assertIn("evil_test.lua:3: FAIL os:", r.stdout)
        self.assertIn("0 passed, 2 failed", r.stdout)

    def test_runaway_step_fails_the_run_not_the_runner(self):
        self.w.write("moonloop.conf.lua", "return { limits = { run_seconds_between_yields = 0.2 } }\n")
        self.w.write("r/spin.lua", 'return { run = function(ctx)\n'
                     '  return ctx.step.run("spin", function() while true do end end)\n'
                     'end }\n')
        self.w.write("r/spin_test.lua", 'local t = test.skill("spin.lua")\n'
                     't:case("stopped", function(c)\n'
                     '  c:run()\n'
                     '  c:err("ran for more than 200 ms without yielding")\n'
                     '  c:eq(c:step("spin").status, "failed")\n'
                     'end)\n'
                     't:case("next case runs", function(c) c:ok(true) end)\n'
                     'return t\n')
        r = self.w.ml("test", "r", check=0)
        self.assertIn("2 passed, 0 failed", r.stdout)

    # A request's timeout against a mock's delay, and a mocked transport
    # error's reason: what the real HTTP client does (engine/core/httpc.c).
    SLOW = ('return { id = "slow", retries = 0, run = function(ctx)\n'
            '  return ctx.step.run("get", function()\n'
            '    local t0 = time.now()\n'
            '    local r, err, why = http.request{ url = env.STANDIN .. "/slow?x=1", timeout = ctx.input.timeout }\n'
            '    return { status = r and r.status, err = err, why = why, took = time.now() - t0 }\n'
            '  end)\n'
            'end }\n')

    def test_a_request_timeout_ends_a_slow_mocks_answer_as_the_real_client_does(self):
        # The real client first, against a stand-in that answers after 1.5 s.
        self.si.routes["/slow"] = lambda h, b, n: (time.sleep(1.5), (200, {}))[1]
        self.w.write("s/slow.lua", self.SLOW)
        r = self.w.ml("run", "s/slow.lua", "--data", '{"timeout": 1}', check=0)
        real = json.loads(r.stdout)
        self.assertEqual(real["why"], "timeout")
        self.assertEqual(real["err"], "timeout after 1000 ms (GET %s/slow?x=1)" % self.si.url)
        calls = self.si.count("/slow")
        # The same request under `moonloop test`, its mock 5 virtual seconds slow.
        self.w.write("s/slow_test.lua", 'local t = test.skill("slow.lua", { env = { STANDIN = %s } })\n'
                     'local real = json.decode(%s)\n'
                     't:case("a timeout shorter than the delay", function(c)\n'
                     '  c:http("GET /slow", { json = {}, delay = "5s" })\n'
                     '  local out = c:run({ timeout = 1 })\n'
                     '  c:eq({ out.err, out.why, out.status }, { real.err, real.why, nil })\n'
                     '  c:eq(out.took, 1)\n'
                     'end)\n'
                     't:case("the default, 30 s", function(c)\n'
                     '  c:http("GET /slow", { json = {}, delay = "31s" })\n'
                     '  c:eq(c:run({}), { err = %s, why = "timeout", took = 30 })\n'
                     'end)\n'
                     't:case("an answer within the timeout", function(c)\n'
                     '  c:http("GET /slow", { json = {}, delay = "5s" })\n'
                     '  c:eq(c:run({ timeout = "6s" }), { status = 200, took = 5 })\n'
                     'end)\n'
                     'return t\n' % (json.dumps(self.si.url), json.dumps(json.dumps(real)),
                                     json.dumps("timeout after 30000 ms (GET %s/slow?x=1)" % self.si.url)))
        r = self.w.ml("test", "s", check=None)
        self.assertIn("3 passed, 0 failed", r.stdout, r.stdout + r.stderr)
        self.assertEqual(self.si.count("/slow"), calls)  # hermetic still

    def test_llm_chat_times_out_and_retries_against_a_slow_mock(self):
        # llm.chat's timeout (120 s by default, or its option) ends a slow
        # answer, and its own retries follow, 1, 2, 4, 8 s apart (no jitter).
        self.w.write("a/ask.lua", 'return { id = "ask", retries = 0, run = function(ctx)\n'
                     '  return ctx.step.run("ask", function()\n'
                     '    return llm.chat({ prompt = "hi", timeout = ctx.input.timeout }).text\n'
                     '  end)\n'
                     'end }\n')
        self.w.write("a/ask_test.lua", 'local t = test.skill("ask.lua")\n'
                     'local answer = { choices = { { message = { role = "assistant", content = "hello" } } } }\n'
                     't:case("120 s by default, five tries", function(c)\n'
                     '  c:http("POST /chat/completions", { json = answer, delay = "121s" })\n'
                     '  local t0 = c:now()\n'
                     '  c:run({})\n'
                     '  c:err("llm.chat: timeout after 120000 ms (POST http://llm.test/v1/chat/completions) (after 5 tries)")\n'
                     '  c:eq(c:now() - t0, 5 * 120 + 1 + 2 + 4 + 8)\n'
                     '  c:eq(#c:requests(), 5)\n'
                     'end)\n'
                     't:case("its timeout option, then an answer in time", function(c)\n'
                     '  c:http("POST /chat/completions", function(req, n)\n'
                     '    return { json = answer, delay = n == 1 and "10s" or "1s" }\n'
                     '  end)\n'
                     '  local t0 = c:now()\n'
                     '  c:eq(c:run({ timeout = 5 }), "hello")\n'
                     '  c:eq(c:now() - t0, 5 + 1 + 1)\n'
                     '  c:eq(c:logs()[1].msg, "llm.chat: POST http://llm.test/v1/chat/completions failed: '
                     'timeout after 5000 ms (POST http://llm.test/v1/chat/completions); retry 1 of 4 in 1.0s")\n'
                     'end)\n'
                     'return t\n')
        r = self.w.ml("test", "a", check=None)
        self.assertIn("2 passed, 0 failed", r.stdout, r.stdout + r.stderr)

    def test_a_mocked_transport_error_has_the_real_clients_reason(self):
        self.w.write("e/slow.lua", self.SLOW)
        self.w.write("e/slow_test.lua", 'local t = test.skill("slow.lua", { env = { STANDIN = "http://s.test" } })\n'
                     't:case("given", function(c)\n'
                     '  c:http("GET /slow", { error = "connection refused", reason = "connect" })\n'
                     '  c:eq(c:run({}), { err = "connection refused", why = "connect", took = 0 })\n'
                     'end)\n'
                     't:case("by default network, after its delay", function(c)\n'
                     '  c:http("GET /slow", { error = "connection reset", delay = "3s" })\n'
                     '  c:eq(c:run({}), { err = "connection reset", why = "network", took = 3 })\n'
                     'end)\n'
                     't:case("a mock function that raises", function(c)\n'
                     '  c:http("GET /slow", function() error("reset", 0) end)\n'
                     '  c:eq(c:run({}), { err = "reset", why = "network", took = 0 })\n'
                     'end)\n'
                     't:case("an error slower than the timeout is a timeout", function(c)\n'
                     '  c:http("GET /slow", { error = "connection reset", delay = "3s" })\n'
                     '  c:eq(c:run({ timeout = 2 }).why, "timeout")\n'
                     'end)\n'
                     't:case("not one of the client\'s", function(c)\n'
                     '  c:http("GET /slow", { error = "x", reason = "refused" })\n'
                     '  c:run({})\n'
                     'end)\n'
                     't:case("a reason without an error", function(c)\n'
                     '  c:http("GET /slow", { json = {}, reason = "dns" })\n'
                     '  c:run({})\n'
                     'end)\n'
                     'return t\n')
        r = self.w.ml("test", "e", check=1)
        self.assertIn("4 passed, 2 failed", r.stdout, r.stdout + r.stderr)
        self.assertIn('FAIL not one of the client\'s: http mock: reason = "refused" is not one the HTTP client '
                      'gives: timeout, connect, dns, tls, too_big, scheme, redirects, invalid, network, nomem, '
                      'internal, self', r.stdout)
        self.assertIn('FAIL a reason without an error: http mock: reason = "dns" goes with error = "..." '
                      '(a failed transfer), which this response does not give', r.stdout)
