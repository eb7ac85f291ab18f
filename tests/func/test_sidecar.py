"""The sidecar: hot-loading the skill files of the workspace into a running
engine (`moonloop serve`), and the standalone `moonloop sidecar`.

Real serve, real files, real HTTP. A version is the SHA-256 of a file's
bytes: the tests compute it here and poll GET /v1/skills/{id} until the
engine's live version is that hash.
"""
import calendar
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, TestCase, kill9, wait_until  # noqa: E402


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


# A skill whose runs park in a sleep and then report the code they ran.
NAPPER = """
return {
  id = "napper",
  run = function(ctx)
    ctx.step.sleep("nap", ctx.input and ctx.input.s or 0)
    return ctx.step.run("report", function() return { code = "%s", version = ctx.version } end)
  end,
}
"""


def simple(sid, mark, extra=""):
    return 'return {\n  id = "%s",%s\n  run = function(ctx) return "%s" end,\n}\n' % (sid, extra, mark)


class Serve:
    """`moonloop serve` on a free port; .url once it printed "listening on"."""

    def __init__(self, w, workspace="skills", env=None):
        self.p = w.serve("--workspace", workspace, "--listen", "127.0.0.1:0", env=env,
                         stdout=subprocess.DEVNULL)
        self.url, self.port, self.lines = self.p.url, self.p.port, self.p.stderr_lines

    def log(self):
        return "".join(self.lines)

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            headers = {}
            if body:
                headers["Content-Type"] = "text/x-lua" if method == "PUT" else "application/json"
            c.request(method, path, body=body, headers=headers)
            r = c.getresponse()
            data = r.read()
            return r.status, json.loads(data) if data else None
        finally:
            c.close()

    def skill(self, sid):
        st, b = self.request("GET", "/v1/skills/%s" % sid)
        return b if st == 200 else None

    def version(self, sid):
        s = self.skill(sid)
        return s and s["version"]

    def invoke(self, sid, data=None, wait=True):
        body = {"data": data}
        if wait:
            body["wait"] = 30
        return self.request("POST", "/v1/skills/%s/invoke" % sid, body)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout=20)


