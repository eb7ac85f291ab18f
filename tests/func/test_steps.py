"""The step API: retries with backoff, fatal, on_failure, timeouts, sleeps, replay checks."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, kill9, ms, wait_until  # noqa: E402


class StepsTest(TestCase):
    def test_retries_with_exponential_backoff_then_success(self):
        self.si.routes["/flaky"] = lambda h, b, n: (500, "boom %d" % n) if n <= 3 else (200, {"n": n})
        self.w.write("flaky.lua", """
return { backoff = "100ms", run = function(ctx)
  return ctx.step.run("flaky", function() return http.get_json(env.STANDIN .. "/flaky") end)
end }""")
        r = self.w.ml("run", "flaky.lua", check=0)
        self.assertEqual(json.loads(r.stdout), {"n": 4})
        steps = self.w.trace(self.run_id_of(r))["steps"]
        atts = steps[0]["attempts"]
        self.assertEqual([a["status"] for a in atts], ["failed", "failed", "failed", "completed"])
        self.assertIn("returned 500: boom 1", atts[0]["error"])
        self.assertIn("traceback", atts[0])
        # Backoff n waits between base*2^(n-1)/2 and base*2^(n-1) (equal jitter).
        for n, a in enumerate(atts[:3], start=1):
            wait = ms(a["retry_at"]) - ms(a["ended_at"])
            self.assertGreaterEqual(wait, 100 * 2 ** (n - 1) / 2 - 2, a)
            self.assertLessEqual(wait, 100 * 2 ** (n - 1) + 2, a)

    def test_default_is_three_retries_then_the_run_fails(self):
        self.si.routes["/down"] = (503, "down")
        self.w.write("down.lua", """
return { backoff = "10ms", run = function(ctx)
  return ctx.step.run("down", function() return http.get(env.STANDIN .. "/down") end)
end }""")
        r = self.w.ml("run", "down.lua", check=1)
        self.assertIn("after 4 attempts", r.stderr)
        self.assertEqual(self.si.count("/down"), 4)

    def test_per_step_retries_override_and_fatal_skips_retries(self):
        self.w.write("f.lua", """
return { retries = 5, backoff = "10ms", run = function(ctx)
  local ok = pcall(ctx.step.run, "once", function() error("nope") end, { retries = 0 })
  local n = 0
  local ok2, e = pcall(ctx.step.run, "fatal", function() n = n + 1; error(fatal("bad input")) end)
  return { ok = ok, ok2 = ok2, msg = tostring(e), n = n }
end }""")
        r = self.w.ml("run", "f.lua", check=0)
        out = json.loads(r.stdout)
        self.assertEqual(out["ok"], False)
        self.assertEqual(out["ok2"], False)
        self.assertEqual(out["n"], 1)
        self.assertIn("bad input", out["msg"])
        steps = self.w.trace(self.run_id_of(r))["steps"]
        self.assertEqual(len(steps[0]["attempts"]), 1)
        self.assertEqual(len(steps[1]["attempts"]), 1)

    def test_error_values_read_like_their_message(self):
        # A caught step error (and a fatal() value) is a table: tostring,
        # .message and `..` on either side all give its message.
        self.w.write("c.lua", """
return { retries = 0, run = function(ctx)
  local _, e = pcall(ctx.step.run, "x", function() error("boom", 0) end)
  local _, f = pcall(ctx.step.run, "y", function() error(fatal("bad")) end)
  local caught
  ctx.step.run("z", function() local _, v = pcall(error, fatal("inner")) caught = "got " .. v end)
  local ok, bad = pcall(function() return e .. {} end)
  return { left = "failed: " .. e, right = e .. "!", num = 1 .. f, both = e .. " / " .. f,
    msg = e.message, str = tostring(e), caught = caught, ok = ok, bad = bad }
end }""")
        r = self.w.ml("run", "c.lua", check=0)
        out = json.loads(r.stdout)
        self.assertEqual(out["left"], "failed: step 'x' failed: boom")
        self.assertEqual(out["right"], "step 'x' failed: boom!")
        self.assertEqual(out["num"], "1step 'y' failed: bad")
        self.assertEqual(out["both"], "step 'x' failed: boom / step 'y' failed: bad")
        self.assertEqual(out["msg"], "step 'x' failed: boom")
        self.assertEqual(out["str"], "step 'x' failed: boom")
        self.assertEqual(out["caught"], "got inner")
        # Only strings, numbers and error values join: a plain table fails as in Lua.
        self.assertFalse(out["ok"])
        self.assertIn("attempt to concatenate a table value", out["bad"])

    def test_a_table_raised_as_an_error_reads_as_its_value_never_its_address(self):
        self.w.write("t.lua", """
