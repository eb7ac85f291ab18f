"""Take a moonloop database back to an older schema, so that a test sees
the migrations after it run on data written before them.

UNDO[v] undoes migration v (engine/store/store_sqlite.c's and
store_pg.c's lists) in each dialect: what would stop it from running
again (a column, table, index or function it adds), not its data. Every
migration has an entry: rewind_sql() refuses a database newer than the
entries, so a new migration fails these tests, here, until its undo is
written (one place, instead of every test that rewinds).
"""

_FLOW = ("DROP INDEX runs_granted; DROP INDEX slot_queue_order;"
         "ALTER TABLE runs DROP COLUMN queued; ALTER TABLE runs DROP COLUMN slot_granted;"
         "ALTER TABLE runs DROP COLUMN flow_at; ALTER TABLE slot_queue DROP COLUMN lim;"
         "ALTER TABLE slot_queue DROP COLUMN prio;"
         "DROP TABLE flow_gcra; DROP TABLE flow_once; DROP TABLE flow_skips; DROP TABLE flow_batch;")
_WAITS = ("ALTER TABLE waits ADD COLUMN match_path TEXT; ALTER TABLE waits ADD COLUMN match_value TEXT;"
          "ALTER TABLE waits DROP COLUMN match_json;")
_SUMMARY = ("DROP INDEX runs_ended; DROP INDEX runs_event;"
            "ALTER TABLE runs DROP COLUMN steps; ALTER TABLE runs DROP COLUMN failed_steps;"
            "ALTER TABLE runs DROP COLUMN retries; ALTER TABLE runs DROP COLUMN tokens;")

# version -> (SQLite, PostgreSQL); None: not written (no test goes back
# past it in that dialect).
UNDO = {
    15: ("ALTER TABLE runs DROP COLUMN prio;",) * 2,
    14: ("ALTER TABLE skills DROP COLUMN limits;",) * 2,
    13: ("ALTER TABLE skills DROP COLUMN scopes;",) * 2,
    12: ("", ""),  # drops and makes its indexes again
    11: ("", ""),  # the same
    10: ("DROP TABLE stats_rollup;",
         "DROP TABLE stats_rollup; DROP FUNCTION moonloop_hist_key(BIGINT);"),
    9: ("", "DROP INDEX events_n; ALTER TABLE events DROP COLUMN n;"),
    8: (_FLOW, _FLOW),
    7: (_WAITS, _WAITS + "DROP FUNCTION moonloop_json_or_null(TEXT);"),
    6: ("ALTER TABLE runs DROP COLUMN crashes;",) * 2,
    5: ("ALTER TABLE versions DROP COLUMN triggers;",) * 2,
    4: (_SUMMARY, None),
}
LATEST = max(UNDO)


def rewind_sql(dialect, current, to):
    """The SQL script that takes a database of schema version current back
    to version to (dialect "sqlite" or "pg"), its version number included;
    run it in one transaction (PostgreSQL) or as one script (SQLite)."""
    if current > LATEST:
        raise AssertionError("the database is at schema %d, and tests/lib/schema.py undoes "
                             "migrations up to %d only: add migration %d's undo to its UNDO"
                             % (current, LATEST, current))
    k = 0 if dialect == "sqlite" else 1
    parts = []
    for v in range(current, to, -1):
        undo = UNDO[v][k]
        if undo is None:
            raise AssertionError("tests/lib/schema.py has no undo of migration %d for %s"
                                 % (v, dialect))
        parts.append(undo)
    if k == 0:
        parts.append("PRAGMA user_version = %d;" % to)
    else:
        parts.append("DELETE FROM moonloop_schema; INSERT INTO moonloop_schema VALUES(%d);" % to)
    return "".join(parts)


def sqlite_rewind(con, to):
    """Take the SQLite database of connection con back to version to."""
    current = con.execute("PRAGMA user_version").fetchone()[0]
    con.executescript(rewind_sql("sqlite", current, to))
