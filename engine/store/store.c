/*
** store.c: the store's entry points (store.h). store_open chooses the
** backend from the database setting; every other function hands its call
** to the table of the store it is given (store_backend.h). Also what both
** backends share: run rows from a cursor, lease liveness, events as skills
** see them.
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the database setting names a PostgreSQL database. */
static int is_pg_url(const char *path) {
  return !strncmp(path, "postgresql://", 13) || !strncmp(path, "postgres://", 11);
}

/* See store.h. */
int store_is_server(const char *path) { return path && is_pg_url(path); }

/* See store.h: a PostgreSQL URL opens the PostgreSQL store, anything else
** is a SQLite file. */
int store_open(const char *path, enum store_durability d, store_t **out, err_t *e) {
  *out = NULL;
  if (!path || !*path) return err_set(e, ERR_INVALID, "no database given");
  if (is_pg_url(path)) return store__pg_open(path, d, out, e);
  return store__sqlite_open(path, d, out, e);
}

/* See store.h. */
int store_absent(const char *path) {
  return path && *path && !is_pg_url(path) && store__sqlite_absent(path);
}

/* See store.h. NULL is a no-op. */
void store_close(store_t *s) {
  if (s) store__ops(s)->close(s);
}

/* See store.h: the file's path, or the URL without its password. */
const char *store_path(const store_t *s) { return store__ops(s)->path(s); }

int store_check_file(store_t *s, err_t *e) { return store__ops(s)->check_file(s, e); }

int store_commit(store_t *s, const journal_t *j, err_t *e) {
  return store__ops(s)->commit(s, j, e);
}

int store_lease_acquire(store_t *s, const struct lease *l, err_t *e) {
  return store__ops(s)->lease_acquire(s, l, e);
}

int store_lease_release(store_t *s, const char *owner, err_t *e) {
  return store__ops(s)->lease_release(s, owner, e);
}

int store_reap(store_t *s, const char *host, int64_t now, err_t *e) {
  return store__ops(s)->reap(s, host, now, e);
}

int store_count_crash(store_t *s, const char *run_id, err_t *e) {
  return store__ops(s)->count_crash(s, run_id, e);
}

/* Claimed rows in id order, whichever backend claimed them. */
static int cmp_rows(const void *a, const void *b) {
  return strcmp(((const struct run_row *)a)->id, ((const struct run_row *)b)->id);
}

/* See store.h: the backend claims, the rows come back sorted by id. */
int store_claim(store_t *s, const char *owner, int limit, struct run_row **rows, size_t *n,
                err_t *e) {
  int rc = store__ops(s)->claim(s, owner, limit, rows, n, e);
  if (!rc && *n > 1) qsort(*rows, *n, sizeof **rows, cmp_rows);
  return rc;
}

int store_take_run(store_t *s, const char *run_id, const char *owner, const char *host,
                   int64_t now, struct run_row **row, err_t *e) {
  return store__ops(s)->take_run(s, run_id, owner, host, now, row, e);
}

int store_dispatch(store_t *s, int64_t now, int limit, int *runs, err_t *e) {
  return store__ops(s)->dispatch(s, now, limit, runs, e);
}

int store_deliver(store_t *s, int64_t *cursor, int limit, err_t *e) {
  return store__ops(s)->deliver(s, cursor, limit, e);
}

int store_prune(store_t *s, int64_t before, int64_t *runs, int64_t *events, err_t *e) {
  return store__ops(s)->prune(s, before, runs, events, e);
}

int64_t store_data_version(store_t *s) { return store__ops(s)->data_version(s); }

int store_wake_fd(store_t *s) {
  const struct store_ops *o = store__ops(s);
  return o->wake_fd ? o->wake_fd(s) : -1;
}

int store_woken(store_t *s) {
  const struct store_ops *o = store__ops(s);
  return o->woken ? o->woken(s) : 0;
}

/* See store.h: beside a SQLite file; for a database on a server, in the
** working folder, named after its URL (shown without a password, so none
** lands in a file name): every character but letters, digits, '.' and '-'
** becomes '_'. */
int store_side_path(const store_t *s, const char *suffix, char *out, size_t n) {
  const char *db = store_path(s);
  int len;
  if (!store_is_server(db)) {
    len = snprintf(out, n, "%s%s", db, suffix);
  } else {
    const char *p = strstr(db, "://") + 3;
    static const char prefix[] = "moonloop-pg-";
    len = snprintf(out, n, "%s%s%s", prefix, p, suffix);
    size_t end = strlen(prefix) + strlen(p);
    for (size_t i = strlen(prefix); i < end && i < n; i++) {
      char c = out[i];
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '-'))
        out[i] = '_';
    }
  }
  return len < 0 || (size_t)len >= n ? ERR_TOOBIG : 0;
}

