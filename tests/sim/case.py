"""case: one generated world run in one mode against real engine processes.

Modes (see docs/simulation.md):
  a  uninterrupted: one `moonloop serve`
  b  SIGKILL of serve at random moments, several per case, some right after
     a restart (during startup) and some while a commit group is held open
     (MOONLOOP_FAULT=commit=MS), restarting it each time
  c  every parked run evicted: limits.parked_runs = 1 and a ballast run
     that takes that one place, so every other run that parks is dropped
     from memory and replayed when it wakes
  d  `moonloop run --resume RUN_ID` after kills: some roots are started by
     `moonloop run` (killed, then resumed), and after each kill of serve a
     few unfinished runs are resumed by `run --resume` before serve returns
  e  takeover: lease = "1s"; engine A is frozen with SIGSTOP past its lease,
     engine B takes its runs over, then A gets SIGCONT; several freezes,
     alternating, some while a commit is held open

The case's driver is one thread (the schedule of faults, starting roots,
watching the database for runs the harness must answer) and a worker
thread that carries every request to the engine (events, invokes,
cancels) and retries it until it is accepted: over HTTP when an engine is
up, with the CLI (straight into the database) when none is.
"""
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from db import Db
from gen import RUN_ENDED_SQL, TERMINAL, early_events
from standin import StandIn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from mltest import BIN  # noqa: E402

BIN = os.path.abspath(BIN)
ASAN = os.sep + "asan" + os.sep in BIN
SLOW = 3.0 if ASAN else 1.0   # bounds that only catch hangs grow under the sanitizers
WORKERS = 3


class Proc:
    """One moonloop process of the case (serve, run, run --resume)."""

    def __init__(self, case, kind, name, args, env=None):
        self.case, self.kind, self.name = case, kind, name
        self.log = os.path.join(case.dir, "%s.log" % name)
        e = dict(case.env)
        e["SIM_ENGINE"] = name
        e.update(env or {})
        with open(self.log, "w") as f:
            self.popen = subprocess.Popen([BIN] + args, cwd=case.dir, env=e, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL if kind == "serve" else f,
                                          stderr=f, start_new_session=True)
        self.url = None
        self.frozen = False
        self.fault = (env or {}).get("MOONLOOP_FAULT")
        self.started = case.clock()

    def alive(self):
        return self.popen.poll() is None

    def text(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def poll_url(self):
        if self.url is None and self.kind == "serve":
            m = re.search(r"listening on (http://\S+)", self.text())
            if m:
                self.url = m.group(1)
        return self.url

    def up(self):
        return self.alive() and not self.frozen and self.poll_url() is not None

    def signal(self, sig):
        try:
            os.kill(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=20)
        self.frozen = False


def http(method, url, obj=None, timeout=30):
    data = None if obj is None else json.dumps(obj).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"null")
        except ValueError:
            return e.code, body.decode(errors="replace")


