"""lualib: what the Lua runtime's security tests share (test_recursion,
test_quarantine, test_memory, test_views, test_env).

The engine is the real binary (mltest's Workdir and serve); requests to
its API are plain HTTP from a client that is not a browser (no Origin), with
the Host it listens on and the Content-Type the API asks for.
"""
import http.client
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, SRC, StandIn, TestCase, Workdir, kill9, wait_until  # noqa: E402,F401


def api(port, method, path, body=None, ctype="application/json", timeout=30):
    """One request to the engine's API; returns (status, parsed JSON body or None)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Accept": "application/json"}
    if body is not None:
        if not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        headers["Content-Type"] = ctype
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data) if data else None
    except ValueError:
        return r.status, data.decode(errors="replace")


def put_skill(port, skill_id, source):
    """PUT /v1/skills/ID with Lua source, as the standalone sidecar sends it."""
    return api(port, "PUT", "/v1/skills/" + skill_id, source, ctype="text/x-lua")


def invoke_wait(port, skill_id, data=None):
    """POST /v1/skills/ID/invoke, waiting up to 120 s for the run's end
    (a slow sanitized build under load): (status, body)."""
    return api(port, "POST", "/v1/skills/%s/invoke" % skill_id, {"data": data, "wait": 120},
               timeout=150)


def alive(p):
    """Whether a started process still runs."""
    return p.poll() is None


def signal_of(returncode):
    """The signal that ended a process (a negative return code), or None."""
    if returncode is not None and returncode < 0:
        return signal.Signals(-returncode).name
    return None


def ml_with_stack(w, stack_bytes, *args, timeout=60, input=None):
    """Run moonloop with the main thread's stack limited to stack_bytes
    (ulimit -s), as a smaller machine or a container might set it."""
    import resource

    def limit():
        hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
        resource.setrlimit(resource.RLIMIT_STACK, (stack_bytes, hard))
    return subprocess.run([BIN] + list(args), cwd=w.path, env=w.env, capture_output=True,
                          text=True, timeout=timeout, input=input, preexec_fn=limit)
