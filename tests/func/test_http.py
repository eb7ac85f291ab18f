"""The http module inside skills: requests, errors, and many requests in flight at once."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, wait_until  # noqa: E402


class HttpTest(TestCase):
    def run_skill(self, body, status=0):
        self.w.write("h.lua", "return { retries = 0, run = function(ctx)\n" + body + "\nend }\n")
        return self.w.ml("run", "h.lua", check=status)

    def test_request_get_and_post(self):
        self.si.routes["/echo"] = lambda h, b, n: (201, {"got": json.loads(b or b"null"),
                                                        "auth": h.headers.get("X-Token")},
                                                  {"X-Answer": "yes"})
        r = self.run_skill("""
return ctx.step.run("req", function()
  local r = http.request{ method = "PUT", url = env.STANDIN .. "/echo", body = '{"a":1}',
                          headers = { ["X-Token"] = "t0k" } }
  local g = http.get_json(env.STANDIN .. "/plain")
  local p = http.post_json(env.STANDIN .. "/echo", { b = 2 })
  return { status = r.status, body = json.decode(r.body), header = r.headers["x-answer"],
           g = g.path, p = p.got }
end)""")
        out = json.loads(r.stdout)
        self.assertEqual(out["status"], 201)
        self.assertEqual(out["body"], {"got": {"a": 1}, "auth": "t0k"})
        self.assertEqual(out["header"], "yes")
        self.assertEqual(out["g"], "/plain")
        self.assertEqual(out["p"], {"b": 2})

    def test_a_json_answer_too_big_to_decode_names_the_budget(self):
        # 1.5 million zeros (4.5 MB of text) are 120 MB as a JSON tree: over
        # a 16 MB budget, get_json and post_json raise saying so (post_json
        # used to hand back the text as if the answer were not JSON), and
        # http.get of the same answer is fine: a string within the budget.
        self.w.write("moonloop.conf.lua", 'return { env = {"STANDIN"}, limits = { run_memory = "16MB" } }\n')
        self.si.routes["/big"] = lambda h, b, n: (200, [0] * 1500000)
        r = self.run_skill("""
