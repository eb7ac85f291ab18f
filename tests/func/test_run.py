"""moonloop run, runs and trace: running a skill in this process and reading what ran."""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SRC, TestCase, wait_until  # noqa: E402

HELLO = """
return {
  id = "hello",
  description = "says hello",
  run = function(ctx)
    local a = ctx.step.run("greet", function()
      log.info("greeting", ctx.input.who)
      return { text = "hello " .. ctx.input.who }
    end)
    for i = 1, 3 do ctx.step.run("count", function() return i end) end
    return { greeting = a.text, key = ctx.run_id }
  end,
}
"""


class RunTest(TestCase):
    def test_run_prints_output_on_stdout_and_id_on_stderr_first(self):
        self.w.write("hello.lua", HELLO)
        r = self.w.ml("run", "hello.lua", "--data", '{"who":"ada"}', check=0)
        run_id = self.run_id_of(r)
        self.assertTrue(r.stderr.startswith("run " + run_id))
        out = json.loads(r.stdout)
        self.assertEqual(out["greeting"], "hello ada")
        self.assertEqual(out["key"], run_id)

    def test_trace_json_is_the_design_run_record(self):
        self.w.write("hello.lua", HELLO)
        run_id = self.run_id_of(self.w.ml("run", "hello.lua", "--data", '{"who":"bo"}', check=0))
        t = self.w.trace(run_id)
        for k in ("id", "skill", "version", "status", "trigger", "parent_id", "input", "output",
                  "error", "created_at", "started_at", "ended_at", "steps"):
            self.assertIn(k, t)
        self.assertEqual(t["status"], "completed")
        self.assertEqual(t["skill"], "hello")
        self.assertEqual(len(t["version"]), 64)
        self.assertEqual(t["trigger"]["kind"], "invoke")
        self.assertEqual(t["input"], {"who": "bo"})
        self.assertEqual([s["id"] for s in t["steps"]], ["greet", "count", "count#2", "count#3"])
        greet = t["steps"][0]
        self.assertEqual(greet["kind"], "run")
        self.assertEqual(greet["status"], "completed")
        self.assertEqual(greet["output"], {"text": "hello bo"})
        self.assertEqual(greet["attempts"][0]["n"], 1)
        self.assertEqual(greet["attempts"][0]["status"], "completed")
        self.assertEqual(greet["logs"][0]["msg"], "greeting bo")
        self.assertEqual(greet["logs"][0]["level"], "info")
        self.assertEqual(t["steps"][3]["output"], 3)
        for s in t["steps"]:
            self.assertTrue(s["started_at"].endswith("Z"))

    def test_trace_tree_for_people(self):
        self.w.write("hello.lua", HELLO)
        run_id = self.run_id_of(self.w.ml("run", "hello.lua", "--data", '{"who":"cy"}', check=0))
        r = self.w.ml("trace", run_id, check=0)
        self.assertIn("run " + run_id, r.stdout)
        self.assertIn("completed", r.stdout)
        self.assertIn("count#3", r.stdout)
        self.assertIn("greeting cy", r.stdout)

    def test_runs_lists_newest_first_with_filters(self):
        self.w.write("hello.lua", HELLO)
        self.w.write("other.lua", 'return { run = function() return 1 end }')
        a = self.run_id_of(self.w.ml("run", "hello.lua", "--data", '{"who":"a"}', check=0))
        b = self.run_id_of(self.w.ml("run", "other.lua", check=0))
        runs = self.w.runs()
        self.assertEqual([r["id"] for r in runs], [b, a])
        self.assertEqual([r["id"] for r in self.w.runs(skill="hello")], [a])
        self.assertEqual(runs[0]["skill"], "other")  # default id from the file name
        self.assertEqual(self.w.runs(status="failed"), [])
        table = self.w.ml("runs", check=0).stdout
        self.assertIn("RUN", table.splitlines()[0])
        self.assertIn(a, table)

    def test_failed_run_exits_1_with_error_on_stderr(self):
        self.w.write("bad.lua", """
return { retries = 0, run = function(ctx)
  ctx.step.run("explode", function() error("the disk is on fire") end)
end }""")
        r = self.w.ml("run", "bad.lua", check=1)
        self.assertEqual(r.stdout, "")
        self.assertIn("the disk is on fire", r.stderr)
        t = self.w.trace(self.run_id_of(r))
        self.assertEqual(t["status"], "failed")
        self.assertEqual(t["error"]["step"], "explode")
        self.assertIn("the disk is on fire", t["error"]["message"])
        self.assertEqual(t["steps"][0]["status"], "failed")

    def test_bad_data_is_a_usage_error(self):
        self.w.write("hello.lua", HELLO)
        r = self.w.ml("run", "hello.lua", "--data", "{nope", check=2)
        self.assertIn("--data is not valid JSON", r.stderr)
        self.assertFalse(os.path.exists(self.w.db) and self.w.runs())

    def test_unknown_command_and_option_are_usage_errors(self):
        self.assertIn("unknown command", self.w.ml("frobnicate", check=2).stderr)
        self.assertIn("unknown option '--bogus'", self.w.ml("runs", "--bogus", check=2).stderr)

    def test_extra_arguments_are_usage_errors_naming_them(self):
        cases = [
            (["skills", "extra"], "skills: unexpected argument 'extra'"),
            (["runs", "extra"], "runs: unexpected argument 'extra'"),
            (["runs", "--json", "one", "two"], "runs: unexpected argument 'one'"),
            (["prune", "--older-than", "1d", "extra"], "prune: unexpected argument 'extra'"),
            (["serve", "extra"], "serve: unexpected argument 'extra'"),
            (["repl", "extra"], "repl: unexpected argument 'extra'"),
            (["sidecar", "extra", "--workspace", "w", "--server", "http://127.0.0.1:1"],
             "sidecar: unexpected argument 'extra'"),
            (["trace", "a", "b"], "trace: unexpected argument 'b'"),
            (["cancel", "a", "b"], "cancel: unexpected argument 'b'"),
            (["rerun", "a", "b"], "rerun: unexpected argument 'b'"),
            (["send", "a", "b"], "send: unexpected argument 'b'"),
            (["invoke", "a", "b"], "invoke: unexpected argument 'b'"),
            (["run", "a.lua", "b"], "run: unexpected argument 'b'"),
            (["run", "--resume", "a", "b"], "takes no other argument, got 'b'"),
        ]
        for args, want in cases:
            with self.subTest(args=args):
                r = self.w.ml(*args, check=2, timeout=30)
                self.assertIn(want, r.stderr)
                self.assertEqual(r.stdout, "")
        self.assertFalse(os.path.exists(self.w.db))  # refused before anything was opened

    def test_an_unknown_skill_or_run_is_a_failed_request(self):
        self.w.ml("runs", check=0)  # the database exists
        for args in (["invoke", "nosuch"], ["invoke", "nosuch", "--wait"], ["run", "nosuch"],
                     ["run", "--resume", "nosuch"], ["trace", "nosuch"], ["cancel", "nosuch"],
                     ["rerun", "nosuch"]):
            with self.subTest(args=args):
                r = self.w.ml(*args, check=1)
                self.assertIn("nosuch", r.stderr)

    def test_version(self):
        for args in (["--version"], ["version"]):
            r = self.w.ml(*args, check=0)
            self.assertRegex(r.stdout, r"^moonloop \d+\.\d+\.\d+\n$")
        self.assertRegex(self.w.ml("version", "--json", check=0).stdout, r'^\{"version":"\d+\.\d+\.\d+"(,"faults":true)?\}\n$')
        self.w.write("moonloop.conf.lua", "return {")  # a broken configuration does not stop it
        self.w.ml("--version", check=0)
        self.assertIn("moonloop version", self.w.ml("--help", check=0).stdout)

    def test_every_usage_line_lists_every_flag_its_command_takes(self):
        # Which command takes which flag: main.c's tables (the parser's own).
        with open(os.path.join(SRC, "engine", "cli", "main.c")) as f:
            main_c = f.read()
        bits = dict(re.findall(r'\{"(\w+)", (C_\w+), ', main_c))
        table = main_c[main_c.index("static const struct option options[]"):]
        flags = re.findall(r'\{"([a-z][a-z-]*)", [01], ([A-Z_ |]+),', table[:table.index("{NULL")])
        flags = [(n, m.strip()) for n, m in flags]
        self.assertIn(("follow", "C_RUNS"), flags)
        helptext = self.w.ml("--help", check=0).stdout
        general = helptext[helptext.index("options for every command"):]
        commands = re.findall(r"^  moonloop (\w+)", helptext, re.M)
        self.assertEqual(sorted(commands), sorted(bits))
        for cmd in commands:
            usage = self.w.ml(cmd, "--help", check=0).stdout
            # What it does, and where the options every command takes are
            # (`help serve` showed one line, and not --db).
            self.assertEqual(usage, self.w.ml("help", cmd, check=0).stdout)
            self.assertIn("and the options for every command: --db PATH, --config FILE", usage)
            self.assertNotIn("(no description)", usage)
            for name, mask in flags:
                if mask == "C_ALL" or bits[cmd] in mask.split(" | "):
                    with self.subTest(command=cmd, flag=name):
                        self.assertTrue("--" + name in usage or (mask == "C_ALL" and "--" + name in general),
                                        "--%s is not in %r" % (name, usage))
        # The parser agrees with what was read: runs takes --follow, skills does not.
        self.w.ml("runs", "--follow", "--help", check=0)
        self.assertIn("unknown option '--follow'", self.w.ml("skills", "--follow", check=2).stderr)

    def test_a_flag_without_its_value_says_so(self):
        cases = [
            (["--config"], "moonloop: --config needs a value"),
            (["--db"], "moonloop: --db needs a value"),
            (["--json", "--server"], "moonloop: --server needs a value"),
            (["--config", "--json", "runs"], "moonloop: --config needs a value"),
            (["runs", "--skill"], "runs: --skill needs a value"),
            (["runs", "--skill", "--json"], "runs: --skill needs a value"),
            (["runs", "--db="], "runs: --db needs a value"),
            (["send", "x", "--data"], "send: --data needs a value"),
            (["prune", "--older-than"], "prune: --older-than needs a value"),
            (["serve", "--workspace", "--listen", "127.0.0.1:0"], "serve: --workspace needs a value"),
        ]
        for args, want in cases:
            with self.subTest(args=args):
                r = self.w.ml(*args, check=2, timeout=30)
                self.assertIn(want, r.stderr)
                self.assertNotIn("usage: moonloop COMMAND", r.stderr)
        # A value that only looks like a flag is still a value.
        self.assertEqual(self.w.ml("send", "x", "--data", "-1", "--json", check=0).returncode, 0)

    def test_database_paths_that_cannot_work_say_why(self):
        self.w.write("notdb", "hello, I am text\n" * 100)
        self.w.write("afile", "")
        # A database whose schema page was written over (it said only
        # "setting WAL mode: database disk image is malformed").
        self.w.ml("send", "x", "--db", "damaged", check=0)
        with sqlite3.connect(os.path.join(self.w.path, "damaged")) as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with open(os.path.join(self.w.path, "damaged"), "r+b") as f:
            f.seek(100)
            f.write(b"\xff" * 200)
        cases = [
            ("nodir/x.db", "cannot open database 'nodir/x.db': the folder 'nodir' does not exist"),
            ("afile/x.db", "cannot open database 'afile/x.db': 'afile' is not a folder"),
            (".", "cannot open database '.': it is a folder, not a file"),
            ("notdb", "'notdb' is not a moonloop database (SQLite: file is not a database)"),
            ("damaged", "'damaged' is damaged (SQLite: database disk image is malformed): put it back "
                        "from a backup; `sqlite3 damaged .recover` saves what can still be read"),
        ]
        for db, want in cases:
            for cmd in (["runs"], ["send", "e"], ["run", "--resume", "x"]):
                with self.subTest(db=db, cmd=cmd):
                    r = self.w.ml(*cmd, "--db", db, check=1)
                    self.assertEqual(r.stderr.strip(), "moonloop: " + want)
        self.assertFalse(os.path.exists(os.path.join(self.w.path, "nodir")))

    def test_step_results_must_be_json(self):
        self.w.write("fn.lua", """
return { run = function(ctx)
  return ctx.step.run("give-fn", function() return { cb = function() end } end)
end }""")
        r = self.w.ml("run", "fn.lua", check=1)
        self.assertIn("not a JSON value", r.stderr)
        self.assertIn("$.cb", r.stderr)
        t = self.w.trace(self.run_id_of(r))
        # Not retried: a function will not become JSON on the next attempt.
        self.assertEqual(len(t["steps"][0]["attempts"]), 1)

    def test_step_output_limit_from_config(self):
        self.w.write("moonloop.conf.lua", 'return { limits = { step_output = "1KB" } }')
        self.w.write("big.lua", """
return { run = function(ctx)
  return ctx.step.run("big", function() return string.rep("x", 5000) end)
end }""")
        r = self.w.ml("run", "big.lua", check=1)
        self.assertIn("over the limit of 1.0 KB", r.stderr)

    def test_run_a_registered_skill_by_id(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/greeter.lua", 'return { id = "greeter", run = function(ctx) return ctx.input end }')
        # serve registers the workspace; stop it at once.
        p = self.w.serve("--workspace", "skills")
        p.terminate()
        p.wait(timeout=10)
        r = self.w.ml("run", "greeter", "--data", '[1,2]', check=0)
        self.assertEqual(json.loads(r.stdout), [1, 2])
        r = self.w.ml("run", "nosuch", check=1)
        self.assertIn("no skill 'nosuch'", r.stderr)

    def test_run_leaves_events_to_the_engine_that_holds_the_triggers(self):
        # On a new database, `moonloop run` holds no triggers: the event
        # sent before it must start its run once serve has registered the
        # workspace, not be marked dispatched with nothing started.
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/greet.lua", """
return { id = "greet", triggers = { { event = "greet" } }, run = function(ctx)
  return "hello " .. ctx.event.data.who
end }""")
        self.w.write("skills/slow.lua", """
return { id = "slow", run = function(ctx) ctx.step.sleep("nap", "300ms") return 1 end }""")
        self.w.ml("send", "greet", "--data", '{"who": "ada"}', check=0)
        self.assertEqual(self.w.ml("run", "skills/slow.lua", check=0).stdout.strip(), "1")
        self.assertEqual(self.w.runs(skill="greet"), [])
        p = self.w.serve("--workspace", "skills")
        wait_until(lambda: [r for r in self.w.runs(skill="greet") if r["status"] == "completed"],
                   what="the greet run")
        self.assertEqual([r["output"] for r in self.w.runs(skill="greet")], ["hello ada"])
        p.terminate()
        p.wait(timeout=20)

    def test_a_run_here_gets_the_events_it_waits_for(self):
        # No engine serves the database: the run in `moonloop run` gets the
        # events sent while it waits, and one sent before its wait.
        self.w.write("w.lua", """
return { id = "w", run = function(ctx)
  local a = ctx.step.wait_for_event("a", { event = "a", timeout = "30s" })
  ctx.step.sleep("nap", "3s")  -- long enough for a loaded machine's polls to see it
  local b = ctx.step.wait_for_event("b", { event = "b", timeout = "30s" })
  local c = ctx.step.wait_for_event("c", { event = "c", timeout = "30s" })
  return { a.data, b.data, c.data }
end }""")
        p = self.w.start("run", "w.lua")

        def steps():
            runs = self.w.runs(skill="w")
            return [s["status"] for s in self.w.trace(runs[0]["id"])["steps"]] if runs else []
        wait_until(lambda: steps() == ["waiting"], what="the first wait")
        self.w.ml("send", "a", "--data", "1", check=0)
        wait_until(lambda: steps()[:2] == ["completed", "sleeping"], what="the nap")
        self.w.ml("send", "b", "--data", "2", check=0)
        wait_until(lambda: steps() == ["completed", "completed", "completed", "waiting"], what="the last wait")
        self.w.ml("send", "c", "--data", "3", check=0)
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(json.loads(out), [1, 2, 3])


class InterruptTest(TestCase):
    def test_an_interrupted_run_says_how_it_goes_on_and_goes_on(self):
        # The signal killed `moonloop run` without a word; the run then
        # waited, sleeping, for its lease to end.
        self.w.write("nap.lua", 'return { id = "nap", run = function(ctx)\n'
                     '  local a = ctx.step.run("a", function() return 1 end)\n'
                     '  ctx.step.sleep("z", 1.5)\n'
                     '  return a + ctx.step.run("b", function() return 1 end)\nend }\n')
        p = self.w.start("run", "nap.lua", stdout=subprocess.PIPE)
        first = p.stderr.readline()
        rid = re.search(r"run (\w{26})", first).group(1)
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the nap")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 130, err)
        self.assertIn("moonloop: interrupted: run %s stopped after its last completed step, which is kept; "
                      "`moonloop run --resume %s` goes on with it" % (rid, rid), err)
        t = self.w.trace(rid)
        self.assertEqual([s["id"] for s in t["steps"] if s["status"] == "completed"], ["a"])
        r = self.w.ml("run", "--resume", rid, check=0, timeout=30)
        self.assertEqual(json.loads(r.stdout), 2)
