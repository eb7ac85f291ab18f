"""Secrets and scope: which variables a skill sees.

Every skill saw every variable of the configuration's global `env` list, so
a token listed for one skill was handed to all. `skill_env = { ["id"] = {
"NAME" } }` grants variables to one skill: it sees the global list plus its
own grant, nothing else, from its top level on. A source checked with
skills.check (from any skill) or `moonloop check` never gets a grant, and a
load that fails only with its grant set does not show its error (it could
hold the secret). `moonloop check` and `serve` warn when the global list
holds a secret-looking name.
"""
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from lualib import TestCase, Workdir, api, invoke_wait, put_skill  # noqa: E402

SECRET = "ghp_0123456789abcdefSECRET"

CONFIG = {"skill_env": '{ ["update-skill"] = { "GITHUB_TOKEN" }, ["other"] = { "OTHER_ONLY" } }'}

# The token is read through a name built at run time (a literal one that
# is not granted is refused by the static checks): a skill it is not
# granted to gets an error naming the grant, never the value.
SHOW = '''
local function read(n)
  local ok, v = pcall(function() return env[n] end)
  if ok then return v or false end
  return "refused: " .. tostring(v)
end
local top = read("GITHUB_" .. "TOKEN")
return { id = "%s", run = function(ctx)
  local names = {}
  for k in pairs(env) do names[#names + 1] = k end
  table.sort(names)
  return { top = top, run = read("GITHUB_" .. "TOKEN"), names = names,
           public = env.PUBLIC_URL or false }
end }
'''
REFUSED = ('refused: skills/plain.lua:%d: env.GITHUB_TOKEN is not granted to this skill: add "GITHUB_TOKEN" '
           'to env = {...} in moonloop.conf.lua (every skill), or to skill_env = { ["plain"] = '
           '{ "GITHUB_TOKEN" } } (this skill only)') % 3


class SkillEnvTest(TestCase):
    env_names = ("PUBLIC_URL",)
    config = CONFIG

    def setUp(self):
        super().setUp()
        self.w.env.update({"GITHUB_TOKEN": SECRET, "PUBLIC_URL": "https://example.test",
                           "OTHER_ONLY": "other-secret", "UNLISTED": "never"})
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/update_skill.lua", SHOW % "update-skill")
        self.w.write("skills/plain.lua", SHOW % "plain")

    def test_a_grant_reaches_its_skill_only(self):
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        st, b = invoke_wait(p.port, "update-skill")
        self.assertEqual(b["output"], {"top": SECRET, "run": SECRET, "public": "https://example.test",
                                       "names": ["GITHUB_TOKEN", "PUBLIC_URL"]})
        st, b = invoke_wait(p.port, "plain")
        self.assertEqual(b["output"], {"top": REFUSED, "run": REFUSED, "public": "https://example.test",
                                       "names": ["PUBLIC_URL"]})

    def test_moonloop_run_of_a_file_gets_the_grant_of_its_id(self):
        r = self.w.ml("run", "skills/update_skill.lua", check=0)
        self.assertEqual(json.loads(r.stdout)["run"], SECRET)
        r = self.w.ml("run", "skills/plain.lua", check=0)
        self.assertEqual(json.loads(r.stdout)["run"], REFUSED)

    def test_checking_a_source_that_claims_the_id_gets_no_grant(self):
        # Any skill may call skills.check; the source it checks can declare
        # any id, and its top level runs: it must not see that id's grant.
        self.w.write("skills/prober.lua", r'''
local SRC = [[
if env.GITHUB_TOKEN then error("LEAK:" .. env.GITHUB_TOKEN) end
return { id = "update-skill", run = function() end }
]]
return { id = "prober", run = function(ctx)
  return ctx.step.run("check", function() return skills.check(SRC) end)
end }
''')
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        st, b = invoke_wait(p.port, "prober")
        self.assertEqual(b["status"], "completed", b)
        self.assertEqual(b["output"], {"ok": True, "id": "update-skill"})
        self.assertNotIn(SECRET, json.dumps(b))
        r = self.w.ml("check", "skills/update_skill.lua", check=0)
        self.assertNotIn(SECRET, r.stdout + r.stderr)

    def test_an_error_only_the_granted_load_raises_is_not_shown(self):
        # A second file claiming the id is refused as a duplicate, but its
        # top level ran with the grant first: whatever it raised then is
        # not recorded where `moonloop skills` and the API show it.
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        src = ('if env.GITHUB_TOKEN then error("LEAK:" .. env.GITHUB_TOKEN) end\n'
               'return { id = "update-skill", run = function() end }\n')
        st, b = put_skill(p.port, "update-skill", src)
        self.assertEqual(st, 400, b)
        self.assertNotIn(SECRET, json.dumps(b))
        self.assertIn("not shown", b["error"]["message"])
        self.w.write("skills/thief.lua", src)
        time.sleep(1.5)  # the watcher loads it (and refuses the duplicate id)
        for path in ("/v1/skills", "/v1/skills/update-skill", "/v1/skills/thief"):
            st, b = api(p.port, "GET", path)
            self.assertNotIn(SECRET, json.dumps(b), path)
        r = self.w.ml("skills", check=0)
        self.assertNotIn(SECRET, r.stdout + r.stderr)

    def test_an_unknown_key_shape_is_refused(self):
        w = Workdir(config={"skill_env": '{ ["x"] = "GITHUB_TOKEN" }'})
        try:
            w.write("ok.lua", 'return { id = "ok", run = function() return 1 end }\n')
            r = w.ml("check", "ok.lua")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("skill_env", r.stderr)
            self.assertIn("list of variable names", r.stderr)
        finally:
            w.close()


class EnvWarningTest(TestCase):
    env_names = ("METRICS_URL", "OPENAI_API_KEY", "DB_PASSWORD", "GITHUB_TOKEN")

    def test_check_and_serve_warn_about_secrets_in_the_global_list(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/ok.lua", 'return { id = "ok", run = function() return 1 end }\n')
        r = self.w.ml("check", "skills/ok.lua", check=0)
        self.assertIn("warning", r.stderr)
        for name in ("OPENAI_API_KEY", "DB_PASSWORD", "GITHUB_TOKEN"):
            self.assertIn(name, r.stderr)
        self.assertNotIn("METRICS_URL", r.stderr)
        self.assertIn("skill_env", r.stderr)
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        self.assertIn("OPENAI_API_KEY", "".join(p.stderr_lines))

    def test_no_warning_for_plain_names(self):
        w = Workdir(env_names=("METRICS_URL", "SLACK_CHANNEL", "MONKEY_COUNT", "BYPASS_MODE"))
        try:
            w.write("ok.lua", 'return { id = "ok", run = function() return 1 end }\n')
            r = w.ml("check", "ok.lua", check=0)
            self.assertNotIn("warning", r.stderr)
        finally:
            w.close()


if __name__ == "__main__":
    unittest.main()
