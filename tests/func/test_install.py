"""Installing moonloop: `cmake --install` into a temporary prefix, and the
Debian package `make deb` builds (scripts/deb.sh).

The build folder is the one MOONLOOP_BIN was built in. Checked: the files
land where GNUInstallDirs says; the installed binary runs; moonloop(1)
renders with `man -l` and documents every command and option the binary
parses (with a description each: it is generated from the same tables as
--help); the bash completion sources cleanly and completes commands,
options and statuses; the zsh completion parses (when zsh is installed);
the systemd unit names the installed paths and passes `systemd-analyze
verify` (when systemd-analyze is installed; nothing is started); the .deb
holds the same files under /usr and /etc, with its dependencies, conffile
and maintainer scripts.
"""
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, SRC, sqlite_only  # noqa: E402

BUILD = os.path.dirname(os.path.abspath(BIN))


def have(cmd):
    return shutil.which(cmd) is not None


def run(*args, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run(list(args), **kw)


def render_man(path):
    """The page as man shows it, plain text; fails on troff's warnings."""
    env = dict(os.environ, MANWIDTH="100", MAN_KEEP_FORMATTING="", LC_ALL="C.UTF-8")
    r = run("man", "--warnings", "-l", path, env=env)
    if r.returncode != 0:
        raise AssertionError("man -l %s failed: %s" % (path, r.stderr))
    if r.stderr.strip():
        raise AssertionError("man -l %s warned: %s" % (path, r.stderr))
    return re.sub(r".\x08", "", r.stdout)


def parsed_tables():
    """The commands and options the binary takes, from its own --help and usages."""
    help_text = run(BIN, "--help").stdout
    commands = re.findall(r"^  moonloop (\w+)", help_text, re.M)
    with open(os.path.join(SRC, "engine", "cli", "main.c")) as f:
        main_c = f.read()
    table = main_c[main_c.index("static const struct option options[]"):]
    options = re.findall(r'\{"([a-z][a-z-]*)", [01], ', table[:table.index("{NULL")])
    return commands, options


@sqlite_only("installing the binary and building its package use no database of the suite's: "
             "run once, on the SQLite pass")
class InstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prefix = tempfile.mkdtemp(prefix="ml-install-")
        r = run("cmake", "--install", BUILD, "--prefix", cls.prefix)
        if r.returncode != 0:
            raise AssertionError("cmake --install failed:\n" + r.stdout + r.stderr)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.prefix, ignore_errors=True)

    def p(self, *parts):
        return os.path.join(self.prefix, *parts)

    def test_the_files_land(self):
        for rel in ("bin/moonloop", "share/man/man1/moonloop.1",
                    "share/bash-completion/completions/moonloop", "share/zsh/site-functions/_moonloop",
                    "etc/moonloop/moonloop.conf.lua", "lib/systemd/system/moonloop.service"):
            self.assertTrue(os.path.isfile(self.p(rel)), rel)
        self.assertTrue(os.access(self.p("bin/moonloop"), os.X_OK))
        self.assertRegex(run(self.p("bin/moonloop"), "--version").stdout, r"^moonloop \d+\.\d+\.\d+$")
        # The installed configuration is one moonloop reads.
        r = run(self.p("bin/moonloop"), "skills", "--config", self.p("etc/moonloop/moonloop.conf.lua"),
                "--db", self.p("test.db"), "--json")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "[]"), r.stderr)

    def test_the_man_page_renders_and_documents_everything(self):
        if not have("man"):
            self.skipTest("man is not installed (apt-get install man-db; scripts/deps.sh does it)")
        text = render_man(self.p("share/man/man1/moonloop.1"))
        self.assertIn("moonloop - a durable orchestration engine for agent loops", text)
        commands, options = parsed_tables()
        self.assertIn("stats", commands)
        for c in commands:
            self.assertRegex(text, r"(?m)^ +moonloop +%s\b" % c)
        for o in options:
            self.assertRegex(text, r"--%s\b" % o)
        self.assertNotIn("(no description)", text)
        for section in ("SYNOPSIS", "COMMANDS", "OPTIONS", "ENVIRONMENT", "EXIT STATUS", "FILES"):
            self.assertRegex(text, r"(?m)^%s$" % section)
        # It is the binary's own: what `help --man` prints at any time.
        with open(self.p("share/man/man1/moonloop.1")) as f:
            self.assertEqual(f.read(), run(BIN, "help", "--man").stdout)

    def test_bash_completion(self):
        path = self.p("share/bash-completion/completions/moonloop")

        def complete(*words):
            script = 'set -eu; source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1));' \
                     ' _moonloop; printf "%s\\n" "${COMPREPLY[@]:-}"'
            r = run("bash", "-c", script, "bash", path, "moonloop", *words)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr, "")
            return [w for w in r.stdout.split("\n") if w]
        r = run("bash", "-c", 'source "$1" && complete -p moonloop', "bash", path)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertIn("-F _moonloop moonloop", r.stdout)
        self.assertEqual(complete("st"), ["stats"])
        self.assertEqual(complete("--db", "x.db", "stats", "--in"), ["--interval"])
        self.assertEqual(complete("runs", "--status", "c"), ["completed", "cancelled"])
        self.assertEqual(complete("runs", "--trigger", "o"), ["on_failure"])
        self.assertIn("--follow", complete("runs", "--"))
        self.assertNotIn("--follow", complete("skills", "--"))

    def test_zsh_completion(self):
        if not have("zsh"):
            self.skipTest("zsh is not installed")
        path = self.p("share/zsh/site-functions/_moonloop")
        r = run("zsh", "-n", path)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        r = run("zsh", "-fc", 'fpath=("$1" $fpath); autoload -Uz compinit; compinit -u -d "$2";'
                ' autoload -Uz _moonloop; print ok', "zsh", os.path.dirname(path),
                os.path.join(self.prefix, "zcompdump"))
        self.assertEqual((r.returncode, r.stdout.strip(), r.stderr), (0, "ok", ""))
        with open(path) as f:
            text = f.read()
        self.assertTrue(text.startswith("#compdef moonloop\n"))
        for c in parsed_tables()[0]:
            self.assertIn("'%s:" % c, text)

    def test_the_systemd_unit(self):
        unit = self.p("lib/systemd/system/moonloop.service")
        with open(unit) as f:
            text = f.read()
        self.assertIn("ExecStart=%s serve --config %s\n" % (self.p("bin/moonloop"),
                                                             self.p("etc/moonloop/moonloop.conf.lua")), text)
        for line in ("Type=notify", "DynamicUser=yes", "StateDirectory=moonloop moonloop/skills",
                     "ProtectSystem=strict", "NoNewPrivileges=yes", "ProtectHome=yes", "PrivateTmp=yes",
                     "CapabilityBoundingSet=", "SystemCallFilter=@system-service",
                     "StartLimitIntervalSec=0"):
            self.assertIn("\n%s\n" % line, text)
        self.assertNotIn("@", re.sub(r"(?m)^#.*$|SystemCallFilter=@\S+", "", text))
        if not have("systemd-analyze"):
            self.skipTest("systemd-analyze is not installed: the unit was not verified")
        # Documentation=man:moonloop(1) is checked too: man finds the installed page.
        env = dict(os.environ, MANPATH=self.p("share", "man") + ":")
        r = run("systemd-analyze", "verify", unit, env=env)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))