class SidecarTest(TestCase):
    def setUp(self):
        super().setUp()
        self.ws = os.path.join(self.w.path, "skills")
        os.makedirs(self.ws)

    def put(self, name, text):
        """Write a skill file the usual way (open, write, close)."""
        p = os.path.join(self.ws, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
        return p

    def live(self, srv, sid, text, timeout=10):
        """Wait until text is sid's live version."""
        want = sha(text)
        wait_until(lambda: srv.version(sid) == want, timeout=timeout,
                   what="%s's version to be %s" % (sid, want[:12]))

    # ---- versions ------------------------------------------------------------

    def test_runs_in_flight_finish_on_their_version_new_runs_take_the_new_one(self):
        v1 = NAPPER % "v1"
        self.put("napper.lua", v1)
        srv = Serve(self.w)
        self.assertEqual(srv.version("napper"), sha(v1))
        ids = [srv.invoke("napper", {"s": 4}, wait=False)[1]["run_id"] for _ in range(50)]
        wait_until(lambda: len(self.w.runs(skill="napper", status="sleeping")) == 50,
                   what="50 runs asleep")
        v2 = NAPPER % "v2"
        self.put("napper.lua", v2)
        self.live(srv, "napper", v2)
        # The change went live while all 50 were parked.
        self.assertEqual(len(self.w.runs(skill="napper", status="sleeping")), 50)
        st, out = srv.invoke("napper", {"s": 0})
        self.assertEqual(st, 200, out)
        self.assertEqual(out["output"], {"code": "v2", "version": sha(v2)})
        wait_until(lambda: len(self.w.runs(skill="napper", status="completed")) == 51,
                   timeout=30, what="the 50 parked runs to finish")
        for rid in ids:
            run = self.w.trace(rid)
            self.assertEqual(run["version"], sha(v1))
            self.assertEqual(run["output"], {"code": "v1", "version": sha(v1)})
        rec = srv.skill("napper")
        self.assertEqual([v["version"] for v in rec["versions"]], [sha(v1), sha(v2)])
        self.assertIn("ok        skills/napper.lua: skill 'napper', version %s" % sha(v2)[:12], srv.log())

    def test_a_restart_replays_old_runs_on_their_own_version(self):
        v1 = NAPPER % "v1"
        self.put("napper.lua", v1)
        srv = Serve(self.w)
        rid = srv.invoke("napper", {"s": 3}, wait=False)[1]["run_id"]
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the run asleep")
        v2 = NAPPER % "v2"
        self.put("napper.lua", v2)
        self.live(srv, "napper", v2)
        kill9(srv.p)
        srv = Serve(self.w)
        self.assertEqual(srv.version("napper"), sha(v2))
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30,
                   what="the old run to finish after the restart")
        self.assertEqual(self.w.trace(rid)["output"], {"code": "v1", "version": sha(v1)})
        self.assertEqual(srv.invoke("napper")[1]["output"]["code"], "v2")

    # ---- rejections --------------------------------------------------------

    def test_rejected_files_keep_the_live_version_and_show_their_error(self):
        good = simple("greet", "v1")
        self.put("greet.lua", good)
        srv = Serve(self.w)
        cases = [
            # (file, source, message pattern, line)
            ("greet.lua", 'return {\n  id = "greet",\n  run = function(ctx) return "x" \n}\n',
             r"'end' expected", 4),
            ("greet.lua", simple("greet", "v2", "\n  retires = 3,"),
             r"unknown key 'retires' in the skill table \(did you mean 'retries'\?\)", 3),
            ("other.lua", '-- a copy\nreturn {\n  id = "greet",\n  run = function() return "dup" end,\n}\n',
             r"skill id 'greet' is already defined by skills/greet.lua", 3),
        ]
        for name, src, pattern, line in cases:
            with self.subTest(file=name, error=pattern):
                before = time.time()
                self.put(name, src)
                path = "skills/" + name

                def rejected():
                    err = srv.skill("greet")["error"]
                    return err and err["file"] == path and re.search(pattern, err["message"]) and err
                err = wait_until(rejected, what="the rejection of " + name)
                self.assertEqual(err["line"], line)
                self.assertGreaterEqual(calendar.timegm(time.strptime(err["at"][:19], "%Y-%m-%dT%H:%M:%S")),
                                        int(before) - 1)
                # The previous version stays live and serves.
                self.assertEqual(srv.version("greet"), sha(good))
                self.assertEqual(srv.invoke("greet")[1]["output"], "v1")
                # moonloop skills: file:line, when, why, what stays.
                out = self.w.ml("skills", check=0).stdout
                self.assertRegex(out, r"rejected %s:%d, (just now|[0-9.]+s ago) \(\d{4}-\d\d-\d\dT[^)]*\): "
                                 % (re.escape(path), line) + pattern)
                self.assertIn("version %s stays live" % sha(good)[:12], out)
                js = {s["id"]: s for s in self.w.json("skills")}
                self.assertEqual(js["greet"]["error"]["file"], path)
                self.assertEqual(js["greet"]["error"]["line"], line)
                self.assertIn("rejected  %s: " % path, srv.log())
                if name == "greet.lua":
                    self.put("greet.lua", good)  # back to the good source: nothing new to load
        self.assertEqual(srv.version("greet"), sha(good))
        self.assertIsNone(srv.skill("other"))

    def test_a_rejected_file_that_is_deleted_is_no_longer_listed(self):
        # Its record (no live version, the refusal) stayed for good.
        srv = Serve(self.w)
        self.put("broken.lua", 'return {\n  id = "broken",\n  run = function(ctx) return 1 \n}\n')
        wait_until(lambda: (srv.skill("broken") or {}).get("error"), what="the rejection")
        os.unlink(os.path.join(self.ws, "broken.lua"))
        wait_until(lambda: srv.skill("broken") is None, what="the refused file's record cleared")
        self.assertNotIn("broken", self.w.ml("skills", check=0).stdout)
        # Deleted while no engine ran: cleared when the next one starts.
        self.put("later.lua", "return {  -- not finished\n")
        wait_until(lambda: (srv.skill("later") or {}).get("error"), what="the second rejection")
        self.assertEqual(srv.stop(), 0)
        os.unlink(os.path.join(self.ws, "later.lua"))
        srv = Serve(self.w)
        wait_until(lambda: srv.skill("later") is None, what="the record cleared at start")
        # A refused duplicate's record is the live skill's: deleting the
        # duplicate leaves the skill as it is.
        good = simple("held", "1")
        self.put("held.lua", good)
        self.live(srv, "held", good)
        self.put("dup.lua", simple("held", "2"))
        wait_until(lambda: (srv.skill("held")["error"] or {}).get("file") == "skills/dup.lua",
                   what="dup.lua rejected")
        os.unlink(os.path.join(self.ws, "dup.lua"))
        time.sleep(0.5)
        self.assertEqual(srv.version("held"), sha(good))
        self.assertEqual(srv.invoke("held")[1]["output"], "1")

    def test_a_fifo_in_the_workspace_holds_nothing_up(self):
        # Opening a FIFO named x.lua waited for a writer: the engine's loop
        # (and every restart, which scans the folder first) hung there.
        os.mkfifo(os.path.join(self.ws, "early.lua"))
        self.put("fx.lua", simple("fx", "1"))
        srv = Serve(self.w)
        self.live(srv, "fx", simple("fx", "1"))
        os.mkfifo(os.path.join(self.ws, "late.lua"))
        self.put("fx.lua", simple("fx", "2"))
        self.live(srv, "fx", simple("fx", "2"))
        self.assertEqual(srv.invoke("fx")[1]["output"], "2")
        # The REPL registers the workspace's files, FIFOs left out.
        r = self.w.ml("repl", "--workspace", "skills", input="1 + 1\n", check=0, timeout=20)
        self.assertIn("workspace skills: 1 skill registered", r.stderr)

    def test_a_file_that_cannot_be_read_is_refused_and_its_live_version_stays(self):
        # Unreadable is not gone (permissions, here a symbolic link that
        # loops): it was unregistered as if deleted, without a word.
        good = simple("fx", "1")
        self.put("fx.lua", good)
        srv = Serve(self.w)
        self.live(srv, "fx", good)
        path = os.path.join(self.ws, "fx.lua")
        os.unlink(path)
        os.symlink("fx.lua", path)
        wait_until(lambda: "cannot read it" in srv.log(), what="the refusal")
        self.assertIn("rejected  skills/fx.lua: cannot read it: Too many levels of symbolic links; its live "
                      "version stays", srv.log())
        time.sleep(0.3)
        self.assertEqual(srv.version("fx"), sha(good))
        self.assertEqual(srv.invoke("fx")[1]["output"], "1")
        os.unlink(path)
        self.put("fx.lua", simple("fx", "2"))
        self.live(srv, "fx", simple("fx", "2"))

    def test_a_rejected_duplicate_gets_the_id_once_its_holder_is_deleted(self):
        a = simple("shared", "from a")
        b = simple("shared", "from b")
        self.put("a.lua", a)
        srv = Serve(self.w)
        self.put("b.lua", b)
        wait_until(lambda: (srv.skill("shared")["error"] or {}).get("file") == "skills/b.lua",
                   what="b.lua rejected")
        self.assertEqual(srv.version("shared"), sha(a))
        os.unlink(os.path.join(self.ws, "a.lua"))
        self.live(srv, "shared", b)
        self.assertEqual(srv.invoke("shared")[1]["output"], "from b")

    # ---- how files are saved -----------------------------------------------

    def test_rapid_writes_truncate_then_write_and_rename_end_on_the_last_content(self):
        self.put("busy.lua", simple("busy", "start"))
        srv = Serve(self.w)
        path = os.path.join(self.ws, "busy.lua")
        # 20 writes in about 100 ms.
        for i in range(20):
            with open(path, "w") as f:
                f.write(simple("busy", "write %d" % i))
            time.sleep(0.005)
        last = simple("busy", "write 19")
        self.live(srv, "busy", last)
        # Truncate, then write in pieces with pauses shorter than the debounce.
        text = simple("busy", "pieces") + "-- " + "x" * 5000 + "\n"
        with open(path, "w") as f:
            f.flush()
            for k in range(0, len(text), 1000):
                f.write(text[k:k + 1000])
                f.flush()
                time.sleep(0.01)
        self.live(srv, "busy", text)
        # Write to a temporary file, then rename over (what most editors do),
        # leaving editor droppings that must never count.
        final = simple("busy", "renamed")
        for junk in (".busy.lua.swp", "busy.lua~", "#busy.lua#", "busy.lua.tmp", ".hidden.lua"):
            with open(os.path.join(self.ws, junk), "w") as f:
                f.write("this is not lua {{{")
        tmp = os.path.join(self.ws, "busy.lua.tmp")
        with open(tmp, "w") as f:
            f.write(final)
        os.rename(tmp, path)
        self.live(srv, "busy", final)
        time.sleep(0.5)  # a last look: nothing else arrives later
        rec = srv.skill("busy")
        self.assertEqual(rec["version"], sha(final))
        self.assertIsNone(rec["error"], rec)
        self.assertEqual(srv.invoke("busy")[1]["output"], "renamed")
        ids = sorted(s["id"] for s in self.w.json("skills"))
        self.assertEqual(ids, ["busy"])
        self.assertNotIn("rejected", srv.log())

    def test_subfolders_and_new_folders_are_watched(self):
        self.put("top.lua", simple("top", "1"))
        self.put("team/inner.lua", simple("inner", "1"))
        srv = Serve(self.w)
        self.assertEqual(srv.version("inner"), sha(simple("inner", "1")))
        os.makedirs(os.path.join(self.ws, "new", "deeper"))
        deep = self.put("new/deeper/deep.lua", simple("deep", "1"))
        self.live(srv, "deep", simple("deep", "1"))
        self.assertEqual(srv.skill("deep")["file"], "skills/new/deeper/deep.lua")
        self.put("new/deeper/deep.lua", simple("deep", "2"))
        self.live(srv, "deep", simple("deep", "2"))
        # A folder moved away takes its skills with it.
        shutil.move(os.path.join(self.ws, "new"), os.path.join(self.w.path, "elsewhere"))
        wait_until(lambda: srv.version("deep") is None, what="deep unregistered")
        self.assertFalse(os.path.exists(deep))
        self.assertEqual(srv.version("top"), sha(simple("top", "1")))

    # ---- deletion and renames ----------------------------------------------

    def test_deleting_a_file_unregisters_the_skill_stops_triggers_and_lets_runs_finish(self):
        src = """
return {
  id = "ticker",
  triggers = { { cron = "* * * * * *" }, { event = "tick.now" } },
  run = function(ctx)
    ctx.step.sleep("nap", ctx.input and ctx.input.s or 0)
    return "ticked"
  end,
}
"""
        self.put("ticker.lua", src)
        srv = Serve(self.w)
        wait_until(lambda: len(self.w.runs(skill="ticker", trigger="cron")) >= 1, what="a cron run")
        st, b = srv.request("POST", "/v1/events", {"name": "tick.now", "data": {"s": 0}})
        self.assertEqual(st, 202, b)
        wait_until(lambda: self.w.runs(skill="ticker", trigger="event"), what="an event run")
        rid = srv.invoke("ticker", {"s": 2}, wait=False)[1]["run_id"]
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="a run in flight")
        os.unlink(os.path.join(self.ws, "ticker.lua"))
        wait_until(lambda: srv.version("ticker") is None, what="ticker unregistered")
        # The registry changes before the line reaches the log (and our reader).
        wait_until(lambda: "removed   skills/ticker.lua: skill 'ticker' unregistered" in srv.log(),
                   what=lambda: "the removal in the log: %s" % srv.log())
        # Its record shows no triggers (they stopped), nor a next cron
        # fire; `moonloop skills` says there is no live version.
        rec = [k for k in json.loads(self.w.ml("skills", "--json").stdout) if k["id"] == "ticker"][0]
        self.assertEqual((rec["triggers"], rec["next_fire"]), ([], None))
        self.assertEqual(len(rec["versions"][-1]["triggers"]), 2)  # its history keeps them
        row = [l for l in self.w.ml("skills").stdout.splitlines() if l.startswith("ticker")][0]
        self.assertIn("none (no live version)", row)
        self.assertNotIn("cron", row)
        # New invokes fail, saying why.
        st, b = srv.invoke("ticker")
        self.assertEqual(st, 404, b)
        self.assertIn("skill 'ticker' has no live version", b["error"]["message"])
        r = self.w.ml("invoke", "ticker", "--wait")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no live version", r.stderr)
        # Its triggers stop: no new cron or event runs.
        time.sleep(0.3)
        cron_before = len(self.w.runs(skill="ticker", trigger="cron"))
        srv.request("POST", "/v1/events", {"name": "tick.now", "data": {"s": 0}})
        time.sleep(2.2)
        self.assertEqual(len(self.w.runs(skill="ticker", trigger="cron")), cron_before)
        self.assertEqual(len(self.w.runs(skill="ticker", trigger="event")), 1)
        # The run in flight finishes on its version.
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=20, what="the run")
        self.assertEqual(self.w.trace(rid)["output"], "ticked")

    def test_renaming_a_file_keeps_a_declared_id(self):
        src = simple("kept", "same")
        self.put("first_name.lua", src)
        self.put("undeclared.lua", 'return { run = function() return "u" end }\n')
        srv = Serve(self.w)
        self.assertEqual(srv.version("undeclared"), sha('return { run = function() return "u" end }\n'))
        os.rename(os.path.join(self.ws, "first_name.lua"), os.path.join(self.ws, "second_name.lua"))
        wait_until(lambda: srv.skill("kept")["file"] == "skills/second_name.lua", what="the new name")
        self.assertEqual(srv.version("kept"), sha(src))
        self.assertEqual(srv.invoke("kept")[1]["output"], "same")
        # Without a declared id, the id is the file's name: the old one goes.
        # (Renamed and edited: an unchanged source is the same version, and a
        # version belongs to one skill, so it would keep its first id.)
        os.rename(os.path.join(self.ws, "undeclared.lua"), os.path.join(self.ws, "renamed_too.lua"))
        with open(os.path.join(self.ws, "renamed_too.lua"), "a") as f:
            f.write("-- renamed\n")
        wait_until(lambda: srv.version("renamed-too") is not None, what="renamed-too")
        wait_until(lambda: srv.version("undeclared") is None, what="undeclared unregistered")
        self.assertIsNone(srv.skill("first-name"))

    def test_a_file_that_declares_another_id_lets_go_of_the_old_one(self):
        self.put("x.lua", simple("old-id", "1"))
        srv = Serve(self.w)
        self.put("x.lua", simple("new-id", "2"))
        wait_until(lambda: srv.version("new-id") is not None, what="new-id")
        wait_until(lambda: srv.version("old-id") is None, what="old-id unregistered")

    # ---- the folder ----------------------------------------------------------

    def test_the_folder_removed_and_recreated_is_watched_again(self):
        self.put("one.lua", simple("one", "1"))
        srv = Serve(self.w)
        shutil.rmtree(self.ws)
        wait_until(lambda: srv.version("one") is None, what="one unregistered")
        os.makedirs(self.ws)
        self.put("two.lua", simple("two", "1"))
        self.live(srv, "two", simple("two", "1"))
        self.put("two.lua", simple("two", "2"))
        self.live(srv, "two", simple("two", "2"))
        self.put("one.lua", simple("one", "again"))
        self.live(srv, "one", simple("one", "again"))
        self.assertIn("workspace skills is gone", srv.log())

    def test_a_missing_folder_is_waited_for_and_deletions_while_down_count(self):
        self.put("gone.lua", simple("gone", "1"))
        srv = Serve(self.w)
        self.assertEqual(srv.stop(), 0)
        os.unlink(os.path.join(self.ws, "gone.lua"))
        os.rmdir(self.ws)
        srv = Serve(self.w)
        # The file was deleted while no engine ran: unregistered at start.
        self.assertIsNone(srv.version("gone"))
        self.assertIn("workspace skills does not exist", srv.log())
        os.makedirs(self.ws)
        self.put("late.lua", simple("late", "1"))
        self.live(srv, "late", simple("late", "1"))


