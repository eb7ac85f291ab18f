"""The configuration file: every numeric key is range-checked, and errors name
the file, the line, the key and what is allowed (a misspelt key gets a
suggestion, as in skill files)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase  # noqa: E402


class ConfigTest(TestCase):
    def refused(self, body):
        """Write moonloop.conf.lua returning {body}; a command must refuse it (exit 2)."""
        self.w.write("moonloop.conf.lua", "return {\n%s\n}\n" % body)
        r = self.w.ml("skills", check=2)
        self.assertEqual(r.stdout, "")
        return r.stderr.strip()

    def test_out_of_range_values_are_refused_naming_file_line_key_and_range(self):
        cases = [
            ("  limits = { step_output = -5 },",
             "moonloop.conf.lua:2: 'limits.step_output' must be a size from 16 B to 256 MB, got -5"),
            ("  limits = {\n    run_memory = \"0MB\",\n  },",
             "moonloop.conf.lua:3: 'limits.run_memory' must be a size from 1 MB to 16 GB, got \"0MB\""),
            ("  limits = { run_seconds_between_yields = 0 },",
             "moonloop.conf.lua:2: 'limits.run_seconds_between_yields' must be a duration from "
             "10ms to 1h, got 0"),
            ("  retry = { retries = 500 },",
             "moonloop.conf.lua:2: 'retry.retries' must be a whole number from 0 to 100, got 500"),
            ("  retry = { retries = \"3\" },",
             "moonloop.conf.lua:2: 'retry.retries' must be a whole number from 0 to 100, "
             "got the string \"3\""),
            ("  limits = { event = \"2GB\" },",
             "'limits.event' must be a size from 16 B to 256 MB, got \"2GB\""),
            ("  limits = { parked_runs = 0 },",
             "'limits.parked_runs' must be a whole number from 1 to 10000000, got 0"),
            ("  limits = { parked_runs = 2.5 },", "got 2.5"),
            ("  limits = { run_logs = \"1KB\" },",
             "'limits.run_logs' must be a size from 64 KB to 16 GB, got \"1KB\""),
            ("  limits = { invoke_depth = 0 },",
             "'limits.invoke_depth' must be a whole number from 1 to 10000, got 0"),
            ("  retry = { backoff = 0 },", "'retry.backoff' must be a duration from 1ms to 1d, got 0"),
            ("  retry = { max_backoff = \"30d\" },", "'retry.max_backoff' must be a duration from 1ms to 7d"),
            ("  lease = \"100ms\",", "'lease' must be a duration from 1s to 1d, got \"100ms\""),
            ("  lease = 1e300,", "'lease' must be a duration from 1s to 1d, got 1e+300"),
            ("  shutdown_grace = -1,", "'shutdown_grace' must be a duration from 0s to 1h, got -1"),
            ("  retention = \"10s\",",
             "'retention' must be 0 (keep runs forever) or a duration from 1m to 36500d, got \"10s\""),
            ("  limits = { run_memory = \"lots\" },",
             "'limits.run_memory' must be a size from 1 MB to 16 GB: bad size 'lots'"),
            ("  retry = { backoff = true },", "'retry.backoff' must be a duration from 1ms to 1d, got boolean"),
            ("  limits = 5,", "moonloop.conf.lua:2: 'limits' must be a table, got number"),
        ]
        for body, want in cases:
            with self.subTest(body=body):
                self.assertIn(want, self.refused(body))

    def test_a_file_that_loops_is_stopped_naming_the_fix(self):
        # It held every command (serve printed nothing) for good.
        self.w.write("moonloop.conf.lua", "local n = 0\nwhile true do n = n + 1 end\nreturn {}\n")
        r = self.w.ml("skills", check=2, timeout=30)
        self.assertIn("configuration: the file ran for more than 2 s: a configuration returns a table, "
                      "and a loop in it must end", r.stderr)
        # A loop that ends is a loop like any other.
        self.w.write("moonloop.conf.lua", "local t = {}\nfor i = 1, 1e5 do t[i] = i end\n"
                     "return { retention = #t .. \"s\" }\n")
        self.w.ml("skills", check=0)

    def test_values_in_range_are_taken(self):
        self.w.write("moonloop.conf.lua", """return {
  limits = { step_output = "1KB", event = "100B", run_seconds_between_yields = 0.2,
             run_memory = "4MB", parked_runs = 20, run_logs = "64KB", invoke_depth = 1 },
  retry = { retries = 0, backoff = "1ms", max_backoff = "7d" },
  lease = "1s", shutdown_grace = 0, retention = 0,
}
""")
        self.w.ml("skills", check=0)
        self.w.write("moonloop.conf.lua", """return {
  limits = { step_output = "256MB", event = 16, run_seconds_between_yields = "1h",
             run_memory = "16GB", parked_runs = 10000000, run_logs = "16GB", invoke_depth = 10000 },
  retry = { retries = 100, backoff = "1d" },
  lease = "1d", shutdown_grace = "1h", retention = "1m",
}
""")
        self.w.ml("skills", check=0)

    def test_a_misspelt_key_gets_its_line_and_a_suggestion(self):
        self.assertEqual(self.refused('  db = "x.db",\n  durabilty = "full",'),
                         "moonloop: moonloop.conf.lua:3: unknown key 'durabilty' "
                         "(did you mean 'durability'?)")
        self.assertEqual(self.refused("  limits = {\n    step_ouput = \"1MB\" },"),
                         "moonloop: moonloop.conf.lua:3: unknown key 'step_ouput' in limits "
                         "(did you mean 'step_output'?)")
        # Nothing near: no suggestion.
        self.assertEqual(self.refused("  zzzzzzzz = 1,"),
                         "moonloop: moonloop.conf.lua:2: unknown key 'zzzzzzzz'")

    def test_an_error_in_a_given_config_file_names_that_file(self):
        self.w.write("other.conf.lua", "return { retry = { retries = -1 } }\n")
        r = self.w.ml("runs", "--config", "other.conf.lua", check=2)
        self.assertIn("other.conf.lua:1: 'retry.retries' must be a whole number from 0 to 100, got -1",
                      r.stderr)
