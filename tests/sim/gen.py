"""gen: a seeded generator of skill worlds for the simulation (see sim.py).

A world is what one case runs: a few skills (Lua source) written from a
grammar of every step kind and option, and the root runs the harness
starts (by events, by invoke, by `moonloop run`), with the events it owes
them. Everything is drawn from one random.Random(seed), so a seed names a
world exactly.

How a world stays deterministic, so that every mode can be compared with
the uninterrupted one:
- Step bodies call the counting stand-in with ctx.step_key and return its
  answer; an answer fails when the stand-in has seen that key at most F
  times (F drawn per site), so a flaky step fails F times and then succeeds
  whatever the kills did, and an always-failing one exhausts its retries.
- Values the run computes come from the answers' `v`, which depends only on
  what the body sent (the run's own sum so far), never on call counts.
- Waits that time out have a short timeout and no event ever matches them;
  waits that are matched have a long timeout (or none) and the harness
  always sends their event: at the start (before the run reaches the wait)
  or when it sees the run waiting (step ids `lsig...`).
- A run that is to be cancelled holds on a wait nobody answers (`hold_c`)
  and the harness cancels it when it sees it there; a child whose parent's
  invoke times out holds on `hold_p` until the engine cancels it ("its
  parent stopped waiting"); the timed child skill (`ct`) holds until its
  run timeout fails it. Only
  run and sleep steps come before a hold in a run that may time out, so a
  timeout firing early changes nothing another run can see.

Step ids carry their site number (`run12`, `par7/2`, `lsig4#3`): sites()
maps a number back to what the generator drew there (kind, failures,
retries), which the checks use for the expected number of calls.
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from vocab import RUN_ENDED as TERMINAL, RUN_ENDED_SQL  # noqa: E402,F401


def lua_str(s):
    return json.dumps(s)  # a JSON string is a valid Lua string literal here (ASCII)


class Site:
    """One place in a skill where a step is taken."""

    def __init__(self, n, kind, **kw):
        self.n = n
        self.kind = kind          # run, par, nap, till, esig, lsig, tmo, inv, send
        self.fail = 0             # failing answers before success (99: always)
        self.fatal = False
        self.retries = None       # effective retries of the body
        self.slow = False         # the body outlasts its timeout
        self.branches = []        # par: [(fail, fatal)] per branch
        self.loop = 1             # how many times the site runs per pass
        self.features = set()
        self.__dict__.update(kw)

    def expected_calls(self, branch=None):
        """Calls of one key when nothing interrupts: attempts until success
        or until retries are exhausted."""
        fail, fatal = (self.fail, self.fatal) if branch is None else self.branches[branch - 1]
        if self.kind == "run" and self.slow:
            return self.retries + 1
        if fail == 0:
            return 1
        if fatal:
            return 1
        return min(fail, self.retries + 1) + (1 if fail <= self.retries else 0)


class Skill:
    def __init__(self, sid, role):
        self.id = sid
        self.role = role          # main, child, timed, receiver, ballast
        self.retries = 2
        self.backoff = "50ms"
        self.timeout = None
        self.cancel_on = False
        self.on_failure = False
        self.triggers = []
        self.has_hold = False     # main: `if d.hold` cancels it at hold_c
        self.has_fail = False     # main: `if d.fail` fails it uncaught
        self.early = []           # (site, times) of waits whose events the harness sends at the start
        self.tmo_decoys = []      # sites of timed-out waits that get a non-matching event
        self.source = ""


class World:
    def __init__(self, seed):
        self.seed = seed
        self.skills = {}
        self.sites = {}
        self.roots = []           # dicts: tag, skill, start, data, batch
        self.batches = []         # (at seconds, [root tags], resend)
        self.edits = []           # live edits: {at (seconds), skill, mark}

    def source_of(self, sid, mark):
        """Skill sid's source as the harness writes it with this mark ("e0":
        as generated; an edit changes only the mark, which each run puts
        in its output as `ver`, so its output says whose code ran)."""
        src = self.skills[sid].source
        return src if mark == "e0" else src.replace('local MARK = "e0"', 'local MARK = %s' % lua_str(mark), 1)

    def site(self, sid):
        """The Site of a step id such as 'run12#2' or 'par7/1', or None."""
        base = sid.split("/")[0].split("#")[0]
        digits = "".join(ch for ch in base if ch.isdigit())
        return self.sites.get(int(digits)) if digits else None

    def features(self):
        out = set()
        for s in self.sites.values():
            out |= s.features
        if self.edits:
            out.add("live edits of skill files")
        for sk in self.skills.values():
            if sk.cancel_on:
                out.add("cancel_on")
            if sk.on_failure:
                out.add("on_failure")
            if sk.timeout:
                out.add("run timeout (%s)" % ("fires" if sk.role == "timed" else "long"))
        return out

    def describe(self):
        """The skills' source, for a failure report."""
        text = "\n".join("-- skills/%s.lua\n%s" % (k, v.source) for k, v in sorted(self.skills.items()))
        for e in self.edits:
            text += "\n-- %.2f s after the start: skills/%s.lua rewritten with MARK %s" % (
                e["at"], e["skill"], e["mark"])
        return text


