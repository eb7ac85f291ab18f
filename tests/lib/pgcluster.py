"""pgcluster: a private PostgreSQL cluster for the tests of the PostgreSQL
store, from Debian's server binaries, in a folder of its own: no system
service, no port or socket shared with anything else.

    python3 pgcluster.py start DIR   initdb into DIR/data (as user postgres
                                     when run as root), start it on a free
                                     port of 127.0.0.1 with its socket in
                                     DIR; DIR/cluster.json says where it is
    python3 pgcluster.py stop DIR    stop it and delete DIR

CTest runs `start` once before the functional tests against PostgreSQL
(a fixture) and `stop` after them; each test makes its own database in it
(mltest.Workdir). Standard library only.
"""
import glob
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import time


# The superuser's password over TCP.
PASSWORD = "ml-test-secret"


def env_of(info):
    """The environment for psql against the cluster."""
    e = dict(os.environ)
    e["PGPASSWORD"] = info.get("password", "")
    return e


def bindir():
    """The folder of Debian's PostgreSQL server binaries (the newest)."""
    try:
        d = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if d and os.path.exists(os.path.join(d, "initdb")):
            return d
    except OSError:
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not found:
        raise SystemExit("pgcluster: no PostgreSQL server binaries (initdb): install the Debian "
                         "package postgresql (apt-get install postgresql), or run `make deps`")
    return os.path.dirname(found[-1])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_as(user, args, **kw):
    """Run args as user (None: as we are)."""
    if user:
        kw["user"] = user
    return subprocess.run(args, capture_output=True, text=True, **kw)


def start(d):
    """initdb and start a cluster in d; returns its description."""
    b = bindir()
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    root = os.geteuid() == 0
    # The server refuses to run as root: as root, run it as postgres (the
    # Debian package's user), in a folder that user owns.
    user = "postgres" if root else None
    superuser = "postgres" if root else pwd.getpwuid(os.geteuid()).pw_name
    if root:
        pw = pwd.getpwnam("postgres")
        os.chown(d, pw.pw_uid, pw.pw_gid)
    data = os.path.join(d, "data")
    # Over TCP (the store's way in) a password is asked, as a real server
    # would: the tests see that it never shows. The socket trusts.
    pwfile = os.path.join(d, "pw")
    with open(pwfile, "w") as f:
        f.write(PASSWORD + "\n")
    if root:
        os.chown(pwfile, pw.pw_uid, pw.pw_gid)
    r = run_as(user, [os.path.join(b, "initdb"), "-D", data, "--username", superuser,
                      "--auth-local", "trust", "--auth-host", "md5", "--pwfile", pwfile,
                      "--encoding", "UTF8", "--locale", "C.UTF-8", "--no-sync"])
    if r.returncode:
        raise SystemExit("pgcluster: initdb failed:\n" + r.stdout + r.stderr)
    for attempt in range(5):
        port = free_port()
        opts = ("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=on -c max_connections=200"
                " -c shared_buffers=32MB" % (port, d))
        r = run_as(user, [os.path.join(b, "pg_ctl"), "start", "-D", data, "-w", "-t", "60",
                          "-l", os.path.join(d, "server.log"), "-o", opts])
        if r.returncode == 0:
            break
        time.sleep(0.2)
    else:
        log = open(os.path.join(d, "server.log")).read() if os.path.exists(
            os.path.join(d, "server.log")) else ""
        raise SystemExit("pgcluster: pg_ctl start failed:\n" + r.stdout + r.stderr + log)
    # md5 rather than SCRAM over TCP: SCRAM's key stretching costs every
    # connection tens of milliseconds of CPU, and the suite makes thousands.
    subprocess.run([os.path.join(b, "psql"), "-X", "-q", "-h", d, "-p", str(port), "-U", superuser,
                    "-d", "postgres", "-c", "SET password_encryption = 'md5'; ALTER ROLE \"%s\""
                    " PASSWORD '%s'" % (superuser, PASSWORD)], check=True, capture_output=True)
    info = {"bindir": b, "data": data, "dir": d, "port": port, "user": superuser,
            "run_as": user, "opts": opts, "password": PASSWORD,
            "url": "postgresql://%s:%s@127.0.0.1:%d" % (superuser, PASSWORD, port)}
    with open(os.path.join(d, "cluster.json"), "w") as f:
        json.dump(info, f)
    if root:
        os.chmod(d, 0o755)
    return info


def load(d):
    with open(os.path.join(d, "cluster.json")) as f:
        return json.load(f)


def psql(info, sql, db="postgres", raw=False):
    """Run sql through psql on db; returns its output: rows as lines, fields
    separated by | (raw: rows end with \\x1e, fields with \\x1f, NULL is
    \\x01). Raises on failure."""
    fmt = ["-F", "\x1f", "-R", "\x1e", "-P", "null=\x01"] if raw else []
    r = subprocess.run([os.path.join(info["bindir"], "psql"), "-X", "-q", "-A", "-t",
                        "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(info["port"]),
                        "-U", info["user"], "-d", db] + fmt + ["-c", sql],
                       capture_output=True, text=True, timeout=60, env=env_of(info))
    if r.returncode:
        raise RuntimeError("psql failed on %r: %s" % (sql, r.stderr.strip()))
    return r.stdout


def query(info, sql, params=(), db="postgres"):
    """The rows of sql on db, as tuples (? marks a parameter, bound as a
    literal): whole numbers come back as ints, other values as strings,
    NULL as None. Raises on failure, as psql does."""
    parts = sql.split("?")
    if len(parts) - 1 != len(params):
        raise ValueError("%d parameters for %d ?" % (len(params), len(parts) - 1))
    text = parts[0]
    for v, rest in zip(params, parts[1:]):
        if v is None:
            lit = "NULL"
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            lit = repr(v)
        else:
            lit = "'" + str(v).replace("'", "''") + "'"
        text += lit + rest
    rows = []
    for line in psql(info, text, db=db, raw=True).split("\x1e"):
        if not line.strip("\n"):
            continue
        rows.append(tuple(None if f == "\x01" else int(f) if re.fullmatch(r"-?\d+", f) else f
                          for f in line.strip("\n").split("\x1f")))
    return rows


def drop_later(info, db):
    """Drop database db without waiting for it (connections left are cut)."""
    subprocess.Popen([os.path.join(info["bindir"], "psql"), "-X", "-q", "-h", "127.0.0.1",
                      "-p", str(info["port"]), "-U", info["user"], "-d", "postgres", "-c",
                      'DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % db],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_of(info))


def pg_ctl(info, *args):
    return run_as(info["run_as"], [os.path.join(info["bindir"], "pg_ctl")] + list(args)
                  + ["-D", info["data"]])


def stop(d):
    if os.path.exists(os.path.join(d, "cluster.json")):
        info = load(d)
        pg_ctl(info, "stop", "-m", "immediate", "-w")
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        raise SystemExit("usage: pgcluster.py start|stop DIR")
    if sys.argv[1] == "start":
        t = time.time()
        info = start(sys.argv[2])
        print("pgcluster: PostgreSQL at %s (data in %s), started in %.1fs" % (
            info["url"], info["data"], time.time() - t))
    else:
        stop(sys.argv[2])