return { retries = 0, run = function(ctx)
  local _, a = pcall(ctx.step.run, "x", function() error({ code = 1 }) end)
  local _, b = pcall(ctx.step.run, "y", function() error(nil) end)
  local _, c = pcall(ctx.step.run, "z", function() local t = {} t.t = t error(t) end)
  return { tostring(a), tostring(b), tostring(c) }
end }""")
        out = json.loads(self.w.ml("run", "t.lua", check=0).stdout)
        self.assertEqual(out, ["step 'x' failed: {\"code\":1}", "step 'y' failed: nil",
                               "step 'z' failed: a table that is not JSON (error() with a string shows its message)"])
        # Outside a step: the run and its replay fail alike, so the test's
        # replay check (which compares them) finds nothing to report.
        self.w.write("u.lua", """
return { run = function(ctx)
  ctx.step.run("a", function() return 1 end)
  error({ 1, 2 })
end }""")
        self.w.write("u_test.lua", """local t = test.skill("u.lua")
t:case("fails alike", function(c)
  c:run({})
  c:eq(c:status(), "failed")
end)
return t
""")
        r = self.w.ml("run", "u.lua", check=1)
        self.assertIn("failed: [1,2]", r.stderr)
        r = self.w.ml("test", "u_test.lua", check=0)
        self.assertEqual(r.stdout.splitlines()[-1], "1 passed, 0 failed", r.stdout)

    def test_on_failure_runs_as_its_own_durable_run(self):
        self.w.write("t.lua", """
return { id = "triage", retries = 1, backoff = "10ms",
  on_failure = function(ctx, err)
    ctx.step.run("notify", function()
      return http.post_json(env.STANDIN .. "/ops", { text = "triage failed: " .. err.message,
        again = "triage failed: " .. err, str = tostring(err), service = ctx.input.service })
    end)
  end,
  run = function(ctx)
    ctx.step.run("fetch", function() error("metrics api down") end)
  end }""")
        r = self.w.ml("run", "t.lua", "--data", '{"service":"api"}', check=1)
        failed = self.run_id_of(r)
        wait_until(lambda: self.si.count("/ops") == 1, what="the on_failure notification")
        body = json.loads(self.si.bodies["/ops"][0])
        self.assertIn("metrics api down", body["text"])
        # err reads as its message, in a concatenation too.
        self.assertEqual(body["again"], body["text"])
        self.assertEqual(body["str"], body["text"][len("triage failed: "):])
        self.assertEqual(body["service"], "api")
        runs = self.w.runs()
        self.assertEqual(len(runs), 2)
        handler = [x for x in runs if x["id"] != failed][0]
        self.assertEqual(handler["trigger"]["kind"], "on_failure")
        self.assertEqual(handler["trigger"]["run_id"], failed)
        self.assertEqual(handler["status"], "completed")
        self.assertEqual(handler["skill"], "triage")

    def test_run_timeout_fails_the_run(self):
        self.w.write("slow.lua", """
return { timeout = "300ms", run = function(ctx)
  ctx.step.sleep("long", "5s")
  return "never"
end }""")
        t0 = time.time()
        r = self.w.ml("run", "slow.lua", check=1)
        self.assertLess(time.time() - t0, 4)
        self.assertIn("timed out after 300ms", r.stderr)
        self.assertEqual(self.w.trace(self.run_id_of(r))["status"], "failed")

    def test_step_timeout_cancels_the_request_and_retries(self):
        def slow(h, b, n):
            if n == 1:
                time.sleep(1.5)
            return 200, {"n": n}
        self.si.routes["/slow"] = slow
        self.w.write("st.lua", """
