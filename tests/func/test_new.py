"""moonloop new: a skill skeleton and its test that pass check and test as
written, for each kind of trigger; bad arguments refused before anything is
written; existing files never overwritten."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import Workdir  # noqa: E402


class NewTest(unittest.TestCase):
    def setUp(self):
        self.w = Workdir()

    def tearDown(self):
        self.w.close()

    def files(self):
        return sorted(f for f in os.listdir(self.w.path) if f.endswith(".lua") and not f.startswith("moonloop"))

    def test_each_trigger_kind_passes_check_and_test(self):
        for args, stem in ((["order-saga", "--event", "order.created"], "order_saga"),
                           (["nightly.digest", "--cron", "*/5 * * * *"], "nightly_digest"),
                           (["plain"], "plain")):
            with self.subTest(args=args):
                r = self.w.ml("new", *args)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("wrote %s.lua" % stem, r.stdout)
                c = self.w.ml("check", stem + ".lua")
                self.assertEqual(c.returncode, 0, c.stderr)
                self.assertIn("(%s)" % args[0], c.stdout)  # the id it asked for
                t = self.w.ml("test", stem + "_test.lua")
                self.assertEqual(t.returncode, 0, t.stdout + t.stderr)
                self.assertIn("1 passed, 0 failed", t.stdout)
        src = open(os.path.join(self.w.path, "order_saga.lua")).read()
        self.assertIn('triggers = { { event = "order.created" } }', src)
        src = open(os.path.join(self.w.path, "nightly_digest.lua")).read()
        self.assertIn('cron = "*/5 * * * *"', src)

    def test_the_skeleton_runs_for_real(self):
        self.w.ml("new", "echo", check=0)
        r = self.w.ml("run", "echo.lua", "--data", '{"n": 3}', check=0)
        self.assertEqual(json.loads(r.stdout), {"received": {"n": 3}})

    def test_existing_files_are_not_overwritten(self):
        self.w.write("order_saga.lua", "-- mine\n")
        r = self.w.ml("new", "order-saga")
        self.assertEqual(r.returncode, 1)
        self.assertIn("order_saga.lua exists; not overwritten", r.stderr)
        self.assertEqual(open(os.path.join(self.w.path, "order_saga.lua")).read(), "-- mine\n")
        self.assertNotIn("order_saga_test.lua", self.files())  # all or nothing
        self.w.write("solo_test.lua", "-- my test\n")
        r = self.w.ml("new", "solo")
        self.assertEqual(r.returncode, 1)
        self.assertIn("solo_test.lua exists", r.stderr)
        self.assertNotIn("solo.lua", self.files())

    def test_bad_arguments_are_refused_before_writing(self):
        for args, words in ((["bad", "--cron", "99 * * * *"], "bad cron expression '99 * * * *'"),
                            (["Bad_Id"], "bad skill id 'Bad_Id'"),
                            (["x", "--event", "a", "--cron", "* * * * *"], "not both"),
                            ([], "usage: moonloop new ID")):
            with self.subTest(args=args):
                r = self.w.ml("new", *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(words, r.stderr)
                self.assertNotIn(".lua:", r.stderr)  # no line of a file never written
        self.assertEqual(self.files(), [])

    def test_workspace_and_json(self):
        os.makedirs(os.path.join(self.w.path, "ws"))
        r = self.w.ml("new", "triage", "--event", 'odd "name"\\x', "--workspace", "ws", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(out, {"id": "triage", "skill": "ws/triage.lua", "test": "ws/triage_test.lua"})
        t = self.w.ml("test", "ws")
        self.assertEqual(t.returncode, 0, t.stdout + t.stderr)  # the odd name stays one literal
        r = self.w.ml("new", "x", "--workspace", "nowhere")
        self.assertEqual(r.returncode, 2)
        self.assertIn("nowhere is not a folder", r.stderr)


if __name__ == "__main__":
    unittest.main()
