"""moonloop repl: driven through a real pseudo-terminal (line editing,
history, completion, Ctrl-C) and through a pipe (scripts and agents), and
the examples of docs/repl.md, run as written.

docs/repl.md's examples: a ```lua block whose first line is `-- NAME.lua`
is written to NAME.lua; a ```repl block is a session piped into `moonloop
repl`: lines starting with `> `, `>> ` or `step> ` are what is typed (the
prompt is not), the other lines are the output (stdout and stderr
together), where run ids, version hashes and durations may differ, runs
of spaces count as one, `...` matches any text within a line and a line
of only `...` any number of lines. Each line of a ```sh block is a
command that must succeed.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, SRC, TestCase, lines_match, wait_until  # noqa: E402
from pty_driver import Pty  # noqa: E402

DOC = os.path.join(SRC, "docs", "repl.md")

HELLO = """
return {
  id = "hello",
  run = function(ctx)
    local a = ctx.step.run("greet", function()
      log.info("greeting", ctx.input.who)
      return { text = "hello " .. ctx.input.who }
    end)
    for i = 1, 3 do ctx.step.run("count", function() return i end) end
    return { greeting = a.text, key = ctx.run_id }
  end,
}
"""

STEPS = """
return {
  id = "steps",
  run = function(ctx)
    local a = ctx.step.run("one", function() return 1 end)
    local b = ctx.step.run("two", function() return a + 1 end)
    local c = ctx.step.run("three", function() return b * 10 end)
    return { a = a, b = b, c = c }
  end,
}
"""

# A step body that never yields: only Ctrl-C (or the slice budget, set
# high in these tests) stops it.
SPIN = """
return {
  id = "spin",
  run = function(ctx)
    ctx.step.run("first", function() return "ok" end)
    ctx.step.run("spin", function() local n = 0 while true do n = n + 1 end end)
    return "never"
  end,
}
"""

SLOW = """
return {
  id = "slow",
  run = function(ctx)
    ctx.step.run("first", function() return "ok" end)
    return ctx.step.run("fetch", function() return http.get(env.STANDIN .. ctx.input.path) end)
  end,
}
"""

RUN_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


class ReplCase(TestCase):
    config = {"limits": "{ run_seconds_between_yields = 60 }"}

    def setUp(self):
        super().setUp()
        self.history = os.path.join(self.w.path, "history")
        self.w.env["MOONLOOP_HISTORY"] = self.history
        self.ptys = []

    def tearDown(self):
        for p in self.ptys:
            p.close()
        super().tearDown()

    def repl(self):
        """A REPL on a pseudo-terminal, at its first prompt."""
        p = Pty([BIN, "repl"], cwd=self.w.path, env=self.w.env)
        self.ptys.append(p)
        p.expect(r"\n> ")
        return p

    def pipe(self, text, timeout=60):
        """Pipe text into moonloop repl; returns (status, stdout, stderr)."""
        r = subprocess.run([BIN, "repl"], cwd=self.w.path, env=self.w.env, input=text,
                           capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def leave(self, p):
        # Ctrl-D only once the prompt is up: libedit puts the terminal in
        # raw mode before it prints it, and a ^D typed while the terminal is
        # still cooked (the REPL printing the last answer) can be lost in the
        # switch, leaving the REPL waiting (seen once under load).
        wait_until(lambda: p.text().endswith("> "), timeout=15, what="the prompt before Ctrl-D")
        p.send("\x04")
        self.assertEqual(p.wait(), 0)


class TerminalTest(ReplCase):
    def test_run_prints_each_step_and_returns_output_and_run_id(self):
        self.w.write("hello.lua", HELLO)
        p = self.repl()
        p.line('out, id = run("hello.lua", {who = "ada"})')
        m = p.expect(r"run (%s) hello" % RUN_ID.pattern)
        run_id = m.group(1)
        p.expect(r"info: greeting ada")
        p.expect(r"✓ greet +\d+ms +\{\"text\":\"hello ada\"\}")
        p.expect(r"✓ count +\d+ms +1\n")
        p.expect(r"✓ count#3 +\d+ms +3\n")
        p.expect(r"run %s completed in" % run_id)
        p.line("out.greeting, id")
        p.expect(r'"hello ada"\n"%s"' % run_id)
        self.leave(p)
        t = self.w.trace(run_id)
        self.assertEqual(t["status"], "completed")
        self.assertEqual(t["trigger"], {"kind": "invoke", "by": "repl"})
        self.assertEqual(t["output"]["key"], run_id)

    def test_step_through_skips_a_step_with_a_typed_value(self):
        self.w.write("steps.lua", STEPS)
        p = self.repl()
        p.line('out, id = step_through("steps.lua")')
        p.expect(r"next: one \(run\)")
        p.expect(r"step> ")
        p.line("")
        p.expect(r"✓ one .* 1\n")
        p.expect(r"next: two \(run\)")
        p.expect(r"step> ")
        p.line("s 40 + 1")
        p.expect(r"two .*skipped with 41")
        p.expect(r"next: three \(run\)")
        p.expect(r"step> ")
        p.line("")
        p.expect(r"✓ three .* 410\n")
        p.expect(r"completed in")
        p.line("out.c, id")
        run_id = p.expect(r'410\n"(%s)"' % RUN_ID.pattern).group(1)
        self.leave(p)
        t = self.w.trace(run_id)
        self.assertEqual(t["status"], "completed")
        self.assertEqual(t["output"], {"a": 1, "b": 41, "c": 410})
        two = t["steps"][1]
        self.assertEqual((two["id"], two["status"], two["output"]), ("two", "completed", 41))

    def test_q_leaves_the_run_resumable_and_run_resume_finishes_it(self):
        self.w.write("steps.lua", STEPS)
        p = self.repl()
        p.line('out, id = step_through("steps.lua")')
        p.expect(r"step> ")
        p.line("")
        p.expect(r"next: two")
        p.expect(r"step> ")
        p.line("q")
        p.expect(r"stays resumable")
        p.expect(r"\n> ")
        p.line("id")
        run_id = p.expect(r'"(%s)"' % RUN_ID.pattern).group(1)
        self.leave(p)
        t = self.w.trace(run_id)
        self.assertEqual(t["status"], "running")
        self.assertEqual([s["id"] for s in t["steps"]], ["one"])
        r = self.w.ml("run", "--resume", run_id, check=0)
        self.assertEqual(json.loads(r.stdout), {"a": 1, "b": 2, "c": 20})
        self.assertEqual(self.w.trace(run_id)["status"], "completed")

    def test_ctrl_c_stops_a_looping_step_and_the_prompt_comes_back(self):
        self.w.write("spin.lua", SPIN)
        p = self.repl()
        p.line('run("spin.lua")')
        run_id = p.expect(r"run (%s) spin" % RUN_ID.pattern).group(1)
        p.expect(r"✓ first")
        time.sleep(0.3)  # inside the endless step body
        p.send("\x03")
        p.expect(r"run %s stopped; it stays resumable" % run_id)
        p.expect(r"\n> ")
        p.line("6 * 7")
        p.expect(r"\n42\n")
        self.leave(p)
        # Nothing was written for the interrupted step: it runs again on resume.
        t = self.w.trace(run_id)
        self.assertEqual(t["status"], "running")
        self.assertEqual([(s["id"], s["status"]) for s in t["steps"]], [("first", "completed")])

    def test_ctrl_c_stops_a_step_waiting_on_a_slow_request(self):
        release = threading.Event()

        def slow(handler, body, n):
            release.wait(30)
            return 200, "late"
        self.si.routes["/slow"] = slow
        self.si.routes["/fast"] = (200, "quick")
        self.addCleanup(release.set)
        self.w.write("slow.lua", SLOW)
        p = self.repl()
        p.line('run("slow.lua", {path = "/slow"})')
        run_id = p.expect(r"run (%s) slow" % RUN_ID.pattern).group(1)
        p.expect(r"✓ first")
        for _ in range(200):
            if self.si.count("/slow"):
                break
            time.sleep(0.02)
        p.send("\x03")
        p.expect(r"interrupted")
        p.expect(r"run %s stopped; it stays resumable" % run_id)
        p.expect(r"\n> ")
        # The run goes on from its last completed step, here in the REPL.
        self.si.routes["/slow"] = (200, "now fast")
        p.line('resume("%s")' % run_id)
        p.expect(r"✓ fetch .*\"now fast\"")
        p.expect(r"run %s completed" % run_id)
        self.leave(p)
        t = self.w.trace(run_id)
        self.assertEqual(t["status"], "completed")
        self.assertEqual(t["output"], "now fast")
        self.assertEqual([s["id"] for s in t["steps"]], ["first", "fetch"])

    def test_ctrl_c_stops_lua_typed_at_the_prompt(self):
        p = self.repl()
        p.line("n = 0 while true do n = n + 1 end")
        time.sleep(0.3)
        p.send("\x03")
        p.expect(r"stdin:1: interrupted")
        p.expect(r"\n> ")
        p.line("n > 0")
        p.expect(r"\ntrue\n")
        # pcall cannot swallow it.
        p.line("while true do pcall(function() while true do end end) end")
        time.sleep(0.3)
        p.send("\x03")
        p.expect(r"interrupted")
        p.expect(r"\n> ")
        self.leave(p)

    def test_ctrl_c_at_the_prompt_clears_the_line(self):
        p = self.repl()
        p.send("error('never run')")
        time.sleep(0.2)
        p.send("\x03")
        p.expect(r"\^C\n> ")
        p.line("1 + 2")
        p.expect(r"\n3\n")
        self.assertNotIn("never run\n", p.text())
        self.leave(p)

    def test_history_recalls_lines_and_persists_across_sessions(self):
        p = self.repl()
        p.line('"first" .. 1')
        p.expect(r'"first1"')
        p.line('"second" .. 2')
        p.expect(r'"second2"')
        p.send("\x1b[A\x1b[A\r")  # up twice: the first line
        p.expect(r'"first1"')
        self.leave(p)
        with open(self.history) as f:  # libedit's format: \040 for a space
            self.assertIn('"second"\\040..\\0402', f.read())
        p = self.repl()
        p.send("\x1b[A\r")  # the last line of the previous session
        p.expect(r'"first1"')
        self.leave(p)

    def test_tab_completes_globals_and_fields(self):
        p = self.repl()
        p.send("json.en\t")
        time.sleep(0.3)
        p.line("({b = 1})")
        p.expect(r'"\{\\"b\\":1\}"')
        p.send("ctx.st\t")  # -> ctx.step (step and step_key share it)
        time.sleep(0.3)
        p.send(".ru\t")  # -> ctx.step.run
        time.sleep(0.3)
        p.line('("x", function() return 6 * 7 end)')
        p.expect(r"\n42\n")
        self.leave(p)

    def test_multi_line_function_definition(self):
        p = self.repl()
        p.line("function add(a, b)")
        p.expect(r"\n>> ")
        p.line("  return a + b")
        p.expect(r"\n>> ")
        p.line("end")
        p.expect(r"\n> ")
        p.line("add(40, 2)")
        p.expect(r"\n42\n")
        self.leave(p)

    def test_pretty_prints_nested_tables_with_a_cycle(self):
        p = self.repl()
        p.line('t = {b = {1, 2, 3}, a = {x = json.null, y = "s"}, [1] = "one"}')
        p.line("t.self = t")
        p.line("t")
        p.expect(r'\{ "one", a = \{ x = null, y = "s" \}, b = \{ 1, 2, 3 \}, self = <cycle> \}')
        p.line("{a = {b = {c = {d = {e = {f = {g = {}}}}}}}}")
        p.expect(r"\{ a = \{ b = \{ c = \{ d = \{ e = \{ f = \{\.\.\.\} \} \} \} \} \} \}")
        self.leave(p)


class PipeTest(ReplCase):
    def test_a_run_from_a_pipe_prints_its_result_and_exits_0(self):
        self.w.write("hello.lua", HELLO)
        status, out, err = self.pipe('return run("hello.lua", {who="x"})\n')
        self.assertEqual(status, 0, err)
        lines = out.splitlines()
        self.assertRegex(lines[0], r'^\{ greeting = "hello x", key = "%s" \}$' % RUN_ID.pattern)
        self.assertRegex(lines[1], r'^"%s"$' % RUN_ID.pattern)
        self.assertIn("✓ greet", err)
        self.assertNotIn("> ", out)  # no prompts

    def test_a_line_that_errors_makes_it_exit_1(self):
        status, out, err = self.pipe('x = 1\nerror("boom")\nx + 1\n')
        self.assertEqual(status, 1)
        self.assertIn("stdin:1: boom", err)
        self.assertEqual(out, "2\n")  # the next lines still run
        status, out, err = self.pipe('x = (\n')  # a chunk left unfinished at the end
        self.assertEqual(status, 1)
        self.assertIn("<eof>", err)

    def test_a_failed_run_raises_its_error(self):
        self.w.write("bad.lua", 'return { retries = 0, run = function(ctx)\n'
                     '  ctx.step.run("s", function() error("nope") end) end }')
        status, out, err = self.pipe('run("bad.lua")\n')
        self.assertEqual(status, 1)
        self.assertRegex(err, r"run %s failed: step 's' failed: bad.lua:2: nope" % RUN_ID.pattern)
        # Caught, the error reads as its message, also in a concatenation.
        status, out, err = self.pipe('ok, e = pcall(run, "bad.lua")\nprint("got: " .. e)\n')
        self.assertEqual(status, 0, err)
        self.assertRegex(out, r"got: run %s failed: step 's' failed: bad.lua:2: nope" % RUN_ID.pattern)

    def test_skill_tests_in_the_workspace_are_not_loaded_as_skills(self):
        # serve and check leave *_test.lua out; the REPL loaded them and
        # printed an error for each ("attempt to index global 'test'").
        self.w.write("skills/one.lua", 'return { id = "one", run = function() return 1 end }\n')
        self.w.write("skills/one_test.lua", 'local t = test.skill("one.lua")\nreturn t\n')
        status, out, err = self.pipe('print(run("one"))\n')
        self.assertEqual(status, 0, err)
        self.assertNotIn("one_test.lua", err)
        self.assertIn("1 skill registered", err)

    def test_ctx_holds_steps_to_a_runs_rules(self):
        # Code tried at the prompt must not pass there and fail in a run: a
        # function returned by a body, a step inside a step.
        status, out, err = self.pipe(
            'ctx.step.run("bad", function() return function() end end)\n'
            'ctx.step.run("x", function() return ctx.step.run("y", function() return 1 end) end)\n'
            'ctx.step.parallel("p", {function() return 1 end, function() return print end})\n'
            't = {1, 2}\ncopy = ctx.step.run("ok", function() return t end)\n'
            'print(#copy, copy ~= t, ctx.step.run("after", function() return 5 end))\n')
        self.assertEqual(status, 1, err)
        lines = err.splitlines()
        self.assertIn("step 'bad' failed: result is not a JSON value: cannot encode a function", lines[0])
        self.assertIn("steps cannot be nested: ctx.step.run('y') was called inside the body of step 'x'",
                      lines[1])
        self.assertIn("step 'p/2' failed: result is not a JSON value", lines[2])
        self.assertEqual(out.strip(), "2\ttrue\t5")

    def test_step_through_reads_its_answers_from_the_pipe(self):
        self.w.write("steps.lua", STEPS)
        status, out, err = self.pipe('out = step_through("steps.lua")\n\ns\n{n = 5}\nq\n'
                                     'print(out)\n')
        self.assertEqual(status, 0, err)
        self.assertIn("skipped with {\"n\":5}", err)
        self.assertIn("stays resumable", err)
        self.assertEqual(out, "nil\n")
        runs = self.w.runs(skill="steps")
        t = self.w.trace(runs[0]["id"])
        self.assertEqual([(s["id"], s["output"]) for s in t["steps"]], [("one", 1), ("two", {"n": 5})])

    def test_ctx_step_run_checks_its_options_as_a_run_does(self):
        # They were ignored: a misspelt option or a bad timeout passed at
        # the prompt and failed the same code in a run.
        status, out, err = self.pipe(
            'ctx.step.run("a", function() return 1 end, {retires = 2})\n'
            'ctx.step.run("b", function() return 1 end, {timeout = "bogus"})\n'
            'ctx.step.run("c", function() return 1 end, {retries = -1})\n'
            'ctx.step.parallel("p", {function() return 1 end}, {timout = 1})\n'
            'print(ctx.step.run("ok", function() return 3 end, {retries = 2, timeout = "5s"}))\n')
        self.assertEqual(status, 1, err)
        lines = err.splitlines()
        self.assertEqual(len(lines), 4, err)
        self.assertIn("step.run: unknown option 'retires' (did you mean 'retries'?)", lines[0])
        self.assertIn("step.run: opts.timeout: bad duration 'bogus'", lines[1])
        self.assertIn("step.run: opts.retries must be a whole number from 0 to 100", lines[2])
        self.assertIn("step.parallel: unknown option 'timout' (did you mean 'timeout'?)", lines[3])
        self.assertEqual(out, "3\n")

    def test_ctx_step_run_holds_the_output_limit(self):
        status, out, err = self.pipe(
            'ctx.step.run("big", function() return string.rep("a", 2 * 1024 * 1024) end)\n'
            'print(#ctx.step.run("small", function() return string.rep("a", 1000) end))\n')
        self.assertEqual(status, 1, err)
        self.assertIn("step 'big' failed: result is not a JSON value: JSON text is 2.0 MB, over the limit "
                      "of 1.0 MB (limits.step_output)", err)
        self.assertEqual(out, "1000\n")

    def test_ctx_step_run_timeout_ends_a_slow_request(self):
        # Not enforced: each call waited for the answer, however late.
        release = threading.Event()

        def slow(handler, body, n):
            release.wait(10)
            return 200, "late"
        self.si.routes["/slow"] = slow
        self.addCleanup(release.set)
        t0 = time.monotonic()
        status, out, err = self.pipe(
            'ctx.step.run("s", function() return http.get(env.STANDIN .. "/slow") end, {timeout = "1s"})\n'
            'r = ctx.step.run("t", function() return {http.request{url = env.STANDIN .. "/slow"}} end,'
            ' {timeout = 0.3})\n'
            'print(r[1] == json.null, r[2], r[3])\n'
            'print(ctx.step.run("after", function() return 1 end))\n')
        took = time.monotonic() - t0
        release.set()
        self.assertEqual(status, 1, err)
        self.assertIn("http.get: step 's' timed out after 1.0s", err)
        self.assertEqual(out, "true\tstep 't' timed out after 300ms\tstep_timeout\n1\n")
        self.assertLess(took, 8)

    def test_step_through_refuses_to_skip_a_parallel(self):
        # A skip journaled the parallel's record alone, and the run then
        # failed for good on its first branch ("... a branch of the ended
        # parallel 'fan', but the journal ends before it").
        self.w.write("fan.lua", 'return { id = "fan", run = function(ctx)\n'
                     '  local a = ctx.step.run("a", function() return 1 end)\n'
                     '  local r = ctx.step.parallel("fan", {function() return 1 end, function() return 2 end})\n'
                     '  return { a = a, r = r } end }\n')
        status, out, err = self.pipe('out, id = step_through("fan.lua", {})\n\ns {7, 8}\n\nout\n')
        self.assertEqual(status, 0, err)
        self.assertIn("'fan' is a step.parallel: it cannot be skipped here", err)
        self.assertNotIn("no longer matches", err)
        self.assertEqual(out, "{ a = 1, r = { 1, 2 } }\n")
        # q after the refusal leaves the run resumable.
        status, out, err = self.pipe('out, id = step_through("fan.lua", {})\n\ns 1\nq\nprint(out)\n')
        self.assertEqual(status, 0, err)
        self.assertIn("cannot be skipped here", err)
        self.assertIn("stays resumable", err)
        self.assertEqual(out, "nil\n")

    def test_the_options_of_invoke_resume_and_runs_are_strict(self):
        status, out, err = self.pipe('invoke("nope", {}, {wiat = true})\n'
                                     'resume("01ABC", {stpe = true})\n'
                                     'runs{skil = "x"}\n')
        self.assertEqual(status, 1, err)
        lines = err.splitlines()
        self.assertIn("invoke: unknown option 'wiat' (did you mean 'wait'?)", lines[0])
        self.assertIn("resume: unknown option 'stpe' (did you mean 'step'?)", lines[1])
        self.assertIn("runs: unknown option 'skil' (did you mean 'skill'?)", lines[2])

    def test_http_works_at_the_top_level(self):
        self.si.routes["/v"] = (200, {"value": [1, 2]})
        status, out, err = self.pipe('http.get_json(env.STANDIN .. "/v")\n')
        self.assertEqual(status, 0, err)
        self.assertEqual(out, "{ value = { 1, 2 } }\n")
        self.assertEqual(self.si.count("/v"), 1)
        # Not from a coroutine of one's own: only the REPL's can wait for the engine.
        status, out, err = self.pipe('coroutine.wrap(function() http.get(env.STANDIN) end)()\n')
        self.assertEqual(status, 1)
        self.assertIn("can only be called inside a run", err)

    def test_send_invoke_runs_and_trace_against_the_database(self):
        ws = os.path.join(self.w.path, "skills")
        os.makedirs(ws)
        self.w.write("skills/hello.lua", HELLO)
        status, out, err = self.pipe(
            'ev = send("order.created", {id = 7})\n'
            'queued = invoke("hello", {who = "q"})\n'
            'out, id = invoke("hello", {who = "w"}, {wait = true})\n'
            'print(out.greeting)\n'
            'print(#runs{skill = "hello"}, runs{status = "queued"}[1].id == queued)\n'
            'print(trace(id).steps[1].output.text)\n'
            'runs{skill = "hello"}\n', timeout=60)
        self.assertEqual(status, 0, err)
        self.assertIn("workspace skills: 1 skill registered", err)
        self.assertEqual(out.splitlines()[:3], ["hello w", "2\ttrue", "hello w"])
        self.assertIn("RUN", out.splitlines()[3])  # the table `moonloop runs` prints
        ev = self.w.ml("runs", "--json", check=0)
        self.assertEqual(len(json.loads(ev.stdout)), 2)

    def test_a_scope_the_registry_refuses_is_said_not_counted(self):
        # Two workspace files give one concurrency scope two limits: the
        # registry (the store, as it judges for every engine) keeps the
        # first and refuses the second; the REPL says so.
        self.w.write("skills/a.lua", 'return { id = "a", concurrency = { limit = 2, scope = "api" },'
                     ' run = function(ctx) return 1 end }')
        self.w.write("skills/b.lua", 'return { id = "b", concurrency = { limit = 3, scope = "api" },'
                     ' run = function(ctx) return 2 end }')
        status, out, err = self.pipe('print(#runs{})\n', timeout=60)
        self.assertEqual(status, 0, err)
        self.assertIn("workspace skills: 1 skill registered", err)
        self.assertRegex(err, r"moonloop: .*scope 'api'")
        skills = {s["id"]: s for s in json.loads(self.w.ml("skills", "--json", check=0).stdout)}
        self.assertTrue(skills["a"]["version"])
        self.assertIn("concurrency scope 'api' has limit 3 here, but skill 'a' gives it limit 2",
                      skills["b"]["error"]["message"])

    def test_a_draft_workspace_does_not_take_a_live_skill_from_its_file(self):
        # An agent keeps drafts in drafts/ (docs/agents.md) and opens the
        # REPL on them to try one: the draft of a live skill must not
        # become the live version (serve would then refuse the real file,
        # also after a restart). The REPL refuses it as serve would, says
        # how to try it, and runs it from its file without registering it.
        self.w.write("skills/hello.lua", 'return { id = "hello", run = function(ctx) return "live" end }')
        self.w.write("drafts/hello_draft.lua", 'return { id = "hello", run = function(ctx) return "draft" end }')
        status, out, err = self.pipe('print(#runs{})\n')  # registers skills/ (the default)
        self.assertEqual(status, 0, err)

        def live():
            return {s["id"]: s for s in json.loads(self.w.ml("skills", "--json", check=0).stdout)}["hello"]
        self.assertEqual(live()["file"], "skills/hello.lua")
        version = live()["version"]
        r = subprocess.run([BIN, "repl", "--workspace", "drafts"], cwd=self.w.path, env=self.w.env,
                           input='print((run("drafts/hello_draft.lua")))\n', capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("workspace drafts: 0 skills registered", r.stderr)
        self.assertIn("drafts/hello_draft.lua: skill id 'hello' is already defined by skills/hello.lua",
                      r.stderr)
        self.assertIn('run("drafts/hello_draft.lua")', r.stderr)
        self.assertIn("draft", r.stdout)  # tried from its file
        self.assertEqual((live()["file"], live()["version"]), ("skills/hello.lua", version))
        # The same workspace under another spelling is the same files.
        r = subprocess.run([BIN, "repl", "--workspace", "./skills"], cwd=self.w.path, env=self.w.env,
                           input='print(1)\n', capture_output=True, text=True, timeout=60)
        self.assertIn("workspace ./skills: 1 skill registered", r.stderr)
        self.assertEqual(live()["version"], version)

    def wait_listening(self, serve):
        line = ""
        while "listening on" not in line:
            line = serve.stderr.readline()
            self.assertTrue(line or serve.poll() is None, "serve exited")

    def test_the_lease_stays_renewed_while_input_is_slow(self):
        # Leases of 1s, and a serve that reaps expired ones: a REPL that did
        # not renew its lease while it waits for input (at the prompt, at a
        # step's question) would lose its run to the serve and have its
        # next commit refused.
        self.w.write("moonloop.conf.lua", 'return { lease = "1s", env = {"STANDIN"} }\n')
        self.w.write("steps.lua", STEPS)
        self.wait_listening(self.w.start("serve"))
        p = subprocess.Popen([BIN, "repl"], cwd=self.w.path, env=self.w.env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            for line, pause in (('out = step_through("steps.lua")', 2.5), ("", 0), ("", 2.5),
                                ("", 0), ("print(out.c)", 2.5), ('print(run("steps.lua").c)', 0)):
                p.stdin.write(line + "\n")
                p.stdin.flush()
                time.sleep(pause)
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out, "20\n20\n")
        self.assertNotIn("lease", err)

    def test_invoke_wait_waits_for_the_engine_that_runs_it(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/hello.lua", HELLO)
        self.wait_listening(self.w.start("serve"))
        status, out, err = self.pipe('out, id = invoke("hello", {who = "s"}, {wait = true})\n'
                                     'print(out.greeting)\n')
        self.assertEqual(status, 0, err)
        self.assertEqual(out, "hello s\n")
        self.assertIn("waiting for the engine running it", err)
        self.assertEqual(self.w.runs()[0]["status"], "completed")

    def test_bad_input_gets_a_clear_error(self):
        status, out, err = self.pipe('run(42)\nrun("hello.lua", {f = print})\nskill("nope")\n'
                                     'runs{status = "done"}\ntrace("not-an-id")\n')
        self.assertEqual(status, 1)
        self.assertIn("run: expected a skill", err)
        self.assertIn("no skill 'nope'", err)
        self.assertIn("status must be one of", err)
        self.assertIn("trace: expected a run id", err)
        self.w.write("hello.lua", HELLO)
        status, out, err = self.pipe('run("hello.lua", {f = print})\n')
        self.assertIn("data is not a JSON value", err)
        # Positions are the typed code's, never the REPL's own Lua file.
        status, out, err = self.pipe('coroutine.wrap(function() run("hello.lua") end)()\n')
        self.assertIn("stdin:1: run can only be called at the REPL's top level", err)
        self.assertNotIn("moonloop/", err)


def doc_blocks(text):
    return [(m.group(1), m.group(2))
            for m in re.finditer(r"^```(lua|repl|sh)\n(.*?)^```", text, re.S | re.M)]


def session(body):
    """(typed lines, expected output lines) of a ```repl block."""
    typed, expected = [], []
    for line in body.splitlines():
        for prompt in ("> ", ">> ", "step> ", "value> "):
            if line.startswith(prompt) or line == prompt.rstrip():
                typed.append(line[len(prompt):])
                break
        else:
            expected.append(line)
    return typed, expected


NORMALIZE = [
    (re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b"), "RUNID"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "HEX"),
    (re.compile(r"just now"), "0s ago"),
    (re.compile(r"\b(\d+(\.\d+)?(ms|s|m|h|d))+\b"), "DUR"),
]


def normalize(line):
    for rx, to in NORMALIZE:
        line = rx.sub(to, line)
    return " ".join(line.split())


class DocTest(ReplCase):
    def test_docs_repl_md_examples_run_as_written(self):
        with open(DOC) as f:
            blocks = doc_blocks(f.read())
        sessions = 0
        for kind, body in blocks:
            if kind == "lua":
                first = body.splitlines()[0]
                m = re.match(r"^-- (\S+\.lua)$", first)
                self.assertTrue(m, "a lua block must start with -- NAME.lua: %r" % first)
                self.w.write(m.group(1), body)
        for kind, body in blocks:
            if kind == "repl":
                sessions += 1
                typed, expected = session(body)
                r = subprocess.run([BIN, "repl"], cwd=self.w.path, env=self.w.env,
                                   input="\n".join(typed) + "\n", stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=60)
                if not lines_match(expected, r.stdout.splitlines(), normalize):
                    self.fail("docs/repl.md session %d:\n%s\ngave:\n%s" % (sessions, body, r.stdout))
            elif kind == "sh":
                for line in body.splitlines():
                    if line.startswith("moonloop repl ["):
                        continue  # the synopsis
                    cmd = line.replace("moonloop", BIN, 1) if line.startswith("moonloop") else \
                        line.replace("| moonloop", "| " + BIN)
                    r = subprocess.run(["bash", "-c", cmd], cwd=self.w.path, env=self.w.env,
                                       capture_output=True, text=True, timeout=60)
                    self.assertEqual(r.returncode, 0, "%s:\n%s%s" % (line, r.stdout, r.stderr))
        self.assertGreaterEqual(sessions, 5)
