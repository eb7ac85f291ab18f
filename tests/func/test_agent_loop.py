"""The agent loop end to end, against the stand-ins (tests/lib/standins.py):
health check, incident triage, the weekly review and the update skill."""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from story import Story  # noqa: E402


class AgentLoopTest(unittest.TestCase):
    def setUp(self):
        self.s = Story()

    def tearDown(self):
        self.s.close()

    def completed(self, skill):
        return [r for r in self.s.runs(skill) if r["status"] == "completed"]

    def test_the_story_triage_only_when_degraded_one_summary_across_a_kill_and_a_new_version(self):
        s = self.s
        s.world.state["llm_delay"] = 2.0
        s.start_serve()
        s.wait("three healthy checks", lambda: len(self.completed("health-check")) >= 3)
        self.assertEqual(s.runs("incident-triage"), [])  # healthy: no triage
        for r in self.completed("health-check"):
            self.assertEqual(r["output"]["health"], "normal")
            self.assertEqual(r["output"]["source"], "llm")

        s.world.state["spike"] = True
        triage = s.wait("a triage", lambda: s.runs("incident-triage"))[0]
        s.wait("the triage's LLM call", lambda: s.llm_asked("Correlate"))
        s.kill_serve()
        s.start_serve()
        s.wait("the triage to complete", lambda: s.trace(triage["id"])["status"] == "completed", timeout=40)
        s.world.state["spike"] = False
        s.world.state["llm_delay"] = 0
        t = s.trace(triage["id"])
        self.assertEqual([x["id"] for x in t["steps"]],
                         ["fetch-detailed-metrics", "fetch-deploys", "correlate", "post-summary"])
        self.assertEqual(t["output"]["severity"], "high")
        self.assertIn("4f2a9c1", t["output"]["root_cause"])
        self.assertEqual(s.world.count("GET /detailed"), 1)  # completed before the kill: not run again
        self.assertIsNotNone(t["steps"][2]["usage"])  # the LLM's tokens are in the trace
        # More degraded ticks came meanwhile: still one triage and one summary for the incident.
        time.sleep(3.5)
        self.assertEqual(len(s.runs("incident-triage")), 1)
        chat = s.chat()
        self.assertEqual(len(chat), 1)
        self.assertIn("checkout", chat[0]["text"])
        self.assertEqual(chat[0]["key"], triage["id"] + ":post-summary")
        parent = s.trace(t["parent_id"])
        self.assertEqual(parent["skill"], "health-check")
        self.assertEqual(parent["output"]["health"], "degraded")

        # The review deploys a new health check; a run of the old version in
        # flight meanwhile finishes on it, and the next run uses the new one.
        old = [x for x in s.json("skills") if x["id"] == "health-check"][0]["version"]
        s.world.state["llm_delay"] = 2.0  # keep a health check busy in its classify step
        in_flight = s.wait("a health check in flight", lambda: [
            r for r in s.runs("health-check") if r["status"] == "running" and r["version"] == old])[0]["id"]
        s.world.state["llm_delay"] = 0
        review = s.json_out("invoke", "review-skill-performance", "--wait")
        self.assertTrue(review["changed"])
        self.assertEqual(review["stats"]["total"], 1)
        self.assertEqual(review["stats"]["success_rate"], 1)
        self.assertEqual(review["outcomes"]["false_positives"], 5)
        new = review["update"]["new_version"]
        self.assertNotEqual(new, old)
        s.wait("the new version to be live", lambda: any(
            x["id"] == "health-check" and x["version"] == new for x in s.json("skills")))
        with open(os.path.join(s.dir, "skills", "health_check.lua")) as f:
            self.assertIn("latency_ms = 800", f.read())
        s.wait("a health check on the new version",
               lambda: [r for r in self.completed("health-check") if r["version"] == new])
        s.wait("the old run to finish", lambda: s.trace(in_flight)["status"] == "completed")
        self.assertEqual(s.trace(in_flight)["version"], old)  # finished on the version it started with

    def test_the_rule_based_fallback_when_the_llm_answers_nonsense_or_fails(self):
        s = self.s
        s.world.state["spike"] = True
        s.world.state["llm"] = "nonsense"
        s.start_serve()
        r = s.wait("a degraded check", lambda: [x for x in self.completed("health-check")
                                                 if x["output"]["health"] != "normal"])[0]
        self.assertEqual(r["output"]["source"], "rules")
        self.assertEqual(r["output"]["affected"], ["checkout"])
        self.assertIn("latency_ms 1850 over 500", r["output"]["reasons"][0])
        logs = [l["msg"] for st in s.trace(r["id"])["steps"] for l in st["logs"]]
        self.assertTrue(any("falling back to rules" in m for m in logs), logs)
        s.world.state["llm"] = "fail"
        n = len(self.completed("health-check"))
        r = s.wait("a check while the LLM fails", lambda: [
            x for x in self.completed("health-check")[: max(0, len(self.completed("health-check")) - n)]])[0]
        self.assertEqual(r["output"]["source"], "rules")

    def test_on_failure_tells_ops_when_the_metrics_api_stays_down(self):
        s = self.s
        s.world.state["metrics_down"] = True
        s.env["HEALTH_CRON"] = "0 9 1 1 *"  # no ticks: the triage is invoked directly
        s.start_serve()
        r = s.ml("invoke", "incident-triage", "--data", '{"service": "checkout"}', "--wait", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("503", r.stderr)
        ops = s.wait("the ops message", lambda: s.chat("ops"))
        self.assertEqual(len(ops), 1)
        self.assertIn("incident triage failed for checkout", ops[0]["text"])
        self.assertIn("metrics backend unavailable", ops[0]["text"])
        self.assertEqual(ops[0]["services"], ["checkout"])
        self.assertEqual(s.chat(), [])  # no summary
        failed = s.runs("incident-triage")
        triage = [x for x in failed if x["trigger"]["kind"] != "on_failure"][0]
        t = s.trace(triage["id"])
        self.assertEqual(len(t["steps"][0]["attempts"]), 4)  # backed off and retried three times
        self.assertEqual(s.world.count("GET /detailed"), 4)
