"""Text from skills against the operator's terminal (docs/security.md,
"Terminal output").

One payload holds every kind of control a terminal obeys: OSC 0 (title),
OSC 52 (clipboard), OSC 8 (hidden link), CSI 2J (clear), a carriage
return that forges a line, BEL, DEL, C1 CSI both as U+009B and as a lone
0x9b byte, and the bidirectional controls (RLO, RLI, RLM, ALM). It goes
into every text field a skill controls (description, trigger event name,
log lines, step ids, outputs, errors, attempt errors, load errors, file
names, event names and keys, test names), and every command that prints
them is run: the raw bytes of its output must hold none of those controls,
and must show them escaped (\\x1b, \\u202e). --json output stays exact.
"""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from seclib import BIN, Engine, wait_until  # noqa: E402

# The payload, as Lua source (decimal escapes) and as the text it makes.
LUA_P = (r'"[\27]0;owned\7|\27]52;c;cHduZWQ=\7|\27[2J|\rforged|\127|\194\155|\155|'
         r'\226\128\174|\226\129\167|\226\128\143|\216\156|\27]8;;http://x\7link\27]8;;\7]"')
P = ("[\x1b]0;owned\x07|\x1b]52;c;cHduZWQ=\x07|\x1b[2J|\rforged|\x7f|\u009b|\udc9b|"
     "\u202e|\u2067|\u200f|\u061c|\x1b]8;;http://x\x07link\x1b]8;;\x07]")
# Printed escaped (the lone 0x9b byte as \x9b, U+009B as \u009b).
SHOWN = (r"[\x1b]0;owned\x07|\x1b]52;c;cHduZWQ=\x07|\x1b[2J|\x0dforged|\x7f|\u009b|\x9b|"
         r"\u202e|\u2067|\u200f|\u061c|\x1b]8;;http://x\x07link\x1b]8;;\x07]")
# What went through JSON (the HTTP API, a stored output, a run record read
# back from the store in either mode) lost the lone byte: JSON cannot hold
# it, and the store's record writer shows it as U+FFFD (docs/api.md).
SHOWN_API = SHOWN.replace(r"\x9b", "\ufffd")
# Inside JSON text the C0 escapes are JSON's own, and the lone byte is U+FFFD.
SHOWN_JSON = r"[\u001b]0;owned\u0007|\u001b]52;c;cHduZWQ=\u0007|\u001b[2J|\rforged|\u007f|\u009b|"
P_API = P.replace("\udc9b", "\ufffd")

EVIL = """
return {
  id = "evil", description = "about " .. %(p)s, retries = 1,
  triggers = { { event = "ev" .. %(p)s } },
  run = function(ctx)
    log.info("run log " .. %(p)s)
    local o = ctx.step.run("step" .. %(p)s, function()
      log.warn("step log " .. %(p)s)
      return { out = %(p)s }
    end)
    if ctx.input and ctx.input.fail then
      ctx.step.run("flaky", function() error("attempt " .. %(p)s) end)
    end
    return "result " .. %(p)s
  end,
}
""" % {"p": LUA_P}
BROKEN = 'error("load " .. %s)\n' % LUA_P
EVIL_TEST = """
local t = test.skill("evil.lua")
t:case("case " .. %(p)s, function(c)
  c:eq(c:run({}), "not " .. %(p)s)
end)
""" % {"p": LUA_P}

# Bytes a terminal obeys: C0 but \\n and \\t, DEL, C1 as UTF-8, bidi controls.
DANGER = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8e\x8f\xaa-\xae]|"
                    rb"\xe2\x81[\xa6-\xa9]|\xd8\x9c")


class TerminalOutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.e = Engine({"evil": EVIL})
        cls.addClassCleanup(cls.e.close)
        w = cls.e.w
        w.write("skills/evil_test.lua", EVIL_TEST)
        # Written once serve runs, so what it logs about them comes after
        # "listening on": a file that fails to load, and a file whose name
        # is the payload's controls.
        w.write("skills/broken.lua", BROKEN)
        w.write("skills/name\x1b[2J\u202e.lua", 'return { id = "oddname", run = function() end }\n')
        cls.env = dict(w.env, NO_COLOR="1")
        wait_until(lambda: (cls.e.skill("oddname") or {}).get("version") and
                   (cls.e.skill("broken") or {}).get("error"), timeout=10,
                   what="the new files to be seen")
        r = cls.ml("send", "ev" + P, "--data", '{"k": 1}', "--id", "key" + P)
        assert r.returncode == 0, r.stderr
        cls.ok_id = wait_until(lambda: [x["id"] for x in cls.e.runs("evil", "completed")],
                               timeout=20, what="the evil run")[0]
        r = cls.ml("invoke", "evil", "--data", '{"fail": true}', "--wait", "--server", cls.e.url)
        cls.failed_id = wait_until(lambda: [x["id"] for x in cls.e.runs("evil", "failed")],
                                   timeout=20, what="the failed run")[0]


    @classmethod
    def ml(cls, *args, input=None, timeout=60):
        return subprocess.run([BIN] + list(args), cwd=cls.e.w.path, env=cls.env, input=input,
                              capture_output=True, timeout=timeout)

    def assert_safe(self, what, out, shown=(SHOWN,)):
        m = DANGER.search(out)
        if m:
            i = m.start()
            self.fail("%s printed a raw control %r at %d: ...%r..." % (what, m.group(), i,
                                                                     out[max(0, i - 40):i + 40]))
        for s in shown:
            self.assertIn(s.encode(), out, "%s did not show the escaped payload:\n%s" % (
                what, out.decode("utf-8", "replace")))

    def test_trace(self):
        for where in ((), ("--server", self.e.url)):
            with self.subTest(where=where):
                r = self.ml("trace", self.ok_id, *where)
                self.assertEqual(r.returncode, 0, r.stderr)
                # Event name and key, run log, step id, step log, step output, run output.
                shown = SHOWN_API
                self.assert_safe("trace", r.stdout, (
                    "event ev" + shown, "run log " + shown, "step" + shown,
                    "step log " + shown, SHOWN_JSON))
                r = self.ml("trace", self.failed_id, *where)
                self.assert_safe("trace of the failed run", r.stdout, ("attempt " + shown,))

    def test_runs_and_skills(self):
        for where in ((), ("--server", self.e.url)):
            with self.subTest(where=where):
                r = self.ml("runs", *where)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assert_safe("runs", r.stdout, ())
                r = self.ml("skills", *where)
                self.assertEqual(r.returncode, 0, r.stderr)
                # Trigger event names, load errors, file names.
                # (The triggers column is cut at 36 characters.)
                self.assert_safe("skills", r.stdout, (r"event ev[\x1b]0;owned",
                                                      "load " + (SHOWN_API if where else SHOWN),
                                                      r"name\x1b[2J\u202e.lua"))

    def test_run_and_invoke_wait(self):
        for args in (("run", "skills/evil.lua", "-v"), ("invoke", "evil", "--wait", "--server", self.e.url)):
            with self.subTest(args=args):
                r = self.ml(*args)
                self.assertEqual(r.returncode, 0, r.stderr)
                # The output is still JSON, and decodes to the payload.
                self.assertEqual(json.loads(r.stdout), "result " + P_API)
                self.assert_safe(" ".join(args) + " (stdout)", r.stdout, ())
                self.assert_safe(" ".join(args) + " (stderr)", r.stderr, ())
                if args[0] == "run":
                    self.assert_safe("run -v", r.stderr, ("run log " + SHOWN, "step" + SHOWN))
        for args in (("run", "skills/evil.lua", "--data", '{"fail": true}'),
                     ("invoke", "evil", "--data", '{"fail": true}', "--wait", "--server", self.e.url)):
            with self.subTest(args=args):
                r = self.ml(*args)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assert_safe(" ".join(args), r.stderr,
                                 ("attempt " + (SHOWN_API if "--server" in args else SHOWN),))

    def test_check_and_test(self):
        r = self.ml("check", "skills/broken.lua", "skills/evil.lua", "skills/name\x1b[2J\u202e.lua")
        self.assertEqual(r.returncode, 1)
        self.assert_safe("check (stderr)", r.stderr, ("load " + SHOWN,))
        self.assert_safe("check (stdout)", r.stdout, (r"name\x1b[2J\u202e.lua",))
        r = self.ml("test", "skills/evil_test.lua")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assert_safe("test", r.stdout, ("case " + SHOWN, r"not [\u001b]0;owned\u0007"))

    def test_repl(self):
        lines = "\n".join([
            'skill("evil")',
            'skills.get("evil").description',
            'print("print " .. %s)' % LUA_P,
            'run("evil", {})',
            'error("raised " .. %s)' % LUA_P,
            'runs{skill = "evil"}',
            'trace("%s")' % self.ok_id,
        ]) + "\n"
        r = self.ml("repl", "--workspace", "skills", input=lines.encode())
        self.assert_safe("repl (stdout)", r.stdout, ("print " + SHOWN, "run log " + SHOWN_API,
                                                      r'"about [\027]0;owned\007|'))
        self.assert_safe("repl (stderr)", r.stderr, ("raised " + SHOWN, "step" + SHOWN))

    def test_serve_log_lines(self):
        out = "".join(self.e.p.stderr_lines).encode("utf-8", "surrogateescape")
        self.assert_safe("serve's stderr", out, ("load " + SHOWN, r"name\x1b[2J\u202e.lua"))

    def test_json_stays_exact(self):
        r = self.ml("trace", self.ok_id, "--json")
        run = json.loads(r.stdout.decode("utf-8", "surrogateescape"))
        # Bytes that are not UTF-8 become U+FFFD in the JSON answers (api.md);
        # everything else is the payload as the skill wrote it.
        self.assertEqual(run["output"], "result " + P_API)
        self.assertEqual(run["steps"][0]["id"], "step" + P_API)
        self.assertEqual(run["trigger"]["event"]["name"], "ev" + P_API)
        self.assertIn(b"\xe2\x80\xae", r.stdout)  # U+202E as itself, not escaped
        r = self.ml("runs", "--json")
        self.assertEqual(r.returncode, 0)
        json.loads(r.stdout)


if __name__ == "__main__":
    unittest.main()
