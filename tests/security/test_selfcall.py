"""Skills against the engine's own API (docs/security.md, "Skills and the
API").

`deployers` is a boundary only if a skill cannot do over HTTP what
skills.deploy refuses it. A skill that is not a deployer tries the API of
its own engine through every spelling of the address, through a redirect
from an outside server, by setting the marker header itself, and from a
process with no server of its own (`moonloop run`, where only the header
its requests carry gives it away). Nothing it sends changes anything; a
deployer still may.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from seclib import Engine, StandIn, api, wait_until  # noqa: E402

# Tries each URL in ctx.input.urls with ctx.input.method; returns what it got.
PROBE = """
return { id = "%s", retries = 0, run = function(ctx)
  local out = {}
  for i, u in ipairs(ctx.input.urls) do
    out[i] = ctx.step.run("try", function()
      local ok, r, err = pcall(http.request, { method = ctx.input.method, url = u,
        body = ctx.input.body, headers = ctx.input.headers or { ["Content-Type"] = ctx.input.ctype } })
      if not ok then return { raised = tostring(r) } end
      if not r then return { err = err } end
      return { status = r.status, body = r.body }
    end)
  end
  return out
end }
"""
VICTIM_SRC = 'return { id = "victim", run = function(ctx) return "planted" end }\n'


class SelfCallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.si = StandIn()
        cls.addClassCleanup(cls.si.close)
        cls.e = Engine({"sneaky": PROBE % "sneaky", "deployer": PROBE % "deployer",
                        "waiter": """
return { id = "waiter", triggers = { { event = "go" } }, run = function(ctx)
  return ctx.step.wait_for_event("w", { event = "approve", timeout = "10m" })
end }"""}, config={"deployers": '{ "deployer" }'})
        cls.addClassCleanup(cls.e.close)
        cls.port = cls.e.port
        cls.e.w.ml("send", "go", check=0)
        wait_until(lambda: cls.e.runs("waiter", "waiting"), timeout=20, what="a waiting run")

    def probe(self, skill, urls, method="PUT", body=VICTIM_SRC, ctype="text/x-lua", headers=None):
        data = {"urls": urls, "method": method, "ctype": ctype}
        if body is not None:  # (a JSON null would reach http.request as json.null: an error)
            data["body"] = body
        if headers:
            data["headers"] = headers
        st, b = api(self.port, "POST", "/v1/skills/%s/invoke" % skill, {"data": data, "wait": 60})
        self.assertEqual((st, b.get("status")), (200, "completed"), b)
        return b["output"]

    def spellings(self, path):
        p = self.port
        return ["http://%s:%d%s" % (h, p, path) for h in
                ("127.0.0.1", "localhost", "LOCALHOST", "127.1", "127.0.0.2", "2130706433",
                 "0x7f000001", "0177.0.0.1", "0.0.0.0", "0", "[::1]", "[::ffff:127.0.0.1]", "[::]")]

    def assert_untouched(self):
        self.assertIsNone(self.e.skill("victim"))
        self.assertEqual(len(self.e.runs("waiter", "waiting")), 1)

    def test_every_spelling_of_the_address_is_refused_before_sending(self):
        urls = self.spellings("/v1/skills/victim")
        for url, got in zip(urls, self.probe("sneaky", urls)):
            with self.subTest(url=url):
                self.assertIn("err", got, got)
                self.assertRegex(got["err"], r"^refused: .* is this engine's own API, which a skill "
                                             r"can use only when the configuration lists it in `deployers`")
        urls = self.spellings("/v1/events")
        for url, got in zip(urls, self.probe("sneaky", urls, "POST", '{"name": "approve"}',
                                             "application/json")):
            with self.subTest(url=url):
                self.assertTrue(got.get("err", "").startswith("refused: "), got)
        self.assert_untouched()

    def test_a_redirect_from_outside_is_refused_too(self):
        target = "http://localhost:%d/v1/skills/victim" % self.port
        for code in (301, 302, 303, 307, 308):
            self.si.routes["/r%d" % code] = (lambda c: lambda h, body, n: (
                c, "", {"Location": target}))(code)
        urls = ["%s/r%d" % (self.si.url, c) for c in (301, 302, 303, 307, 308)]
        for url, got in zip(urls, self.probe("sneaky", urls)):
            with self.subTest(url=url):
                self.assertTrue(got.get("err", "").startswith("refused: "), got)
        self.assert_untouched()

    def test_a_skill_cannot_set_or_drop_the_marker(self):
        # (curl reads "Name:" as "drop the header", "Name;" as "send it empty".)
        for hv, words in (({"Moonloop-From-Skill": "0"}, "the header Moonloop-From-Skill is the engine's"),
                          ({"moonloop-from-skill": ""}, "the header Moonloop-From-Skill is the engine's"),
                          ({"MOONLOOP-FROM-SKILL;": ""}, "invalid request header")):
            with self.subTest(headers=hv):
                got = self.probe("sneaky", [self.si.url + "/echo"], "GET", None, headers=hv)[0]
                self.assertIn(words, got.get("err", ""), got)
        self.assertEqual(self.si.count("/echo"), 0)

    def test_outside_servers_see_the_marker(self):
        seen = {}

        def echo(h, body, n):
            seen["marker"] = h.headers.get("Moonloop-From-Skill")
            return 200, {"ok": True}
        self.si.routes["/seen"] = echo
        got = self.probe("sneaky", [self.si.url + "/seen"], "GET", None)[0]
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(seen["marker"], "1")

    def test_the_api_refuses_marked_requests_from_any_process(self):
        # `moonloop run` has no server, so it does not know where one
        # listens: its request goes out, carrying the marker, and the
        # engine that gets it refuses it.
        data = json.dumps({"urls": ["http://127.0.0.1:%d/v1/skills/victim" % self.port],
                           "method": "PUT", "body": VICTIM_SRC, "ctype": "text/x-lua"})
        r = self.e.w.ml("run", "skills/sneaky.lua", "--data", data, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout)[0]
        self.assertEqual(got["status"], 403, got)
        body = json.loads(got["body"])
        self.assertEqual(body["error"]["code"], "forbidden")
        self.assertIn("this request comes from a skill", body["error"]["message"])
        data = json.dumps({"urls": ["http://127.0.0.1:%d/v1/events" % self.port], "method": "POST",
                           "body": '{"name": "approve"}', "ctype": "application/json"})
        r = self.e.w.ml("run", "skills/sneaky.lua", "--data", data, timeout=60)
        self.assertEqual(json.loads(r.stdout)[0]["status"], 403, r.stdout)
        self.assert_untouched()

    def test_zz_a_deployer_may_use_the_api(self):
        got = self.probe("deployer", ["http://localhost:%d/v1/skills/victim" % self.port])[0]
        self.assertEqual(got.get("status"), 200, got)
        self.assertEqual(self.e.skill("victim")["id"], "victim")


if __name__ == "__main__":
    unittest.main()
