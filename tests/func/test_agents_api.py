"""docs/agents.md documents the whole API, and only the API.

The engine's validation tables (lua/api.lua) are printed by `moonloop check
--api --json`: every skill key, ctx field, step with its options, and module
function with its options. The reference tables of docs/agents.md (each
after an `<!-- api: NAME -->` marker) must name each of them, and nothing
the tables do not know: an agent that reads only that page can write any
call the engine takes, and no call it refuses.
"""
import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SRC, TestCase  # noqa: E402

DOC = os.path.join(SRC, "docs", "agents.md")
TICKED = re.compile(r"`([^`]+)`")
IDENT = re.compile(r"^[a-z_]+$")


def table_after(doc, marker):
    """The rows of the markdown table that follows <!-- api: marker -->, as
    lists of cells (the header and its rule left out)."""
    at = doc.find("<!-- api: %s -->" % marker)
    if at < 0:
        raise AssertionError("docs/agents.md has no <!-- api: %s --> table" % marker)
    rows = []
    for line in doc[at:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    return rows[2:]


def options_of(cell):
    """The option keys a cell names: the backticked lower-case identifiers."""
    return {t for t in TICKED.findall(cell) if IDENT.match(t)}


class AgentsApiTest(TestCase):
    def setUp(self):
        super().setUp()
        self.api = json.loads(self.w.ml("check", "--api", "--json", check=0).stdout)
        with open(DOC) as f:
            self.doc = f.read()

    def test_skill_keys(self):
        rows = table_after(self.doc, "skill keys")
        documented = {TICKED.findall(r[0])[0]: r for r in rows}
        self.assertEqual(set(documented), {k["name"] for k in self.api["skill_keys"]})
        # The keys of the sub-tables, in their rows as `key =`.
        for key, sub in (("triggers", "trigger_keys"), ("concurrency", "concurrency_keys"),
                         ("throttle", "throttle_keys"), ("rate_limit", "rate_limit_keys"),
                         ("singleton", "singleton_keys"), ("idempotency", "idempotency_keys"),
                         ("debounce", "debounce_keys"), ("batch", "batch_keys"),
                         ("cancel_on", "cancel_on_keys")):
            text = " ".join(documented[key][1:])
            written = set(re.findall(r"(\w+) =", text))
            self.assertEqual(written, set(self.api[sub]), "the keys of %s" % key)

    def test_ctx_fields(self):
        rows = table_after(self.doc, "ctx")
        documented = {TICKED.findall(r[0])[0] for r in rows}
        self.assertEqual(documented, {"ctx." + f["name"] for f in self.api["ctx_fields"]})

    def test_steps_with_their_options_and_what_they_return(self):
        rows = table_after(self.doc, "steps")
        documented = {}
        for r in rows:
            m = re.match(r"ctx\.step\.(\w+)\(", TICKED.findall(r[0])[0])
            self.assertTrue(m, "not a step call: %s" % r[0])
            documented[m.group(1)] = r
        self.assertEqual(set(documented), {s["name"] for s in self.api["steps"]})
        for s in self.api["steps"]:
            with self.subTest(step=s["name"]):
                cells = documented[s["name"]]
                want = set(s["options"]) or (set(self.api["event_keys"]) if s["name"] == "send_event" else set())
                self.assertEqual(options_of(cells[1]), want)
                for k in s["required"]:
                    self.assertIn("`%s` (required)" % k, cells[1])
                self.assertTrue(cells[2], "what step.%s returns" % s["name"])
        self.assertIn("`nil` when the timeout passed", documented["wait_for_event"][2])

    def test_module_functions_with_their_options(self):
        rows = table_after(self.doc, "modules")
        documented = {}
        for r in rows:
            calls = [t for t in TICKED.findall(r[0]) if re.match(r"^\w+(\.\w+)?[({]|^\w+\.\w+$", t)]
            self.assertTrue(calls, "no call in %s" % r[0])
            for c in calls:
                name = re.match(r"^(\w+(?:\.\w+)?)", c).group(1)
                documented[name] = (r, len(calls))
        known = {}
        for m in self.api["modules"]:
            if m.get("call"):
                known[m["name"]] = {"options": [], "required": []}
            for f in m["functions"]:
                known[m["name"] + "." + f["name"]] = f
            for v in m["values"]:
                known[m["name"] + "." + v["name"]] = {"options": [], "required": []}
        self.assertEqual(set(documented), set(known))
        for name, f in known.items():
            with self.subTest(function=name):
                row, shared = documented[name]
                if shared == 1:  # a row of one call: its options are that call's
                    self.assertEqual(options_of(row[1]), set(f["options"]))
                    for k in f["required"]:
                        self.assertIn("`%s` (required)" % k, row[1])
                elif f["options"]:
                    self.fail("%s takes options: give it a row of its own" % name)
                self.assertTrue(row[2], "what %s returns" % name)
        # env is a table of values: its rule is said in words.
        self.assertIn("`env` is a read-only table of strings", self.doc)

    def test_configuration_an_agent_needs(self):
        doc = self.doc
        for key in ("env", "llm", "deployers", "cancellers", "workspace"):
            self.assertRegex(doc, r"\| `%s[ `]" % key)
        self.assertRegex(doc, r"\| `skill_env[ `]")
        self.assertIn("**`env.NAME` is an error unless the configuration grants NAME**", doc)

    def test_the_table_reader_can_fail(self):
        doc = "<!-- api: x -->\n| a | b |\n|---|---|\n| `one` | `k`, `GET` |\n\nafter\n| `no` |\n"
        self.assertEqual(table_after(doc, "x"), [["`one`", "`k`, `GET`"]])
        self.assertEqual(options_of("`k`, `GET`, `\"7d\"`, `max_tokens`"), {"k", "max_tokens"})
        with self.assertRaises(AssertionError):
            table_after(doc, "missing")

    def test_api_is_printed_as_text_too(self):
        out = self.w.ml("check", "--api", check=0).stdout
        self.assertIn("ctx.step.wait_for_event(id, {event=, match=, timeout=}) -> ", out)
        self.assertIn("http.request{method=, url=, headers=, body= or json=, timeout=} -> ", out)
        self.assertIn("runs.cancel(run_id [, reason]) -> ", out)
        self.w.ml("check", "--api", "x.lua", check=2)


if __name__ == "__main__":
    unittest.main()
