#!/usr/bin/env python3
"""story: the agent loop's world for the demo and the end-to-end test.

A temporary folder with a database, a workspace holding the loop's skills
(health check, incident triage, weekly review, update skill), a
configuration that points them at the local stand-ins (standins.World),
and helpers to start, kill and restart `moonloop serve` and to read runs.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("MOONLOOP_BIN") or os.path.join(TOP, "build", "moonloop")
sys.path.insert(0, HERE)
from standins import World  # noqa: E402

SKILLS = ["health_check.lua", "incident_triage.lua", "review_skill_performance.lua", "update_skill.lua"]


class Story:
    """The loop's world: stand-ins, a workspace, an engine. health_cron is
    the health check's schedule (every 3 s by default)."""

    def __init__(self, health_cron="*/3 * * * * *", quiet=True):
        self.quiet = quiet
        self.dir = tempfile.mkdtemp(prefix="moonloop-story-")
        self.world = World().start()
        url = self.world.url
        self.env = dict(os.environ, MOONLOOP_DB=os.path.join(self.dir, "moonloop.db"), NO_COLOR="1",
                        METRICS_URL=url, DEPLOYS_URL=url, OUTCOMES_URL=url,
                        CHAT_WEBHOOK=url + "/chat", OPS_WEBHOOK=url + "/ops",
                        HEALTH_CRON=health_cron, TRIAGE_COOLDOWN="10m", TRIAGE_BACKOFF="300ms",
                        REVIEW_CRON="0 9 1 1 *", MOONLOOP_LISTEN="127.0.0.1:0")
        self.env.pop("MOONLOOP_URL", None)
        ws = os.path.join(self.dir, "skills")
        os.makedirs(ws)
        for f in SKILLS:
            shutil.copy(os.path.join(TOP, "skills", f), ws)
        with open(os.path.join(self.dir, "moonloop.conf.lua"), "w") as f:
            f.write('return {\n'
                    '  workspace = "skills",\n'
                    '  env = { "METRICS_URL", "DEPLOYS_URL", "OUTCOMES_URL", "CHAT_WEBHOOK", "OPS_WEBHOOK",\n'
                    '          "HEALTH_CRON", "TRIAGE_COOLDOWN", "TRIAGE_BACKOFF", "REVIEW_CRON" },\n'
                    '  llm = { base_url = "%s/v1", model = "standin-1" },\n'
                    '  deployers = { "update-skill" },\n'
                    '}\n' % url)
        self.serve = None
        self.follow = None

    def ml(self, *args, check=True):
        r = subprocess.run([BIN] + list(args), cwd=self.dir, env=self.env, capture_output=True, text=True,
                           timeout=120)
        if check and r.returncode != 0:
            raise AssertionError("moonloop %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr))
        return r

    def json(self, *args):
        return json.loads(self.ml(*args, "--json").stdout)

    def json_out(self, *args):
        """A command's output (not --json: invoke --wait prints the run's output as JSON)."""
        return json.loads(self.ml(*args).stdout)

    def runs(self, skill):
        return self.json("runs", "--skill", skill, "--limit", "500")

    def trace(self, run_id):
        return self.json("trace", run_id)

    def chat(self, box="chat"):
        return json.loads(urllib.request.urlopen(self.world.url + "/" + box).read())

    def wait(self, what, pred, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            v = pred()
            if v:
                return v
            time.sleep(0.1)
        raise AssertionError("timed out after %ds waiting for %s" % (timeout, what))

    def llm_asked(self, word):
        return any(word in (m.get("content") or "") for r in list(self.world.llm_requests)
                   for m in r.get("messages", []))

    def start_serve(self):
        self.serve = subprocess.Popen([BIN, "serve"], cwd=self.dir, env=self.env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)
        line = self.serve.stderr.readline()
        while line and "listening on" not in line:
            line = self.serve.stderr.readline()
        threading.Thread(target=self.serve.stderr.read, daemon=True).start()
        self.wait("the skills to be registered", lambda: len(self.json("skills")) >= len(SKILLS))
        return self.serve

    def kill_serve(self):
        os.killpg(self.serve.pid, signal.SIGKILL)
        self.serve.wait()

    def start_follow(self, show):
        self.follow = subprocess.Popen([BIN, "runs", "--follow"], cwd=self.dir, env=self.env,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def pump():
            for line in self.follow.stdout:
                if not line.startswith("following"):
                    show(line.rstrip())
        threading.Thread(target=pump, daemon=True).start()

    def close(self):
        for p in (self.follow, self.serve):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        self.world.close()
        shutil.rmtree(self.dir, ignore_errors=True)
