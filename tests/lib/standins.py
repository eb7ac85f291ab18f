#!/usr/bin/env python3
"""Local stand-ins for the outside world of the agent loop (demo and tests).

One small HTTP server plays every service the skills talk to:

  GET  /metrics                  services' error rate, latency, memory, CPU
  GET  /detailed?service=NAME    one service in detail (per endpoint, per minute)
  GET  /deploys?since=2h         recent deploys
  GET  /outcomes?since=7d        what became of last week's incidents
  POST /v1/chat/completions      an OpenAI-compatible LLM with scripted answers
  POST /chat, GET /chat          the team's chat webhook (records messages)
  POST /ops, GET /ops            the ops channel (records messages)
  POST /control, GET /control    the demo's and tests' knobs (see World.state)

The metrics simulate a night-time latency spike on "checkout" while
`spike` is on (set by /control, or for a time window with --spike-at and
--spike-for). The LLM answers like a careful model would, from what the
prompts contain: it classifies from the metrics, correlates the spike
with the checkout deploy, advises raising the latency threshold, and
writes the updated skill file. `llm` = "fail" makes it answer 503,
"nonsense" makes it ramble. `metrics_down` makes the metrics API answer 503.

The HTTP server is mltest's StandIn (the tests' one stand-in server):
every path goes to World.route, and StandIn counts the requests.

Run alone: python3 tests/lib/standins.py [--spike-at S --spike-for S]
prints its port, then serves until killed. Standard library only.
"""
import json
import os
import re
import sys
import time
from urllib.parse import parse_qs, urlparse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mltest import StandIn  # noqa: E402

HEALTHY = [
    {"name": "api", "error_rate": 0.004, "latency_ms": 120, "memory": 0.61, "cpu": 0.42},
    {"name": "checkout", "error_rate": 0.006, "latency_ms": 180, "memory": 0.58, "cpu": 0.37},
    {"name": "search", "error_rate": 0.001, "latency_ms": 95, "memory": 0.55, "cpu": 0.30},
]
SPIKE = {"name": "checkout", "error_rate": 0.031, "latency_ms": 1850, "memory": 0.71, "cpu": 0.66}

DEPLOYS = [
    {"id": "4f2a9c1", "service": "checkout", "author": "dana", "minutes_ago": 14,
     "change": "switch payment client to the new connection pool"},
    {"id": "9b03e77", "service": "search", "author": "lee", "minutes_ago": 95,
     "change": "tune ranking weights"},
]