class StandaloneTest(TestCase):
    """`moonloop sidecar --workspace DIR --server URL` against a serve whose own
    workspace is another folder."""

    def test_register_reject_and_delete_over_http(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        remote = os.path.join(self.w.path, "remote")
        os.makedirs(remote)
        srv = Serve(self.w)
        with open(os.path.join(remote, "far.lua"), "w") as f:
            f.write(simple("far", "from afar"))
        p = subprocess.Popen([BIN, "sidecar", "--workspace", remote, "--server", srv.url],
                             cwd=self.w.path, env=self.w.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.w.procs.append(p)
        lines = []
        threading.Thread(target=lambda: [lines.append(l) for l in p.stdout], daemon=True).start()

        def line(pattern):
            return wait_until(lambda: next((l for l in lines if re.search(pattern, l)), None),
                              what="a line matching %r in %r" % (pattern, lines))
        line(r"^ok        far\.lua: skill 'far', version %s" % sha(simple("far", "from afar"))[:12])
        self.assertEqual(srv.version("far"), sha(simple("far", "from afar")))
        rec = srv.skill("far")
        self.assertRegex(rec["file"], r"^//[^/]+%s/far\.lua$" % re.escape(remote))
        self.assertEqual(srv.invoke("far")[1]["output"], "from afar")
        # A change.
        with open(os.path.join(remote, "far.lua"), "w") as f:
            f.write(simple("far", "changed"))
        line(r"^ok        far\.lua: skill 'far', version %s" % sha(simple("far", "changed"))[:12])
        self.assertEqual(srv.invoke("far")[1]["output"], "changed")
        # A rejection: printed with its reason; the live version stays.
        with open(os.path.join(remote, "far.lua"), "w") as f:
            f.write(simple("far", "bad", "\n  retires = 3,"))
        l = line(r"^rejected  far\.lua: ")
        self.assertIn("unknown key 'retires' in the skill table (did you mean 'retries'?)", l)
        self.assertEqual(srv.version("far"), sha(simple("far", "changed")))
        err = srv.skill("far")["error"]
        self.assertEqual(err["line"], 3)
        self.assertTrue(err["file"].endswith("/remote/far.lua"), err)
        # A duplicate of an id held by another file of the sidecar.
        with open(os.path.join(remote, "twin.lua"), "w") as f:
            f.write(simple("far", "twin"))
        l = line(r"^rejected  twin\.lua: ")
        self.assertIn("skill id 'far' is already defined by", l)
        os.unlink(os.path.join(remote, "twin.lua"))
        # Deletion: unregistered.
        os.unlink(os.path.join(remote, "far.lua"))
        line(r"^removed   far\.lua: skill 'far' unregistered")
        wait_until(lambda: srv.version("far") is None, what="far unregistered")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=10), 0)
        self.assertIn("moonloop: sidecar: watching", p.stderr.read())

    def test_a_missing_workspace_is_said_on_stderr_at_once_as_serve_says_it(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        srv = Serve(self.w)
        # stdout is a pipe (block-buffered): the warning must not wait in it.
        p = subprocess.Popen([BIN, "sidecar", "--workspace", "nodir", "--server", srv.url],
                             cwd=self.w.path, env=self.w.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.w.procs.append(p)
        err, out = [], []
        threading.Thread(target=lambda: [err.append(l) for l in p.stderr], daemon=True).start()
        threading.Thread(target=lambda: [out.append(l) for l in p.stdout], daemon=True).start()
        wait_until(lambda: any("moonloop: sidecar: workspace nodir does not exist: watching for it"
                               in l for l in err), what="the warning in %r" % err)
        # And it is watched for: once it exists, its files register.
        os.makedirs(os.path.join(self.w.path, "nodir"))
        with open(os.path.join(self.w.path, "nodir", "late.lua"), "w") as f:
            f.write(simple("late", "1"))
        wait_until(lambda: srv.version("late") == sha(simple("late", "1")), what="late registered")
        wait_until(lambda: any("workspace nodir is back" in l for l in err), what="'back' in %r" % err)
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=10), 0)
        self.assertFalse(any("workspace" in l for l in out), out)

    def test_delete_api_and_usage_errors(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        srv = Serve(self.w)
        st, b = srv.request("PUT", "/v1/skills/viaput?file=%2F%2Fbox%2Fws%2Fviaput.lua",
                            simple("viaput", "1"))
        self.assertEqual(st, 200, b)
        self.assertEqual(b["file"], "//box/ws/viaput.lua")
        st, b = srv.request("DELETE", "/v1/skills/viaput?file=%2F%2Fbox%2Fws%2Fother.lua")
        self.assertEqual(st, 404, b)
        self.assertIn("not registered from //box/ws/other.lua", b["error"]["message"])
        st, b = srv.request("DELETE", "/v1/skills/viaput?nope=1")
        self.assertEqual(st, 400, b)
        st, b = srv.request("DELETE", "/v1/skills/viaput")
        self.assertEqual(st, 200, b)
        self.assertIsNone(b["version"])
        st, b = srv.request("DELETE", "/v1/skills/viaput")
        self.assertEqual(st, 404, b)
        st, b = srv.request("DELETE", "/v1/skills/nosuch")
        self.assertEqual(st, 404, b)
        r = self.w.ml("sidecar", "--workspace", "x")
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage: moonloop sidecar --workspace DIR --server URL", r.stderr)
        r = self.w.ml("sidecar", "--workspace", "x", "--server", "http://127.0.0.1:1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot reach the engine", r.stderr)


if __name__ == "__main__":
    unittest.main()
