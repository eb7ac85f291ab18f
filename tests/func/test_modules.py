"""The runs and skills modules: run history for review loops, and the registry."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, wait_until  # noqa: E402


class ModulesTest(TestCase):
    def test_runs_list_and_get_for_a_review(self):
        self.w.write("work.lua", """
return { id = "work", retries = 0, run = function(ctx)
  ctx.step.run("do", function() if ctx.input.fail then error("bad day") end return 1 end)
  return "done"
end }""")
        for fail in (False, False, True):
            self.w.ml("run", "work.lua", "--data", json.dumps({"fail": fail}), check=1 if fail else 0)
        self.w.write("review.lua", """
return { id = "review", run = function(ctx)
  return ctx.step.run("stats", function()
    local all = runs.list{ skill = "work", since = "7d", limit = 50 }
    local failed = runs.list{ skill = "work", status = "failed" }
    local one = runs.get(failed[1].id)
    local none = runs.list{ skill = "work", since = "1970-01-01T00:00:00Z", ["until"] = 1 }
    return { total = #all, failed = #failed, rate = (#all - #failed) / #all,
             failed_step = one.steps[1].id, error = one.error.message, old = #none }
  end)
end }""")
        out = json.loads(self.w.ml("run", "review.lua", check=0).stdout)
        self.assertEqual(out["total"], 3)
        self.assertEqual(out["failed"], 1)
        self.assertAlmostEqual(out["rate"], 2 / 3)
        self.assertEqual(out["failed_step"], "do")
        self.assertIn("bad day", out["error"])
        self.assertEqual(out["old"], 0)

    def test_runs_list_is_strict(self):
        # A misspelt key or value used to match every run (skil=) or none
        # (status="bogus"): now each is an error naming it.
        self.w.write("work.lua", 'return { id = "work", run = function(ctx) return 1 end }')
        self.w.ml("run", "work.lua", check=0)
        self.w.write("review.lua", """
return { id = "review", run = function(ctx)
  return ctx.step.run("q", function()
    local out = {}
    for i, f in ipairs({ {skil = "work"}, {status = "bogus"}, {status = "complete"},
        {trigger = "manual"}, {trigger = "invok"}, {skill = 5}, {[1] = "work"} }) do
      local ok, e = pcall(runs.list, f)
      out[i] = ok and "ok" or tostring(e)
    end
    local all = runs.list{ skill = "work", status = "completed", trigger = "invoke", since = "1d",
      ["until"] = 4102444800, limit = 5 }
    out[#out + 1] = #all
    return out
  end)
end }""")
        out = json.loads(self.w.ml("run", "review.lua", check=0).stdout)
        keys = "; the keys are skill, status, trigger, parent, since, until and limit"
        statuses = "queued, running, sleeping, waiting, completed, failed, cancelled, skipped"
        kinds = "event, cron, invoke, rerun, on_failure"
        self.assertEqual(out, [
            "review.lua:7: runs.list: unknown key 'skil' (did you mean 'skill'?)" + keys,
            "review.lua:7: runs.list: status must be one of %s; got 'bogus'" % statuses,
            "review.lua:7: runs.list: status must be one of %s; got 'complete' (did you mean 'completed'?)" % statuses,
            "review.lua:7: runs.list: trigger must be one of %s; got 'manual'" % kinds,
            "review.lua:7: runs.list: trigger must be one of %s; got 'invok' (did you mean 'invoke'?)" % kinds,
            "review.lua:7: runs.list: skill must be a string, got number",
            "review.lua:7: runs.list: unknown key 1" + keys,
            1,
        ])

    def test_skills_check_get_and_deploy_rules(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("moonloop.conf.lua", 'return { deployers = { "updater" } }')
        self.w.write("skills/target.lua", 'return { id = "target", run = function() return 1 end }')
        p = self.w.serve("--workspace", "skills")
        p.terminate()
        p.wait(timeout=10)
        body = """
return { id = "%s", run = function(ctx)
  return ctx.step.run("deploy", function()
    local cur = skills.get("target")
    local bad = skills.check("return { id = 'target', retires = 1, run = function() end }")
    local good = skills.check(cur.source:gsub("return 1", "return 2"))
    local ok, err = pcall(skills.deploy, "target", cur.source:gsub("return 1", "return 2"))
    return { source = cur.source, bad = bad, good = good, ok = ok, err = err and tostring(err) }
  end)
end }"""
        self.w.write("updater.lua", body % "updater")
        self.w.write("intruder.lua", body % "intruder")
        out = json.loads(self.w.ml("run", "updater.lua", check=0).stdout)
        self.assertIn("return 1", out["source"])
        self.assertFalse(out["bad"]["ok"])
        self.assertIn("did you mean 'retries'", out["bad"]["error"])
        self.assertEqual(out["good"], {"ok": True, "id": "target"})
        self.assertTrue(out["ok"], out["err"])
        with open(os.path.join(self.w.path, "skills", "target.lua")) as f:
            self.assertIn("return 2", f.read())  # written where the sidecar watches
        out = json.loads(self.w.ml("run", "intruder.lua", check=0).stdout)
        self.assertFalse(out["ok"])
        self.assertIn("skills.deploy: skill 'intruder' is not allowed to deploy: add it to `deployers` in the "
                      "configuration (deployers = { \"intruder\" } in moonloop.conf.lua)", out["err"])
        # Not caught: the step fails at once (retrying cannot give the
        # permission), where it used to be retried.
        self.w.write("intruder2.lua", """
return { id = "intruder2", retries = 3, run = function(ctx)
  return ctx.step.run("deploy", function() local r = skills.deploy("target", "return {}") return r end)
end }""")
        r = self.w.ml("run", "intruder2.lua", check=1)
        self.assertIn("intruder2.lua:3: skills.deploy: skill 'intruder2' is not allowed to deploy", r.stderr)
        step = self.w.trace(self.run_id_of(r))["steps"][0]
        self.assertEqual(len(step["attempts"]), 1)

    def test_a_deploy_the_engine_would_refuse_fails_and_writes_nothing(self):
        # skills.deploy returned {file, version} for a source the engine then
        # refused (a concurrency scope with another limit in another live
        # skill): an agent believed it deployed. It now asks the registry
        # first, as a PUT does (409), and fails saying why.
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("moonloop.conf.lua", 'return { deployers = { "updater" } }')
        self.w.write("skills/one.lua", 'return { id = "one", concurrency = { limit = 2, scope = "api" },'
                     ' run = function() return 1 end }')
        self.w.write("skills/two.lua", 'return { id = "two", run = function() return 1 end }')
        p = self.w.serve("--workspace", "skills")
        p.terminate()
        p.wait(timeout=10)
        self.w.write("updater.lua", """
return { id = "updater", run = function(ctx)
  return ctx.step.run("deploy", function()
    local src = "return { id = 'two', concurrency = { limit = %d, scope = 'api' }, run = function() return 2 end }"
    local ok, err = pcall(skills.deploy, "two", src:format(3))
    local fine = skills.deploy("two", src:format(2))
    return { ok = ok, err = err and tostring(err), fine = fine.file }
  end)
end }""")
        out = json.loads(self.w.ml("run", "updater.lua", check=0).stdout)
        self.assertFalse(out["ok"])
        self.assertIn("skills.deploy: the engine would refuse it: skills/two.lua: concurrency scope 'api' has "
                      "limit 3 here, but skill 'one' (skills/one.lua) gives it limit 2", out["err"])
        self.assertEqual(out["fine"], "skills/two.lua")  # the same limit: written
        with open(os.path.join(self.w.path, "skills", "two.lua")) as f:
            self.assertIn("limit = 2", f.read())

    def test_unknown_option_keys_are_errors_in_every_module_function(self):
        # Each call gets a table with one key the function does not take
        # (through pcall, where the static checks cannot see the literal):
        # http.request{ json = body } used to send an empty body.
        self.w.write("opts.lua", """
return { id = "opts", retries = 3, run = function(ctx)
  local out = ctx.step.run("calls", function()
    local u = env.STANDIN .. "/x"
    local out = {}
    for i, c in ipairs({
      { http.request, { url = u, jsn = 1 } },
      { http.request, { url = u, data = "x" } },
      { http.get, u, { header = {} } },
      { http.get_json, u, { timout = 1 } },
      { http.post_json, u, {}, { retries = 1 } },
      { llm.chat, { prompt = "x", max_token = 5 } },
      { runs.list, { skil = "x" } },
      { json.encode, {}, { indent = 2 } },
    }) do
      local ok, e = pcall(unpack(c))
      out[i] = ok and "ok" or tostring(e)
    end
    return out
  end)
  -- Not caught: the step fails at once, without its 3 retries.
  ctx.step.run("bad", function() local o = { url = env.STANDIN .. "/y", bdy = "x" } local r = http.request(o) return r end)
end }""")
        r = self.w.ml("run", "opts.lua", check=1)
        self.assertIn("step 'bad' failed: opts.lua:22: http.request: unknown key 'bdy' (did you mean 'body'?)",
                      r.stderr)
        trace = self.w.trace(self.run_id_of(r))
        out = trace["steps"][0]["output"]
        at = "opts.lua:16: "
        self.assertEqual(out, [
            at + "http.request: unknown key 'jsn' (did you mean 'json'?); the keys are method, url, headers, "
                 "body, json and timeout",
            at + "http.request: unknown key 'data' (did you mean 'json'?); the keys are method, url, headers, "
                 "body, json and timeout",
            at + "http.get: unknown option 'header' (did you mean 'headers'?); the options are headers and timeout",
            at + "http.get_json: unknown option 'timout' (did you mean 'timeout'?); the options are headers and "
                 "timeout",
            at + "http.post_json: unknown option 'retries'; the options are headers and timeout",
            at + "llm.chat: unknown key 'max_token' (did you mean 'max_tokens'?); the keys are prompt, messages, "
                 "system, model, json, temperature, max_tokens and timeout",
            at + "runs.list: unknown key 'skil' (did you mean 'skill'?); the keys are skill, status, trigger, "
                 "parent, since, until and limit",
            at + "json.encode: unknown option 'indent'; the options are pretty",
        ])
        self.assertEqual(len(trace["steps"][1]["attempts"]), 1)
        self.assertEqual(self.si.count("/x") + self.si.count("/y"), 0)  # nothing was sent

    def test_unknown_steps_and_ctx_fields_are_errors_that_name_the_fix(self):
        # Through a local the static checks do not follow: the runtime says it too.
        self.w.write("c.lua", """
return { id = "c", run = function(ctx)
  local k = "wait"
  local ok1, e1 = pcall(function() return ctx.step[k]("w", { event = "x" }) end)
  local f = "data"
  local ok2, e2 = pcall(function() return ctx[f] end)
  return { tostring(e1), tostring(e2) }
end }""")
        out = json.loads(self.w.ml("run", "c.lua", check=0).stdout)
        self.assertEqual(out, [
            "c.lua:4: ctx.step.wait is not a step: did you mean ctx.step.wait_for_event? (the steps are run, "
            "sleep, sleep_until, wait_for_event, invoke, send_event and parallel)",
            "c.lua:6: ctx.data is not a field of ctx: did you mean ctx.input? (the fields are input, event, "
            "run_id, skill, version, trigger, events, step, log, attempt and step_key)",
        ])


    def test_a_function_a_module_does_not_have_raises_with_did_you_mean(self):
        # Names built at run time (the static checks name literal ones):
        # reading the key raises at the skill's line, not a nil to call.
        self.w.write("m.lua", """
return { id = "m", retries = 3, run = function(ctx)
  local out = {}
  for i, c in ipairs({ { http, "post" }, { json, "parse" }, { runs, "find" }, { skills, "put" },
                       { log, "warning" }, { time, "time" }, { llm, "complete" }, { ctx.log, "debug" },
                       { env, "get" } }) do
    local ok, e = pcall(function() return c[1][c[2]] end)
    out[i] = ok and "no error" or tostring(e)
  end
  ctx.step.run("call", function() local f = "post" return http[f]("http://x", {}) end)
  return out
end }""")
        r = self.w.ml("run", "m.lua", check=1)
        self.assertIn("step 'call' failed: m.lua:10: http.post is not a function of the http module: did you "
                      "mean http.post_json? (its functions are request, get, get_json and post_json)", r.stderr)
        trace = self.w.trace(self.run_id_of(r))
        self.assertEqual(len(trace["steps"][0]["attempts"]), 1)  # not retried
        self.w.write("m2.lua", """
return { id = "m2", run = function(ctx)
  local out = {}
  for i, c in ipairs({ { http, "post" }, { json, "parse" }, { runs, "find" }, { skills, "put" },
                       { log, "warning" }, { time, "time" }, { llm, "complete" }, { ctx.log, "debug" },
                       { env, "get" } }) do
    local ok, e = pcall(function() return c[1][c[2]] end)
    out[i] = ok and "no error" or tostring(e)
  end
  -- Values and functions that exist read as before; so do the standard library's missing names.
  out[#out + 1] = tostring(json.null == json.decode("null")) .. " " .. type(http.get) .. " "
    .. tostring(table.nope) .. " " .. tostring(string.nope)
  return out
end }""")
        out = json.loads(self.w.ml("run", "m2.lua", check=0).stdout)
        at = "m2.lua:7: "
        self.assertEqual(out, [
            at + "http.post is not a function of the http module: did you mean http.post_json? (its functions "
                 "are request, get, get_json and post_json)",
            at + "json.parse is not a function of the json module: did you mean json.decode? (its functions are "
                 "encode, decode, array and object)",
            at + "runs.find is not a function of the runs module: did you mean runs.list? (its functions are "
                 "list, get, cancel and stats)",
            at + "skills.put is not a function of the skills module: did you mean skills.deploy? (its functions "
                 "are list, get, check and deploy)",
            at + "log.warning is not a function of the log module: did you mean log.warn? (its functions are "
                 "info, warn and error)",
            at + "time.time is not a function of the time module: did you mean time.now? (its functions are now, "
                 "parse and parse_duration)",
            at + "llm.complete is not a function of the llm module: did you mean llm.chat? (its functions are chat)",
            at + "log.debug is not a function of the log module: did you mean log.info? (its functions are info, "
                 "warn and error)",
            at + "env.get(...): env holds strings, not functions: it is the variables the configuration grants "
                 "(env = { \"NAME\" } in moonloop.conf.lua), read as env.NAME",
            "true function nil nil",
        ])


class RunsCancelTest(TestCase):
    def test_runs_cancel_for_the_skills_the_configuration_lets(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("moonloop.conf.lua", 'return { env = { "STANDIN" }, cancellers = { "janitor" } }')
        self.w.write("skills/waiter.lua", """
return { id = "waiter", triggers = { { event = "order.placed" } }, run = function(ctx)
  return ctx.step.wait_for_event("paid", { event = "order.paid", timeout = "1h" })
end }""")
        self.w.write("skills/janitor.lua", """
return { id = "janitor", run = function(ctx)
  return ctx.step.run("cancel", function()
    local first, e1 = runs.cancel(ctx.input.id, "order abandoned")
    local again, e2 = runs.cancel(ctx.input.id)
    local none, e3 = runs.cancel("01AAAAAAAAAAAAAAAAAAAAAAAA")
    local bad, e4 = runs.cancel("nope")
    local ok, e5 = pcall(runs.cancel, ctx.run_id)
    return { first = first, e1 = e1, e2 = e2, e3 = e3, e4 = e4, e5 = tostring(e5) }
  end)
end }""")
        self.w.write("skills/intruder.lua", """
return { id = "intruder", retries = 3, run = function(ctx)
  return ctx.step.run("cancel", function() local r = runs.cancel(ctx.input.id) return r end)
end }""")
        p = self.w.serve("--workspace", "skills")
        try:
            self.w.ml("send", "order.placed", "--data", '{"order": 7}', check=0)
            waiting = wait_until(lambda: self.w.runs(skill="waiter", status="waiting"), what="the waiting run")
            target = waiting[0]["id"]
            # Not in `cancellers`: the step fails at once, naming the key to add.
            r = self.w.ml("invoke", "intruder", "--data", json.dumps({"id": target}), "--wait", check=1)
            self.assertIn("intruder.lua:3: runs.cancel: skill 'intruder' is not allowed to cancel runs: add it "
                          "to `cancellers` in the configuration (cancellers = { \"intruder\" } in "
                          "moonloop.conf.lua)", r.stderr)
            intruder = self.w.runs(skill="intruder")[0]
            self.assertEqual(len(self.w.trace(intruder["id"])["steps"][0]["attempts"]), 1)
            self.assertEqual(self.w.runs(skill="waiter")[0]["status"], "waiting")
            # Listed: the run is cancelled as `moonloop cancel` does it.
            r = self.w.ml("invoke", "janitor", "--data", json.dumps({"id": target}), "--wait", check=0)
            out = json.loads(r.stdout)
            janitor = self.w.runs(skill="janitor")[0]["id"]
            self.assertEqual(out["first"], {"run_id": target, "status": "cancelled"})
            self.assertNotIn("e1", out)
            self.assertEqual(out["e2"], "run %s is already cancelled: nothing to cancel" % target)
            self.assertEqual(out["e3"], "no run with id '01AAAAAAAAAAAAAAAAAAAAAAAA'")
            self.assertEqual(out["e4"], "no run with id 'nope'")
            self.assertIn("runs.cancel: a run cannot cancel itself", out["e5"])
            run = self.w.trace(target)
            self.assertEqual(run["status"], "cancelled")
            self.assertIn("cancelled by run %s of skill janitor: order abandoned" % janitor,
                          run["error"]["message"])
        finally:
            p.terminate()
            p.wait(timeout=10)


GRANT = ('env.%s is not granted to this skill: add "%s" to env = {...} in moonloop.conf.lua (every skill), '
         'or to skill_env = { ["%s"] = { "%s" } } (this skill only)')


class EnvGrantTest(TestCase):
    """env.NAME of a variable the configuration does not grant is an error
    naming the key to add; a granted one that is not set reads nil."""
    config = {"skill_env": '{ ["crm-sync"] = { "CRM_TOKEN" } }'}
    env_names = ("STANDIN", "CRM_URL", "OPTIONAL_X")

    def setUp(self):
        super().setUp()
        self.w.env["CRM_URL"] = "http://crm.test"
        self.w.env["CRM_TOKEN"] = "s3cret"
        self.w.env.pop("OPTIONAL_X", None)

    def test_a_name_not_granted_raises_at_its_line_naming_the_key(self):
        # Names built at run time, where the static checks cannot see them.
        self.w.write("reader.lua", """
return { id = "reader", retries = 3, run = function(ctx)
  local function read(n) return env[n] end
  return ctx.step.run("read", function() return read("MISSING") end)
end }""")
        r = self.w.ml("run", "reader.lua", check=1)
        # Fatal: the step is not retried (a retry cannot grant it).
        self.assertIn("step 'read' failed: reader.lua:3: " + GRANT % ("MISSING", "MISSING", "reader", "MISSING"),
                      r.stderr)
        trace = self.w.trace(self.run_id_of(r))
        self.assertEqual(len(trace["steps"][0]["attempts"]), 1)
        self.w.write("reader2.lua", """
return { id = "reader2", run = function(ctx)
  local function read(n) return env[n] end
  local ok1, e1 = pcall(read, "CRM_" .. "TOKEN")   -- granted to crm-sync only
  local ok2, e2 = pcall(function() local g = "get" return env[g]("CRM_URL") end)
  local opt = read("OPTIONAL" .. "_X")              -- granted, not set
  return { e1 = tostring(e1), e2 = tostring(e2), opt = opt or "default", url = read("CRM" .. "_URL"),
           probe = (read("OPTIONAL_X") and "set" or "unset") }
end }""")
        out = json.loads(self.w.ml("run", "reader2.lua", check=0).stdout)
        self.assertEqual(out["e1"], "reader2.lua:3: " + GRANT % ("CRM_TOKEN", "CRM_TOKEN", "reader2", "CRM_TOKEN"))
        self.assertIn("reader2.lua:5: env.get(...): env holds strings, not functions", out["e2"])
        self.assertEqual(out["opt"], "default")
        self.assertEqual(out["probe"], "unset")
        self.assertEqual(out["url"], "http://crm.test")

    def test_a_skill_env_grant_reaches_its_skill_only(self):
        self.w.write("crm.lua", """
return { id = "crm-sync", run = function(ctx)
  return ctx.step.run("t", function() return env.CRM_URL .. "/" .. env.CRM_TOKEN end)
end }""")
        self.assertEqual(json.loads(self.w.ml("run", "crm.lua", check=0).stdout), "http://crm.test/s3cret")
        # Another skill reading it: refused by the static check, naming this skill's id.
        self.w.write("other.lua", """
return { id = "other", run = function(ctx)
  return ctx.step.run("t", function() return env.CRM_TOKEN end)
end }""")
        r = self.w.ml("check", "other.lua", check=1)
        self.assertEqual(r.stderr.strip(), "other.lua:3: " + GRANT % ("CRM_TOKEN", "CRM_TOKEN", "other", "CRM_TOKEN"))
        r = self.w.ml("run", "other.lua", check=1)
        self.assertIn("other.lua:3: env.CRM_TOKEN is not granted to this skill", r.stderr)
        # At the top level too, through a name the static check cannot see.
        self.w.write("top.lua", 'local n = "CRM_" .. "TOKEN"\nlocal t = env[n]\n'
                     'return { id = "top", run = function(ctx) return t end }\n')
        r = self.w.ml("check", "top.lua", check=1)
        self.assertEqual(r.stderr.strip(), "top.lua:2: " + GRANT % ("CRM_TOKEN", "CRM_TOKEN", "top", "CRM_TOKEN"))

    def test_a_granted_variable_that_is_not_set_reads_nil_and_its_nil_error_says_why(self):
        self.w.write("opt.lua", """
return { id = "opt", retries = 0, run = function(ctx)
  local base = env.OPTIONAL_X
  return ctx.step.run("call", function() return base .. "/x" end)
end }""")
        self.w.ml("check", "opt.lua", check=0)
        r = self.w.ml("run", "opt.lua", check=1)
        self.assertIn("opt.lua:4: attempt to concatenate upvalue 'base' (a nil value) (env.OPTIONAL_X is granted "
                      "to this skill but not set where the engine runs: set OPTIONAL_X in the engine's environment "
                      "and restart it, or test it with `if env.OPTIONAL_X then`)", r.stderr)

    def test_check_names_a_literal_name_not_granted_and_skills_check_says_nothing(self):
        src = ('return { id = "crm-sync", run = function(ctx)\n'
               '  return ctx.step.run("t", function()\n'
               '    return env.CRM_URL .. env.CRM_TOKEN .. (env.OPTIONAL_X or "") .. env.CRM_KEY\n'
               '  end)\nend }\n')
        self.w.write("s.lua", src)
        r = self.w.ml("check", "s.lua", check=1)
        self.assertEqual(r.stderr.strip(), "s.lua:3: " + GRANT % ("CRM_KEY", "CRM_KEY", "crm-sync", "CRM_KEY"))
        r = self.w.ml("check", "s.lua", "--json", check=1)
        self.assertEqual(json.loads(r.stdout)[0]["line"], 3)
        # skills.check from a skill: the configuration the source will run
        # with is not known there, so nothing is said about env.
        self.w.write("checker.lua", 'return { id = "checker", run = function(ctx)\n'
                     '  return ctx.step.run("c", function() return skills.check(%s, "s.lua") end)\nend }\n'
                     % json.dumps(src))
        out = json.loads(self.w.ml("run", "checker.lua", check=0).stdout)
        self.assertTrue(out["ok"], out)
        # The workspace watcher knows the configuration: it refuses the file.
        os.makedirs(os.path.join(self.w.path, "ws"))
        self.w.write("ws/s.lua", src)
        p = self.w.serve("--workspace", "ws")
        try:
            def rejected():
                skills = self.w.json("skills")
                return any((s.get("error") or {}).get("file") == "ws/s.lua" for s in skills) and skills
            skills = wait_until(rejected, what="the watcher to reject ws/s.lua")
            err = [s["error"] for s in skills if s.get("error")][0]
            self.assertEqual(err["message"], "ws/s.lua:3: " + GRANT % ("CRM_KEY", "CRM_KEY", "crm-sync", "CRM_KEY"))
        finally:
            p.terminate()
            p.wait(timeout=10)