class World(StandIn):
    """The stand-ins' state, served by a StandIn. Thread-safe."""

    def __init__(self, spike_at=None, spike_for=None):
        self.started = time.time()
        self.spike_at, self.spike_for = spike_at, spike_for
        self.state = {"spike": False, "metrics_down": False, "llm": "ok", "llm_delay": 0.0,
                      "advice_change": True}
        self.chat, self.ops = [], []
        self.llm_requests = []
        super().__init__()
        self.route_prefix("/", self.answer)

    def answer(self, handler, raw, n):
        """StandIn's route: the request's JSON body (None when it has none or
        it is not JSON) to World.route, keyed "METHOD /path"."""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return self.route(handler.path, handler.command, body)

    # ---- the simulated world ----

    def spiking(self):
        if self.state["spike"]:
            return True
        if self.spike_at is None:
            return False
        t = time.time() - self.started
        return self.spike_at <= t < self.spike_at + (self.spike_for or 1e9)

    def services(self):
        if not self.spiking():
            return [dict(s) for s in HEALTHY]
        return [dict(SPIKE) if s["name"] == "checkout" else dict(s) for s in HEALTHY]

    def route(self, path, method, body):
        """(status, JSON value) for one request."""
        u = urlparse(path)
        q = parse_qs(u.query)
        key = "%s %s" % (method, u.path)
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1
        if u.path == "/control":
            if method == "POST" and isinstance(body, dict):
                with self.lock:
                    self.state.update(body)
            return (200, self.state)
        if u.path in ("/metrics", "/detailed") and self.state["metrics_down"]:
            return (503, {"error": "metrics backend unavailable"})
        if u.path == "/metrics":
            return (200, {"services": self.services(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        if u.path == "/detailed":
            name = (q.get("service") or ["?"])[0]
            svc = next((s for s in self.services() if s["name"] == name), None)
            if not svc:
                return (404, {"error": "no service %s" % name})
            slow = svc["latency_ms"] > 500
            return (200, {"service": svc, "endpoints": [
                {"path": "/pay", "p95_ms": svc["latency_ms"] * (1.4 if slow else 1.0), "errors": 41 if slow else 0},
                {"path": "/cart", "p95_ms": svc["latency_ms"] * 0.6, "errors": 3 if slow else 0}],
                "pool": {"db_connections_in_use": 98 if slow else 22, "db_connections_max": 100}})
        if u.path == "/deploys":
            return (200, {"deploys": DEPLOYS})
        if u.path == "/outcomes":
            return (200, {"incidents": 9, "confirmed": 3, "false_positives": 5, "acted_on": 2,
                                 "note": "most false positives were latency alerts between 450 and 800 ms"})
        if u.path in ("/chat", "/ops"):
            box = self.chat if u.path == "/chat" else self.ops
            if method == "POST":
                with self.lock:
                    box.append(body)
                return (200, {"ok": True})
            with self.lock:
                return (200, list(box))
        if u.path == "/v1/chat/completions" and method == "POST":
            return self.llm(body or {})
        return (404, {"error": "no such path: %s" % u.path})

    # ---- the LLM ----

    def llm(self, req):
        with self.lock:
            self.llm_requests.append(req)
            mode, delay = self.state["llm"], float(self.state["llm_delay"] or 0)
        if mode == "fail":
            return (503, {"error": {"message": "model overloaded"}})
        if delay:
            time.sleep(delay)  # a slow model: the demo kills the engine meanwhile
        msgs = req.get("messages") or []
        prompt = "\n".join(m.get("content", "") for m in msgs if m.get("role") == "user")
        # A skill file in the prompt holds other prompts' words: look at it first.
        if mode == "nonsense":
            text = "Honestly it is hard to say, the services seem fine-ish? Maybe check back later."
        elif "Skill file:" in prompt:
            source = prompt.split("Skill file:\n", 1)[1]
            new = re.sub(r"latency_ms = 500,(\s*)--[^\n]*", r"latency_ms = 800,\1-- p95 latency (raised by the weekly review)",
                         source, count=1)
            text = "```lua\n" + new + "\n```"
        elif "Classify" in prompt:
            text = json.dumps(self.classify(prompt))
        elif "Correlate" in prompt:
            text = json.dumps({
                "root_cause": "deploy 4f2a9c1 (new payment connection pool) exhausts the database pool: "
                              "98 of 100 connections in use, /pay p95 up 10x since the deploy",
                "severity": "high",
                "actions": ["roll back 4f2a9c1", "raise db pool size to 200 until the fix",
                            "add a pool saturation alert"]})
        elif "Review" in prompt:
            change = bool(self.state.get("advice_change", True))
            text = json.dumps({
                "change": change, "skill": "health-check",
                "reason": "5 of 9 incidents were false positives, all latency alerts under 800 ms",
                "suggestion": "raise the latency threshold from 500 ms to 800 ms"})
        else:
            text = "I am a stand-in model; I did not recognise this prompt."
        reply = {"id": "chatcmpl-standin", "object": "chat.completion", "model": req.get("model", "standin"),
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                              "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4,
                           "total_tokens": len(prompt) // 4 + len(text) // 4}}
        return (200, reply)

    def classify(self, prompt):
        """Classify from the metrics in the prompt, against the thresholds it gives."""
        try:
            metrics = json.loads(prompt.split("METRICS: ", 1)[1].strip())
            limits = json.loads(prompt.split("Thresholds: ", 1)[1].split("\n", 1)[0])
        except (IndexError, ValueError):
            return {"health": "unknown"}
        affected, reasons, health = [], [], "normal"
        for s in metrics.get("services", []):
            why = [k for k, lim in limits.items() if s.get(k, 0) > lim]
            if why:
                affected.append(s["name"])
                reasons.append("%s: %s above threshold" % (s["name"], ", ".join(sorted(why))))
                health = "degraded"
        return {"health": health, "affected": affected, "reasons": reasons}

    # ---- life ----

    def start(self):
        """The server already runs (StandIn starts it): kept for callers."""
        return self


if __name__ == "__main__":
    args = sys.argv[1:]
    opts = {}
    while args:
        a = args.pop(0)
        if a in ("--spike-at", "--spike-for"):
            opts[a[2:].replace("-", "_")] = float(args.pop(0))
    w = World(**opts).start()
    print(w.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
