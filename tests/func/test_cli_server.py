"""CLI commands that change state, sent to a running engine with --server (and a token)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, wait_until  # noqa: E402


class CliServerTest(TestCase):
    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/greet.lua", """
return { id = "greet", triggers = { { event = "hello" } }, run = function(ctx)
  ctx.step.sleep("pause", ctx.input.pause or 0)
  return "hi " .. ctx.input.who
end }""")
        self.w.env["MOONLOOP_TOKEN"] = "s3cret"
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        self.url = p.url
        # From here on the CLI must not touch the file: point it elsewhere.
        self.w.env["MOONLOOP_DB"] = os.path.join(self.w.path, "not-used.db")

    def cli(self, *args, check=0):
        return self.w.ml(*args, "--server", self.url, check=check)

    def test_send_cancel_rerun_through_the_api(self):
        eid = self.cli("send", "hello", "--data", '{"who": "ada"}', "--id", "k1").stdout.strip()
        self.assertEqual(self.cli("send", "hello", "--data", '{"who": "ada"}', "--id", "k1").stdout.strip(), eid)
        runs = wait_until(lambda: [r for r in json.loads(self.cli("runs", "--json").stdout)
                                   if r["status"] == "completed"], what="the event's run")
        self.assertEqual(runs[0]["output"], "hi ada")
        new = self.cli("rerun", runs[0]["id"]).stdout.strip()
        wait_until(lambda: json.loads(self.cli("trace", new, "--json").stdout)["status"] == "completed",
                   what="the rerun")
        long = self.cli("invoke", "greet", "--data", '{"who": "bo", "pause": 3600}').stdout.strip()
        wait_until(lambda: json.loads(self.cli("trace", long, "--json").stdout)["status"] == "sleeping",
                   what="the sleeping run")
        self.assertIn("cancel", self.cli("cancel", long).stdout)
        wait_until(lambda: json.loads(self.cli("trace", long, "--json").stdout)["status"] == "cancelled",
                   what="the cancellation")
        self.assertIn("already cancelled", self.cli("cancel", long, check=1).stderr)
        self.assertFalse(os.path.exists(os.path.join(self.w.path, "not-used.db")))

    def test_wrong_token_and_run_refused(self):
        self.w.env["MOONLOOP_TOKEN"] = "wrong"
        r = self.cli("send", "hello", "--data", "{}", check=1)
        self.assertIn("wrong token", r.stderr)
        r = self.cli("run", "skills/greet.lua", check=2)
        self.assertIn("invoke SKILL --wait --server", r.stderr)