return ctx.step.run("req", function()
  local a = { pcall(http.get_json, env.STANDIN .. "/big") }
  local b = { pcall(http.post_json, env.STANDIN .. "/big", {}) }
  return { a = a, b = b, n = #http.get(env.STANDIN .. "/big") }
end)""")
        out = json.loads(r.stdout)
        self.assertEqual(out["a"][0], False)
        self.assertIn("http.get_json: GET %s/big: decoding its answer (4500000 bytes): the text would take more "
                      "than the run's memory budget of 16.0 MB" % self.si.url, out["a"][1])
        self.assertEqual(out["b"][0], False)
        self.assertIn("http.post_json: POST %s/big: decoding its answer (4500000 bytes): the text would take "
                      "more than the run's memory budget of 16.0 MB" % self.si.url, out["b"][1])
        for v in (out["a"][1], out["b"][1]):
            self.assertIn("limits.run_memory", v)
        self.assertEqual(out["n"], 4500000)

    def test_a_post_dropped_before_its_answer_reached_the_server_once(self):
        # libcurl sends a request again, unseen, when a kept-alive connection
        # it reused closes before any answer. The server here read the POST
        # and dropped the connection: with retries = 0 it must get it once,
        # and the step fails saying so (it got two, and the run completed).
        def charge(h, body, n):
            if n == 1:
                h.connection.shutdown(socket.SHUT_RDWR)
                return None
            return 200, {"charged": n}
        self.si.routes["/charge"] = charge
        r = self.run_skill("""
ctx.step.run("warm", function() return http.post_json(env.STANDIN .. "/warm", { n = 0 }).n end)
ctx.step.run("look", function() return http.get_json(env.STANDIN .. "/look").n end)
return ctx.step.run("charge", function()
  return http.post_json(env.STANDIN .. "/charge", { amount = 1 }).charged
end)""", status=1)
        self.assertEqual(self.si.count("/charge"), 1)
        self.assertIn("step 'charge' failed", r.stderr)
        self.assertIn("/charge", r.stderr)
        # With an Idempotency-Key the caller says a second copy is harmless:
        # the request may reuse a kept-alive connection (not checked here:
        # whether libcurl re-sends is libcurl's), and it is answered.
        r = self.run_skill("""
return ctx.step.run("again", function()
  local r = http.request{ method = "POST", url = env.STANDIN .. "/charge", body = "{}",
                          headers = { ["Idempotency-Key"] = ctx.step_key } }
  return r.status
end)""")
        self.assertEqual(json.loads(r.stdout), 200)

    def test_request_sends_a_value_as_json(self):
        # Agents reach for http.request{ json = value }: the key used to be
        # ignored and the request sent with an empty body.
        self.si.routes["/j"] = lambda h, b, n: (200, {"got": json.loads(b or b"null"), "method": h.command,
                                                     "type": h.headers.get("Content-Type")})
        r = self.run_skill("""
return ctx.step.run("req", function()
  local a = http.request{ url = env.STANDIN .. "/j", json = { order = 7, items = json.array({}) } }
  local b = http.request{ method = "PUT", url = env.STANDIN .. "/j", json = { 1, 2 },
                          headers = { ["content-type"] = "application/merge-patch+json" } }
  local errs = {}
  for i, req in ipairs({ { url = env.STANDIN .. "/j", json = {}, body = "x" },
                         { url = env.STANDIN .. "/j", body = { a = 1 } },
                         { url = env.STANDIN .. "/j", json = { f = print } } }) do
    errs[i] = select(2, pcall(http.request, req))
  end
  return { a = json.decode(a.body), b = json.decode(b.body), errs = errs }
end)""")
        out = json.loads(r.stdout)
        self.assertEqual(out["a"], {"got": {"items": [], "order": 7}, "method": "POST", "type": "application/json"})
        self.assertEqual(out["b"], {"got": [1, 2], "method": "PUT", "type": "application/merge-patch+json"})
        self.assertEqual(out["errs"], [
            "h.lua:11: http.request: give 'body' (text) or 'json' (a value), not both",
            "h.lua:11: http.request: 'body' must be a string, got a table (to send a value as JSON, use json = value)",
            "h.lua:11: http.request: json is not a JSON value: cannot encode a function at $.f: only JSON "
            "values (nil, booleans, numbers, strings, tables) can be encoded",
        ])
        self.assertEqual(self.si.count("/j"), 2)

    def test_request_returns_non_2xx_and_nil_on_transport_failure(self):
        self.si.routes["/missing"] = (404, {"error": "nope"})
        r = self.run_skill("""
return ctx.step.run("req", function()
  local a = http.request{ url = env.STANDIN .. "/missing" }
  local b, err = http.request{ url = "http://127.0.0.1:9/" }
  return { status = a.status, b = b == nil, err = err }
end)""")
        out = json.loads(r.stdout)
        self.assertEqual(out["status"], 404)
        self.assertTrue(out["b"])
        self.assertIn("127.0.0.1:9", out["err"])

    def test_checked_helpers_raise_clear_errors(self):
        self.si.routes["/bad"] = (502, "upstream exploded")
        self.si.routes["/notjson"] = (200, "<html>")
        for call, want in [
            ('http.get(env.STANDIN .. "/bad")', "http.get: GET %s/bad returned 502: upstream exploded"),
            ('http.get_json(env.STANDIN .. "/notjson")', "did not answer JSON"),
            ('http.get("http://127.0.0.1:9/x")', "http.get:"),
            ('http.get("file:///etc/passwd")', "http.get:"),
        ]:
            with self.subTest(call=call):
                r = self.run_skill('ctx.step.run("c", function() return %s end)' % call, status=1)
                self.assertIn(want.replace("%s", self.si.url), r.stderr)

    def test_post_json_refuses_a_value_that_is_not_json(self):
        # It used to send the request with no body at all.
        r = self.run_skill('ctx.step.run("c", function() local x = http.post_json(env.STANDIN .. "/p", '
                           '{ f = print }) return x end)', status=1)
        self.assertIn("h.lua:2: http.post_json: value is not a JSON value: cannot encode a function at $.f",
                      r.stderr)
        self.assertEqual(self.si.count("/p"), 0)

    def test_io_outside_a_step_is_refused(self):
        r = self.run_skill('return http.get(env.STANDIN .. "/x")', status=1)
        self.assertIn("must be called inside a step body", r.stderr)
        self.assertEqual(self.si.count("/x"), 0)

    def test_errors_point_at_the_skill_never_at_the_runtime(self):
        # Each case is (line 2 of h.lua, what its error must start with): the
        # skill's line, or no position when the caller's frame is gone (a
        # tail call from a step body); never a moonloop/*.lua position.
        self.si.routes["/notjson"] = (200, "<html>")
        u = 'env.STANDIN .. "/notjson"'
        for code, want in [
            # through the sandbox's pcall (was moonloop/sandbox.lua:59)
            ('ctx.step.run("c", function() local ok, e = pcall(http.get_json, %s) error(e, 0) end)' % u,
             "step 'c' failed: h.lua:2: http.get_json: GET "),
            # a tail call from the body: no position (was moonloop/run.lua)
            ('ctx.step.run("c", function() return http.get_json(%s) end)' % u,
             "step 'c' failed: http.get_json: GET "),
            # outside a step (was moonloop/modules.lua:91); through a local,
            # since the static checks name `http.get(...)` in the run itself
            # before it runs (test_check.py)
            ('local get = http.get local x = get(%s)' % u, "h.lua:2: http.get must be called inside a step body"),
            ('local list = runs.list local x = list{}', "h.lua:2: runs.list must be called inside a step body"),
            # bad arguments the runtime's own Lua tripped over
            ('ctx.step.run("c", function() local x = http.get(%s, 5) return x end)' % u,
             "step 'c' failed: h.lua:2: http.get: opts must be a table"),
            ('ctx.step.run("c", function() local x = http.post_json(%s, 1, {headers = 1}) return x end)' % u,
             "step 'c' failed: h.lua:2: http.post_json: opts.headers must be a table"),
            ('ctx.step.run("c", function() local x = time.parse_duration({}) return x end)',
             "step 'c' failed: h.lua:2: time.parse_duration expects"),
            ('ctx.step.run("c", function() local x = skills.check("return {}", {}) return x end)',
             "step 'c' failed: h.lua:2: skills.check: name must be"),
            ('local x = ctx.step.run("c", function() end, { retries = "2" })',
             "h.lua:2: step.run: opts.retries must be a whole number from 0 to 100, got string"),
            ('local x = ctx.step.parallel("p", { function() end }, { retries = 0.5 })',
             "h.lua:2: step.parallel: opts.retries must be a whole number from 0 to 100, got 0.5"),
            ('local x = ctx.step.sleep("s", {})', 'h.lua:2: step.sleep: expected a duration'),
            ('ctx.step.run("c", function() print(setmetatable({}, {__tostring = function() return 1 end})) end)',
             "step 'c' failed: h.lua:2: '__tostring' must return a string"),
        ]:
            with self.subTest(code=code):
                r = self.run_skill(code, status=1)
                err = r.stderr.split(" failed: ", 1)[1]
                self.assertTrue(err.startswith(want), err)
                self.assertNotIn("moonloop/", r.stderr)

    def test_hundreds_of_requests_in_flight_share_one_thread(self):
        def slow(h, b, n):
            # Long enough for hundreds to overlap even when the runs are
            # claimed in batches on a loaded machine (PostgreSQL reached 94
            # at 0.5 s once).
            with self.si.track("slow"):
                time.sleep(2.0)
            return 200, {"n": n}
        self.si.routes["/slow"] = slow
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/slow.lua", """
return { id = "slow", run = function(ctx)
  return ctx.step.run("call", function() return http.get_json(env.STANDIN .. "/slow").n end)
end }""")
        p = self.w.serve("--workspace", "skills")
        # A few runs through the CLI, the rest queued in one transaction, so
        # that serve finds hundreds waiting at once.
        n = 300
        for _ in range(3):
            self.w.ml("invoke", "slow", check=0)
        self._enqueue_many(n - 3)
        wait_until(lambda: len(self.w.runs(skill="slow", status="completed")) == n, timeout=60,
                   what="300 runs")
        self.assertEqual(self.si.count("/slow"), n)
        # Far more than one at a time: the requests overlapped on the engine's loop.
        self.assertGreater(self.si.max_inflight["slow"], 100)
        p.terminate()

    def _enqueue_many(self, n):
        """Queue n runs directly, as `moonloop invoke` does (one transaction)."""
        version = self.w.sql("SELECT version FROM skills WHERE id='slow'")[0][0]
        now = int(time.time() * 1000)
        values = ",".join("('01ZZZZ%020d', 'slow', '%s', 'queued', '{\"kind\":\"invoke\"}', 'null', %d)"
                          % (i, version, now) for i in range(n))
        self.w.sql("INSERT INTO runs(id, skill, version, status, trigger, input, created_at)"
                   " VALUES" + values)