@sqlite_only("installing the binary and building its package use no database of the suite's: "
             "run once, on the SQLite pass")
class DebianPackageTest(unittest.TestCase):
    """scripts/deb.sh (make deb): a Release build in build/deb, staged, packaged."""

    @classmethod
    def setUpClass(cls):
        for cmd in ("dpkg-deb", "dpkg-shlibdeps", "dpkg"):
            if not have(cmd):
                raise unittest.SkipTest("%s is missing (apt-get install dpkg-dev)" % cmd)
        cls.out = tempfile.mkdtemp(prefix="ml-deb-")
        r = run("sh", os.path.join(SRC, "scripts", "deb.sh"), env=dict(os.environ, DEB_OUT=cls.out),
                timeout=900)
        if r.returncode != 0:
            raise AssertionError("scripts/deb.sh failed:\n" + r.stdout + r.stderr)
        cls.deb = r.stdout.strip().splitlines()[-1]
        cls.root = os.path.join(cls.out, "root")
        run("dpkg-deb", "-x", cls.deb, cls.root, check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def field(self, name):
        return run("dpkg-deb", "-f", self.deb, name).stdout.strip()

    def test_control(self):
        self.assertEqual(self.field("Package"), "moonloop")
        version = run(BIN, "--version").stdout.split()[1]
        self.assertEqual(self.field("Version"), version)
        self.assertEqual(self.field("Architecture"), run("dpkg", "--print-architecture").stdout.strip())
        depends = self.field("Depends")
        for lib in ("libc6", "libsqlite3-0", "libuv1", "libcurl4", "libh2o"):
            self.assertIn(lib, depends)
        ctl = os.path.join(self.out, "control")
        run("dpkg-deb", "-e", self.deb, ctl, check=True)
        with open(os.path.join(ctl, "conffiles")) as f:
            self.assertEqual(f.read(), "/etc/moonloop/moonloop.conf.lua\n")
        for script in ("postinst", "prerm", "postrm"):
            path = os.path.join(ctl, script)
            self.assertTrue(os.access(path, os.X_OK), script)
            self.assertEqual(run("sh", "-n", path).returncode, 0, script)

    def test_contents(self):
        listing = run("dpkg-deb", "--contents", self.deb).stdout
        paths = sorted(re.findall(r" \./(\S*[^/\s])$", listing, re.M))
        self.assertEqual(paths, sorted([
            "etc/moonloop/moonloop.conf.lua", "usr/bin/moonloop",
            "usr/lib/systemd/system/moonloop.service",
            "usr/share/bash-completion/completions/moonloop",
            "usr/share/doc/moonloop/changelog.Debian.gz", "usr/share/doc/moonloop/copyright",
            "usr/share/man/man1/moonloop.1.gz", "usr/share/zsh/vendor-completions/_moonloop"]))
        for line in listing.splitlines():
            self.assertIn(" root/root ", line)
        exe = os.path.join(self.root, "usr", "bin", "moonloop")
        self.assertRegex(run(exe, "--version").stdout, r"^moonloop \d+\.\d+\.\d+$")
        with open(os.path.join(self.root, "usr/lib/systemd/system/moonloop.service")) as f:
            unit = f.read()
        self.assertIn("ExecStart=/usr/bin/moonloop serve --config /etc/moonloop/moonloop.conf.lua\n", unit)
        self.assertIn("EnvironmentFile=-/etc/moonloop/environment\n", unit)
        if have("man"):
            text = render_man(os.path.join(self.root, "usr/share/man/man1/moonloop.1.gz"))
            self.assertIn("moonloop stats [SKILL]", text)
        with gzip.open(os.path.join(self.root, "usr/share/man/man1/moonloop.1.gz"), "rt") as f:
            self.assertTrue(f.read().startswith(".\\\" moonloop(1)"))


if __name__ == "__main__":
    unittest.main()
