"""The engine's words, read from engine/base/vocab.h (the one place they
are listed), so that tests, the simulation and the benchmarks never keep a
copy of their own: a status added there is seen here."""

import os
import re

_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "engine", "base", "vocab.h")


def _list(name):
    """[(word, ended)] of the X-macro list name in vocab.h, in its order."""
    with open(_H) as f:
        text = f.read()
    m = re.search(r"#define %s\(X\)((?:.*\\\n)*.*)" % name, text)
    if not m:
        raise RuntimeError("vocab.h has no list %s" % name)
    return [(w, e == "1") for w, e in re.findall(r'X\(\w+,\s*"(\w+)",\s*([01])\)', m.group(1))]


RUN_STATUSES = tuple(w for w, _ in _list("VOCAB_RUN_STATUS_LIST"))
RUN_ENDED = tuple(w for w, e in _list("VOCAB_RUN_STATUS_LIST") if e)  # a run in one of these is over
STEP_KINDS = tuple(w for w, _ in _list("VOCAB_STEP_KIND_LIST"))
RUN_ENDED_SQL = "(%s)" % ",".join("'%s'" % w for w in RUN_ENDED)  # for "status IN ..." / "NOT IN ..."
