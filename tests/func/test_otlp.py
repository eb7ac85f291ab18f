"""OpenTelemetry export: each finished run arrives at an OTLP/HTTP collector
stand-in as a trace whose span tree matches the run's steps and attempts."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, wait_until  # noqa: E402


def attrs(span):
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = v.get("stringValue", v.get("intValue"))
    return out


class OtlpTest(TestCase):
    def setUp(self):
        super().setUp()
        self.w.write("moonloop.conf.lua", """return { env = { "STANDIN" },
  otlp = { endpoint = "%s/otel", service_name = "moonloop-test" } }""" % self.si.url)

    def traces(self):
        spans = []
        for body in self.si.bodies.get("/otel/v1/traces", []):
            req = json.loads(body)
            for rs in req["resourceSpans"]:
                svc = attrs(rs["resource"])["service.name"]
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        sp["_service"] = svc
                        spans.append(sp)
        return spans

    def test_run_step_and_attempt_spans(self):
        self.si.routes["/flaky"] = lambda h, b, n: (500, "no") if n == 1 else (200, {"n": n})
        self.w.write("s.lua", """
return { id = "traced", backoff = "10ms", run = function(ctx)
  ctx.step.run("first", function() log.info("hello span"); return 1 end)
  ctx.step.run("flaky", function() return http.get_json(env.STANDIN .. "/flaky").n end)
  return "ok"
end }""")
        run_id = self.run_id_of(self.w.ml("run", "s.lua", check=0))
        wait_until(lambda: len(self.traces()) >= 6, what="the trace at the collector")
        spans = self.traces()
        self.assertTrue(all(s["_service"] == "moonloop-test" for s in spans))
        trace_ids = {s["traceId"] for s in spans}
        self.assertEqual(len(trace_ids), 1)
        root = [s for s in spans if "parentSpanId" not in s]
        self.assertEqual(len(root), 1)
        root = root[0]
        self.assertEqual(attrs(root)["moonloop.run_id"], run_id)
        self.assertEqual(root["status"]["code"], 1)
        steps = [s for s in spans if s.get("parentSpanId") == root["spanId"]]
        self.assertEqual(sorted(attrs(s)["moonloop.step.id"] for s in steps), ["first", "flaky"])
        flaky = [s for s in steps if attrs(s)["moonloop.step.id"] == "flaky"][0]
        attempts = [s for s in spans if s.get("parentSpanId") == flaky["spanId"]]
        self.assertEqual(sorted(s["name"] for s in attempts), ["attempt 1", "attempt 2"])
        failed = [s for s in attempts if s["name"] == "attempt 1"][0]
        self.assertEqual(failed["status"]["code"], 2)
        self.assertIn("returned 500", attrs(failed)["moonloop.error"])
        first = [s for s in steps if attrs(s)["moonloop.step.id"] == "first"][0]
        self.assertEqual(first["events"][0]["name"], "hello span")
        for s in spans:
            self.assertLessEqual(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))

    def test_a_child_run_links_to_its_parent(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/child.lua", 'return { id = "child", run = function(ctx) return 2 end }')
        self.w.write("skills/parent.lua", """
return { id = "parent", run = function(ctx) return ctx.step.invoke("c", { skill = "child" }) end }""")
        p = self.w.serve("--workspace", "skills")
        self.w.ml("invoke", "parent", "--wait", check=0)
        wait_until(lambda: len({s["traceId"] for s in self.traces()}) == 2, what="two traces")
        spans = self.traces()
        roots = {attrs(s)["moonloop.skill"]: s for s in spans if "parentSpanId" not in s}
        link = roots["child"]["links"][0]
        self.assertEqual(link["traceId"], roots["parent"]["traceId"])
        self.assertEqual(link["spanId"], roots["parent"]["spanId"])
        p.terminate()
