"""Skills and API callers against the file system (docs/security.md,
"Files").

The only file the engine writes for skills is the one skills.deploy
writes, and it must land inside the workspace: checked on the real path
(links resolved) when PUT registers a file name, and again when the file
is written. These tests try every way out: '..' in ?file=, absolute paths,
percent-encoding, skill ids, a linked folder, a linked file, a folder
swapped for a link after it was registered, and pointing one skill at
another skill's file.
"""
import os
import sys
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
from seclib import Engine, api, assert_refused, http_raw, jbody, wait_until  # noqa: E402

DEPLOYER = """
return { id = "deployer", retries = 0, run = function(ctx)
  return ctx.step.run("deploy", function()
    local ok, r = pcall(skills.deploy, ctx.input.id, ctx.input.src)
    if ok then return { file = r.file } end
    return { err = tostring(r) }
  end)
end }
"""
ORDINARY = DEPLOYER.replace('"deployer"', '"ordinary"')
VICTIM = 'return { id = "victim", run = function(ctx) return "victim v1" end }\n'


def src(sid, text="v"):
    return 'return { id = "%s", run = function(ctx) return "%s" end }\n' % (sid, text)


def q(s):
    return urllib.parse.quote(s, safe="")


class FilesTest(unittest.TestCase):
    def setUp(self):
        self.e = Engine({"deployer": DEPLOYER, "ordinary": ORDINARY, "victim": VICTIM},
                        config={"deployers": '{ "deployer" }'})
        self.ws = os.path.join(self.e.w.path, "skills")
        self.outside = os.path.join(self.e.w.path, "outside")
        os.makedirs(self.outside)

    def tearDown(self):
        self.e.close()

    def put(self, sid, file, source=None):
        st, b = api(self.e.port, "PUT", "/v1/skills/%s?file=%s" % (sid, q(file)),
                    source or src(sid), ctype="text/x-lua")
        return st, b

    def deploy(self, sid, source=None, by="deployer"):
        st, b = api(self.e.port, "POST", "/v1/skills/%s/invoke" % by,
                    {"data": {"id": sid, "src": source or src(sid, "deployed")}, "wait": 20})
        self.assertEqual(st, 200, b)
        self.assertEqual(b["status"], "completed", b)
        return b["output"]

    def outside_files(self):
        found = []
        for root, _, files in os.walk(self.e.w.path):
            if os.path.realpath(root).startswith(os.path.realpath(self.ws)):
                continue
            found += [os.path.join(root, f) for f in files
                      if f.endswith((".lua", ".sh")) and f != "moonloop.conf.lua"]
        return found

    def test_file_names_that_lead_out_are_refused(self):
        os.symlink(self.outside, os.path.join(self.ws, "linked"))
        with open(os.path.join(self.outside, "target.lua"), "w") as f:
            f.write("-- the operator's file\n")
        os.symlink(os.path.join(self.outside, "target.lua"), os.path.join(self.ws, "linkfile.lua"))
        cases = [
            ("skills/../escaped.sh", "has a '..' part"),
            ("../escaped.lua", "has a '..' part"),
            ("skills/./sub/../../escaped.lua", "has a '..' part"),
            ("..", "has a '..' part"),
            ("//box/ws/../../etc/x.lua", "has a '..' part"),
            (os.path.join(self.e.w.path, "escaped.sh"), "is outside the workspace"),
            ("/etc/cron.d/x", "is outside the workspace"),
            ("escaped.lua", "is outside the workspace"),
            ("skills/linked/x1.lua", "is outside the workspace"),
            ("skills/linkfile.lua", "is outside the workspace"),
            ("//box", "a remote file is named //HOST/PATH"),
            ("///etc/x.lua", "a remote file is named //HOST/PATH"),
        ]
        for file, words in cases:
            with self.subTest(file=file):
                st, b = self.put("x1", file)
                assert_refused(self, st, b, 400, "invalid", [words])
        # Percent-encoded dots are dots once decoded: the same refusal.
        st, b = api(self.e.port, "PUT", "/v1/skills/x1?file=skills%2F%2E%2E%2Fescaped.sh",
                    src("x1"), ctype="text/x-lua")
        assert_refused(self, st, b, 400, "invalid", ["'..' part"])
        self.assertIsNone(self.e.skill("x1"))
        # Whatever was tried, a deploy of x1 writes inside the workspace.
        out = self.deploy("x1")
        self.assertEqual(out, {"file": "skills/x1.lua"})
        self.assertEqual(self.outside_files(), [os.path.join(self.outside, "target.lua")])
        with open(os.path.join(self.outside, "target.lua")) as f:
            self.assertEqual(f.read(), "-- the operator's file\n")

    def test_names_inside_the_workspace_and_remote_names_work(self):
        st, b = self.put("x2", "skills/x2.lua")
        self.assertEqual((st, b["file"]), (200, "skills/x2.lua"), b)
        st, b = self.put("x3", os.path.join(self.ws, "deep", "x3.lua"))
        self.assertEqual(st, 200, b)
        st, b = self.put("x4", "//box/home/ops/ws/x4.lua")
        self.assertEqual((st, b["file"]), (200, "//box/home/ops/ws/x4.lua"), b)
        # A remote file is never written here. A deploy into the workspace
        # would be refused by the registry while the remote file holds the
        # id: the deploy says so and writes nothing.
        out = self.deploy("x4")
        self.assertIn("the engine would refuse it: skills/x4.lua:1: skill id 'x4' is already defined by "
                      "//box/home/ops/ws/x4.lua", out.get("err", ""))
        self.assertFalse(os.path.exists(os.path.join(self.ws, "x4.lua")))
        self.assertEqual(self.deploy("x2"), {"file": "skills/x2.lua"})

    def test_skill_ids_that_lead_out_are_refused(self):
        for sid in ("..%2F..%2Fescaped", "%2E%2E", ".hidden", "a%2Fb", "A"):
            with self.subTest(id=sid):
                st, _, b = http_raw(self.e.port, "PUT", "/v1/skills/" + sid,
                                    [("Host", "127.0.0.1"), ("Content-Type", "text/x-lua")], src("x"))
                self.assertEqual(st, 400, b)
                self.assertIn("bad skill id", jbody(b)["error"]["message"])
        for sid in ("../../escaped", "../outside/x", "/tmp/x", "a/b", ".."):
            with self.subTest(deploy_id=sid):
                out = self.deploy(sid, src("x"))
                self.assertIn("is not a skill id", out["err"])
        self.assertEqual(self.outside_files(), [])

    def test_a_skill_cannot_take_another_skills_file(self):
        # victim came from skills/victim.lua (the watcher): its file is its own.
        self.assertEqual(self.e.skill("victim")["file"], "skills/victim.lua")
        st, b = self.put("attacker", "skills/victim.lua")
        assert_refused(self, st, b, 409, "conflict", ["is the file of skill 'victim'"])
        # Nor can victim be re-pointed at another file while its own exists.
        st, b = self.put("victim", "skills/elsewhere.lua", VICTIM)
        assert_refused(self, st, b, 409, "conflict", ["already defined by skills/victim.lua"])
        self.assertEqual(self.e.skill("victim")["file"], "skills/victim.lua")
        # A deploy of attacker writes attacker's own file; victim's is untouched.
        self.assertEqual(self.deploy("attacker"), {"file": "skills/attacker.lua"})
        with open(os.path.join(self.ws, "victim.lua")) as f:
            self.assertEqual(f.read(), VICTIM)

    def test_links_swapped_in_after_registration_are_not_followed(self):
        os.makedirs(os.path.join(self.ws, "sub"))
        st, b = self.put("x5", "skills/sub/x5.lua")
        self.assertEqual(st, 200, b)
        # The folder becomes a link out of the workspace after the PUT.
        os.rmdir(os.path.join(self.ws, "sub"))
        os.symlink(self.outside, os.path.join(self.ws, "sub"))
        out = self.deploy("x5")
        # The registered name now leads out: the deploy falls back to the
        # default name inside the workspace, never through the link.
        self.assertEqual(out, {"file": "skills/x5.lua"})
        self.assertEqual(os.listdir(self.outside), [])
        # A linked file in place of the skill's file: not written through.
        with open(os.path.join(self.outside, "keep.lua"), "w") as f:
            f.write("-- keep\n")
        os.symlink(os.path.join(self.outside, "keep.lua"), os.path.join(self.ws, "x6.lua"))
        out = self.deploy("x6")
        self.assertIn("is outside the workspace", out.get("err", ""), out)
        with open(os.path.join(self.outside, "keep.lua")) as f:
            self.assertEqual(f.read(), "-- keep\n")

    def test_only_deployers_deploy(self):
        out = self.deploy("fresh", by="ordinary")
        self.assertIn("not allowed to deploy", out["err"])
        self.assertFalse(os.path.exists(os.path.join(self.ws, "fresh.lua")))
        self.assertEqual(self.deploy("fresh"), {"file": "skills/fresh.lua"})
        # What a deploy writes is a skill file like any other: the watcher loads it.
        wait_until(lambda: (self.e.skill("fresh") or {}).get("version"), timeout=10,
                   what="the deployed skill to load")


if __name__ == "__main__":
    unittest.main()
