"""match on several fields: wait_for_event and cancel_on with a table of
path = value, a list of paths, or both; events that arrived before the wait
was registered; strict validation; and a kill -9 while a two-field wait is
pending."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import PG, SkillsTestCase, kill9, wait_until  # noqa: E402

APPROVAL = """
return { id = "approval",
  cancel_on = { { event = "deploy.aborted", match = { "data.service", "data.version" } },
                { event = "freeze", match = { ["data.all"] = true } } },
  run = function(ctx)
    ctx.step.sleep("settle", ctx.input.settle or 0)
    local ev = ctx.step.wait_for_event("ok", { event = "deploy.approved", timeout = "1h",
      match = { ["data.service"] = ctx.input.service, ["data.version"] = ctx.input.version } })
    return ev.data.by
  end }"""


class MatchTest(SkillsTestCase):
    def start(self, data):
        return self.w.ml("invoke", "approval", "--data", json.dumps(data), check=0).stdout.strip()

    def send(self, name, data):
        self.w.ml("send", name, "--data", json.dumps(data), check=0)

    def test_a_wait_takes_only_the_event_where_every_field_matches(self):
        self.skill("approval", APPROVAL)
        self.serve()
        rid = self.start({"service": "api", "version": "2"})
        wait_until(lambda: self.w.trace(rid)["status"] == "waiting", what="the wait")
        self.send("deploy.approved", {"service": "api", "version": "1", "by": "wrong version"})
        self.send("deploy.approved", {"service": "db", "version": "2", "by": "wrong service"})
        self.send("deploy.approved", {"service": "api", "version": 2, "by": "a number, not the string"})
        self.send("deploy.approved", {"service": "api", "version": "2", "by": "alice"})
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", what="the approval")
        self.assertEqual(self.w.trace(rid)["output"], "alice")

    def test_an_event_that_arrived_before_the_wait_counts_when_it_matches(self):
        self.skill("approval", APPROVAL)
        self.serve()
        rid = self.start({"service": "api", "version": "7", "settle": "1s"})
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the settle step")
        self.send("deploy.approved", {"service": "api", "version": "6", "by": "old"})
        self.send("deploy.approved", {"service": "api", "version": "7", "by": "early"})
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", what="the approval")
        self.assertEqual(self.w.trace(rid)["output"], "early")

    def test_cancel_on_a_list_of_paths_compares_them_with_the_runs_event(self):
        self.skill("approval", APPROVAL)
        self.serve()
        a = self.start({"service": "api", "version": "2"})
        b = self.start({"service": "api", "version": "3"})
        wait_until(lambda: len(self.runs_of("approval", "waiting")) == 2, what="two waits")
        self.send("deploy.aborted", {"service": "api", "version": "3"})
        wait_until(lambda: self.w.trace(b)["status"] == "cancelled", what="b cancelled")
        self.assertIn("deploy.aborted", self.w.trace(b)["error"]["message"])
        self.assertEqual(self.w.trace(a)["status"], "waiting")
        # A constant in the table form: freeze with all = true only.
        self.send("freeze", {"all": False})
        self.send("freeze", {"all": "true"})
        self.send("deploy.approved", {"service": "nothing", "version": "0"})  # a later write, to order
        self.assertEqual(self.w.trace(a)["status"], "waiting")
        self.send("freeze", {"all": True})
        wait_until(lambda: self.w.trace(a)["status"] == "cancelled", what="a cancelled by the freeze")

    def test_a_two_field_wait_survives_kill_9(self):
        self.skill("approval", APPROVAL)
        p = self.serve()
        rid = self.start({"service": "api", "version": "9"})
        wait_until(lambda: self.w.trace(rid)["status"] == "waiting", what="the wait")
        kill9(p)
        self.send("deploy.approved", {"service": "api", "version": "8", "by": "no"})
        self.send("deploy.approved", {"service": "api", "version": "9", "by": "yes"})
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", what="the approval")
        self.assertEqual(self.w.trace(rid)["output"], "yes")

    def test_a_bad_match_is_an_error_that_names_the_fix(self):
        cases = [
            ('match = { [1] = 5 }', "match[1] must be a path such as \"data.service\""),
            ('match = { [true] = "x" }', "'match' keys must be paths such as \"data.service\", got a boolean key"),
            ('match = { ["data.order"] = { id = 1 } }',
             "match[\"data.order\"] is a table: match compares single values (a string, number or boolean); "
             "name each field by its own path, such as match = { [\"data.order.id\"] = ... }"),
            ('match = {}', "'match' is empty"),
            ('match = "data..x"', "'match' must be a path such as \"data.request_id\""),
        ]
        for i, (opt, want) in enumerate(cases):
            self.skill("bad%d" % i, """
return { id = "bad%d", run = function(ctx)
  return ctx.step.wait_for_event("w", { event = "e", %s })
end }""" % (i, opt))
            r = self.w.ml("run", "skills/bad%d.lua" % i, check=1)
            self.assertIn("step.wait_for_event: " + want, r.stderr, opt)
        # cancel_on is checked when the skill loads.
        self.skill("badc", """