return { backoff = "10ms", run = function(ctx)
  return ctx.step.run("slow", function() return http.get_json(env.STANDIN .. "/slow") end,
    { timeout = "200ms" })
end }""")
        r = self.w.ml("run", "st.lua", check=0)
        self.assertEqual(json.loads(r.stdout), {"n": 2})
        atts = self.w.trace(self.run_id_of(r))["steps"][0]["attempts"]
        self.assertIn("timed out after 200ms", atts[0]["error"])

    def test_durable_sleep_and_sleep_until(self):
        self.w.write("z.lua", """
return { run = function(ctx)
  local t0 = ctx.step.run("t0", function() return time.now() end)
  ctx.step.sleep("nap", "600ms")
  ctx.step.sleep_until("until", t0 + 0.9)
  local t1 = ctx.step.run("t1", function() return time.now() end)
  return t1 - t0
end }""")
        r = self.w.ml("run", "z.lua", check=0)
        self.assertGreaterEqual(float(r.stdout), 0.9)
        steps = self.w.trace(self.run_id_of(r))["steps"]
        self.assertEqual([s["kind"] for s in steps], ["run", "sleep", "sleep", "run"])
        self.assertEqual(steps[1]["status"], "completed")

    def test_a_sleep_of_math_huge_parks_its_run_and_stops_no_other_timer(self):
        # math.huge is how one writes "until cancelled". Converted as C does
        # a double out of range, it was -2^63: that run's wake time broke the
        # engine's sums, and no other sleep, retry or timeout fired again
        # (not after a restart either). It means "never" now: 9999-12-31.
        self.w.write("skills/forever.lua", """
return { id = "forever", timeout = math.huge, run = function(ctx)
  ctx.step.sleep_until("until", 1e300)
end }""")
        self.w.write("skills/waits.lua", """
return { id = "waits", run = function(ctx)
  return ctx.step.wait_for_event("w", { event = "never", timeout = math.huge })
end }""")
        self.w.write("skills/nap.lua", """
return { id = "nap", backoff = math.huge, retries = 1, run = function(ctx)
  ctx.step.sleep("nap", 1)
  return "woke"
end }""")
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        try:
            forever = self.w.ml("invoke", "forever", check=0).stdout.strip()
            waits = self.w.ml("invoke", "waits", check=0).stdout.strip()
            wait_until(lambda: self.w.trace(forever)["status"] == "sleeping", what="the long sleep")
            r = self.w.ml("invoke", "nap", "--wait", check=0, timeout=30)
            self.assertEqual(json.loads(r.stdout.splitlines()[-1]), "woke")
            t = self.w.trace(forever)
            self.assertEqual(t["steps"][0]["wake_at"], "9999-12-31T23:59:59.999Z")
            self.assertEqual(self.w.trace(waits)["status"], "waiting")
        finally:
            p.terminate()
            p.wait(timeout=30)

    def test_parallel_results_too_large_together_name_the_limit(self):
        # Each branch's 100 kB is within the step output limit (1 MB); the
        # twenty together are not: the step failed with "internal error: op
        # COMMIT: argument 4 (output) is nil".
        self.w.write("par.lua", """
return { retries = 0, run = function(ctx)
  local fns = {}
  for i = 1, 20 do fns[i] = function() return string.rep("x", 100000) end end
  return #ctx.step.parallel("p", fns)
end }""")
        r = self.w.ml("run", "par.lua", check=1)
        self.assertIn("step 'p' failed: the results of its branches are not a JSON value: JSON text is", r.stderr)
        self.assertIn("limits.step_output", r.stderr)
        self.assertNotIn("internal error", r.stderr)

    def test_interrupted_sleep_ends_on_its_original_schedule(self):
        self.w.write("z.lua", """
