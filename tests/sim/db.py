"""db: the database of one case, as the harness reads it (never writes):
SQLite's file, or a PostgreSQL database of the simulation's own cluster
(sim.py --pg), read through psql. The harness's queries are written once,
in the SQL both dialects share; tag() is the one expression that differs.
"""
import os
import re
import sqlite3
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import pgcluster  # noqa: E402


class Db:
    def __init__(self, folder, pg=None, name=""):
        """A database for a case in folder: the file moonloop.db there, or
        (pg: pgcluster's description of a running cluster) a new database
        in that cluster."""
        self.pg = pg
        if pg:
            self.name = "mlsim_%s_%s" % (re.sub(r"\W", "", name), uuid.uuid4().hex[:8])
            pgcluster.psql(pg, 'CREATE DATABASE "%s"' % self.name)
            self.url = "%s/%s" % (pg["url"], self.name)
        else:
            self.url = os.path.join(folder, "moonloop.db")

    def tag(self, col):
        """The SQL of the `tag` field of the JSON text in column col."""
        return "(%s::json ->> 'tag')" % col if self.pg else "json_extract(%s, '$.tag')" % col

    def rows(self, sql, args=(), writable=False):
        """The rows of sql (? marks a parameter) as tuples, or None when the
        database cannot be read now (locked, the file not there yet, the
        server away)."""
        if not self.pg:
            if not os.path.exists(self.url):
                return []
            try:
                uri = self.url if writable else "file:%s?mode=ro" % self.url
                con = sqlite3.connect(uri, uri=not writable, timeout=5)
                try:
                    return con.execute(sql, args).fetchall()
                finally:
                    con.close()
            except sqlite3.Error:
                return None
        try:
            return pgcluster.query(self.pg, sql, args, db=self.name)
        except (RuntimeError, OSError):
            return None

    def integrity(self):
        """SQLite's integrity_check (["ok"] when sound); PostgreSQL keeps its
        own, so ["ok"] there."""
        if self.pg:
            return ["ok"]
        rows = self.rows("PRAGMA integrity_check", writable=True)
        return [r[0] for r in rows] if rows is not None else ["the file could not be read"]

    def drop(self):
        if self.pg:
            pgcluster.drop_later(self.pg, self.name)