/* See store.h. */
void store_rows_free(struct run_row *rows, size_t n) {
  if (!rows) return;
  for (size_t i = 0; i < n; i++) {
    struct run_row *r = &rows[i];
    free((char *)r->id), free((char *)r->skill), free((char *)r->version);
    free((char *)r->status), free((char *)r->entry), free((char *)r->trigger);
    free((char *)r->parent_id), free((char *)r->input), free((char *)r->output);
    free((char *)r->error), free((char *)r->owner), free((char *)r->cancel_reason);
  }
  free(rows);
}

/* ---- shared by the backends ------------------------------------------------- */

/* Column i as a malloc'd string, or NULL. */
static char *col_dup(const struct store_cur *c, int i) {
  const char *t = cur_text(c, i);
  return t ? mem_strdup(t) : NULL;
}

/* See store_backend.h. */
void store__run_row(const struct store_cur *c, struct run_row *r, int with_claim) {
  memset(r, 0, sizeof *r);
  r->id = col_dup(c, 0);
  r->skill = col_dup(c, 1);
  r->version = col_dup(c, 2);
  r->status = col_dup(c, 3);
  r->entry = col_dup(c, 4);
  r->trigger = col_dup(c, 5);
  r->parent_id = col_dup(c, 6);
  r->input = col_dup(c, 7);
  r->output = col_dup(c, 8);
  r->error = col_dup(c, 9);
  r->created_at = cur_i64(c, 10);
  r->started_at = cur_i64(c, 11);
  r->ended_at = cur_i64(c, 12);
  r->deadline_at = cur_i64(c, 13);
  r->wake_at = cur_i64(c, 14);
  r->owner = col_dup(c, 15);
  /* STORE_CLAIM_COLS: what adopting the run needs beyond its record. */
  if (with_claim) {
    r->crashes = cur_int(c, 17);
    r->cancel_requested = cur_int(c, 18);
    r->cancel_reason = col_dup(c, 19);
    r->has_prio = !cur_null(c, 20);
    r->prio = r->has_prio ? cur_i64(c, 20) : 0;
  }
}

/* See store_backend.h. */
int store__is_terminal(const char *status) {
  return vocab_run_ended(status);
}

/* See store_backend.h: expired, or (on this host) its process is gone. */
int store__lease_dead(const char *lease_host, long pid, long long pid_start, int64_t expires,
                      const char *host, int64_t now) {
  if (expires < now) return 1;
  return lease_host && host && !strcmp(lease_host, host) && !proc_alive(pid, pid_start);
}

/* See store_backend.h. */
int store__upgrade_refused(int from, int to, const char *kind, const char *lease_host, long pid,
                           long long pid_start, int64_t expires, err_t *e) {
  if (store__lease_dead(lease_host, pid, pid_start, expires, proc_hostname(), units_now_ms()))
    return 0;
  return err_set(e, ERR_CONFLICT, "this moonloop upgrades the database's schema from version %d "
                 "to %d, but a moonloop %s (pid %ld on %s) is using it: stop every engine on the "
                 "database first, then start this one (older engines do not know the new schema; "
                 "the upgrade is one-way: keep a backup, docs/operations.md \"Upgrades\")", from,
                 to, kind ? kind : "process", pid, lease_host ? lease_host : "?");
}

/* See store_backend.h. */
char *store__event_json(const char *id, const char *name, const char *data, int64_t ts) {
  cJSON *o = cJSON_CreateObject();
  char t[40];
  units_rfc3339(ts, t, sizeof t);
  cJSON_AddStringToObject(o, "name", name);
  cJSON_AddStringToObject(o, "id", id);
  cJSON *d = data ? cJSON_Parse(data) : NULL;
  cJSON_AddItemToObject(o, "data", d ? d : cJSON_CreateNull());
  cJSON_AddStringToObject(o, "ts", t);
  char *s = jsontext_print_text(o);
  cJSON_Delete(o);
  return s;
}

/* See store_backend.h. */
int store__event_matches(const char *event_json_text, const char *match) {
  if (!match || !*match) return 1;
  cJSON *m = cJSON_Parse(match);
  cJSON *ev = cJSON_IsObject(m) ? cJSON_Parse(event_json_text) : NULL;
  int ok = ev != NULL;
  const cJSON *want;
  for (want = m ? m->child : NULL; ok && want; want = want->next) {
    const cJSON *v = jsontext_path(ev, want->string);
    char *got = v ? jsontext_print_text(v) : mem_strdup("null");
    char *exp = jsontext_print_text(want);
    ok = got && exp && !strcmp(got, exp);
    free(got), free(exp);
  }
  cJSON_Delete(ev);
  cJSON_Delete(m);
  return ok;
}
