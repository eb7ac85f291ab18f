/*
** store_copy.c: `moonloop db copy`: a SQLite database copied into an empty
** PostgreSQL database, so a team that outgrows one file keeps its history
** and its unfinished runs (store_copy in store.h).
**
** The copy follows the two schemas, not a list of its own: every table
** of the SQLite file (sqlite_master) is copied, column by column as
** PRAGMA table_info lists them, into the table of that name in
** PostgreSQL. Before anything is written both lists are compared: a table
** or a column found on one side only (a migration written in one dialect
** and not the other) refuses the copy, naming it, instead of dropping
** data. PostgreSQL's identity columns (n: the order rows were written
** in, SQLite's rowid) are left to the database: rows go in rowid order,
** so they are numbered as SQLite ordered them. moonloop_schema (the
** version, PRAGMA user_version in SQLite) is the destination's own.
**
** Guarantees:
**   - One transaction on the destination, holding the write lock whole
**     (store_pg_db.h's PG_WRITE_LOCK): a copy that fails, is interrupted
**     or finds a difference leaves the destination as it was, and an
**     engine started on it meanwhile waits for the copy to end.
**   - The destination must be empty (every table without rows) and at the
**     source's schema version (both were brought to this moonloop's by
**     store_open); otherwise nothing is written.
**   - The source is read inside one write transaction of its own (BEGIN
**     IMMEDIATE): a consistent snapshot, which no command can write to
**     while the copy reads it. A live lease in it (an engine serving it,
**     a `moonloop run` in progress) refuses the copy: that process would
**     go on running runs the copy hands to the new database's engines.
**     Leases of processes that are gone are copied as they are; the new
**     database's engines reap them as they would have.
**   - Every row arrives as SQLite holds it (text is made valid UTF-8 as
**     the PostgreSQL store writes it, a NUL byte, which PostgreSQL's text
**     cannot hold, becomes U+FFFD); each table's rows are counted again in
**     the transaction before it commits.
**
** Rows travel with COPY ... FROM STDIN (text format), a table at a time.
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "store/store_db.h"
#include "store/store_pg_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How many rows between two calls of the progress callback. */
#define COPY_PROGRESS_ROWS 5000
/* How many bytes of COPY data are gathered before they are sent. */
#define COPY_CHUNK (256 * 1024)

/* One table to copy: its name, its columns on the SQLite side (each also
** in PostgreSQL), whether SQLite gives it a rowid, how many rows it has. */
struct ctable {
  char *name;
  char **cols;
  int ncols;
  int rowid;
  int64_t rows;
};

/* One character into b. */
static void putch(buf_t *b, char ch) { buf_add(b, &ch, 1); }

struct copy {
  struct store *src;
  struct pg_store *dst;
  struct ctable *t;
  int nt;
  buf_t data; /* COPY data not sent yet */
  store_copy_cb cb;
  void *arg;
};

static void tables_free(struct copy *c) {
  for (int i = 0; i < c->nt; i++) {
    for (int k = 0; k < c->t[i].ncols; k++) free(c->t[i].cols[k]);
    free(c->t[i].cols);
    free(c->t[i].name);
  }
  free(c->t);
  c->t = NULL;
  c->nt = 0;
}

/* A name quoted for SQL ("runs" -> "\"runs\""), into b. */
static void quoted(buf_t *b, const char *name) {
  putch(b, '"');
  for (const char *p = name; *p; p++) {
    if (*p == '"') putch(b, '"');
    putch(b, *p);
  }
  putch(b, '"');
}

/* The first column of every row of sql (one text parameter, or none) on
** the source's writer, into a malloc'd list of malloc'd strings. */
static int sqlite_list(struct copy *c, const char *sql, const char *arg, char ***out, int *n,
                       err_t *e) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *st = store__prep(c->src->w, sql, e);
  if (!st) return e->code;
  if (arg) sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
  int rc, cap = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) *out = mem_realloc(*out, (size_t)(cap = cap ? cap * 2 : 16) * sizeof **out);
    (*out)[(*n)++] = mem_strdup((const char *)sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return store__db_err(e, c->src->w, "reading the source's tables");
  return 0;
}

