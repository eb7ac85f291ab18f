"""moonloop check: strict validation with errors that name the file, the line and the key."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, kill9, wait_until  # noqa: E402

GOOD = """return {
  id = "incident-triage",
  description = "triage",
  triggers = { { event = "infra.incident.triage" }, { cron = "*/30 * * * *", tz = "Europe/Paris" } },
  retries = 3,
  timeout = "1h",
  concurrency = { limit = 1, key = "event.data.service" },
  cancel_on = { { event = "infra.incident.resolved", match = "data.service" } },
  on_failure = function(ctx, err) end,
  run = function(ctx) return 1 end,
}
"""


class CheckTest(TestCase):
    def check(self, src, name="s.lua", status=1):
        self.w.write(name, src)
        r = self.w.ml("check", name, check=status)
        return r.stderr.strip()

    def test_good_file(self):
        self.w.write("good.lua", GOOD)
        r = self.w.ml("check", "good.lua", check=0)
        self.assertIn("ok  good.lua  (incident-triage)", r.stdout)

    def test_unknown_key_names_line_and_suggests(self):
        msg = self.check("return {\n  id = \"x\",\n  retires = 3,\n  run = function() end,\n}\n")
        self.assertEqual(msg, "s.lua:3: unknown key 'retires' in the skill table (did you mean 'retries'?)")

    def test_syntax_error_names_the_line(self):
        msg = self.check("return {\n  run = function()\n    local x = = 1\n  end,\n}\n")
        self.assertTrue(msg.startswith("s.lua:3:"), msg)

    def test_runtime_error_at_load_names_the_line(self):
        msg = self.check("local t = nil\nlocal y = t.x\nreturn { run = function() end }\n")
        self.assertTrue(msg.startswith("s.lua:2:"), msg)

    def test_table_problems(self):
        cases = [
            ("return 42\n", "must return a table"),
            ("return { id = \"x\" }\n", "needs a 'run' function"),
            ("return { id = \"Bad Id\", run = function() end }\n", "bad skill id 'Bad Id'"),
            ("return { retries = -1, run = function() end }\n", "'retries' must be a whole number"),
            ("return { retries = \"3\", run = function() end }\n",
             "'retries' must be a whole number from 0 to 100, got the string \"3\""),
            ("return { retries = 2.5, run = function() end }\n",
             "'retries' must be a whole number from 0 to 100, got 2.5"),
            ("return { retries = {}, run = function() end }\n",
             "'retries' must be a whole number from 0 to 100, got a table"),
            ("return { concurrency = { limit = \"2\" }, run = function() end }\n",
             "'concurrency.limit' must be a whole number of at least 1, got the string \"2\""),
            ("return { timeout = -5, run = function() end }\n", "'timeout' must be a positive duration, got -5"),
            ("return { timeout = \"5 fortnights\", run = function() end }\n", "'timeout'"),
            ("return { triggers = { { cron = \"61 * * * *\" } }, run = function() end }\n",
             "out of range"),
            ("return { triggers = { { cron = \"* * * * *\", tz = \"Mars/Olympus\" } }, run = function() end }\n",
             "unknown time zone 'Mars/Olympus'"),
            ("return { triggers = { { cron = \"* * * * *\", tz = \"\" } }, run = function() end }\n",
             "trigger 1: 'tz' is empty: name a zone such as \"Europe/Paris\", or leave tz out for UTC"),
            ("return { triggers = { { event = \"a\", cron = \"* * * * *\" } }, run = function() end }\n",
             "exactly one of 'event' or 'cron'"),
            ("return { triggers = { { evnt = \"a\" } }, run = function() end }\n",
             "unknown key 'evnt' in trigger 1 (did you mean 'event'?)"),
            ("return { concurrency = { limit = 0 }, run = function() end }\n", "concurrency.limit"),
            ("return { concurrency = { limt = 1 }, run = function() end }\n", "did you mean 'limit'?"),
            ("return { on_failure = 1, run = function() end }\n", "'on_failure' must be a function"),
        ]
        for src, want in cases:
            with self.subTest(want=want):
                self.assertIn(want, self.check(src))

    def test_default_id_is_the_file_name(self):
        self.w.write("health_check.lua", "return { run = function() end }\n")
        r = self.w.ml("check", "health_check.lua", check=0)
        self.assertIn("(health-check)", r.stdout)

    def test_several_files_and_json(self):
        self.w.write("a.lua", GOOD)
        self.w.write("b.lua", "return {\n  retires = 1, run = function() end }\n")
        r = self.w.ml("check", "a.lua", "b.lua", "--json", check=1)
        res = json.loads(r.stdout)
        self.assertEqual([x["ok"] for x in res], [True, False])
        self.assertEqual(res[1]["line"], 2)
        self.assertEqual(res[0]["id"], "incident-triage")

    def test_missing_file(self):
        r = self.w.ml("check", "nope.lua", check=1)
        self.assertIn("cannot read 'nope.lua'", r.stderr)

    def test_a_folder_is_checked_as_the_watcher_loads_it(self):
        self.w.write("ws/a.lua", GOOD)
        self.w.write("ws/sub/b.lua", "return { run = function() end }\n")
        self.w.write("ws/sub/bad.lua", "return {\n  retires = 1, run = function() end }\n")
        # Not skills, as for the watcher: tests, dotfiles, editor files, dot-folders, other files.
        for name in ("ws/a_test.lua", "ws/.x.lua", "ws/#y.lua#", "ws/.git/z.lua", "ws/notes.txt",
                     "ws/a.lua~"):
            self.w.write(name, "this is not Lua")
        r = self.w.ml("check", "ws", check=1)
        self.assertEqual(r.stdout.splitlines(), ["ok  ws/a.lua  (incident-triage)",
                                                 "ok  ws/sub/b.lua  (b)"])
        self.assertEqual(r.stderr.strip(), "ws/sub/bad.lua:2: unknown key 'retires' in the skill table "
                                           "(did you mean 'retries'?)")
        os.unlink(os.path.join(self.w.path, "ws/sub/bad.lua"))
        r = self.w.ml("check", "ws/", "--json", check=0)
        self.assertEqual([x["file"] for x in json.loads(r.stdout)], ["ws/a.lua", "ws/sub/b.lua"])
        # A folder and a file together.
        os.makedirs(os.path.join(self.w.path, "only"))
        self.w.write("only/c.lua", "return { run = function() end }\n")
        r = self.w.ml("check", "only", "ws/a.lua", check=0)
        self.assertEqual(r.stdout.splitlines(), ["ok  only/c.lua  (c)", "ok  ws/a.lua  (incident-triage)"])
        # A test file named on the command line is checked whatever its name.
        self.w.write("t_test.lua", "return { run = function() end }\n")
        self.w.ml("check", "t_test.lua", check=0)

    def test_a_folder_without_skill_files_is_a_usage_error(self):
        self.w.write("empty/x_test.lua", "return {}\n")
        r = self.w.ml("check", "empty", check=2)
        self.assertIn("check: no skill files (*.lua, not *_test.lua) in empty", r.stderr)


def skill(body, head=""):
    """A skill file whose run function is body (its lines start at line 3,
    after `head`'s lines)."""
    return '%sreturn { id = "s",\n  run = function(ctx)\n%s\n  end,\n}\n' % (head, body)


class StaticCheckTest(TestCase):
    """The static checks (lua/lint.lua): what an agent guesses wrong is named
    with its line and the fix before the skill ever runs."""

    def check(self, src, status=1, name="s.lua"):
        self.w.write(name, src)
        return self.w.ml("check", name, check=status)

    def test_each_mistake_is_named_with_its_line_and_its_fix(self):
        cases = [
            # a step kind that does not exist, also through a local alias of ctx.step
            ('    ctx.step.wait("w", { event = "x" })',
             "s.lua:3: ctx.step.wait is not a step: did you mean ctx.step.wait_for_event? (the steps are run, "
             "sleep, sleep_until, wait_for_event, invoke, send_event and parallel)"),
            ('    local step = ctx.step\n    step.call("c", { skill = "x" })',
             "s.lua:4: ctx.step.call is not a step: did you mean ctx.step.invoke?"),
            # a literal step option that does not exist
            ('    ctx.step.run("x", function() return 1 end, { retires = 2 })',
             "s.lua:3: step.run: unknown option 'retires' (did you mean 'retries'?); the options are retries "
             "and timeout"),
            ('    ctx.step.parallel("p", { function() return 1 end }, { timout = "1m" })',
             "s.lua:3: step.parallel: unknown option 'timout' (did you mean 'timeout'?)"),
            ('    ctx.step.wait_for_event("w", { name = "order.paid", timeout = "1h" })',
             "s.lua:3: step.wait_for_event: unknown key 'name' (did you mean 'event'?); the keys are event, "
             "match and timeout"),
            ('    ctx.step.invoke("i", { skill = "x", input = {} })',
             "s.lua:3: step.invoke: unknown key 'input' (did you mean 'data'?); the keys are skill, data and "
             "timeout"),
            ('    ctx.step.send_event("e", { event = "x", data = {} })',
             "s.lua:3: step.send_event: event 1: unknown key 'event' (did you mean 'name'?); an event has name, "
             "data and id"),
            ('    ctx.step.send_event("e", { { name = "a" }, { name = "b", payload = 1 } })',
             "s.lua:3: step.send_event: event 2: unknown key 'payload' (did you mean 'data'?)"),
            # a module function that does not exist
            ('    ctx.step.run("p", function() return http.post("http://x", {}) end)',
             "s.lua:3: http.post is not a function of the http module: did you mean http.post_json? (its "
             "functions are request, get, get_json and post_json)"),
            ('    ctx.step.run("c", function() return runs.cancle("x") end)',
             "s.lua:3: runs.cancle is not a function of the runs module: did you mean runs.cancel?"),
            ('    local url = env.get("CRM_URL")',
             "s.lua:3: env.get(...): env holds strings, not functions: it is the variables the configuration "
             "grants (env = { \"NAME\" } in moonloop.conf.lua), read as env.NAME"),
            ('    local parse = json.parse',
             "s.lua:3: json.parse is not a function of the json module: did you mean json.decode?"),
            # a literal option table of a module call with an unknown key
            ('    ctx.step.run("p", function()\n      return http.request{ url = "http://x", jsn = {} }\n    end)',
             "s.lua:4: http.request: unknown key 'jsn' (did you mean 'json'?); the keys are method, url, "
             "headers, body, json and timeout"),
            ('    ctx.step.run("a", function() return llm.chat{ promt = "hi" } end)',
             "s.lua:3: llm.chat: unknown key 'promt' (did you mean 'prompt'?)"),
            ('    ctx.step.run("r", function() return runs.list{ state = "failed" } end)',
             "s.lua:3: runs.list: unknown key 'state' (did you mean 'status'?)"),
            ('    ctx.step.run("g", function() return http.get_json("http://x", { header = {} }) end)',
             "s.lua:3: http.get_json: unknown option 'header' (did you mean 'headers'?); the options are "
             "headers and timeout"),
            ('    local s = json.encode({}, { indent = 2 })',
             "s.lua:3: json.encode: unknown option 'indent'; the options are pretty"),
            # a step inside a step body
            ('    ctx.step.run("outer", function()\n      return ctx.step.run("inner", function() return 1 end)\n'
             '    end)',
             "s.lua:4: steps cannot be nested: step.run('inner') is inside the body of step 'outer' (line 3): "
             "call it in the run function, before or after that step"),
            ('    ctx.step.parallel("fan", { function() ctx.step.sleep("z", 1) end })',
             "s.lua:3: steps cannot be nested: step.sleep('z') is inside the body of step 'fan' (line 3)"),
            # I/O in the run function itself
            ('    local page = http.get("http://x")',
             "s.lua:3: http.get must be called inside a step body (ctx.step.run(\"name\", function() ... end)), "
             "where its result is checkpointed"),
            # a field ctx does not have
            ('    return ctx.data.order_id',
             "s.lua:3: ctx.data is not a field of ctx: did you mean ctx.input?"),
            # a module function called with ':'
            ('    ctx.step.run("g", function() return http:get("http://x") end)',
             "s.lua:3: http:get(...) passes the module as the first argument: call it with a dot, http.get(...)"),
        ]
        for body, want in cases:
            with self.subTest(want=want):
                r = self.check(skill(body))
                self.assertTrue(r.stderr.strip().startswith(want), r.stderr)
                self.assertEqual(r.stdout, "")

    def test_what_is_not_certain_is_not_flagged(self):
        body = '''
    local http = { post = function() return 1 end }   -- a local named like a module
    local a = http.post()
    local function json() return 2 end
    local opts = { retires = 1 }                      -- not a literal at the call
    local b = ctx.step.run("x", function() return a end, opts)
    local cfg = { step = { wait = 1 } }               -- .step.wait of something that is not ctx
    local c = cfg.step.wait
    local function helper() return os.time() end      -- may be called in a step only
    local d = ctx.step.run("t", function() return helper() end)
    local e = ctx.step.run("now", function() return { os.time(), math.random(), time.now() } end)
    local f = os.date("%Y", 0)                         -- a date of a given time
    local g = skills.check("return {}")                -- pure: no I/O
    return { a, b, c, d, e, f, g and 1 }'''
        # A helper's parameter named ctx may be another ctx: its fields are its own.
        head = "local function render(ctx) return ctx.title end\n"
        r = self.check(skill(body, head=head), status=0)
        self.assertEqual(r.stderr, "")
        self.assertIn("ok  s.lua  (s)", r.stdout)
        # A table returned through a local, run given as a function statement.
        self.check('local skill = { id = "t" }\nfunction skill.run(c)\n  local w = c.step.wait_for_event('
                   '"w", { event = "x", timeout = 1 })\n  return w\nend\nreturn skill\n', status=0)
        r = self.check('local skill = { id = "t" }\nfunction skill.run(c)\n  return c.step.sleeep("s", 1)\n'
                       'end\nreturn skill\n')
        self.assertIn("s.lua:3: ctx.step.sleeep is not a step: did you mean ctx.step.sleep?", r.stderr)

    def test_code_that_is_not_deterministic_is_a_warning(self):
        body = '''    local started = os.time()
    local pick = math.random(3)
    if pick > 1 then
      local now = time.now()
    end
    local day = os.date("%A")
    local fixed = os.time({ year = 2020, month = 1, day = 1 }) + #os.date("%A", 0)
    return ctx.step.run("a", function() return { started, pick, day, fixed, os.clock() } end)'''
        r = self.check(skill(body), status=0)
        self.assertIn("ok  s.lua  (s)", r.stdout)
        lines = r.stderr.splitlines()
        # os.time(t) and os.date(fmt, t), of a given time, are not warned.
        self.assertEqual(len(lines), 4, r.stderr)
        self.assertTrue(lines[0].startswith(
            "s.lua:3: warning: os.time() outside a step body gives another value when the run is replayed "
            "after a restart: call it inside a step"), lines[0])
        self.assertTrue(lines[1].startswith("s.lua:4: warning: math.random() outside a step body"), lines[1])
        self.assertTrue(lines[2].startswith(
            "s.lua:6: warning: time.now() outside a step body is the time recorded at the last step"), lines[2])
        self.assertTrue(lines[3].startswith("s.lua:8: warning: os.date() outside a step body"), lines[3])
        r = self.w.ml("check", "s.lua", "--json", check=0)
        res = json.loads(r.stdout)[0]
        self.assertTrue(res["ok"])
        self.assertEqual([w["line"] for w in res["warnings"]], [3, 4, 6, 8])
        # on_failure runs as a run too.
        r = self.check('return { id = "f", run = function() end,\n  on_failure = function(ctx, err)\n'
                       '    local n = math.random()\n  end }\n', status=0)
        self.assertIn("s.lua:3: warning: math.random()", r.stderr)

    def test_a_step_body_that_changes_a_local_of_the_run_is_a_warning(self):
        # An agent loop appending the model's reply to its history inside the
        # step: a replay skips the body, so after a crash the next call got a
        # history without it, and check, test and replay all said ok.
        body = '''    local messages = { "user: hi" }
    local count = 0
    for i = 1, 2 do
      ctx.step.run("think", function()
        local reply = llm.chat{ prompt = table.concat(messages, "\\n") }.text
        table.insert(messages, reply)
        count = count + 1
        local own = {}
        own.seen = reply
        return reply
      end)
    end
    local last = ctx.step.run("last", function() return #messages end)
    messages[#messages + 1] = last
    return count'''
        r = self.check(skill(body), status=0)
        self.assertIn("ok  s.lua  (s)", r.stdout)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 2, r.stderr)
        self.assertTrue(lines[0].startswith(
            "s.lua:8: warning: the body of step 'think' (line 6) changes 'messages', a local of the run "
            "function: a replay (after a crash, and in moonloop test) returns the step's recorded result "
            "without running the body"), lines[0])
        self.assertTrue(lines[1].startswith("s.lua:9: warning: the body of step 'think' (line 6) changes 'count'"),
                        lines[1])

    def test_a_recorded_version_is_not_checked_again_when_its_run_resumes(self):
        # A version accepted before a check was added must not fail the runs
        # that started on it. Stand-in for an older binary's version: the
        # stored source gets a line the static checks refuse (in a branch
        # that never runs).
        self.w.write("w.lua", 'return { id = "w", run = function(ctx)\n'
                     '  local e = ctx.step.wait_for_event("w", { event = "go", timeout = "1h" })\n'
                     '  return e.data\nend }\n')
        p = self.w.start("run", "w.lua")
        run = wait_until(lambda: self.w.runs(status="waiting"), what="the run to wait")[0]
        kill9(p)
        (src,) = self.w.sql("SELECT source FROM versions WHERE version = ?", (run["version"],))[0]
        old = src.replace("return e.data", 'if not e then return ctx.step.run("x", function() '
                          'return http.post("u", {}) end) end\n  return e.data')
        self.w.sql("UPDATE versions SET source = ? WHERE version = ?", (old, run["version"]))
        self.assertIn("http.post is not a function", self.check(old).stderr)  # refused as a new file
        p = self.w.start("run", "--resume", run["id"])
        self.w.ml("send", "go", "--data", '{"ok": true}', check=0)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(json.loads(out), {"ok": True})

    def test_a_recorded_version_that_no_longer_loads_fails_its_run(self):
        # (It crashed the process that adopted the run.)
        self.w.write("w.lua", 'return { id = "w", run = function(ctx)\n'
                     '  return ctx.step.wait_for_event("w", { event = "go", timeout = "1h" })\nend }\n')
        p = self.w.start("run", "w.lua")
        run = wait_until(lambda: self.w.runs(status="waiting"), what="the run to wait")[0]
        kill9(p)
        self.w.sql("UPDATE versions SET source = 'return {' WHERE version = ?", (run["version"],))
        r = self.w.ml("run", "--resume", run["id"], check=1)
        self.assertIn("cannot load version %s of skill 'w'" % run["version"][:12], r.stderr)
        self.assertEqual(self.w.runs()[0]["status"], "failed")

    def test_every_way_in_validates_alike(self):
        # skills.check answers what check answers, warnings included; the
        # watcher refuses the same file with the same message.
        bad = skill('    ctx.step.run("x", function() return 1 end, { retires = 2 })')
        warned = skill('    local t = os.time()\n    return t')
        self.w.write("checker.lua", '''return { id = "checker", run = function(ctx)
  return ctx.step.run("c", function()
    return { bad = skills.check(%r, "x.lua"), warned = skills.check(%r, "y.lua") }
  end)
end }''' % (bad, warned))
        out = json.loads(self.w.ml("run", "checker.lua", check=0).stdout)
        self.assertFalse(out["bad"]["ok"])
        self.assertEqual(out["bad"]["line"], 3)
        self.assertTrue(out["bad"]["error"].startswith("x.lua:3: step.run: unknown option 'retires'"), out)
        self.assertTrue(out["warned"]["ok"])
        self.assertEqual(out["warned"]["warnings"][0]["line"], 3)
        self.assertIn("os.time()", out["warned"]["warnings"][0]["message"])
        os.makedirs(os.path.join(self.w.path, "ws"))
        self.w.write("ws/bad.lua", bad)
        p = self.w.serve("--workspace", "ws")
        try:
            def rejected():
                skills = self.w.json("skills")
                return any((s.get("error") or {}).get("file") == "ws/bad.lua" for s in skills) and skills
            skills = wait_until(rejected, what="the watcher to reject ws/bad.lua")
            err = [s["error"] for s in skills if s.get("error")][0]
            self.assertTrue(err["message"].startswith("ws/bad.lua:3: step.run: unknown option 'retires'"), err)
            self.assertEqual(err["line"], 3)
        finally:
            p.terminate()
            p.wait(timeout=10)
