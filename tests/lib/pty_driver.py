"""pty_driver: drive an interactive program through a real pseudo-terminal.

The program runs with a pty as its stdin, stdout and stderr (so isatty() is
true and line editing is on), a fixed window size and TERM=xterm. A thread
reads everything it prints; expect() waits for a regular expression in
what was printed since the last match, with terminal escape sequences
removed. Standard library only.
"""
import fcntl
import os
import pty
import re
import signal
import struct
import termios
import threading
import time

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\x1b[=>]|\x07")


class Pty:
    def __init__(self, argv, cwd=None, env=None, rows=50, cols=200):
        env = dict(env or os.environ)
        env["TERM"] = "xterm"
        pid, fd = pty.fork()
        if pid == 0:  # the child
            try:
                if cwd:
                    os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.raw = b""
        self.pos = 0  # in the cleaned text: where the next expect() starts
        self.lock = threading.Lock()
        self.status = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.raw += data

    def text(self):
        """Everything printed so far, escape sequences removed."""
        with self.lock:
            raw = self.raw
        return ANSI.sub("", raw.decode("utf-8", "replace")).replace("\r", "")

    def send(self, s):
        os.write(self.fd, s.encode() if isinstance(s, str) else s)

    def line(self, s):
        """Type a line and press Enter."""
        self.send(s + "\r")

    def expect(self, pattern, timeout=15):
        """Wait for pattern (a regular expression) in what was printed since
        the last match; returns the match. Fails with the whole transcript."""
        rx = re.compile(pattern)
        end = time.time() + timeout
        while True:
            t = self.text()
            m = rx.search(t, self.pos)
            if m:
                self.pos = m.end()
                return m
            if time.time() > end:
                raise AssertionError("timed out after %ss waiting for %r; the terminal shows:\n%s"
                                     % (timeout, pattern, t[-4000:]))
            if self.poll() is not None and not rx.search(self.text(), self.pos):
                time.sleep(0.2)
                if not rx.search(self.text(), self.pos):
                    raise AssertionError("the program exited (status %s) before printing %r:\n%s"
                                         % (self.status, pattern, self.text()[-4000:]))
            time.sleep(0.02)

    def poll(self):
        """The exit status once the program ended, else None."""
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
        return self.status

    def wait(self, timeout=15):
        end = time.time() + timeout
        while self.poll() is None:
            if time.time() > end:
                raise AssertionError("the program did not exit within %ss:\n%s"
                                     % (timeout, self.text()[-4000:]))
            time.sleep(0.02)
        return self.status

    def close(self):
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait()
        try:
            os.close(self.fd)
        except OSError:
            pass