static void list_free(char **l, int n) {
  for (int i = 0; i < n; i++) free(l[i]);
  free(l);
}

static int in_names(char **l, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(l[i], name)) return 1;
  return 0;
}

/* Run sql, made on the fly (so not prepared: store__pg_run keys its
** statements by their text's address), on the destination's writer: the
** result of a query, or NULL with e filled. */
static PGresult *pg_query(struct copy *c, const char *sql, const char *what, err_t *e) {
  PGresult *r = store__pg_exec_raw(&c->dst->w, sql);
  if (PQresultStatus(r) == PGRES_TUPLES_OK) return r;
  store__pg_err(c->dst, &c->dst->w, r, what, e);
  PQclear(r);
  return NULL;
}

/* The first column of every row of sql (with $1 = arg when arg is not
** NULL) on the destination's writer, into a malloc'd list. */
static int pg_list(struct copy *c, const char *sql, const char *arg, char ***out, int *n,
                   err_t *e) {
  *out = NULL;
  *n = 0;
  struct store_val v[1] = {SV_TEXT(arg)};
  PGresult *r = store__pg_run(c->dst, &c->dst->w, NULL, sql, v, arg ? 1 : 0,
                              "reading the destination's tables", e);
  if (!r) return e->code;
  *n = PQntuples(r);
  *out = mem_calloc((size_t)*n + 1, sizeof **out);
  for (int i = 0; i < *n; i++) (*out)[i] = mem_strdup(PQgetvalue(r, i, 0));
  PQclear(r);
  return 0;
}

/* Fill c->t from the source's tables, checking each against the
** destination's: the same tables, the same columns (but PostgreSQL's
** generated ones). ERR_INVALID naming the first difference. */
static int plan(struct copy *c, err_t *e) {
  char **st = NULL, **pt = NULL;
  int nst = 0, npt = 0, rc;
  rc = sqlite_list(c, "SELECT name FROM sqlite_master WHERE type = 'table'"
                   " AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name", NULL, &st, &nst, e);
  if (!rc)
    rc = pg_list(c, "SELECT table_name FROM information_schema.tables WHERE table_schema ="
                 " current_schema() AND table_type = 'BASE TABLE' AND table_name <> 'moonloop_schema'",
                 NULL, &pt, &npt, e);
  for (int i = 0; !rc && i < npt; i++)
    if (!in_names(st, nst, pt[i]))
      rc = err_set(e, ERR_INVALID, "the destination has a table %s that the source has not: the "
                   "two schemas differ (a migration made in one dialect only?); nothing was copied",
                   pt[i]);
  for (int i = 0; !rc && i < nst; i++)
    if (!in_names(pt, npt, st[i]))
      rc = err_set(e, ERR_INVALID, "the source has a table %s that the destination has not: the "
                   "two schemas differ (a migration made in one dialect only?); nothing was copied",
                   st[i]);
  if (!rc) c->t = mem_calloc((size_t)nst + 1, sizeof *c->t);
  for (int i = 0; !rc && i < nst; i++) {
    struct ctable *t = &c->t[c->nt++];
    t->name = mem_strdup(st[i]);
    char **pc = NULL;
    int npc = 0;
    rc = sqlite_list(c, "SELECT name FROM pragma_table_info(?1) ORDER BY cid", t->name, &t->cols,
                     &t->ncols, e);
    /* The destination's columns that take a value (not an identity or a
    ** generated one: the database makes those). */
    if (!rc)
      rc = pg_list(c, "SELECT column_name FROM information_schema.columns WHERE table_schema ="
                   " current_schema() AND table_name = $1 AND is_identity = 'NO'"
                   " AND is_generated = 'NEVER'", t->name, &pc, &npc, e);
    for (int k = 0; !rc && k < npc; k++)
      if (!in_names(t->cols, t->ncols, pc[k]))
        rc = err_set(e, ERR_INVALID, "the destination's table %s has a column %s that the "
                     "source's has not: the two schemas differ; nothing was copied", t->name, pc[k]);
    for (int k = 0; !rc && k < t->ncols; k++)
      if (!in_names(pc, npc, t->cols[k]))
        rc = err_set(e, ERR_INVALID, "the source's table %s has a column %s that the "
                     "destination's has not: the two schemas differ; nothing was copied", t->name,
                     t->cols[k]);
    list_free(pc, npc);
    if (rc) break;
    /* A WITHOUT ROWID table has no order of its own to keep. */
    buf_t q = BUF_INIT;
    buf_puts(&q, "SELECT rowid FROM ");
    quoted(&q, t->name);
    sqlite3_stmt *probe = NULL;
    t->rowid = sqlite3_prepare_v2(c->src->w, buf_str(&q), -1, &probe, NULL) == SQLITE_OK;
    sqlite3_finalize(probe);
    buf_free(&q);
  }
  list_free(st, nst);
  list_free(pt, npt);
  return rc;
}