PRELUDE = r'''-- generated by tests/sim (seed %(seed)d): skill %(id)s
local MARK = "e0"
local function call(ctx, x, f, d, fat)
  local r = http.post_json(env.SIM_URL .. "/call", {
    key = ctx.step_key, x = x, f = f, d = d, fatal = fat, a = ctx.attempt, e = env.SIM_ENGINE })
  if r.fail then
    if r.fatal then error(fatal("fatal " .. r.v)) end
    error("fail " .. r.v)
  end
  return r
end

local function note(out, r)
  out.trail[#out.trail + 1] = { k = r.k, c = r.c, v = r.v }
  out.acc = (out.acc + r.v) %% 1000
end

local function add(out, t) out.trail[#out.trail + 1] = t end

'''


class Gen:
    """Draws one world from a seed."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.rng2 = random.Random(seed * 7919 + 1)  # draws added later, apart from rng's stream
        self.w = World(seed)
        self.nsite = 0

    # ---- sites and statements -------------------------------------------

    def new_site(self, kind, **kw):
        self.nsite += 1
        s = Site(self.nsite, kind, **kw)
        self.w.sites[s.n] = s
        return s

    def body_outcome(self, retries, allow_fail):
        """(fail, fatal, feature) of a step body."""
        r = self.rng.random()
        if not allow_fail or r < 0.45:
            return 0, False, "run ok"
        if r < 0.75 and retries > 0:
            return self.rng.randint(1, retries), False, "run retried then ok"
        if r < 0.88:
            return 99, False, "run retries exhausted"
        return 99, True, "run fatal()"

    def stmt_run(self, sk, out, ind, loop, caught=None, force_fail=False):
        rng = self.rng
        opts, feats = [], set()
        retries = sk.retries
        if rng.random() < 0.4:
            retries = rng.randint(0, 3)
            opts.append("retries = %d" % retries)
            feats.add("run opts.retries")
        slow = False
        if caught is None:
            caught = rng.random() < 0.5
        fail, fat, feat = self.body_outcome(retries, caught)
        if force_fail:
            fat = rng.random() < 0.4
            fail, feat = 99, "run fatal() uncaught" if fat else "run retries exhausted uncaught"
        elif caught and rng.random() < 0.12:
            # A body that outlasts its timeout: every attempt fails.
            slow = True
            opts.append('timeout = "300ms"')
            fail, fat, feat = 99, False, "run opts.timeout exceeded"
        elif rng.random() < 0.25:
            opts.append('timeout = "20s"')
            feats.add("run opts.timeout")
        feats.add(feat)
        s = self.new_site("run", fail=fail, fatal=fat, retries=retries, slow=slow, loop=loop)
        d = 1500 if slow else rng.choice((0, 0, 20, 60, 150))
        sid = "run%d" % s.n
        inner = ""
        if rng.random() < 0.15:
            inner = 'local ok = pcall(error, "swallowed"); '
            feats.add("pcall inside a body")
        body = "function() %sreturn call(ctx, out.acc + %d, %d, %d, %s) end" % (
            inner, s.n, fail, d, "true" if fat else "false")
        o = (", { %s }" % ", ".join(opts)) if opts else ""
        if caught:
            feats.add("step error caught with pcall")
            out.append(ind + "do")
            out.append(ind + "  local ok, r = pcall(ctx.step.run, %s, %s%s)" % (lua_str(sid), body, o))
            out.append(ind + "  if ok then note(out, r) else add(out, { err = tostring(r) }) end")
            out.append(ind + "end")
        else:
            out.append(ind + "note(out, ctx.step.run(%s, %s%s))" % (lua_str(sid), body, o))
        s.features = feats | {"step.run"}
        return fail != 0 and not caught

    def stmt_luaerr(self, sk, out, ind, loop):
        s = self.new_site("run", fail=0, retries=0, loop=loop)
        s.features = {"step.run", "Lua error in a body, caught"}
        out.append(ind + "do")
        out.append(ind + '  local ok, e = pcall(ctx.step.run, "run%d", function() local t = nil; return t.x end, { retries = 0 })' % s.n)
        out.append(ind + "  add(out, { err = tostring(e) })")
        out.append(ind + "end")

    def stmt_sleep(self, sk, out, ind, loop):
        rng = self.rng
        secs = round(rng.uniform(0.2, 0.6 if loop > 1 else 2.0), 2)
        if rng.random() < 0.3:
            s = self.new_site("till", loop=loop)
            s.features = {"step.sleep_until"}
            out.append(ind + 'ctx.step.sleep_until("till%d", time.now() + %s)' % (s.n, secs))
            return
        s = self.new_site("nap", loop=loop)
        s.features = {"step.sleep"}
        arg = '"%dms"' % int(secs * 1000) if rng.random() < 0.5 else repr(secs)
        out.append(ind + 'ctx.step.sleep("nap%d", %s)' % (s.n, arg))

    def stmt_wait_timeout(self, sk, out, ind, loop):
        rng = self.rng
        s = self.new_site("tmo", loop=loop)
        s.features = {"step.wait_for_event timed out"}
        secs = round(rng.uniform(0.3, 0.6 if loop > 1 else 1.5), 2)
        match = rng.random() < 0.7
        if match and sk.role == "main" and rng.random() < 0.5:
            sk.tmo_decoys.append(s.n)
            s.features.add("step.wait_for_event with a non-matching event")
        m = ', match = "data.tag"' if match else ""
        out.append(ind + "do")
        out.append(ind + '  local ev = ctx.step.wait_for_event("tmo%d", { event = "sim.nope.%d"%s, timeout = %s })' % (s.n, s.n, m, secs))
        out.append(ind + '  add(out, { sig = ev and "unexpected" or "none" })')
        out.append(ind + "end")

    def stmt_wait_match(self, sk, out, ind, loop, early):
        rng = self.rng
        kind = "esig" if early else "lsig"
        s = self.new_site(kind, loop=loop)
        s.features = {"step.wait_for_event matched " + ("(event sent before the wait)" if early else "(event sent while waiting)")}
        if early:
            sk.early.append((s.n, loop))
        t = rng.choice((', timeout = "60s"', ', timeout = 90', ""))
        out.append(ind + "do")
        out.append(ind + '  local ev = ctx.step.wait_for_event("%s%d", { event = "sim.sig.%d", match = "data.tag"%s })' % (kind, s.n, s.n, t))
        out.append(ind + '  add(out, { sig = ev and ev.data.sig or "none" })')
        out.append(ind + "end")

    def stmt_parallel(self, sk, out, ind, loop, caught=None):
        rng = self.rng
        n = rng.randint(2, 4)
        retries = sk.retries
        opts = ""
        feats = {"step.parallel"}
        if rng.random() < 0.4:
            retries = rng.randint(1, 3)
            opts = ", { retries = %d }" % retries
            feats.add("parallel opts.retries")
        if caught is None:
            caught = rng.random() < 0.4
        branches = []
        for i in range(n):
            if caught and i == n - 1 and rng.random() < 0.5:
                branches.append((99, rng.random() < 0.3))
                feats.add("parallel branch fails")
            elif retries > 0 and rng.random() < 0.3:
                branches.append((rng.randint(1, retries), False))
                feats.add("parallel branch retried")
            else:
                branches.append((0, False))
        s = self.new_site("par", retries=retries, branches=branches, loop=loop)
        s.features = feats
        fns = []
        for i, (f, fat) in enumerate(branches):
            d = rng.choice((0, 20, 80, 200))
            fns.append("function() return call(ctx, out.acc + %d, %d, %d, %s) end" % (
                s.n * 10 + i, f, d, "true" if fat else "false"))
        lst = "{\n" + "".join(ind + "    " + f + ",\n" for f in fns) + ind + "  }"
        out.append(ind + "do")
        if caught:
            out.append(ind + '  local ok, res = pcall(ctx.step.parallel, "par%d", %s%s)' % (s.n, lst, opts))
            out.append(ind + "  if ok then for _, r in ipairs(res) do note(out, r) end else add(out, { err = tostring(res) }) end")
        else:
            out.append(ind + '  local res = ctx.step.parallel("par%d", %s%s)' % (s.n, lst, opts))
            out.append(ind + "  for _, r in ipairs(res) do note(out, r) end")
        out.append(ind + "end")

    def stmt_send(self, sk, out, ind, loop):
        rng = self.rng
        s = self.new_site("send", loop=loop)
        s.features = {"step.send_event"}
        n = rng.randint(1, 3)
        # Tags name the sending skill: one event can start two skills with the same tag.
        evs = ['{ name = "sim.fan", data = { tag = T .. "/%s.s" .. k .. "/%d" } }' % (sk.id, i + 1) for i in range(n)]
        if rng.random() < 0.3:
            evs.append('{ name = "sim.unheard", data = { tag = T } }')
            s.features.add("send_event of an event nobody listens to")
        if len(evs) == 1 and rng.random() < 0.5:
            arg = evs[0]
            s.features.add("send_event of a single event")
        else:
            arg = "{ " + ", ".join(evs) + " }"
        self.ensure_receiver()
        out.append(ind + "do")
        out.append(ind + "  k = k + 1")
        out.append(ind + '  local ids = ctx.step.send_event("send%d", %s)' % (s.n, arg))
        out.append(ind + "  add(out, { sent = #ids })")
        out.append(ind + "end")

    def stmt_invoke(self, sk, out, ind, loop, uncaught_ok=False):
        """An invoke of a child run that completes, fails, is cancelled, or
        outlasts the invoke's or its own timeout."""
        rng = self.rng
        modes = ["ok", "ok", "fail", "cancel", "orphan", "expire"]
        mode = rng.choice(modes)
        if loop > 1 and mode in ("orphan", "expire"):
            mode = "ok"
        s = self.new_site("inv", loop=loop)
        s.features = {"step.invoke child " + {"ok": "completes", "fail": "fails", "cancel": "is cancelled",
                                               "orphan": "outlasts the invoke timeout",
                                               "expire": "hits its run timeout"}[mode]}
        if mode == "expire":
            child = self.ensure_timed()
        else:
            child = self.ensure_child()
        timeout = ""
        if mode == "orphan":
            timeout = ', timeout = "800ms"'
        elif rng.random() < 0.3:
            timeout = ', timeout = "%s"' % rng.choice(("60s", "2m"))
            s.features.add("invoke timeout (not reached)")
        caught = mode != "ok" and not (uncaught_ok and rng.random() < 0.5)
        if mode == "orphan":
            caught = True  # the child must outlive a parent that goes on
        args = '"inv%d", { skill = "%s", data = { tag = T .. "/%s.i" .. k, mode = "%s" }%s }' % (
            s.n, child, sk.id, mode, timeout)
        out.append(ind + "do")
        out.append(ind + "  k = k + 1")
        if mode == "ok" and self.rng2.random() < 0.35:
            # Children in parallel: step.invoke in the functions of
            # step.parallel (drawn from rng2, so the other draws of every
            # seed stay as they were).
            n = self.rng2.randint(2, 3)
            s.features = {"step.invoke in step.parallel (%d children at once)" % n}
            fns = ['function() return ctx.step.invoke("c", { skill = "%s", data = { tag = T .. "/%s.i" .. k .. "/%d",'
                   ' mode = "ok" }%s }) end' % (child, sk.id, b + 1, timeout) for b in range(n)]
            lst = "{\n" + "".join(ind + "    " + f + ",\n" for f in fns) + ind + "  }"
            out.append(ind + '  for _, r in ipairs(ctx.step.parallel("inv%d", %s)) do add(out, { child = r }) end' % (s.n, lst))
            out.append(ind + "end")
            return False
        if caught:
            out.append(ind + "  local ok, r = pcall(ctx.step.invoke, %s)" % args)
            out.append(ind + "  if ok then add(out, { child = r }) else add(out, { err = tostring(r) }) end")
        else:
            out.append(ind + "  add(out, { child = ctx.step.invoke(%s) })" % args)
        out.append(ind + "end")
        return mode != "ok" and not caught

    # ---- skills -----------------------------------------------------------

    def ensure_receiver(self):
        if "r1" not in self.w.skills:
            sk = Skill("r1", "receiver")
            sk.triggers = ["sim.fan"]
            self.w.skills["r1"] = sk
            lines = []
            self.stmt_run(sk, lines, "    ", 1, caught=False)
            if self.rng.random() < 0.5:
                self.stmt_sleep(sk, lines, "    ", 1)
            sk.lines = lines
        return "r1"

    def ensure_child(self):
        have = [k for k, v in self.w.skills.items() if v.role == "child"]
        if have and (len(have) >= 2 or self.rng.random() < 0.6):
            return self.rng.choice(have)
        cid = "c%d" % (len(have) + 1)
        sk = Skill(cid, "child")
        sk.retries = self.rng.randint(0, 3)
        sk.cancel_on = self.rng.random() < 0.5
        self.w.skills[cid] = sk
        lines = []
        for _ in range(self.rng.randint(1, 3)):
            r = self.rng.random()
            if r < 0.45:
                self.stmt_run(sk, lines, "    ", 1, caught=True)
            elif r < 0.6:
                self.stmt_sleep(sk, lines, "    ", 1)
            elif r < 0.75:
                self.stmt_parallel(sk, lines, "    ", 1, caught=True)
            elif r < 0.9:
                self.stmt_wait_match(sk, lines, "    ", 1, early=False)
            else:
                self.stmt_wait_timeout(sk, lines, "    ", 1)
        sk.lines = lines
        return cid

    def ensure_timed(self):
        if "ct" not in self.w.skills:
            sk = Skill("ct", "timed")
            sk.timeout = "%dms" % self.rng.choice((1500, 2000, 2500))
            self.w.skills["ct"] = sk
            lines = []
            self.stmt_run(sk, lines, "    ", 1, caught=False)
            self.stmt_sleep(sk, lines, "    ", 1)
            sk.lines = lines
        return "ct"

    def gen_body(self, sk, lines, ind, depth, budget):
        """A sequence of statements for a main skill."""
        rng = self.rng
        for _ in range(budget):
            r = rng.random()
            if r < 0.22:
                self.stmt_run(sk, lines, ind, depth)
            elif r < 0.32:
                self.stmt_sleep(sk, lines, ind, depth)
            elif r < 0.40:
                self.stmt_wait_match(sk, lines, ind, depth, early=rng.random() < 0.5)
            elif r < 0.47:
                self.stmt_wait_timeout(sk, lines, ind, depth)
            elif r < 0.60:
                self.stmt_parallel(sk, lines, ind, depth)
            elif r < 0.72:
                self.stmt_invoke(sk, lines, ind, depth)
            elif r < 0.80:
                self.stmt_send(sk, lines, ind, depth)
            elif r < 0.85:
                self.stmt_luaerr(sk, lines, ind, depth)
            elif depth == 1:
                n = rng.randint(2, 3)
                lines.append(ind + "for i = 1, %d do" % n)
                first = self.nsite + 1
                self.gen_body(sk, lines, ind + "  ", n, rng.randint(1, 2))
                lines.append(ind + "end")
                for k in range(first, self.nsite + 1):
                    self.w.sites[k].features.add("repeated step ids in a loop")
            else:
                self.stmt_run(sk, lines, ind, depth)

    def gen_main(self, i):
        rng = self.rng
        sk = Skill("m%d" % i, "main")
        sk.retries = rng.randint(0, 3)
        sk.backoff = rng.choice(("20ms", "50ms", "100ms"))
        sk.triggers = ["sim.start.m%d" % i]
        if rng.random() < 0.4:
            sk.timeout = rng.choice(("10m", "1h"))
        sk.cancel_on = rng.random() < 0.5
        sk.on_failure = rng.random() < 0.6
        self.w.skills[sk.id] = sk
        lines = []
        n = rng.randint(3, 7)
        hold_at = rng.randint(0, n) if rng.random() < 0.6 else None
        fail_at = rng.randint(0, n) if rng.random() < 0.5 else None
        for j in range(n + 1):
            if j == hold_at:
                sk.has_hold = True
                lines.append('    if d.hold then ctx.step.wait_for_event("hold_c", { event = "sim.never", match = "data.tag" }) end')
            if j == fail_at:
                sk.has_fail = True
                lines.append("    if d.fail then")
                if rng.random() < 0.6:
                    self.stmt_run(sk, lines, "      ", 1, caught=False, force_fail=True)
                else:
                    self.stmt_invoke(sk, lines, "      ", 1, uncaught_ok=True)
                    lines.append('      error("the run gives up")')
                lines.append("    end")
            if j < n:
                self.gen_body(sk, lines, "    ", 1, 1)
        sk.lines = lines
        return sk

    # ---- source -------------------------------------------------------------

    def source(self, sk):
        head = PRELUDE % {"seed": self.w.seed, "id": sk.id}
        L = [head, "return {", "  id = %s," % lua_str(sk.id)]
        if sk.triggers:
            L.append("  triggers = { %s }," % ", ".join("{ event = %s }" % lua_str(t) for t in sk.triggers))
        L.append("  retries = %d," % sk.retries)
        L.append("  backoff = %s," % lua_str(sk.backoff))
        if sk.timeout:
            L.append("  timeout = %s," % lua_str(sk.timeout))
        if sk.cancel_on:
            L.append('  cancel_on = { { event = "sim.cancel", match = "data.tag" } },')
        if sk.on_failure:
            s = self.new_site("run", fail=0, retries=sk.retries)
            s.features = {"step.run", "on_failure"}
            L.append("  on_failure = function(ctx, err)")
            L.append("    local out = { tag = ctx.event.data.tag, acc = 0, trail = {}, failed = err.message }")
            L.append("    note(out, ctx.step.run(\"run%d\", function() return call(ctx, %d, 0, 20, false) end))" % (s.n, s.n))
            if self.rng.random() < 0.4:
                n = self.new_site("nap")
                n.features = {"step.sleep"}
                L.append('    ctx.step.sleep("nap%d", 0.3)' % n.n)
            L.append("    return out")
            L.append("  end,")
        L.append("  run = function(ctx)")
        L.append("    local d = ctx.input or {}")
        L.append("    local T = d.tag")
        L.append("    local out = { tag = T, acc = 0, trail = {}, ver = MARK }")
        L.append("    local k = 0")
        if sk.role == "ballast":
            L.append('    ctx.step.wait_for_event("hold_b", { event = "sim.never", match = "data.tag" })')
        L.extend(getattr(sk, "lines", []))
        if sk.role == "child":
            L.append('    if d.mode == "fail" then')
            s = self.new_site("run", fail=99, fatal=True, retries=0)
            s.features = {"step.run", "run fatal()"}
            L.append('      note(out, ctx.step.run("run%d", function() return call(ctx, %d, 99, 0, true) end))' % (s.n, s.n))
            L.append("    end")
            L.append('    if d.mode == "cancel" then ctx.step.wait_for_event("hold_c", { event = "sim.never", match = "data.tag" }) end')
            L.append('    if d.mode == "orphan" then ctx.step.wait_for_event("hold_p", { event = "sim.never", match = "data.tag" }) end')
        if sk.role == "timed":
            L.append('    ctx.step.wait_for_event("hold_t", { event = "sim.never", match = "data.tag" })')
        L.append("    return out")
        L.append("  end,")
        L.append("}")
        return "\n".join(L) + "\n"

    # ---- the world --------------------------------------------------------

    def world(self):
        rng = self.rng
        mains = [self.gen_main(i + 1) for i in range(rng.randint(1, 2))]
        if len(mains) == 2 and rng.random() < 0.4:
            for m in mains:
                m.triggers.append("sim.start.both")
        ballast = Skill("zb", "ballast")
        self.w.skills["zb"] = ballast
        for sk in self.w.skills.values():
            sk.source = self.source(sk)
        # Root runs: tags r1..rN; each one skill (or both, for a shared event).
        nroots = rng.randint(4, 9)
        for i in range(nroots):
            m = rng.choice(mains)
            start = rng.choice(("event", "event", "event", "invoke", "invoke", "run"))
            skills = [m.id]
            ev = "sim.start." + m.id
            if start == "event" and "sim.start.both" in m.triggers and rng.random() < 0.4:
                skills = [x.id for x in mains]
                ev = "sim.start.both"
            data = {"tag": "r%d" % (i + 1)}
            if m.has_hold and rng.random() < 0.3:
                data["hold"] = True
            if m.has_fail and rng.random() < 0.35:
                data["fail"] = True
            self.w.roots.append({"tag": data["tag"], "skills": skills, "start": start, "event": ev,
                                 "data": data})
        # Batches: when the harness starts them (seconds from the case start).
        tags = [r["tag"] for r in self.w.roots]
        rng.shuffle(tags)
        nb = rng.randint(2, 4)
        cuts = sorted(rng.sample(range(1, len(tags)), min(nb - 1, len(tags) - 1)))
        parts, prev = [], 0
        for c in cuts + [len(tags)]:
            parts.append(tags[prev:c])
            prev = c
        t = 0.0
        for p in parts:
            self.w.batches.append({"at": round(t, 2), "tags": p, "resend": rng.random() < 0.35,
                                   "cli": rng.random() < 0.3})
            t += rng.uniform(0.3, 1.5)
        self.flow()
        self.live_edits()
        return self.w

    # ---- live edits -------------------------------------------------------------

    def live_edits(self):
        """In some worlds (a stream of its own), the harness rewrites skill
        files while runs are in flight, as an agent does (guarantee 5):
        each edit changes only the file's MARK, so whatever the edits'
        timing, outputs agree with mode a once `ver` is left out, and each
        run's `ver` says which version's code it ran, to be compared with
        the version its record names (check.py)."""
        rng = random.Random(self.w.seed * 15485863 + 11)
        if rng.random() < 0.5:
            return
        cands = sorted(k for k, sk in self.w.skills.items() if sk.role in ("main", "child", "flow"))
        started = {}  # tag -> when its batch starts
        for b in self.w.batches:
            for tag in b["tags"]:
                started[tag] = b["at"]
        for i in range(rng.randint(1, 3)):
            sid = rng.choice(cands)
            # Before the last batch that starts the skill (any batch, for a
            # child), so that runs start on both sides of the edit.
            last = max([started.get(r["tag"], 0) for r in self.w.roots if sid in r["skills"]] or
                       [b["at"] for b in self.w.batches])
            at = rng.uniform(0.1, last - 0.2) if last > 0.4 else rng.uniform(0.1, 1.0)
            self.w.edits.append({"at": round(at, 2), "skill": sid, "mark": "e%d" % (i + 1)})
        self.w.edits.sort(key=lambda e: e["at"])

    # ---- flow control ---------------------------------------------------------

    def flow(self):
        """Flow control, in some worlds (drawn from a stream of its own, so
        the other draws of every seed stay as they were): skills under
        concurrency limits (per key, and a scope shared by two skills),
        throttle, singleton and idempotency, and the roots that start them
        (events and invokes, added to the batches). Their bodies only run
        steps (no sleeps or waits: a run holds its slots from its first
        step to its last, so the steps' times in the trace show who was in
        flight). Which root of an idempotency key or of a singleton's key
        runs depends on timing: the checks judge those by invariants
        (check.py's flow checks), not by comparing outcomes with mode a."""
        rng = random.Random(self.w.seed * 104729 + 3)
        if rng.random() < 0.5:
            return
        scope = rng.randint(1, 3)
        specs = []
        f1 = {"id": "f1", "conc": [{"limit": rng.randint(1, 2), "key": "event.data.g"},
                                   {"limit": scope, "scope": "simflow"}]}
        if rng.random() < 0.5:
            f1["throttle"] = {"limit": rng.randint(1, 3), "period": rng.choice(("1s", "2s"))}
        if rng.random() < 0.6:
            f1["idempotency"] = "event.data.idem"
        specs.append(f1)
        f2 = {"id": "f2", "conc": [{"limit": scope, "scope": "simflow"}]}
        if rng.random() < 0.6:
            f2["throttle"] = {"limit": rng.randint(1, 2), "period": "1s", "burst": rng.randint(0, 1)}
        specs.append(f2)
        if rng.random() < 0.6:
            specs.append({"id": "fs", "singleton": {"key": "event.data.g", "mode": "skip"}})
        for spec in specs:
            sk = Skill(spec["id"], "flow")
            sk.flow = spec
            sk.retries = 2
            sk.triggers = ["sim.flow." + spec["id"]]
            self.w.skills[sk.id] = sk
            lines = []
            for _ in range(rng.randint(1, 3)):
                fail = 1 if rng.random() < 0.2 else 0
                s = self.new_site("run", fail=fail, retries=sk.retries)
                s.features = {"step.run", "flow control: %s" % ", ".join(self.flow_kinds(spec))}
                lines.append("    note(out, ctx.step.run(\"run%d\", function() return call(ctx, out.acc + %d, %d, %d, false)"
                             " end))" % (s.n, s.n, fail, rng.choice((80, 150, 300))))
            sk.lines = lines
            sk.source = self.source(sk).replace("  run = function(ctx)", self.flow_options(spec) + "  run = function(ctx)")
        # Roots: several per skill, a few keys each, so limits bind.
        n0 = len(self.w.roots)
        idem = 0
        for i in range(rng.randint(6, 12)):
            spec = rng.choice(specs)
            data = {"tag": "q%d" % (i + 1), "g": rng.choice(("a", "b"))}
            if "idempotency" in spec:
                idem += rng.random() < 0.6
                data["idem"] = "k%d" % max(idem, 1)
            start = "event" if rng.random() < 0.6 else "invoke"
            root = {"tag": data["tag"], "skills": [spec["id"]], "start": start,
                    "event": "sim.flow." + spec["id"], "data": data, "flow": True}
            if start == "invoke" and rng.random() < 0.6:
                # A caller-chosen run key: a retried (or repeated) invoke
                # starts one run.
                root["key"] = "start:" + data["tag"]
                root["twice"] = rng.random() < 0.5
            self.w.roots.append(root)
        for r in self.w.roots[n0:]:
            rng.choice(self.w.batches)["tags"].append(r["tag"])

    @staticmethod
    def flow_kinds(spec):
        return [k for k in ("conc", "throttle", "idempotency", "singleton") if k in spec]

    @staticmethod
    def flow_options(spec):
        """The skill's flow control options, as Lua."""
        def tbl(d):
            return "{ " + ", ".join("%s = %s" % (k, lua_str(v) if isinstance(v, str) else v)
                                    for k, v in d.items()) + " }"
        out = []
        if "conc" in spec:
            out.append("  concurrency = { %s }," % ", ".join(tbl(c) for c in spec["conc"]))
        if "throttle" in spec:
            out.append("  throttle = %s," % tbl(spec["throttle"]))
        if "idempotency" in spec:
            out.append("  idempotency = %s," % lua_str(spec["idempotency"]))
        if "singleton" in spec:
            out.append("  singleton = %s," % tbl(spec["singleton"]))
        return "\n".join(out) + "\n"


def generate(seed):
    return Gen(seed).world()


def early_events(world, root):
    """The events the harness sends with a root's start: the matching events
    of its skill's early waits (one per pass of a loop), and events for its
    timed-out waits that do not match."""
    out = []
    for sid in root["skills"]:
        sk = world.skills[sid]
        for site, times in sk.early:
            for i in range(times):
                out.append({"name": "sim.sig.%d" % site, "data": {"tag": root["tag"], "sig": i + 1},
                            "id": "%s:%s:sig%d:%d" % (root["tag"], sid, site, i + 1)})
        for site in sk.tmo_decoys:
            out.append({"name": "sim.nope.%d" % site, "data": {"tag": "not-" + root["tag"]},
                        "id": "%s:%s:decoy%d" % (root["tag"], sid, site)})
    return out


if __name__ == "__main__":
    import sys
    w = generate(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    print(w.describe())
    print(json.dumps(w.roots, indent=1))
    print(json.dumps(w.batches))
    print(sorted(w.features()))
