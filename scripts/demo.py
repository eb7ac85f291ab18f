#!/usr/bin/env python3
"""make demo: the agent loop from end to end, in about a minute.

1. A health check ticks every 3 seconds against local stand-ins (metrics,
   deploys, an OpenAI-compatible LLM, a chat webhook).
2. A night-time latency spike hits checkout: the LLM classifies it as
   degraded and the health check invokes incident triage.
3. The engine is killed with SIGKILL while triage waits for the LLM; it
   restarts and the triage resumes from its last completed step; one summary
   reaches the chat, not two.
4. The weekly review reads the run history, asks the LLM whether the health
   check should change, and the update skill deploys a new version through
   the sidecar; the next health check runs on it.

Everything runs on the embedded SQLite default in a temporary folder; the
world around it is tests/lib/standins.py, set up by tests/lib/story.py.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
from story import BIN, Story  # noqa: E402

TTY = sys.stdout.isatty()
BOLD, DIM, GREEN, RED, RESET = ("\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[0m") if TTY else ("",) * 5
T0 = time.time()


def say(title):
    print("\n%s== %s%s" % (BOLD, title, RESET), flush=True)


def note(text):
    print("   " + text, flush=True)


class Demo(Story):
    # ---- the story ----

    def run(self):
        self.world.state["llm_delay"] = 2.5  # the triage's LLM call is slow: time to kill it
        say("1. The workspace: four skills, checked")
        for f in sorted(os.listdir(os.path.join(self.dir, "skills"))):
            print("   " + self.ml("check", os.path.join("skills", f)).stdout.strip())

        say("2. moonloop serve: the health check ticks every 3 s (runs as they start and end)")
        self.start_follow(lambda line: print("   %s| %s%s" % (DIM, line, RESET), flush=True))
        self.start_serve()
        note("%smoonloop serve started (pid %d)%s" % (DIM, self.serve.pid, RESET))
        self.wait("two healthy checks", lambda: sum(
            1 for r in self.runs("health-check") if r["status"] == "completed") >= 2)
        note("all services healthy so far")

        say("3. Night-time latency spike on checkout")
        self.world.state["spike"] = True
        triage = self.wait("a triage", lambda: self.runs("incident-triage"))[0]
        self.wait("triage to ask the LLM", lambda: self.llm_asked("Correlate"))
        done = [s["id"] for s in self.json("trace", triage["id"])["steps"] if s["status"] == "completed"]
        note("triage %s is waiting for the LLM; completed so far: %s" % (triage["id"], ", ".join(done)))

        say("4. kill -9 the engine in the middle of the triage, and restart it")
        self.kill_serve()
        note("%skilled with SIGKILL%s; the database holds:" % (RED, RESET))
        for line in self.ml("trace", triage["id"]).stdout.splitlines()[:14]:
            print("   " + line)
        self.start_serve()
        note("%smoonloop serve restarted (pid %d)%s" % (DIM, self.serve.pid, RESET))
        self.wait("the triage to complete", lambda: (
            lambda tr: tr if tr["status"] == "completed" else None)(self.json("trace", triage["id"])), timeout=40)
        note("%sresumed and completed%s: the steps done before the kill were not run again "
             "(detailed metrics fetched %d time)" % (GREEN, RESET, self.world.count("GET /detailed")))
        self.world.state["spike"] = False
        self.world.state["llm_delay"] = 0

        say("5. The triage's trace (moonloop trace %s)" % triage["id"])
        print("\n".join("   " + l for l in self.ml("trace", triage["id"]).stdout.splitlines()))
        chat = self.chat()
        say("6. The chat message it posted (%d message%s in the chat)" % (len(chat), "" if len(chat) == 1 else "s"))
        for m in chat:
            note(m["text"])
        if len(chat) != 1:
            raise SystemExit("demo: expected exactly one chat message, got %d" % len(chat))

        say("7. The weekly review (invoked now rather than on Monday)")
        before = self.json("skills")
        old = [s for s in before if s["id"] == "health-check"][0]["version"]
        review = self.json_out("invoke", "review-skill-performance", "--wait")
        st = review["stats"]
        note("triage runs this week: %d, success rate %.0f%%, average %.1f s" % (
            st["total"], 100 * (st["success_rate"] or 0), st["avg_duration_s"] or 0))
        note("incident outcomes: %(confirmed)d confirmed, %(false_positives)d false positives, "
             "%(acted_on)d acted on" % review["outcomes"])
        new = review["update"]["new_version"]
        note("the LLM advised a change; update-skill deployed health-check %s -> %s" % (old[:12], new[:12]))
        self.wait("the sidecar to make it live", lambda: any(
            s["id"] == "health-check" and s["version"] == new for s in self.json("skills")))
        note("%slive%s: moonloop skills shows the new version" % (GREEN, RESET))
        with open(os.path.join(self.dir, "skills", "health_check.lua")) as f:
            line = [l.strip() for l in f if "latency_ms =" in l][0]
        note("the changed line: " + line)
        nxt = self.wait("a health check on the new version", lambda: [
            r for r in self.runs("health-check") if r["version"] == new and r["status"] == "completed"])
        note("health check %s ran on version %s" % (nxt[0]["id"], new[:12]))

        say("8. All runs")
        print("\n".join("   " + l for l in self.ml("runs", "--limit", "12").stdout.splitlines()))
        print("\n%sdemo: ok%s (%.0f s)" % (GREEN, RESET, time.time() - T0))


def main():
    if not os.path.exists(BIN):
        raise SystemExit("demo: build first (make demo builds and runs it)")
    d = Demo()
    try:
        d.run()
    finally:
        d.close()


if __name__ == "__main__":
    main()
