"""The llm module against an OpenAI-compatible stand-in: answers, JSON mode,
retries on 429/5xx with Retry-After, usage in the trace, and no second call on replay."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, kill9, wait_until  # noqa: E402


class LlmTest(TestCase):
    def setUp(self):
        super().setUp()
        self.w.write("moonloop.conf.lua", """return {
  env = { "STANDIN" },
  llm = { base_url = "%s/v1", model = "tiny-1", api_key_env = "TEST_LLM_KEY" },
}""" % self.si.url)
        self.w.env["TEST_LLM_KEY"] = "sk-test"

    def skill(self, body, name="s.lua", retries=0):
        self.w.write(name, "return { retries = %d, backoff = '10ms', run = function(ctx)\n%s\nend }\n"
                     % (retries, body))

    def test_prompt_answer_usage_model_and_key(self):
        self.si.llm(["all good"])
        self.skill('return ctx.step.run("ask", function() return llm.chat{ prompt = "status?" } end)')
        r = self.w.ml("run", "s.lua", check=0)
        out = json.loads(r.stdout)
        self.assertEqual(out["text"], "all good")
        self.assertEqual(out["usage"]["total_tokens"], 18)
        self.assertEqual(self.si.last_llm_request["model"], "tiny-1")
        self.assertEqual(self.si.last_llm_request["messages"], [{"role": "user", "content": "status?"}])
        self.assertEqual(self.si.last_llm_auth, "Bearer sk-test")
        step = self.w.trace(self.run_id_of(r))["steps"][0]
        self.assertEqual(step["usage"], {"prompt_tokens": 11, "completion_tokens": 7,
                                         "total_tokens": 18, "calls": 1})
        # The text trace shows them too, under the step (the README says so).
        text = self.w.ml("trace", self.run_id_of(r), check=0).stdout
        self.assertIn("llm tokens 18 (prompt 11, completion 7)", text)

    def test_messages_system_and_json_mode(self):
        self.si.llm(['```json\n{"health": "degraded", "reasons": ["latency"]}\n```'])
        self.skill('''return ctx.step.run("classify", function()
  return llm.chat{ system = "be terse", messages = { { role = "user", content = "classify" } },
                   json = true }.json
end)''')
        r = self.w.ml("run", "s.lua", check=0)
        self.assertEqual(json.loads(r.stdout), {"health": "degraded", "reasons": ["latency"]})
        req = self.si.last_llm_request
        self.assertEqual(req["response_format"], {"type": "json_object"})
        self.assertEqual(req["messages"][0], {"role": "system", "content": "be terse"})

    def test_json_mode_fails_clearly_on_nonsense(self):
        self.si.llm(["I think it is probably fine?"])
        self.skill('return ctx.step.run("c", function() return llm.chat{ prompt = "x", json = true }.json end)')
        r = self.w.ml("run", "s.lua", check=1)
        self.assertIn("the model's answer is not JSON", r.stderr)
        self.assertIn("probably fine", r.stderr)

    def test_429_and_5xx_are_retried_honouring_retry_after(self):
        self.si.llm([(429, {"Retry-After": "1"}), 503, "finally"])
        self.skill('return ctx.step.run("ask", function() return llm.chat{ prompt = "x" }.text end)')
        t0 = time.time()
        r = self.w.ml("run", "s.lua", check=0)
        self.assertEqual(json.loads(r.stdout), "finally")
        self.assertGreaterEqual(time.time() - t0, 1.0)  # waited for Retry-After
        self.assertEqual(self.si.count("/v1/chat/completions"), 3)
        # One step attempt: the retries were the module's own.
        self.assertEqual(len(self.w.trace(self.run_id_of(r))["steps"][0]["attempts"]), 1)

    def test_retries_are_said_in_the_trace_also_of_failures_that_are_not_answers(self):
        # A connection dropped without an answer is retried like a 503, and
        # every retry is a warn line in the step's log (it used to be silent).
        self.si.llm(["fine"])
        chat = self.si.routes["/v1/chat/completions"]

        def drop_first(h, body, n):
            if n == 1:
                h.connection.shutdown(socket.SHUT_RDWR)  # no answer at all
                return None
            if n == 2:
                return 503, {"error": {"message": "warming up"}}
            return chat(h, body, n - 2)
        self.si.routes["/v1/chat/completions"] = drop_first
        self.skill('return ctx.step.run("ask", function() return llm.chat{ prompt = "x" }.text end)')
        r = self.w.ml("run", "s.lua", check=0)
        self.assertEqual(json.loads(r.stdout), "fine")
        logs = self.w.trace(self.run_id_of(r))["steps"][0]["logs"]
        url = self.si.url + "/v1/chat/completions"
        self.assertEqual([l["level"] for l in logs], ["warn", "warn"])
        self.assertTrue(logs[0]["msg"].startswith("llm.chat: POST %s failed: " % url), logs[0]["msg"])
        self.assertIn("; retry 1 of 4 in ", logs[0]["msg"])
        self.assertTrue(logs[1]["msg"].startswith("llm.chat: POST %s returned 503; retry 2 of 4 in " % url),
                        logs[1]["msg"])

    def test_a_steps_timeout_ends_a_wait_for_retry_after(self):
        # Retry-After: 3600 (held to 120 s) must not outlast the step's
        # timeout: the step fails when its time is up, saying why it waited.
        self.si.llm([(429, {"Retry-After": "3600"})])
        self.skill('return ctx.step.run("ask", function() return llm.chat{ prompt = "x" }.text end,'
                   ' { timeout = "1s" })')
        r = self.w.ml("run", "s.lua", check=1, timeout=60)
        self.assertIn("llm.chat: step 'ask' timed out after 1.0s, waiting to try again after: returned 429",
                      r.stderr)
        self.assertEqual(self.si.count("/v1/chat/completions"), 1)

    def test_an_endpoint_nobody_answers_at_names_the_setting(self):
        # "could not connect to 127.0.0.1:11434" did not say where that
        # address came from: an agent without `llm` in its configuration
        # got the default. The retry lines (and the final error) name
        # llm.base_url, and say when it is the default.
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nobody listens there
        self.skill('return ctx.step.run("ask", function() return llm.chat{ prompt = "x" }.text end,'
                   ' { timeout = "1s" })')
        for conf, want in (
                ('llm = { base_url = "http://127.0.0.1:%d/v1" }' % port,
                 "; the endpoint is llm.base_url in moonloop.conf.lua (http://127.0.0.1:%d/v1)" % port),
                ("", "; the endpoint is the default llm.base_url, http://127.0.0.1:11434/v1 (a local "
                     "Ollama): set llm = { base_url = ..., model = ... } in moonloop.conf.lua")):
            if not conf:
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", 11434)) == 0:
                        continue  # something answers at the default here
            self.w.write("moonloop.conf.lua", "return { %s }" % conf)
            r = self.w.ml("run", "s.lua", check=1, timeout=60)
            logs = self.w.trace(self.run_id_of(r))["steps"][0].get("logs") or []
            self.assertTrue(logs, r.stderr)
            self.assertIn("could not connect", logs[0]["msg"])
            self.assertTrue(logs[0]["msg"].endswith(want), logs[0]["msg"])

    def test_a_steps_timeout_during_a_call_is_not_retried(self):
        # The endpoint hangs: the step's timeout cuts the call, and llm.chat
        # stops there (it logged "the step timed out; retry 2 of 4" and
        # slept on, sending nothing).
        def hang(h, body, n):
            time.sleep(8)
            return 503, {}
        self.si.routes["/v1/chat/completions"] = hang
        self.skill('return ctx.step.run("ask", function() return llm.chat{ prompt = "x" }.text end,'
                   ' { timeout = "1s" })')
        r = self.w.ml("run", "s.lua", check=1, timeout=60)
        self.assertIn("llm.chat: step 'ask' timed out after 1.0s", r.stderr)
        self.assertNotIn("after 2 tries", r.stderr)
        self.assertEqual(self.si.count("/v1/chat/completions"), 1)
        logs = self.w.trace(self.run_id_of(r))["steps"][0].get("logs") or []
        self.assertEqual([l["msg"] for l in logs if "retry" in l["msg"]], [])

    def test_an_answer_over_the_size_limit_is_not_asked_for_again(self):
        # 17 MB: over the 16 MB a response may have. Asking again gets the
        # same answer (and pays for it): it fails at once.
        big = "x" * (17 << 20)
        self.si.routes["/v1/chat/completions"] = lambda h, body, n: (200, big, {"Content-Type": "text/plain"})
        self.skill('return ctx.step.run("ask", function() return llm.chat{ prompt = "x" }.text end)')
        r = self.w.ml("run", "s.lua", check=1, timeout=60)
        self.assertIn("response too large", r.stderr)
        self.assertNotIn("tries", r.stderr)
        self.assertEqual(self.si.count("/v1/chat/completions"), 1)

    def test_bad_arguments_and_io_outside_steps(self):
        self.skill('return ctx.step.run("c", function() return llm.chat{ temperature = 1 } end)')
        self.assertIn("give 'prompt'", self.w.ml("run", "s.lua", check=1).stderr)
        # A request that is not JSON is refused before it is sent.
        self.skill('return ctx.step.run("c", function() local x = llm.chat{ prompt = "x", temperature = print } return x end)')
        self.assertIn("llm.chat: the request is not a JSON value: cannot encode a function at $.temperature",
                      self.w.ml("run", "s.lua", check=1).stderr)
        self.assertEqual(self.si.count("/v1/chat/completions"), 0)
        # Outside a step body: the static checks refuse the file...
        self.skill('local x = llm.chat{ prompt = "x" }')
        err = self.w.ml("run", "s.lua", check=1).stderr
        self.assertIn("s.lua:2: llm.chat must be called inside a step body", err)
        # ...and the runtime too, where they cannot see it (through a local).
        # It names llm.chat (not the http.request it uses) at the skill's line.
        self.skill('local chat = llm.chat local x = chat{ prompt = "x" }')
        err = self.w.ml("run", "s.lua", check=1).stderr
        self.assertIn("failed: s.lua:2: llm.chat must be called inside a step body", err)
        self.assertNotIn("moonloop/", err)

    def test_a_replay_after_sigkill_never_pays_twice(self):
        self.si.llm(['{"root_cause": "deploy 42"}'])
        self.si.routes["/hang"] = lambda h, b, n: (time.sleep(30 if n == 1 else 0), (200, {"n": n}))[1]
        self.skill('''
local a = ctx.step.run("correlate", function() return llm.chat{ prompt = "why?", json = true }.json end)
local b = ctx.step.run("post", function() return http.get_json(env.STANDIN .. "/hang").n end)
return { cause = a.root_cause, post = b }''')
        p = self.w.start("run", "s.lua")
        wait_until(lambda: self.si.count("/hang") == 1, what="the step after the LLM call")
        kill9(p)
        run_id = self.w.runs()[0]["id"]
        r = self.w.ml("run", "--resume", run_id, check=0)
        self.assertEqual(json.loads(r.stdout), {"cause": "deploy 42", "post": 2})
        self.assertEqual(self.si.count("/v1/chat/completions"), 1)
