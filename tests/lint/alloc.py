"""alloc: the engine's C code allocates through engine/base/mem.h, whose
functions never return NULL (the out-of-memory policy, docs/architecture.md
"Out of memory"). A plain malloc, calloc, realloc, strdup, strndup,
asprintf or vasprintf in engine/ or sidecar/ would bring back a NULL that no
caller checks any more. mem.c itself is exempt, and so is a line that says
why it is not mem.h's with a comment "not mem.h: ..." (the Lua state's own
allocator, which enforces the budgets).

It also finds cJSON's printers (cJSON_Print, cJSON_PrintUnformatted,
cJSON_PrintBuffered) outside engine/base/jsontext.c: they round numbers (15
significant digits within an epsilon), so every text a user's values pass
through is printed by jsontext_print_text or jsontext_print_pretty.

Prints every use and exits 1; exits 0 when there is none.
"""
import os
import re
import sys

SRC = os.environ.get("MOONLOOP_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")
CALL = re.compile(r"(?<![\w.>])(malloc|calloc|realloc|strdup|strndup|v?asprintf)\s*\(")
PRINT = re.compile(r"\b(cJSON_Print|cJSON_PrintUnformatted|cJSON_PrintBuffered)\s*\(")


def code_of(line, in_comment):
    """The line without its comments (and whether a comment is still open)."""
    out, i = [], 0
    while i < len(line):
        if in_comment:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_comment = end + 2, False
        elif line.startswith("/*", i):
            in_comment = True
            i += 2
        elif line.startswith("//", i):
            break
        elif line[i] == '"':  # a string: skip it whole
            j = i + 1
            while j < len(line) and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            out.append('""')
            i = j + 1
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def main():
    bad = []
    for top in ("engine", "sidecar"):
        for root, _, names in os.walk(os.path.join(SRC, top)):
            for name in sorted(names):
                if not name.endswith((".c", ".h")) or name in ("mem.c",):
                    continue
                path = os.path.join(root, name)
                in_comment = False
                with open(path) as f:
                    for n, line in enumerate(f, 1):
                        code, in_comment = code_of(line, in_comment)
                        m = CALL.search(code)
                        if m and "not mem.h:" not in line:
                            bad.append("%s:%d: %s() instead of base/mem.h's (%s)" % (
                                os.path.relpath(path, SRC), n, m.group(1), line.strip()))
                        m = PRINT.search(code)
                        if m and name != "jsontext.c":
                            bad.append("%s:%d: %s() rounds numbers: use jsontext_print_text or "
                                       "jsontext_print_pretty (%s)" % (
                                           os.path.relpath(path, SRC), n, m.group(1), line.strip()))
    for b in bad:
        print(b)
    print("alloc: %d plain allocations or cJSON printers" % len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