return { run = function(ctx)
  local t0 = ctx.step.run("t0", function() return time.now() end)
  ctx.step.sleep("nap", "2s")
  return ctx.step.run("t1", function() return time.now() end) - t0
end }""")
        p = self.w.start("run", "z.lua")
        wait_until(lambda: self.w.runs() and self.w.runs()[0]["status"] == "sleeping", what="sleep")
        time.sleep(0.5)
        kill9(p)
        run_id = self.w.runs()[0]["id"]
        r = self.w.ml("run", "--resume", run_id, check=0)
        took = float(r.stdout)
        self.assertGreaterEqual(took, 2.0)
        self.assertLess(took, 2.0 + 1.5)  # not 2 s after the restart

    def test_replay_mismatch_fails_with_a_message_naming_both_steps(self):
        self.si.routes["/hang"] = lambda h, b, n: (time.sleep(5), (200, {}))[1]
        self.w.write("moonloop.conf.lua", 'return { env = { "STANDIN", "MODE" } }')
        self.w.write("nd.lua", """
return { run = function(ctx)
  ctx.step.run("mode-" .. env.MODE, function() return env.MODE end)
  ctx.step.run("hang", function() return http.get_json(env.STANDIN .. "/hang") end)
end }""")
        self.w.env["MODE"] = "a"
        p = self.w.start("run", "nd.lua")
        wait_until(lambda: self.si.count("/hang") == 1, what="the second step")
        kill9(p)
        self.w.env["MODE"] = "b"
        run_id = self.w.runs()[0]["id"]
        r = self.w.ml("run", "--resume", run_id, check=1)
        self.assertIn("step 1 is 'mode-a' (run) in the journal, but the code reached 'mode-b' (run)",
                      r.stderr)

    def test_nested_steps_are_refused(self):
        self.w.write("n.lua", """
return { run = function(ctx)
  ctx.step.run("outer", function() ctx.step.run("inner", function() end) end, { retries = 0 })
end }""")
        r = self.w.ml("run", "n.lua", check=1)
        self.assertIn("steps cannot be nested", r.stderr)

    def test_a_step_in_a_callback_of_a_c_function_is_refused_before_its_body_runs(self):
        # Lua cannot yield across string.gsub or table.sort: the step is
        # refused at the skill's line, its body never run, for every kind.
        cases = {
            "gsub": 'local s = ("ab"):gsub("a", function()\n'
                    '    local v = ctx.step.run("g", function() log.info("BODY RAN") return "z" end)\n'
                    '    return v\n  end)',
            "sort": 'table.sort({ 3, 1, 2 }, function(a, b)\n'
                    '    ctx.step.sleep("s", 0)\n    return a < b\n  end)',
            "http": 'ctx.step.run("b", function()\n'
                    '    ("x"):gsub("x", function() http.get("http://127.0.0.1:1/") end)\n  end)',
        }
        want = {
            "gsub": "gsub.lua:4: step.run cannot be called",
            "sort": "sort.lua:4: step.sleep cannot be called",
            "http": "step 'b' failed: http.lua:4: http.get cannot be called",
        }
        for name, body in cases.items():
            self.w.write(name + ".lua", "return { retries = 0, run = function(ctx)\n"
                         "  local x = 1\n  %s\n  return 1\nend }\n" % body)
            r = self.w.ml("run", name + ".lua", check=1)
            self.assertIn(want[name] + " from inside a callback of a C function (string.gsub, table.sort, "
                          "...): call it from the ", r.stderr)
            self.assertNotIn("moonloop/", r.stderr)
            self.assertNotIn("BODY RAN", r.stdout + r.stderr)

    def test_unknown_step_options_are_errors_naming_them(self):
        # A typo such as retires = 0 must not silently keep the default retries.
        self.w.write("o.lua", """
