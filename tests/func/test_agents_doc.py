"""docs/agents.md runs as written.

The page's examples are extracted from the markdown and run in order, in a
fresh folder, against a real `moonloop serve`:
  - a ```lua block whose first line is `-- PATH.lua` is written to PATH;
    for a skill file under skills/ (not a test, *_test.lua), the test waits
    until the engine has taken it (its version is live, or its rejection
    is recorded), as an agent would check with `moonloop skills`;
  - in a ```sh block, each line starting with `$ ` is a command, run by
    bash with `moonloop` on the PATH; a command ending in `&` is started in
    the background (the engine); the lines after a command are its output
    (stdout and stderr together), where `...` matches any text within a
    line and a line of only `...` matches any number of lines; RUN_ID in a
    command is the newest run's id.
The `runs` module part (between the `begin: runs module` and
`end: runs module` markers) runs when the engine has the module.
"""
import calendar
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, SRC, TestCase, lines_match, wait_until  # noqa: E402

DOC = os.path.join(SRC, "docs", "agents.md")


def blocks(text):
    """[(kind, body, in_runs_part)] for every lua and sh block, in order."""
    begin = text.find("<!-- begin: runs module -->")
    end = text.find("<!-- end: runs module -->")
    out = []
    for m in re.finditer(r"^```(lua|sh)\n(.*?)^```", text, re.S | re.M):
        inside = begin >= 0 and begin < m.start() < end
        out.append((m.group(1), m.group(2), inside))
    return out


def commands(body):
    """[(command, [expected output lines])] of a sh block."""
    out = []
    for line in body.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        elif line.strip():
            raise AssertionError("output before any command in a sh block: %r" % line)
    return out


class AgentsDocTest(TestCase):
    env_names = ()

    def setUp(self):
        super().setUp()
        self.bindir = tempfile.mkdtemp(prefix="mltest-bin-")
        os.symlink(os.path.abspath(BIN), os.path.join(self.bindir, "moonloop"))
        self.w.env["PATH"] = self.bindir + os.pathsep + self.w.env.get("PATH", "")

    def tearDown(self):
        super().tearDown()
        os.unlink(os.path.join(self.bindir, "moonloop"))
        os.rmdir(self.bindir)

    def has_runs_module(self):
        """Whether skills see the runs module (a run in a throwaway folder)."""
        d = tempfile.mkdtemp(prefix="mltest-probe-")
        try:
            with open(os.path.join(d, "probe.lua"), "w") as f:
                f.write('return { run = function(ctx) return ctx.step.run("p", function()\n'
                        '  return type(runs.list({ limit = 1 })) == "table" end) end }\n')
            env = dict(self.w.env, MOONLOOP_DB=os.path.join(d, "probe.db"))
            r = subprocess.run([BIN, "run", "probe.lua"], cwd=d, env=env, capture_output=True,
                               text=True, timeout=60)
            return r.returncode == 0 and r.stdout.strip() == "true"
        finally:
            subprocess.run(["rm", "-rf", d])

    def skill_state(self, path):
        """(live version, error) of the skill registered from path."""
        r = self.w.ml("skills", "--json")
        if r.returncode != 0:
            return None, None
        for s in json.loads(r.stdout):
            err = s.get("error") or {}
            if s.get("file") == path or err.get("file") == path:
                return s.get("version") if s.get("file") == path else None, err or None
        return None, None

    def wait_taken(self, path, text, since):
        want = hashlib.sha256(text.encode()).hexdigest()

        def taken():
            version, err = self.skill_state(path)
            if version == want:
                return True
            if err and err.get("file") == path:
                at = calendar.timegm(time.strptime(err["at"][:19], "%Y-%m-%dT%H:%M:%S"))
                return at >= int(since) - 1
            return False
        wait_until(taken, timeout=10, what="the engine to take " + path)

    def start_background(self, cmd):
        p = subprocess.Popen(["bash", "-c", "exec " + cmd.rstrip("& ")], cwd=self.w.path,
                             env=self.w.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        self.w.procs.append(p)
        lines = []
        threading.Thread(target=lambda: [lines.append(l) for l in p.stderr], daemon=True).start()
        wait_until(lambda: any("listening on" in l for l in lines) or p.poll() is not None,
                   timeout=20, what="%r to start" % cmd)
        self.assertIsNone(p.poll(), "".join(lines))

    def newest_run(self):
        return self.w.json("runs", "--limit", "1")[0]["id"]

    def test_every_example_runs_as_shown(self):
        with open(DOC) as f:
            doc = f.read()
        runs_module = self.has_runs_module()
        ran = {"lua": 0, "sh": 0}
        for kind, body, in_runs_part in blocks(doc):
            if in_runs_part and not runs_module:
                print("test_agents_doc: the runs module is not in this engine: its examples skipped",
                      file=sys.stderr)
                continue
            ran[kind] += 1
            if kind == "lua":
                first = body.splitlines()[0]
                m = re.match(r"-- ([\w./-]+\.lua)$", first)
                self.assertTrue(m, "a lua block must start with '-- PATH.lua': %r" % first)
                path = m.group(1)
                since = time.time()
                self.w.write(path, body)
                if path.startswith("skills/") and not path.endswith("_test.lua"):
                    self.wait_taken(path, body, since)
                continue
            for cmd, expected in commands(body):
                with self.subTest(command=cmd):
                    if cmd.rstrip().endswith("&"):
                        self.start_background(cmd)
                        continue
                    if "RUN_ID" in cmd:
                        cmd = cmd.replace("RUN_ID", self.newest_run())
                    r = subprocess.run(["bash", "-c", cmd], cwd=self.w.path, env=self.w.env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       timeout=60)
                    self.assertIn(r.returncode, (0, 1), r.stdout)
                    self.assertTrue(lines_match(expected, r.stdout.splitlines()),
                                    "$ %s\n--- expected:\n%s\n--- got:\n%s" % (
                                        cmd, "\n".join(expected), r.stdout))
        # The page has its parts: files, and commands.
        self.assertGreaterEqual(ran["lua"], 5)
        self.assertGreaterEqual(ran["sh"], 6)

    def test_the_matcher_can_fail(self):
        self.assertTrue(lines_match(["run ...", "{\"a\":1}"], ["run 01ABC", "{\"a\":1}"]))
        self.assertTrue(lines_match(["x", "...", "z"], ["x", "y1", "y2", "z"]))
        self.assertTrue(lines_match(["x", "...", "z"], ["x", "z"]))
        self.assertFalse(lines_match(["{\"a\":1}"], ["{\"a\":2}"]))
        self.assertFalse(lines_match(["x"], ["x", "extra"]))
        self.assertFalse(lines_match(["a...b"], ["a-c"]))


if __name__ == "__main__":
    unittest.main()
