"""Attach, idempotent starts, and a serve that answers only once ready.

- GET /v1/runs/{id}?wait=SECONDS answers as soon as the run ends (completed,
  failed, cancelled), with the current record when the wait runs out, for
  runs this engine executes and runs another process executes; across an
  engine restart the client gets an error it can retry (503, or a broken
  connection), then the answer.
- invoke's key: a repeated key answers the first run's id, also after
  kill -9 in the middle of the commit that stores it; `moonloop invoke
  --key`, in file mode and over --server.
- `moonloop trace RUN --wait` and `moonloop invoke --wait --server` attach.
- serve answers no request before the workspace's skills are registered:
  invokes sent in a tight loop from serve's first moment never get 404.

Waits are bounded only to catch hangs (tests never assert how fast).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import http.client

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, RUN_ENDED, SkillsTestCase, kill9, wait_until  # noqa: E402

SLEEPER = """
return { id = "sleeper", run = function(ctx)
  ctx.step.run("before", function() return 1 end)
  ctx.step.sleep("nap", ctx.input.s)
  if ctx.input.fail then error(fatal("it went wrong")) end
  return { slept = ctx.input.s }
end }
"""

OTHER = """
return { id = "other", run = function(ctx) return "other" end }
"""

TERMINAL = RUN_ENDED


def call(port, method, path, body=None, timeout=60):
    """(status, headers, parsed body) on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(data) if data else None
    finally:
        c.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Background(threading.Thread):
    """A call made in a thread: .result is (status, headers, body), or .error."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.start()

    def run(self):
        try:
            self.result = self.fn()
        except Exception as e:  # noqa: BLE001 - the test looks at it
            self.error = e


class AttachTest(SkillsTestCase):
    def setUp(self):
        super().setUp()
        self.skill("sleeper", SLEEPER)
        self.p = self.serve()

    def start(self, **data):
        st, _, b = call(self.p.port, "POST", "/v1/skills/sleeper/invoke", {"data": data})
        self.assertEqual(st, 202, b)
        return b["run_id"]

    def attach(self, run_id, wait=60, port=None):
        return call(port or self.p.port, "GET", "/v1/runs/%s?wait=%s" % (run_id, wait),
                    timeout=wait + 30)

    def status(self, run_id, port=None):
        return call(port or self.p.port, "GET", "/v1/runs/" + run_id)[2]["status"]

    def test_attach_answers_when_the_run_completes(self):
        run_id = self.start(s=1)
        st, _, rec = self.attach(run_id)
        self.assertEqual(st, 200, rec)
        self.assertEqual(rec["status"], "completed")
        self.assertEqual(rec["output"], {"slept": 1})
        self.assertEqual([s["id"] for s in rec["steps"]], ["before", "nap"])

    def test_attach_answers_when_the_run_fails(self):
        run_id = self.start(s=0.5, fail=True)
        st, _, rec = self.attach(run_id)
        self.assertEqual(st, 200, rec)
        self.assertEqual(rec["status"], "failed")
        self.assertIn("it went wrong", rec["error"]["message"])

    def test_attach_answers_when_the_run_is_cancelled(self):
        run_id = self.start(s=600)
        wait_until(lambda: self.status(run_id) == "sleeping", what="the run asleep")
        waiting = Background(lambda: self.attach(run_id, wait=120))
        time.sleep(0.3)
        self.assertTrue(waiting.is_alive(), "the attach answered before the run ended")
        st, _, b = call(self.p.port, "POST", "/v1/runs/%s/cancel" % run_id)
        self.assertEqual(st, 200, b)
        waiting.join(60)
        self.assertIsNone(waiting.error)
        self.assertEqual(waiting.result[2]["status"], "cancelled")

    def test_a_cancel_says_what_the_run_ended_as(self):
        """Invoke, then cancel at once, 60 times: the run may complete
        before the cancel reaches it. A 200 "cancelled" must mean the run
        was cancelled, a 409 that it ended another way; the answer said
        "cancelled" for a run still in memory, 17 times in 100 for runs
        that completed (a review's count)."""
        answers = {}
        for _ in range(60):
            run_id = self.start(s=0)
            st, _, b = call(self.p.port, "POST", "/v1/runs/%s/cancel" % run_id)
            st2, _, rec = self.attach(run_id)
            self.assertEqual(st2, 200, rec)
            if st == 200:
                self.assertEqual(b, {"run_id": run_id, "status": "cancelled"})
                self.assertEqual(rec["status"], "cancelled", rec)
            else:
                self.assertEqual(st, 409, b)
                self.assertIn("nothing", b["error"]["message"])
                self.assertIn(rec["status"], ("completed",), rec)
                self.assertIn(rec["status"], b["error"]["message"])
            answers[st] = answers.get(st, 0) + 1
        self.assertTrue(answers.get(200), answers)  # most cancels reach the run

    def test_the_wait_runs_out_with_the_current_record(self):
        run_id = self.start(s=600)
        wait_until(lambda: self.status(run_id) == "sleeping", what="the run asleep")
        st, _, rec = self.attach(run_id, wait=0.3)
        self.assertEqual(st, 200, rec)
        self.assertEqual(rec["status"], "sleeping")
        self.assertEqual(rec["id"], run_id)

    def test_ended_unknown_and_malformed(self):
        run_id = self.start(s=0)
        self.attach(run_id)
        st, _, rec = self.attach(run_id, wait=300)  # ended: answered at once
        self.assertEqual(rec["status"], "completed")
        st, _, b = self.attach("01J00000000000000000000000", wait=5)
        self.assertEqual(st, 404, b)
        for bad in ("abc", "301", "-1"):
            st, _, b = call(self.p.port, "GET", "/v1/runs/%s?wait=%s" % (run_id, bad))
            self.assertEqual(st, 400, b)
            self.assertIn("wait", b["error"]["message"])
        st, _, b = call(self.p.port, "GET", "/v1/runs/%s?since=1" % run_id)
        self.assertEqual(st, 400, b)
        # Empty values are the defaults, as the lists take them (a form sends them so).
        st, _, b = call(self.p.port, "GET", "/v1/runs/%s?wait=&steps=" % run_id)
        self.assertEqual((st, b["status"], len(b["steps"])), (200, "completed", 2))

    def test_steps_false_answers_the_record_as_the_list_has_it(self):
        run_id = self.start(s=0.5)
        st, _, rec = call(self.p.port, "GET", "/v1/runs/%s?wait=60&steps=false" % run_id,
                          timeout=90)
        self.assertEqual(st, 200, rec)
        self.assertEqual(rec["status"], "completed")
        self.assertEqual(rec["output"], {"slept": 0.5})
        for key in ("steps", "logs", "children"):
            self.assertNotIn(key, rec)
        # The same fields as the run list's entry, and as the full record
        # without its steps, logs and children.
        _, _, page = call(self.p.port, "GET", "/v1/runs?limit=50")
        self.assertEqual(rec, [r for r in page["runs"] if r["id"] == run_id][0])
        _, _, full = call(self.p.port, "GET", "/v1/runs/" + run_id)
        self.assertEqual(rec, {k: v for k, v in full.items() if k not in ("steps", "logs", "children")})
        for q in ("steps=0", "steps=false&wait=0"):
            st, _, b = call(self.p.port, "GET", "/v1/runs/%s?%s" % (run_id, q))
            self.assertEqual((st, b), (200, rec), q)
        for q in ("steps=true", "steps=1", "wait=1&steps=true"):
            st, _, b = call(self.p.port, "GET", "/v1/runs/%s?%s" % (run_id, q))
            self.assertEqual((st, b), (200, full), q)
        # A wait that runs out: the record as it stands, still without steps.
        sleeping = self.start(s=600)
        wait_until(lambda: self.status(sleeping) == "sleeping", what="the run asleep")
        st, _, b = call(self.p.port, "GET", "/v1/runs/%s?steps=false&wait=0.3" % sleeping)
        self.assertEqual((st, b["status"]), (200, "sleeping"), b)
        self.assertNotIn("steps", b)
        for bad in ("maybe", "FALSE", "2"):
            st, _, b = call(self.p.port, "GET", "/v1/runs/%s?steps=%s" % (run_id, bad))
            self.assertEqual(st, 400, b)
            self.assertIn("steps must be true or false", b["error"]["message"])
        st, _, b = call(self.p.port, "GET", "/v1/runs/01J00000000000000000000000?steps=false")
        self.assertEqual(st, 404, b)

    def test_many_clients_attach_to_one_run_and_one_gives_up(self):
        run_id = self.start(s=1.5)
        gone = socket.create_connection(("127.0.0.1", self.p.port))
        gone.sendall(("GET /v1/runs/%s?wait=60 HTTP/1.1\r\nHost: x\r\n\r\n" % run_id).encode())
        clients = [Background(lambda: self.attach(run_id)) for _ in range(20)]
        time.sleep(0.2)
        gone.close()  # a client that went away must not hurt the others
        for c in clients:
            c.join(60)
            self.assertIsNone(c.error)
            self.assertEqual(c.result[2]["status"], "completed")

    def test_attach_to_a_run_another_process_executes(self):
        # `moonloop run` executes the run in its own process, on the same database.
        other = self.w.start("run", "sleeper", "--data", '{"s": 1.5}', "--quiet")
        line = other.stderr.readline()
        self.assertTrue(line.startswith("run "), line)
        run_id = line.split()[1]
        # Its id is printed before its row is committed: attach once it is there.
        wait_until(lambda: call(self.p.port, "GET", "/v1/runs/" + run_id)[0] == 200, what="the run")
        st, _, rec = self.attach(run_id)
        self.assertEqual(rec["status"], "completed", rec)
        self.assertEqual(rec["trigger"]["by"], "cli")
        self.assertEqual(other.wait(30), 0)

    def test_attach_across_an_engine_restart(self):
        run_id = self.start(s=3)
        wait_until(lambda: self.status(run_id) == "sleeping", what="the run asleep")
        # SIGTERM: the attached client is answered at once with a 503 it can retry.
        waiting = Background(lambda: self.attach(run_id, wait=120))
        time.sleep(0.3)
        self.p.send_signal(signal.SIGTERM)
        waiting.join(30)
        self.assertIsNone(waiting.error)
        st, h, b = waiting.result
        self.assertEqual(st, 503, b)
        self.assertIn("attach again", b["error"]["message"])
        self.assertEqual(h.get("retry-after"), "1")
        self.assertEqual(self.p.wait(30), 0)
        # kill -9: the client's connection breaks; it attaches again after the restart.
        p2 = self.serve()
        waiting = Background(lambda: self.attach(run_id, wait=120, port=p2.port))
        time.sleep(0.3)
        kill9(p2)
        waiting.join(30)
        self.assertIsNotNone(waiting.error, waiting.result)
        p3 = self.serve()
        st, _, rec = self.attach(run_id, port=p3.port)
        self.assertEqual(st, 200, rec)
        self.assertEqual(rec["status"], "completed")
        self.assertEqual(rec["output"], {"slept": 3})


class IdempotentStartTest(SkillsTestCase):
    def setUp(self):
        super().setUp()
        self.skill("sleeper", SLEEPER)
        self.skill("other", OTHER)

    def invoke(self, port, skill, body, timeout=60):
        return call(port, "POST", "/v1/skills/%s/invoke" % skill, body, timeout=timeout)

    def runs_with_key(self, key):
        return [r[0] for r in self.w.sql("SELECT id FROM runs WHERE idem = ?", (key,))]

    def test_a_repeated_key_answers_the_first_run(self):
        p = self.serve()
        st, _, a = self.invoke(p.port, "sleeper", {"data": {"s": 0.5}, "key": "order-42"})
        self.assertEqual(st, 202, a)
        st, _, b = self.invoke(p.port, "sleeper", {"data": {"s": 9}, "key": "order-42"})
        self.assertEqual(st, 202, b)
        self.assertEqual(b["run_id"], a["run_id"])
        # With wait, the repeat attaches to the first run and answers its output.
        st, _, c = self.invoke(p.port, "sleeper", {"data": {"s": 9}, "key": "order-42", "wait": 60})
        self.assertEqual(st, 200, c)
        self.assertEqual((c["run_id"], c["status"], c["output"]), (a["run_id"], "completed", {"slept": 0.5}))
        # The key is per skill, and shown in the run's trigger.
        st, _, d = self.invoke(p.port, "other", {"key": "order-42"})
        self.assertNotEqual(d["run_id"], a["run_id"])
        rec = call(p.port, "GET", "/v1/runs/" + a["run_id"])[2]
        self.assertEqual(rec["trigger"]["key"], "order-42")
        self.assertEqual(len(self.runs_with_key("order-42")), 2)
        st, _, e = self.invoke(p.port, "sleeper", {"key": ""})
        self.assertEqual(st, 400, e)
        st, _, e = self.invoke(p.port, "sleeper", {"key": 42})
        self.assertEqual(st, 400, e)

    def test_a_repeated_key_still_answers_once_its_skill_is_gone(self):
        # A client retrying a keyed start while a deploy removes the skill
        # got 404 "no live version", and concluded its start never happened.
        p = self.serve()
        st, _, a = self.invoke(p.port, "sleeper", {"data": {"s": 1}, "key": "deploy-7"})
        self.assertEqual(st, 202, a)
        st, _, b = call(p.port, "DELETE", "/v1/skills/sleeper")
        self.assertEqual(st, 200, b)
        st, _, b = self.invoke(p.port, "sleeper", {"data": {"s": 9}, "key": "deploy-7"})
        self.assertEqual((st, b), (202, {"run_id": a["run_id"]}))
        st, _, c = self.invoke(p.port, "sleeper", {"key": "deploy-7", "wait": 60})
        self.assertEqual(st, 200, c)
        self.assertEqual((c["run_id"], c["status"], c["output"]), (a["run_id"], "completed", {"slept": 1}))
        # A new key of a skill that is gone is still refused, naming it.
        st, _, d = self.invoke(p.port, "sleeper", {"key": "deploy-8"})
        self.assertEqual(st, 404, d)
        self.assertIn("sleeper", d["error"]["message"])
        self.assertEqual(len(self.runs_with_key("deploy-7")), 1)

    def test_concurrent_repeats_start_one_run(self):
        p = self.serve()
        calls = [Background(lambda: self.invoke(p.port, "sleeper", {"data": {"s": 0}, "key": "same"}))
                 for _ in range(20)]
        ids = set()
        for c in calls:
            c.join(60)
            self.assertIsNone(c.error)
            ids.add(c.result[2]["run_id"])
        self.assertEqual(len(ids), 1)
        self.assertEqual(self.runs_with_key("same"), list(ids))

    def test_a_retry_after_kill9_finds_the_key(self):
        # Answered, then killed: the retry after the restart gets the same run.
        p = self.serve()
        st, _, a = self.invoke(p.port, "sleeper", {"data": {"s": 1}, "key": "k1"})
        self.assertEqual(st, 202, a)
        kill9(p)
        p = self.serve()
        st, _, b = self.invoke(p.port, "sleeper", {"data": {"s": 1}, "key": "k1", "wait": 60})
        self.assertEqual((st, b["run_id"], b["status"]), (200, a["run_id"], "completed"))
        kill9(p)
        # Killed inside the commit that stores the key (each commit holds its
        # transaction 400 ms): the client got no answer; its retry starts the
        # run once, whether the first try's commit made it or not.
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0",
                         env={"MOONLOOP_FAULT": "commit=400"})
        first = Background(lambda: self.invoke(p.port, "sleeper", {"data": {"s": 0}, "key": "k2"},
                                               timeout=30))
        time.sleep(0.2)
        kill9(p)
        first.join(30)
        self.assertIsNotNone(first.error, "the first try was answered before the kill")
        before = self.runs_with_key("k2")
        self.assertLessEqual(len(before), 1)
        p = self.serve()
        st, _, b = self.invoke(p.port, "sleeper", {"data": {"s": 0}, "key": "k2", "wait": 60})
        self.assertEqual(st, 200, b)
        self.assertEqual(b["status"], "completed")
        self.assertEqual(self.runs_with_key("k2"), [b["run_id"]])
        if before:
            self.assertEqual(before, [b["run_id"]])

    def test_cli_invoke_key_in_file_mode_and_over_server(self):
        p = self.serve()
        a = self.w.ml("invoke", "sleeper", "--data", '{"s": 0}', "--key", "cli-1", check=0)
        b = self.w.ml("invoke", "sleeper", "--data", '{"s": 0}', "--key", "cli-1", check=0)
        self.assertEqual(a.stdout, b.stdout)
        self.assertIn("started before", b.stderr)
        c = self.w.ml("invoke", "sleeper", "--key", "cli-1", "--server", p.url, check=0)
        self.assertEqual(c.stdout, a.stdout)
        d = self.w.ml("invoke", "sleeper", "--key", "cli-1", "--wait", "--server", p.url, check=0)
        self.assertEqual(json.loads(d.stdout), {"slept": 0})
        self.assertEqual(self.runs_with_key("cli-1"), [a.stdout.strip()])

    def test_cli_invoke_key_wait_with_no_engine_runs_it_here(self):
        kill9(self.serve())  # the workspace is registered; no engine holds the database

        a = self.w.ml("invoke", "sleeper", "--data", '{"s": 0.2}', "--key", "here", "--wait", check=0)
        self.assertEqual(json.loads(a.stdout), {"slept": 0.2})
        b = self.w.ml("invoke", "sleeper", "--data", '{"s": 9}', "--key", "here", "--wait", check=0)
        self.assertEqual(json.loads(b.stdout), {"slept": 0.2})
        self.assertEqual(len(self.runs_with_key("here")), 1)