return { run = function(ctx)
  local ok, e = pcall(ctx.step.run, "x", function() return 1 end, { retires = 0 })
  local ok2, e2 = pcall(ctx.step.parallel, "p", { function() return 1 end }, { timout = "1s" })
  return { tostring(e), tostring(e2) }
end }""")
        out = json.loads(self.w.ml("run", "o.lua", check=0).stdout)
        self.assertIn("step.run: unknown option 'retires' (did you mean 'retries'?)", out[0])
        self.assertIn("step.parallel: unknown option 'timout' (did you mean 'timeout'?)", out[1])

    def test_a_nested_step_fails_at_once_without_retries(self):
        # A code error, like fatal(): retrying the body would repeat it. The
        # check comes before the call's own argument checks (a bad duration).
        self.w.write("n.lua", """
return { retries = 3, backoff = "10ms", run = function(ctx)
  local n, m = 0, 0
  local ok, e = pcall(ctx.step.run, "outer", function()
    n = n + 1
    local x = ctx.step.run("inner", function() end)
  end)
  local ok2, e2 = pcall(ctx.step.parallel, "par", { function()
    m = m + 1
    local x = ctx.step.sleep("nap", {})
  end })
  return { n = n, m = m, e = tostring(e), e2 = tostring(e2) }
end }""")
        r = self.w.ml("run", "n.lua", check=0)
        out = json.loads(r.stdout)
        self.assertEqual(out["n"], 1)
        self.assertEqual(out["m"], 1)
        self.assertEqual(out["e"], "step 'outer' failed: n.lua:6: steps cannot be nested: "
                         "step.run('inner') was called inside the body of step 'outer'")
        self.assertEqual(out["e2"], "step 'par' failed: step 'par/1' failed: n.lua:10: steps cannot be nested: "
                         "step.sleep('nap') was called inside the body of step 'par/1'")
        steps = self.w.trace(self.run_id_of(r))["steps"]
        self.assertEqual([len(s["attempts"]) for s in steps if s["id"] in ("outer", "par/1")], [1, 1])

    def test_time_now_outside_steps_is_stable_across_replay(self):
        self.si.routes["/hang"] = lambda h, b, n: (time.sleep(5 if n == 1 else 0), (200, {"n": n}))[1]
        self.w.write("tn.lua", """
return { run = function(ctx)
  ctx.step.run("a", function() return 1 end)
  local t = time.now()
  ctx.step.run("hang", function() return http.get_json(env.STANDIN .. "/hang") end)
  return ctx.step.run("t", function() return t end) == t and t or "changed"
end }""")
        p = self.w.start("run", "tn.lua")
        wait_until(lambda: self.si.count("/hang") == 1, what="the hanging step")
        time.sleep(0.3)
        kill9(p)
        run_id = self.w.runs()[0]["id"]
        r = self.w.ml("run", "--resume", run_id, check=0)
        t = json.loads(r.stdout)
        steps = self.w.trace(run_id)["steps"]
        self.assertAlmostEqual(t * 1000, ms(steps[0]["ended_at"]), delta=2)


class TimerReuseTest(TestCase):
    def test_a_retry_after_a_sleep_does_not_end_the_sleep_again(self):
        self.si.routes["/once"] = lambda h, b, n: (500, "no") if n == 1 else (200, {"n": n})
        self.w.write("s.lua", """
return { backoff = "50ms", run = function(ctx)
  ctx.step.sleep("nap", "200ms")
  local n = ctx.step.run("flaky", function() return http.get_json(env.STANDIN .. "/once").n end)
  local m = ctx.step.run("after", function() return 7 end)
  return { n = n, m = m }
end }""")
        r = self.w.ml("run", "s.lua", check=0)
        self.assertEqual(json.loads(r.stdout), {"n": 2, "m": 7})
        steps = self.w.trace(self.run_id_of(r))["steps"]
        self.assertEqual([s["id"] for s in steps], ["nap", "flaky", "after"])
        self.assertEqual([s["status"] for s in steps], ["completed"] * 3)
        # The sleep ended once, before the next step began (the retry's backoff
        # timer must not end it again).
        self.assertLessEqual(ms(steps[0]["ended_at"]), ms(steps[1]["started_at"]))
