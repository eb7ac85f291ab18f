"""moonloop serve under a service manager: readiness notification.

systemd starts a Type=notify unit's dependents when the service says
READY=1 on the datagram socket named by $NOTIFY_SOCKET. Here a Python
datagram socket plays systemd: it must get READY=1 only once the
workspace's skills are registered (checked in the database and through
the API the moment the datagram arrives), and STOPPING=1 when serve is
asked to stop. No systemd service is started on this machine.
"""
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase  # noqa: E402

NSKILLS = 60


class NotifyTest(TestCase):
    def setUp(self):
        super().setUp()
        for i in range(NSKILLS):
            self.w.write("skills/s%02d.lua" % i, 'return { id = "s%02d", triggers = { { event = "e%d" } },'
                         ' run = function(ctx) return %d end }\n' % (i, i, i))
        self.sockdir = tempfile.mkdtemp(prefix="ml-notify-")

    def tearDown(self):
        super().tearDown()
        for f in os.listdir(self.sockdir):
            os.unlink(os.path.join(self.sockdir, f))
        os.rmdir(self.sockdir)

    def listen(self, abstract=False):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = "ml-notify-test-%d-%d" % (os.getpid(), time.monotonic_ns())
            s.bind("\0" + name)
            where = "@" + name
        else:
            where = os.path.join(self.sockdir, "notify")
            s.bind(where)
        s.settimeout(60)
        self.addCleanup(s.close)
        return s, where

    def registered(self):
        return self.w.sql("SELECT count(*) FROM skills WHERE version IS NOT NULL")[0][0]

    def start(self, where):
        return self.w.start("serve", "--workspace", "skills", env={"NOTIFY_SOCKET": where})

    def port_of(self, p):
        for _ in range(600):
            line = p.stderr.readline()
            if "listening on" in line:
                return int(line.rsplit(":", 1)[1])
        raise AssertionError("serve did not say where it listens")

    def test_ready_only_once_the_skills_are_registered(self):
        s, where = self.listen()
        p = self.start(where)
        msg = s.recv(4096)
        # The moment READY=1 arrives, every skill is live, and the API answers.
        n = self.registered()
        self.assertEqual(msg, b"READY=1")
        self.assertEqual(n, NSKILLS)
        port = self.port_of(p)
        with urllib.request.urlopen("http://127.0.0.1:%d/v1/skills" % port, timeout=10) as r:
            self.assertEqual(len(json.loads(r.read())["skills"]), NSKILLS)
        # Nothing else was said meanwhile; on SIGTERM, STOPPING=1.
        s.settimeout(0.2)
        with self.assertRaises(socket.timeout):
            s.recv(4096)
        s.settimeout(60)
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(s.recv(4096), b"STOPPING=1")
        self.assertEqual(p.wait(timeout=60), 0)

    def test_an_abstract_socket(self):
        s, where = self.listen(abstract=True)
        p = self.start(where)
        self.assertEqual(s.recv(4096), b"READY=1")
        self.assertEqual(self.registered(), NSKILLS)
        p.send_signal(signal.SIGINT)
        self.assertEqual(s.recv(4096), b"STOPPING=1")
        p.wait(timeout=60)

    def test_a_socket_nobody_listens_on_is_said_not_fatal(self):
        p = self.start(os.path.join(self.sockdir, "nobody"))
        port = self.port_of(p)
        with urllib.request.urlopen("http://127.0.0.1:%d/v1/skills" % port, timeout=10) as r:
            self.assertEqual(r.status, 200)
        line = p.stderr.readline()
        self.assertIn("telling systemd READY=1 through %s" % os.path.join(self.sockdir, "nobody"), line)
        p = self.w.start("serve", "--workspace", "skills", "--listen", "127.0.0.1:0",
                         env={"NOTIFY_SOCKET": "relative/path",
                              "MOONLOOP_DB": os.path.join(self.w.path, "other.db")})
        self.port_of(p)
        self.assertIn("NOTIFY_SOCKET 'relative/path' is not a socket path", p.stderr.readline())


if __name__ == "__main__":
    import unittest
    unittest.main()