class CliWaitTest(SkillsTestCase):
    def setUp(self):
        super().setUp()
        self.skill("sleeper", SLEEPER)
        self.p = self.serve()

    def test_trace_wait_in_file_mode_and_over_server(self):
        for extra in ([], ["--server", self.p.url]):
            run_id = self.w.ml("invoke", "sleeper", "--data", '{"s": 1}', check=0).stdout.strip()
            rec = json.loads(self.w.ml("trace", run_id, "--wait", "60", "--json", *extra, check=0).stdout)
            self.assertEqual(rec["status"], "completed", extra)
            # A wait that runs out prints the run as it stands.
            run_id = self.w.ml("invoke", "sleeper", "--data", '{"s": 600}', check=0).stdout.strip()
            wait_until(lambda: self.w.trace(run_id)["status"] == "sleeping", what="the run asleep")
            rec = json.loads(self.w.ml("trace", run_id, "--wait", "0.3", "--json", *extra, check=0).stdout)
            self.assertEqual(rec["status"], "sleeping", extra)
            r = self.w.ml("trace", run_id, "--wait", "soon", *extra, check=2)
            self.assertIn("--wait", r.stderr)

    def test_invoke_wait_over_server_attaches_until_the_end(self):
        r = self.w.ml("invoke", "sleeper", "--data", '{"s": 1, "fail": true}', "--wait", "--server",
                      self.p.url, check=1)
        self.assertIn("it went wrong", r.stderr)
        r = self.w.ml("invoke", "sleeper", "--data", '{"s": 1}', "--wait", "--server", self.p.url, check=0)
        self.assertEqual(json.loads(r.stdout), {"slept": 1})


class ReadyTest(SkillsTestCase):
    def test_no_404_in_serves_first_milliseconds(self):
        for i in range(20):
            self.skill("s%02d" % i, 'return { id = "s%02d", run = function(ctx) return %d end }' % (i, i))
        port = free_port()
        p = self.w.start("serve", "--workspace", "skills", "--listen", "127.0.0.1:%d" % port)
        seen = {}
        end = time.time() + 60
        while time.time() < end and seen.get(202, 0) < 20:
            try:
                st, _, b = call(port, "POST", "/v1/skills/s19/invoke", {"data": {}}, timeout=30)
            except (ConnectionRefusedError, ConnectionResetError):
                continue  # not bound yet
            seen[st] = seen.get(st, 0) + 1
            self.assertEqual(st, 202, b)
        self.assertEqual(seen.get(202), 20)
        p.send_signal(signal.SIGTERM)
        p.wait(30)


if __name__ == "__main__":
    import unittest
    unittest.main()