/* ERR_CONFLICT when a live lease holds the source (read inside its write
** transaction, so none can be taken until the copy ends). */
static int source_unheld(struct copy *c, err_t *e) {
  sqlite3_stmt *st = store__prep(c->src->w,
    "SELECT owner, kind, host, pid, pid_start, expires_at FROM leases", e);
  if (!st) return e->code;
  int64_t now = units_now_ms();
  int rc, found = 0;
  while (!found && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char *host = (const char *)sqlite3_column_text(st, 2);
    if (store__lease_dead(host, (long)sqlite3_column_int64(st, 3), sqlite3_column_int64(st, 4),
                          sqlite3_column_int64(st, 5), proc_hostname(), now))
      continue;
    found = 1;
    err_set(e, ERR_CONFLICT, "%s is in use: a %s process (pid %lld on %s) holds a live lease "
            "on it; stop it first (the copy would hand its unfinished runs to the new database's "
            "engines while it still runs them); nothing was copied",
            c->src->path, (const char *)sqlite3_column_text(st, 1),
            (long long)sqlite3_column_int64(st, 3), host ? host : "?");
  }
  if (!found && rc != SQLITE_DONE) store__db_err(e, c->src->w, "reading the source's leases");
  sqlite3_finalize(st);
  return found || rc != SQLITE_DONE ? e->code : 0;
}

/* 0 when every table of the destination is empty; ERR_CONFLICT naming
** one that is not. Inside the copy's transaction. */
static int destination_empty(struct copy *c, err_t *e) {
  for (int i = 0; i < c->nt; i++) {
    buf_t q = BUF_INIT;
    buf_puts(&q, "SELECT 1 FROM ");
    quoted(&q, c->t[i].name);
    buf_puts(&q, " LIMIT 1");
    PGresult *r = pg_query(c, buf_str(&q), "looking at the destination", e);
    buf_free(&q);
    if (!r) return e->code;
    int rows = PQntuples(r);
    PQclear(r);
    if (rows)
      return err_set(e, ERR_CONFLICT, "the destination %s is not empty (its table %s has rows): "
                     "db copy writes into an empty database only (CREATE DATABASE a new one); "
                     "nothing was copied", c->dst->shown, c->t[i].name);
  }
  return 0;
}

/* How many rows each table of the source has (the progress's totals). */
static int count_source(struct copy *c, err_t *e) {
  for (int i = 0; i < c->nt; i++) {
    buf_t q = BUF_INIT;
    buf_puts(&q, "SELECT count(*) FROM ");
    quoted(&q, c->t[i].name);
    sqlite3_stmt *st = store__prep(c->src->w, buf_str(&q), e);
    buf_free(&q);
    if (!st) return e->code;
    int rc = sqlite3_step(st);
    c->t[i].rows = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return store__db_err(e, c->src->w, "counting the source's rows");
  }
  return 0;
}

/* Text of n bytes as COPY's text format holds it, into b: the four
** characters it gives a meaning escaped, what is not valid UTF-8 (and a
** NUL byte) as U+FFFD. */
static void copy_text(buf_t *b, const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t ok = jsontext_utf8_prefix(s + i, n - i);
    for (size_t k = i; k < i + ok; k++) {
      char ch = s[k];
      if (ch == '\\') buf_puts(b, "\\\\");
      else if (ch == '\n') buf_puts(b, "\\n");
      else if (ch == '\r') buf_puts(b, "\\r");
      else if (ch == '\t') buf_puts(b, "\\t");
      else if (ch == 0) buf_add(b, "\xEF\xBF\xBD", 3);
      else putch(b, ch);
    }
    i += ok;
    if (i < n) {
      buf_add(b, "\xEF\xBF\xBD", 3);
      i++;
    }
  }
}