return { id = "badc", cancel_on = { { event = "x", match = { ["data.a"] = { 1, 2 } } } },
  run = function(ctx) return 1 end }""")
        r = self.w.ml("check", "skills/badc.lua", check=1)
        self.assertIn("cancel_on 1: match[\"data.a\"] is a table", r.stdout + r.stderr)

    def test_a_path_that_names_no_field_of_an_event_is_refused(self):
        # "service" for "data.service": nil in every event, so nil == nil
        # let any "ans" resume a run waiting for its own service's answer,
        # and one "stop" cancel every run of the skill.
        self.skill("rootless", """
return { id = "rootless", run = function(ctx)
  local path = ctx.input.path
  local e = ctx.step.wait_for_event("w", { event = "ans", match = path, timeout = "1h" })
  return e and e.data or "timeout"
end }""")
        r = self.w.ml("run", "skills/rootless.lua", "--data", json.dumps({"path": "service"}), check=1)
        self.assertIn("step.wait_for_event: 'match' \"service\" names no field of an event (a path "
                      "starts at data, name, id, ts): did you mean \"data.service\"?", r.stderr)
        cases = [
            ('wait', 'ctx.step.wait_for_event("w", { event = "e", match = "service" })',
             "'match' \"service\" names no field of an event"),
            ('waitlist', 'ctx.step.wait_for_event("w", { event = "e", match = { "data.a", "b" } })',
             "match[2] \"b\" names no field of an event"),
            ('waitkey', 'ctx.step.wait_for_event("w", { event = "e", match = { ["event.svc"] = "x" } })',
             "match key \"event.svc\" names no field of an event (a path starts at data, name, id, ts): "
             "did you mean \"data.svc\"?"),
        ]
        for name, call, want in cases:
            self.skill(name, 'return { id = "%s", run = function(ctx) return %s end }' % (name, call))
            r = self.w.ml("check", "skills/%s.lua" % name, check=1)
            self.assertIn(want, r.stdout + r.stderr, name)
        self.skill("cancelroot", """
return { id = "cancelroot", cancel_on = { { event = "stop", match = "order" } },
  run = function(ctx) return 1 end }""")
        r = self.w.ml("check", "skills/cancelroot.lua", check=1)
        self.assertIn("cancel_on 1: 'match' \"order\" names no field of an event", r.stdout + r.stderr)
        # Every field of an event is a root, with or without "event.".
        self.skill("roots", """
return { id = "roots", cancel_on = { { event = "stop", match = { "data.order", "event.name" } } },
  run = function(ctx)
    return ctx.step.wait_for_event("w", { event = "e", match = { ["id"] = "x", ["event.ts"] = "y" },
                                          timeout = 0.05 })
  end }""")
        self.w.ml("check", "skills/roots.lua", check=0)
        self.w.ml("run", "skills/roots.lua", check=0)

    def test_a_wait_kept_from_before_the_upgrade_still_matches(self):
        # A database whose waits still have match_path and match_value (the
        # schema before migration 7), with a pending wait on "event.data.k":
        # the upgrade carries it over and the run gets its event.
        self.skill("w", """
return { id = "w", run = function(ctx)
  local ev = ctx.step.wait_for_event("go", { event = "go", match = "data.k" })
  return ev.data.v
end }""")
        p = self.serve()
        rid = self.w.ml("invoke", "w", "--data", json.dumps({"k": "x"}), check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "waiting", what="the wait")
        kill9(p)
        ((match,),) = self.w.sql("SELECT match_json FROM waits WHERE run_id = ?", (rid,))
        self.assertEqual(json.loads(match), {"data.k": "x"})
        # Back to schema 6 (every migration from 7 on runs again), the wait
        # as 6 kept it: one path and one value.
        self.w.rewind_schema(6)
        self.w.sql("UPDATE waits SET match_path = 'event.data.k', match_value = '\"x\"'")
        self.w.ml("send", "go", "--data", json.dumps({"k": "y", "v": "no"}), check=0)
        self.w.ml("send", "go", "--data", json.dumps({"k": "x", "v": "yes"}), check=0)
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", what="the wait after the upgrade")
        self.assertEqual(self.w.trace(rid)["output"], "yes")
        if PG:
            cols = [r[0] for r in self.w.sql("SELECT column_name FROM information_schema.columns"
                                             " WHERE table_name = 'waits'")]
        else:
            cols = [r[1] for r in self.w.sql("PRAGMA table_info(waits)")]
        self.assertIn("match_json", cols)
        self.assertNotIn("match_path", cols)

    def test_check_flags_a_literal_bad_match_at_its_line(self):
        self.skill("lit", """
return { id = "lit", run = function(ctx)
  ctx.step.run("a", function() return 1 end)
  return ctx.step.wait_for_event("w", { event = "e", match = { ["data.order"] = { id = ctx.input.id } } })
end }""")
        r = self.w.ml("check", "skills/lit.lua", check=1)
        self.assertIn("skills/lit.lua:4: step.wait_for_event: match[\"data.order\"] is a table", r.stdout + r.stderr)
        self.skill("ok", """
return { id = "ok", run = function(ctx)
  return ctx.step.wait_for_event("w", { event = "e", match = { "data.service", [ctx.input.path] = ctx.input.v,
    ["data.version"] = ctx.input.version } })
end }""")
        self.w.ml("check", "skills/ok.lua", check=0)