class Case:
    def __init__(self, world, mode, opts):
        self.w = world
        self.mode = mode
        self.opts = opts
        self.rng = random.Random(world.seed * 1009 + ord(mode))
        self.t0 = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="mlsim-%d%s-" % (world.seed, mode))
        self.db = Db(self.dir, getattr(opts, "cluster", None), "%d%s" % (world.seed, mode))
        self.lock = threading.RLock()
        self.procs = []
        self.interrupts = []     # (t, what, engine): kills and freezes
        self.actions = []        # (t, text): the schedule as it ran
        self.accepted = {}       # idempotency id -> event id
        self.harness_errors = []
        self.engine_errors = []
        self.roots = {r["tag"]: dict(r, confirmed=False) for r in world.roots}
        self.batches_left = list(world.batches)
        self.edits_left = sorted(world.edits, key=lambda e: e["at"])
        self.edits_done = []     # (t, skill, mark): files rewritten
        self.done_late = set()
        self.done_cancel = set()
        self.queue = queue.Queue()
        self.busy = 0
        self.ready = None
        self.durable = {}        # step key -> when the harness first saw it completed in the database
        self.current = None
        self.stopping = False
        self.ballast = mode == "c"
        self.nstarts = 0
        self.stats = {"kills": 0, "freezes": 0, "resumes": 0}
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("MOONLOOP_"):
                del self.env[k]
        self.env.update({"MOONLOOP_DB": self.db.url, "MOONLOOP_LISTEN": "127.0.0.1:0", "NO_COLOR": "1"})
        self.reports = os.path.join(self.dir, ".sanitizer")
        os.makedirs(self.reports)
        for name in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
            o = [x for x in self.env.get(name, "").split(":") if x and not x.startswith("log_path=")]
            self.env[name] = ":".join(o + ["log_path=" + os.path.join(self.reports, "report")])

    def clock(self):
        return time.monotonic() - self.t0

    def act(self, text):
        self.actions.append((self.clock(), text))
        if self.opts.verbose > 1:
            print("    %7.3f %s" % (self.clock(), text), flush=True)

    # ---- setting up --------------------------------------------------------

    def setup(self):
        self.standin = StandIn(self.clock)
        self.env["SIM_URL"] = self.standin.url
        os.makedirs(os.path.join(self.dir, "skills"))
        for sid, sk in self.w.skills.items():
            with open(os.path.join(self.dir, "skills", sid + ".lua"), "w") as f:
                f.write(sk.source)
        conf = ['  env = { "SIM_URL", "SIM_ENGINE" },']
        if self.mode == "c":
            conf.append("  limits = { parked_runs = 1 },")
        if self.mode == "e":
            conf.append('  lease = "1s",')
        with open(os.path.join(self.dir, "moonloop.conf.lua"), "w") as f:
            f.write("return {\n%s\n}\n" % "\n".join(conf))
        # A few workers: one request stuck behind a locked database must not
        # hold back the others (events a waiting run needs, cancellations).
        self.workers = [threading.Thread(target=self.work, daemon=True) for _ in range(WORKERS)]
        for t in self.workers:
            t.start()

    def cli(self, *args, timeout=60):
        try:
            return subprocess.run([BIN] + list(args), cwd=self.dir, env=self.env, capture_output=True,
                                  text=True, timeout=timeout * SLOW, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(e.cmd, 124, "", "timed out")

    # ---- processes -----------------------------------------------------------

    def serve(self, name, fault_ms=None):
        env = {"MOONLOOP_FAULT": "commit=%d" % fault_ms} if fault_ms else {}
        p = Proc(self, "serve", name, ["serve", "--workspace", "skills"], env)
        with self.lock:
            self.procs.append(p)
        self.act("start %s%s" % (name, " (commit held open %d ms)" % fault_ms if fault_ms else ""))
        return p

    def engines(self):
        with self.lock:
            return [p for p in self.procs if p.kind == "serve"]

    def live(self):
        with self.lock:
            return [p for p in self.procs if p.alive()]

    def pick(self):
        """An engine that answers HTTP now, or None."""
        ups = [p for p in self.engines() if p.up()]
        return random.choice(ups) if ups else None

    def kill(self, p, why="kill"):
        if not p.alive():
            return False
        t = self.clock()
        p.kill()
        self.interrupts.append((t, why, p.name))
        self.stats["kills"] += 1
        self.act("SIGKILL %s (%s)" % (p.name, why))
        return True

    def freeze(self, p):
        t = self.clock()
        p.signal(signal.SIGSTOP)
        p.frozen = True
        self.interrupts.append((t, "freeze", p.name))
        self.stats["freezes"] += 1
        self.act("SIGSTOP %s" % p.name)

    def thaw(self, p):
        p.signal(signal.SIGCONT)
        p.frozen = False
        self.act("SIGCONT %s" % p.name)

    # ---- the database, read-only, to see what the harness must answer ----------

    def query(self, sql, args=()):
        return self.db.rows(sql, args)

    def root_run(self, tag, skill):
        """The id of the root run with this tag, or None when there is none
        (the database is read again until it answers)."""
        for _ in range(100):
            rows = self.query("SELECT id FROM runs WHERE skill = ? AND parent_id IS NULL AND entry = 'run'"
                              " AND " + self.db.tag("input") + " = ?", (skill, tag))
            if rows is not None:
                return rows[0][0] if rows else None
            time.sleep(0.1)
        raise RuntimeError("the database cannot be read")

    def status(self, run_id):
        rows = self.query("SELECT status FROM runs WHERE id = ?", (run_id,))
        return rows[0][0] if rows else None

    # ---- live edits -------------------------------------------------------------

    def edit(self, e):
        """Rewrite a skill file as an agent or an editor does: the whole new
        text under another name, then renamed over the old (the watchers
        never see half a file)."""
        path = os.path.join(self.dir, "skills", e["skill"] + ".lua")
        with open(path + ".tmp-edit", "w") as f:
            f.write(self.w.source_of(e["skill"], e["mark"]))
        os.replace(path + ".tmp-edit", path)
        self.edits_done.append((self.clock(), e["skill"], e["mark"]))
        self.act("rewrite skills/%s.lua (MARK %s)" % (e["skill"], e["mark"]))

    # ---- the worker: requests to the engine, retried until accepted -------------

    def work(self):
        while True:
            task = self.queue.get()
            if task is None:
                return
            with self.lock:
                self.busy += 1
                self.current = getattr(task, "what", repr(task))
            try:
                task()
            except Exception as e:  # a harness bug must show, not hang the case
                self.harness_errors.append("worker: %r" % e)
            finally:
                with self.lock:
                    self.busy -= 1
                    self.current = None

    def idle(self):
        with self.lock:
            return self.queue.empty() and self.busy == 0

    def accept(self, idem, eid):
        prev = self.accepted.get(idem)
        if prev and prev != eid:
            self.harness_errors.append("event id %s accepted twice as different events: %s and %s" % (idem, prev, eid))
        self.accepted[idem] = eid

    def send_events(self, evs, cli=False, then=None):
        """A task: accept every event of evs (a batch over HTTP, or one by one
        with `moonloop send --id` when no engine is up or cli is asked)."""
        def task():
            pending = list(evs)
            use_cli = cli
            while pending and not self.stopping:
                eng = None if use_cli else self.pick()
                use_cli = cli
                if eng:
                    try:
                        st, body = http("POST", eng.url + "/v1/events", pending, timeout=15 * SLOW)
                    except OSError as e:
                        self.act("POST /v1/events (%s) to %s failed: %s" % (task.what, eng.name, e))
                        use_cli = True  # the next try goes around that engine
                        continue
                    if 200 <= st < 300:
                        for ev, eid in zip(pending, body["ids"]):
                            self.accept(ev["id"], eid)
                        self.act("sent %s over HTTP to %s" % (task.what, eng.name))
                        pending = []
                    else:
                        self.harness_errors.append("POST /v1/events answered %s: %s" % (st, body))
                        time.sleep(0.2)
                    continue
                ev = pending[0]
                r = self.cli("send", ev["name"], "--data", json.dumps(ev["data"]), "--id", ev["id"], "--json")
                if r.returncode == 0:
                    self.accept(ev["id"], json.loads(r.stdout)["id"])
                    self.act("sent %s with moonloop send" % ev["id"])
                    pending.pop(0)
                else:
                    self.act("moonloop send %s failed (%d): %s" % (ev["id"], r.returncode, r.stderr.strip()[-200:]))
                    time.sleep(0.2)
            if then and not self.stopping:
                then()
        task.what = "send %s" % ",".join(e["id"] for e in evs)
        return task

    def invoke(self, root, skill, cli=False):
        """A task: start root by invoke; when the answer is lost (the engine
        died), look for the run once that engine is gone before trying again."""
        def task():
            tag = root["tag"]
            while not self.stopping:
                eng = None if cli else self.pick()
                if eng:
                    try:
                        req = {"data": root["data"]}
                        if root.get("key"):
                            req["key"] = root["key"]
                        st, body = http("POST", eng.url + "/v1/skills/%s/invoke" % skill, req,
                                        timeout=30 * SLOW)
                        if 200 <= st < 300:
                            self.act("invoked %s over HTTP to %s" % (root["tag"], eng.name))
                            return self.confirm(root, body["run_id"])
                        self.harness_errors.append("invoke answered %s: %s" % (st, body))
                        time.sleep(0.2)
                        continue
                    except OSError as e:
                        self.act("invoke of %s over HTTP to %s failed: %s" % (root["tag"], eng.name, e))
                        end = time.monotonic() + 3 * SLOW
                        while eng.alive() and time.monotonic() < end and not self.stopping:
                            time.sleep(0.05)
                        if root.get("key"):
                            continue  # an invoke with a key is retried as it is: one run whatever
                        rid = self.root_run(tag, skill)
                        if rid:
                            return self.confirm(root, rid)
                        continue
                r = self.cli("invoke", skill, "--data", json.dumps(root["data"]),
                             *(("--key", root["key"]) if root.get("key") else ()))
                if r.returncode == 0:
                    self.act("invoked %s with moonloop invoke" % root["tag"])
                    return self.confirm(root, r.stdout.strip())
                self.act("moonloop invoke %s failed (%d): %s" % (root["tag"], r.returncode, r.stderr.strip()[-200:]))
                time.sleep(0.2)
        task.what = "invoke %s %s" % (skill, root["tag"])
        return task

    def confirm(self, root, run_id):
        root["confirmed"] = True
        root.setdefault("run_ids", []).append(run_id)
        if root.get("signalled"):
            return
        root["signalled"] = True
        evs = early_events(self.w, root)
        if evs:
            self.queue.put(self.send_events(evs))

    def cancel(self, run_id, tag, skill):
        def task():
            sk = self.w.skills.get(skill)
            if sk and sk.cancel_on:
                return self.send_events([{"name": "sim.cancel", "data": {"tag": tag}, "id": "cancel:" + tag}])()
            use_cli = False
            while not self.stopping:
                eng = None if use_cli else self.pick()
                use_cli = False
                if eng:
                    try:
                        st, body = http("POST", eng.url + "/v1/runs/%s/cancel" % run_id, {}, timeout=15 * SLOW)
                        if 200 <= st < 300 or st == 409:
                            self.act("cancelled %s over HTTP to %s (%s)" % (tag, eng.name, st))
                            return
                        self.act("cancel of %s over HTTP answered %s: %s" % (tag, st, body))
                    except OSError as e:
                        self.act("cancel of %s over HTTP to %s failed: %s" % (tag, eng.name, e))
                    use_cli = True
                    continue
                r = self.cli("cancel", run_id)
                if r.returncode == 0 or "nothing to cancel" in r.stderr:
                    self.act("cancelled %s with moonloop cancel" % tag)
                    return
                self.act("moonloop cancel %s failed (%d): %s" % (tag, r.returncode, r.stderr.strip()[-200:]))
                time.sleep(0.2)
        task.what = "cancel %s (%s)" % (tag, run_id)
        return task

    # ---- starting roots ------------------------------------------------------------

    def start_batch(self, b, force_cli=False, why=""):
        cli = b["cli"] or force_cli
        evs = []
        for tag in b["tags"]:
            root = self.roots[tag]
            self.nstarts += 1
            if root["start"] == "event":
                evs.append({"name": root["event"], "data": root["data"], "id": "start:" + tag})
            elif root["start"] == "run" and self.mode == "d":
                self.start_runner(root)
            else:
                self.queue.put(self.invoke(root, root["skills"][0], cli=cli))
                if root.get("key") and root.get("twice"):
                    # The same key again: the answer is the first run's.
                    self.queue.put(self.invoke(root, root["skills"][0], cli=not cli))
        if evs:
            ev_roots = [self.roots[t] for t in b["tags"] if self.roots[t]["start"] == "event"]
            extra = [e for r in ev_roots for e in early_events(self.w, r)]

            def confirmed():
                for r in ev_roots:
                    r["confirmed"] = True
            # The early events go in the same batch, after the start events:
            # they count for the runs (accepted after their trigger).
            self.queue.put(self.send_events(evs + extra, cli=cli, then=confirmed))
            if b["resend"]:
                self.queue.put(self.send_events(evs, cli=not cli))
        self.act("start batch %s%s%s%s" % (",".join(b["tags"]), " (CLI)" if cli else "",
                                           " (sent twice)" if b["resend"] else "", why))

    def start_runner(self, root):
        """Mode d: `moonloop run` for a root, killed later and resumed."""
        name = "run-%s" % root["tag"]
        p = Proc(self, "run", name, ["run", "skills/%s.lua" % root["skills"][0], "--data", json.dumps(root["data"])])
        with self.lock:
            self.procs.append(p)
        p.kill_at = self.clock() + self.rng.uniform(0.5, 2.5)
        p.root = root
        self.act("moonloop run for %s" % root["tag"])

    def resume(self, run_id):
        p = Proc(self, "resume", "resume-%d" % len(self.procs), ["run", "--resume", run_id])
        with self.lock:
            self.procs.append(p)
        self.stats["resumes"] += 1
        self.act("moonloop run --resume %s (%s)" % (run_id, p.name))
        return p

    def runner_killed(self, p):
        """A `moonloop run` was killed: resume its run, or start it again if it
        never became durable."""
        root = p.root
        rid = self.root_run(root["tag"], root["skills"][0])
        if rid is None:
            self.act("run for %s left nothing: invoke it" % root["tag"])
            self.queue.put(self.invoke(root, root["skills"][0], cli=True))
            return
        self.confirm(root, rid)
        if self.rng.random() < 0.7 and p.popen.returncode == -signal.SIGKILL and \
                self.status(rid) not in TERMINAL:
            self.resume(rid)

    # ---- watching runs ---------------------------------------------------------------

    def watch(self):
        """Answer what runs wait for: late events, cancellations; and note
        when each completed step is first seen in the database (from then on
        its body must never run again)."""
        rows = self.query("SELECT run_id, id FROM steps WHERE status = 'completed' AND kind = 'run'") or []
        seen = self.clock()  # after the read: by then each of these steps was completed
        for rid, sid in rows:
            self.durable.setdefault("%s:%s" % (rid, sid), seen)
        rows = self.query(
            "SELECT r.id, r.skill, r.input, s.id FROM runs r JOIN steps s ON s.run_id = r.id"
            " WHERE r.status NOT IN " + RUN_ENDED_SQL + " AND s.status = 'waiting'"
            " AND s.kind = 'wait'") or []
        for rid, skill, inp, sid in rows:
            try:
                tag = json.loads(inp or "{}").get("tag")
            except ValueError:
                tag = None
            if tag is None:
                continue
            if sid.startswith("lsig") and (rid, sid) not in self.done_late:
                self.done_late.add((rid, sid))
                site = re.match(r"lsig(\d+)", sid).group(1)
                self.act("%s waits at %s: send its event" % (tag, sid))
                self.queue.put(self.send_events([{"name": "sim.sig." + site, "data": {"tag": tag, "sig": sid},
                                                  "id": "%s:%s:late" % (tag, sid)}]))
            elif sid == "hold_c":
                if rid not in self.done_cancel:
                    self.done_cancel.add(rid)
                    self.act("cancel %s (%s at %s)" % (tag, skill, sid))
                    self.queue.put(self.cancel(rid, tag, skill))

    def unfinished(self):
        """(runs not ended but the ballast, events not dispatched), or None
        when the database cannot be read now."""
        a = self.query("SELECT count(*) FROM runs WHERE status NOT IN " + RUN_ENDED_SQL +
                       " AND skill != 'zb'")
        b = self.query("SELECT count(*) FROM events WHERE dispatched = 0")
        if not a or not b:
            return None
        return a[0][0], b[0][0]

    # ---- the schedules of the modes -----------------------------------------------------

    def wait(self, secs):
        end = self.clock() + secs
        while self.clock() < end:
            yield

    def plan_a(self):
        self.serve("A")
        yield

    def plan_c(self):
        self.serve("A")
        self.queue.put(self.invoke({"tag": "ballast", "data": {"tag": "ballast"}, "skills": ["zb"]}, "zb"))
        yield

    def plan_b(self):
        rng = self.rng
        nk = rng.randint(3, 6)
        fault = rng.randint(100, 300) if rng.random() < 0.4 else None
        gen = 0
        p = self.serve("A%d" % gen, fault)
        for i in range(nk):
            yield from self.wait(rng.uniform(0.4, 2.5))
            self.kill(p, "during a commit" if fault else "at a random moment")
            down = rng.uniform(0.0, 1.2)
            if self.batches_left and rng.random() < 0.5:
                self.start_batch(self.batches_left.pop(0), force_cli=True, why=" while the engine is down")
            yield from self.wait(down)
            gen += 1
            fault = rng.randint(100, 300) if i < nk - 1 and rng.random() < 0.4 else None
            p = self.serve("A%d" % gen, fault)
            if rng.random() < 0.35:
                yield from self.wait(rng.uniform(0.0, 0.08))
                self.kill(p, "during startup")
                yield from self.wait(0.1)
                gen += 1
                p = self.serve("A%d" % gen, fault)

    def plan_d(self):
        rng = self.rng
        gen = 0
        p = self.serve("A%d" % gen)
        for i in range(rng.randint(2, 3)):
            yield from self.wait(rng.uniform(1.0, 3.0))
            for q in self.live():
                self.kill(q, "with everything")
            for _ in range(rng.randint(1, 2)):
                rows = self.query("SELECT id FROM runs WHERE status NOT IN " + RUN_ENDED_SQL +
                                  " AND skill != 'zb' ORDER BY id") or []
                picks = rng.sample(rows, min(len(rows), rng.randint(1, 2)))
                resumers = [self.resume(r[0]) for r in picks]
                yield from self.wait(rng.uniform(0.5, 2.5))
                for q in resumers:
                    self.kill(q, "resumer")
            gen += 1
            p = self.serve("A%d" % gen)

    def plan_e(self):
        rng = self.rng
        # Commits held open a little (some freezes then land inside one, with
        # the write lock held); not long, or the other engine starves.
        a = self.serve("A", rng.randint(30, 100) if rng.random() < 0.3 else None)
        b = None
        victim, other = a, None
        for i in range(rng.randint(2, 4)):
            yield from self.wait(rng.uniform(0.8, 2.5))
            self.freeze(victim)
            if other is None:
                b = other = self.serve("B", rng.randint(30, 100) if rng.random() < 0.3 else None)
            yield from self.wait(rng.uniform(1.6, 4.0))
            self.thaw(victim)
            victim, other = other, victim

    # ---- the case -------------------------------------------------------------------------

    def run(self):
        self.setup()
        plan = getattr(self, "plan_" + self.mode)()
        plan_done = False
        plan_end = None
        last_watch = 0
        stable = 0
        ballast_cancelled = False
        bound = 30 * SLOW
        result = {"stuck": None}
        while True:
            now = self.clock()
            if not plan_done:
                try:
                    next(plan)
                except StopIteration:
                    plan_done, plan_end = True, now
            if self.ready is None and any(p.poll_url() for p in self.engines()):
                self.ready = now
                self.act("the workspace is registered: roots start from here")
            while self.ready is not None and self.batches_left and self.batches_left[0]["at"] <= now - self.ready:
                self.start_batch(self.batches_left.pop(0))
            while self.ready is not None and self.edits_left and self.edits_left[0]["at"] <= now - self.ready:
                self.edit(self.edits_left.pop(0))
            for p in list(self.procs):
                if p.kind == "run" and getattr(p, "kill_at", None) and now >= p.kill_at:
                    p.kill_at = None
                    self.kill(p, "moonloop run")
                    self.runner_killed(p)
                if p.kind == "serve" and not p.alive() and not getattr(p, "reported", False) \
                        and p.popen.returncode != -signal.SIGKILL:
                    p.reported = True
                    self.engine_errors.append("%s exited by itself (status %s): %s" % (
                        p.name, p.popen.returncode, p.text()[-1500:]))
            if self.mode in ("b", "d", "e") and plan_done and not any(p.alive() for p in self.engines()):
                self.serve("Z")   # an engine died by itself: the case still has to finish
            if now - last_watch > 0.2:
                last_watch = now
                self.watch()
                for p in self.procs:
                    if p.kind == "run" and not p.root["confirmed"]:
                        rid = self.root_run(p.root["tag"], p.root["skills"][0])
                        if rid:
                            self.confirm(p.root, rid)
                if plan_done and not self.batches_left and self.idle() and \
                        all(r["confirmed"] for r in self.roots.values()) and \
                        not any(p.alive() for p in self.procs if p.kind != "serve"):
                    u = self.unfinished()
                    stable = stable + 1 if u == (0, 0) else 0
                    if stable >= 2:
                        if self.ballast and not ballast_cancelled:
                            ballast_cancelled = True
                            rid = self.root_run("ballast", "zb")
                            if rid:
                                self.queue.put(self.cancel(rid, "ballast", "zb"))
                            stable = 0
                        elif not self.ballast or self.ballast_done():
                            self.act("every run ended, every event dispatched")
                            break
                if plan_done and now - plan_end > bound:
                    self.act("%.0f s after the last fault, runs have not ended" % bound)
                    result["stuck"] = self.query(
                        "SELECT id, skill, status, " + self.db.tag("input") + " FROM runs"
                        " WHERE status NOT IN " + RUN_ENDED_SQL)
                    u = self.unfinished()
                    result["stuck_events"] = u[1] if u else None
                    self.harness_errors.append("at the bound: worker on %s, %d requests queued" % (
                        self.current, self.queue.qsize())) if self.current or not self.queue.empty() else None
                    break
            time.sleep(0.02)
        result["elapsed"] = self.clock()
        result["t0_wall"] = time.time() - self.clock()  # the case's clock, in wall time
        return self.finish(result)

    def ballast_done(self):
        rows = self.query("SELECT status FROM runs WHERE skill = 'zb'")
        return rows is not None and all(r[0] in TERMINAL for r in rows)

    def collect(self):
        """Every run's record (GET /v1/runs/ID, or `moonloop trace --json`)."""
        eng = self.pick()
        ids = [r[0] for r in (self.query("SELECT id FROM runs ORDER BY id") or [])]
        if eng:
            listed, before = [], None
            while True:
                st, body = http("GET", eng.url + "/v1/runs?limit=1000" + ("&before=" + before if before else ""))
                listed += [r["id"] for r in body["runs"]]
                before = body.get("next")
                if not before:
                    break
            if sorted(listed) != ids:
                self.harness_errors.append("GET /v1/runs lists %d runs, the database holds %d" % (len(listed), len(ids)))
        traces = {}
        for rid in ids:
            if eng:
                st, t = http("GET", eng.url + "/v1/runs/" + rid)
                if st == 200:
                    traces[rid] = t
                    continue
            r = self.cli("trace", rid, "--json")
            traces[rid] = json.loads(r.stdout) if r.returncode == 0 else None
        return traces

    def finish(self, result):
        try:
            result["traces"] = self.collect()
        except Exception as e:
            result["traces"] = {}
            self.harness_errors.append("collecting the runs: %r" % e)
        # Replays as the engines counted them (moonloop_replays_total), read
        # from every engine still up before it stops: after an eviction in
        # mode c; a killed engine's count is gone with it.
        result["replays"] = 0
        for p in self.live():
            if p.frozen or not p.url:
                continue
            try:
                with urllib.request.urlopen(p.url + "/metrics", timeout=10 * SLOW) as r:
                    m = re.search(r"^moonloop_replays_total (\d+)", r.read().decode(), re.M)
                result["replays"] += int(m.group(1)) if m else 0
            except (OSError, ValueError) as e:
                self.harness_errors.append("reading %s's metrics: %r" % (p.name, e))
        self.stopping = True
        for _ in self.workers:
            self.queue.put(None)
        for p in self.live():
            if p.frozen:
                self.thaw(p)
            p.signal(signal.SIGTERM)
        for p in list(self.procs):
            try:
                p.popen.wait(timeout=20 * SLOW)
            except subprocess.TimeoutExpired:
                self.engine_errors.append("%s did not stop within %ds of SIGTERM" % (p.name, 20 * SLOW))
                p.kill()
        for t in self.workers:
            t.join(timeout=30)
        self.standin.close()
        result["calls"] = self.standin.snapshot()
        def rows(sql, what):
            got = self.db.rows(sql, writable=True)
            if got is None:
                self.harness_errors.append("reading %s from the database failed" % what)
            return got or []
        result["integrity"] = self.db.integrity()
        result["events"] = dict(rows("SELECT idem, id FROM events WHERE idem IS NOT NULL", "the events"))
        # Every engine has stopped and released its runs: an unfinished
        # run that still has an owner is owned by a lease that is gone.
        result["orphans"] = dict(rows(
            "SELECT id, owner FROM runs WHERE owner IS NOT NULL AND status NOT IN "
            + RUN_ENDED_SQL + " AND owner NOT IN (SELECT owner FROM leases)", "the orphans"))
        # Events a wait took (a delivery) that its step never got.
        result["lost_deliveries"] = rows(
            "SELECT d.run_id, s.id, d.event_id, s.status FROM deliveries d JOIN steps s"
            " ON s.run_id = d.run_id AND s.seq = d.seq WHERE s.kind = 'wait'"
            " AND (s.status != 'completed' OR s.output IS NULL OR s.output = 'null')"
            " AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.run_id = d.run_id AND w.seq = d.seq)",
            "the deliveries")
        result["fenced"] = {p.name for p in self.procs if "lease lost" in p.text()}
        result["sanitizer"] = []
        for name in sorted(os.listdir(self.reports)):
            with open(os.path.join(self.reports, name), errors="replace") as f:
                result["sanitizer"].append("== %s\n%s" % (name, f.read()))
        result["interrupts"] = list(self.interrupts)
        result["durable"] = dict(self.durable)
        result["actions"] = list(self.actions)
        result["accepted"] = dict(self.accepted)
        result["edits"] = list(self.edits_done)
        result["run_ids"] = {tag: list(r.get("run_ids", [])) for tag, r in self.roots.items()}
        result["harness_errors"] = list(self.harness_errors)
        result["engine_errors"] = list(self.engine_errors)
        result["engines"] = {p.name: {"kind": p.kind, "fault": p.fault} for p in self.procs}
        result["frozen"] = {p[2] for p in self.interrupts if p[1] == "freeze"}
        result["stats"] = dict(self.stats)
        result["dir"] = self.dir
        return result

    def abort(self):
        """Kill every process of the case (the harness was interrupted)."""
        self.stopping = True
        for p in self.live():
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGKILL)
        try:
            self.standin.close()
        except Exception:
            pass

    def cleanup(self, keep=False):
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.db.drop()