/* Column k of st's row as COPY's text format holds it, into b. */
static void copy_value(buf_t *b, sqlite3_stmt *st, int k) {
  switch (sqlite3_column_type(st, k)) {
  case SQLITE_NULL: buf_puts(b, "\\N"); break;
  case SQLITE_INTEGER: buf_printf(b, "%lld", (long long)sqlite3_column_int64(st, k)); break;
  case SQLITE_FLOAT: {
    /* A whole number that SQLite holds as a float goes into an integer
    ** column as the integer it is. */
    double d = sqlite3_column_double(st, k);
    if (d > -9e18 && d < 9e18 && d == (double)(long long)d) buf_printf(b, "%lld", (long long)d);
    else buf_printf(b, "%.17g", d);
    break;
  }
  default: {
    const char *s = (const char *)sqlite3_column_text(st, k);
    copy_text(b, s ? s : "", (size_t)sqlite3_column_bytes(st, k));
    break;
  }
  }
}

/* Send what c->data holds to the COPY in progress. */
static int copy_flush(struct copy *c, err_t *e) {
  if (!c->data.len) return 0;
  int rc = PQputCopyData(c->dst->w.c, c->data.p, (int)c->data.len);
  buf_reset(&c->data);
  if (rc != 1) return store__pg_err(c->dst, &c->dst->w, NULL, "copying rows", e);
  return 0;
}

/* Copy table t: COPY t(cols) FROM STDIN fed from SELECT cols FROM t (in
** rowid order when it has one); the destination's count checked after. */
static int copy_table(struct copy *c, struct ctable *t, err_t *e) {
  buf_t cols = BUF_INIT, sel = BUF_INIT, cp = BUF_INIT;
  for (int k = 0; k < t->ncols; k++) {
    if (k) buf_puts(&cols, ", ");
    quoted(&cols, t->cols[k]);
  }
  buf_printf(&sel, "SELECT %s FROM ", buf_str(&cols));
  quoted(&sel, t->name);
  if (t->rowid) buf_puts(&sel, " ORDER BY rowid");
  buf_puts(&cp, "COPY ");
  quoted(&cp, t->name);
  buf_printf(&cp, "(%s) FROM STDIN", buf_str(&cols));
  sqlite3_stmt *st = store__prep(c->src->w, buf_str(&sel), e);
  int rc = st ? 0 : e->code;
  if (!rc) {
    PGresult *r = store__pg_exec_raw(&c->dst->w, buf_str(&cp));
    if (PQresultStatus(r) != PGRES_COPY_IN) rc = store__pg_err(c->dst, &c->dst->w, r, "copying rows", e);
    PQclear(r);
  }
  buf_free(&cols), buf_free(&sel), buf_free(&cp);
  if (rc) {
    sqlite3_finalize(st);
    return rc;
  }
  int64_t done = 0;
  int step;
  if (c->cb) c->cb(c->arg, t->name, 0, t->rows);
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    for (int k = 0; k < t->ncols; k++) {
      if (k) putch(&c->data, '\t');
      copy_value(&c->data, st, k);
    }
    putch(&c->data, '\n');
    if (c->data.len >= COPY_CHUNK && (rc = copy_flush(c, e))) break;
    if (++done % COPY_PROGRESS_ROWS == 0 && c->cb) c->cb(c->arg, t->name, done, t->rows);
  }
  if (!rc && step != SQLITE_DONE) rc = store__db_err(e, c->src->w, "reading the source's rows");
  sqlite3_finalize(st);
  if (!rc) rc = copy_flush(c, e);
  buf_reset(&c->data);
  /* End the COPY whatever happened: its result says whether PostgreSQL
  ** took the rows (a value it refused fails here, naming the row). */
  if (PQputCopyEnd(c->dst->w.c, rc ? "the copy stopped" : NULL) != 1 && !rc)
    rc = store__pg_err(c->dst, &c->dst->w, NULL, "copying rows", e);
  PGresult *r;
  while ((r = PQgetResult(c->dst->w.c))) {
    if (PQresultStatus(r) != PGRES_COMMAND_OK && !rc) rc = store__pg_err(c->dst, &c->dst->w, r, "copying rows", e);
    PQclear(r);
  }
  if (rc) return err_prefix(e, "copying table %s", t->name);
  /* The source's rows, all of them, and no more: counted again. */
  buf_t q = BUF_INIT;
  buf_puts(&q, "SELECT count(*) FROM ");
  quoted(&q, t->name);
  r = pg_query(c, buf_str(&q), "counting the copied rows", e);
  buf_free(&q);
  if (!r) return e->code;
  int64_t there = store__pg_i64(r, 0, 0);
  PQclear(r);
  if (there != done || done != t->rows)
    return err_set(e, ERR_IO, "copying table %s: %lld rows read of %lld, %lld in the destination; "
                   "nothing was copied", t->name, (long long)done, (long long)t->rows, (long long)there);
  if (c->cb) c->cb(c->arg, t->name, done, t->rows);
  return 0;
}

