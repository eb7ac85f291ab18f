"""moonloop check: strict validation with errors that name the file, the line and the key."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase  # noqa: E402

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