/* The schema version of each side: PRAGMA user_version, moonloop_schema. */
static int versions_match(struct copy *c, err_t *e) {
  sqlite3_stmt *st = store__prep(c->src->w, "PRAGMA user_version", e);
  if (!st) return e->code;
  int sv = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
  sqlite3_finalize(st);
  PGresult *r = store__pg_run(c->dst, &c->dst->w, NULL, "SELECT max(version) FROM moonloop_schema",
                              NULL, 0, "reading the destination's schema version", e);
  if (!r) return e->code;
  int dv = (int)store__pg_i64(r, 0, 0);
  PQclear(r);
  if (sv != dv)
    return err_set(e, ERR_INVALID, "the source is at schema version %d and the destination at %d: "
                   "copy between databases of one moonloop version; nothing was copied", sv, dv);
  return 0;
}

/* See store.h. */
int store_copy(store_t *src, store_t *dst, store_copy_cb cb, void *arg, cJSON **counts,
               err_t *e) {
  if (counts) *counts = NULL;
  if (strcmp(store__ops(src)->name, "sqlite") || strcmp(store__ops(dst)->name, "postgresql"))
    return err_set(e, ERR_INVALID, "db copy copies a SQLite database into a PostgreSQL one "
                   "(from a file to a postgresql:// URL)");
  struct copy c = {.src = (struct store *)(void *)src, .dst = pg_of(dst), .cb = cb, .arg = arg};
  if (store__exec(c.src->w, "BEGIN IMMEDIATE", e))
    return err_prefix(e, "locking the source %s for the copy (a process is writing to it?)",
                      c.src->path);
  int rc = source_unheld(&c, e);
  if (!rc) rc = versions_match(&c, e);
  if (!rc) rc = plan(&c, e);
  if (!rc) rc = store__pg_begin(c.dst, PG_LOCK_ALL, e);
  int began = !rc;
  /* A large copy sends for a long while: the session's guard against a
  ** client stopped inside a transaction must not end this one. */
  if (!rc) rc = store__pg_exec(c.dst, &c.dst->w, "SET LOCAL idle_in_transaction_session_timeout = 0",
                               "copying", e);
  if (!rc) rc = destination_empty(&c, e);
  if (!rc) rc = count_source(&c, e);
  for (int i = 0; !rc && i < c.nt; i++) rc = copy_table(&c, &c.t[i], e);
  if (!rc) rc = store__pg_commit_tx(c.dst, 1, e);
  else if (began) store__pg_rollback(c.dst);
  err_t ignored;
  store__exec(c.src->w, "ROLLBACK", &ignored);
  if (!rc && counts) {
    *counts = cJSON_CreateObject();
    for (int i = 0; i < c.nt; i++) cJSON_AddNumberToObject(*counts, c.t[i].name, (double)c.t[i].rows);
  }
  tables_free(&c);
  buf_free(&c.data);
  return rc;
}
