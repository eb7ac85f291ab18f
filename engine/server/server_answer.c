/*
** server_answer.c: answering the HTTP API's requests (see server.h):
** reads from the store's reader connection, control operations through the
** scheduler, /metrics and the dashboard's embedded files (web.h). Every API
** answer goes through server__respond, which sets Content-Length and counts
** it; the dashboard's files go through server__static (ETag, 304).
**
** A request that needs the scheduler becomes a `pending` record (malloc'd,
** linked in the server's list) and a `guard` (in the request's memory pool,
** pointing at the pending record). The two point at each other until one
** side goes away:
**   - the scheduler's callback fires: the pending record detaches the guard,
**     answers the request if it is still there, and frees itself;
**   - the request's pool is cleared first (the client went away, or the
**     server answered 503 at shutdown): the guard's dispose callback marks
**     the pending record abandoned (req = NULL); the callback, when it fires,
**     then only frees it.
** Pending records whose callback never fires (the scheduler stopped) are
** freed by server_free.
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "base/workspace.h"
#include "server/server_int.h"
#include "server/web.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


struct guard;

/* A request waiting for a scheduler callback. */
struct pending {
  server_t *srv;
  h2o_req_t *req;       /* NULL once the request is gone or was answered */
  struct guard *guard;
  enum server_op op;
  struct sched_watch *watch; /* GET_RUN with wait: the attach, until it fires */
  char run_id[SERVER_ID_MAX + 1]; /* GET_RUN: the run attached to */
  int with_steps;                 /* GET_RUN: answer the record with its steps */
  struct pending *prev, *next;
};

/* Lives in the request's pool; its dispose marks the pending record abandoned. */
struct guard {
  struct pending *p;
};


/* ---- answering ---------------------------------------------------------- */

/* The reason phrase of the statuses the API answers with. */
static const char *reason_of(int status) {
  switch (status) {
  case 200: return "OK";
  case 202: return "Accepted";
  case 304: return "Not Modified";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 409: return "Conflict";
  case 413: return "Payload Too Large";
  case 415: return "Unsupported Media Type";
  case 503: return "Service Unavailable";
  default: return status < 400 ? "OK" : "Internal Server Error";
  }
}

/* See server_int.h. */
void server__count(server_t *srv, int status) {
  if (status >= 100 && status < SERVER_MAX_STATUS) srv->codes[status]++;
}

/* Dispose callback of a body slot: frees the malloc'd body. */
/* A HEAD request gets the headers of its GET (Content-Length included)
** and no body: H2O leaves that to the handler. */
static int is_head(const h2o_req_t *req) {
  return h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
}

static void free_slot(void *x) { free(*(char **)x); }

/* Answer req with status and body (malloc'd; ownership passes to the
** request's pool, which frees it once the response is sent). */
void server__respond(server_t *srv, h2o_req_t *req, int status, const char *ctype, char *body,
                     size_t len) {
  char **slot = h2o_mem_alloc_shared(&req->pool, sizeof *slot, free_slot);
  *slot = body;
  req->res.status = status;
  req->res.reason = reason_of(status);
  req->res.content_length = len;
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, ctype,
                 strlen(ctype));
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                 H2O_STRLIT("no-store"));
  /* An answer is never to be read as anything but its type (a page that
  ** loads it as a script or a style sheet gets nothing). */
  h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-content-type-options"), 0,
                        NULL, H2O_STRLIT("nosniff"));
  /* While stopping, no connection is kept alive for another request. */
  if (srv->stopping) req->http1_is_persistent = 0;
  server__count(srv, status);
  static h2o_generator_t generator = {NULL, NULL};
  h2o_start_response(req, &generator);
  h2o_iovec_t buf = h2o_iovec_init(body, len);
  h2o_send(req, &buf, len && !is_head(req) ? 1 : 0, H2O_SEND_STATE_FINAL);
}

/* Answer a JSON body (malloc'd text). */
static void respond_json(server_t *srv, h2o_req_t *req, int status, char *json) {
  server__respond(srv, req, status, "application/json", json, strlen(json));
}

/* Answer a cJSON tree (consumed). */
static void respond_cjson(server_t *srv, h2o_req_t *req, int status, cJSON *v) {
  jsontext_fix_utf8(v);
  char *s = jsontext_print_text(v);
  cJSON_Delete(v);
  respond_json(srv, req, status, s);
}

/* See server_int.h. */
void server__respond_error(server_t *srv, h2o_req_t *req, int status, const char *code,
                           const char *message) {
  /* Every 503 is worth a retry: say when (once, if the caller has not). */
  if (status == 503 && h2o_find_header(&req->res.headers, H2O_TOKEN_RETRY_AFTER, -1) < 0)
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL, H2O_STRLIT("1"));
  respond_json(srv, req, status, server_error_json(code, message));
}

/* Answer from an err_t: the status follows its code. */
static void respond_err(server_t *srv, h2o_req_t *req, const err_t *e) {
  int status = server_status_of(e->code);
  server__respond_error(srv, req, status, server_error_code(status, e->code), e->msg);
}

/* ---- pending answers ------------------------------------------------------ */

static void pending_free(struct pending *p);

/* The request's pool is being cleared: its pending record loses it. An
** attach has nothing left to do: its watch goes at once (a client that
** gave up costs nothing until the wait would have run out). */
static void guard_dispose(void *x) {
  struct guard *g = x;
  struct pending *p = g->p;
  if (!p) return;
  p->req = NULL;
  p->guard = NULL;
  if (p->watch) {
    sched_unwatch(p->srv->en->sched, p->watch);
    p->watch = NULL;
    pending_free(p);
  }
}

/* A pending record for req, guarded from its pool. */
static struct pending *pending_new(server_t *srv, h2o_req_t *req, enum server_op op) {
  struct pending *p = mem_calloc(1, sizeof *p);
  struct guard *g = h2o_mem_alloc_shared(&req->pool, sizeof *g, guard_dispose);
  g->p = p;
  p->guard = g;
  p->req = req;
  p->srv = srv;
  p->op = op;
  p->next = srv->pending;
  if (p->next) p->next->prev = p;
  srv->pending = p;
  return p;
}

/* Cut the link to the request (if still there) and return it. */
static h2o_req_t *pending_detach(struct pending *p) {
  h2o_req_t *req = p->req;
  if (p->guard) p->guard->p = NULL;
  p->guard = NULL;
  p->req = NULL;
  return req;
}

/* Unlink and free a pending record (detaching it first). */
static void pending_free(struct pending *p) {
  server_t *srv = p->srv;
  pending_detach(p);
  if (p->prev) p->prev->next = p->next;
  else srv->pending = p->next;
  if (p->next) p->next->prev = p->prev;
  free(p);
}

/* Whether an invoke answer says the run has ended ({"run_id"} alone, the
** answer of a start that does not wait, says nothing of it). */
static int terminal_status(const char *json) {
  if (!json || !strstr(json, "\"status\"")) return 0;
  cJSON *v = cJSON_Parse(json);
  cJSON *st = cJSON_GetObjectItemCaseSensitive(v, "status");
  int t = vocab_run_ended(cJSON_GetStringValue(st));
  cJSON_Delete(v);
  return t;
}

/* The scheduler's answer to a control operation (once, from the loop). */
static void on_reply(const struct sched_reply *r, void *arg) {
  struct pending *p = arg;
  server_t *srv = p->srv;
  enum server_op op = p->op;
  h2o_req_t *req = pending_detach(p);
  pending_free(p);
  if (!req) return; /* the client went away, or shutdown answered it */
  if (r->rc) {
    int status = server_status_of(r->rc);
    server__respond_error(srv, req, status, server_error_code(status, r->rc),
                  r->message ? r->message : err_name(r->rc));
    return;
  }
  int status = 200;
  if (op == SERVER_OP_EVENTS || op == SERVER_OP_RERUN) status = 202;
  else if (op == SERVER_OP_INVOKE) status = terminal_status(r->json) ? 200 : 202;
  respond_json(srv, req, status, mem_strdup(r->json ? r->json : "{}"));
}

/* Hand a plan to the scheduler. On a synchronous failure the callback
** never fires: answer the error here. */
static void control(server_t *srv, h2o_req_t *req, const struct server_plan *pl) {
  struct pending *p = pending_new(srv, req, pl->op);
  sched_t *s = srv->en->sched;
  err_t e = {0};
  int rc;
  switch (pl->op) {
  case SERVER_OP_EVENTS: rc = sched_send_events(s, pl->events, on_reply, p, &e); break;
  case SERVER_OP_INVOKE:
    rc = sched_invoke(s, pl->id, pl->data, pl->key[0] ? pl->key : NULL, pl->wait_ms, on_reply, p,
                      &e);
    break;
  case SERVER_OP_CANCEL: rc = sched_cancel(s, pl->id, on_reply, p, &e); break;
  case SERVER_OP_RERUN: rc = sched_rerun(s, pl->id, *pl->key ? pl->key : NULL, on_reply, p, &e); break;
  case SERVER_OP_PUT_SKILL:
    /* A local file name must be inside the workspace on its real path
    ** (skills.deploy writes to it); "//HOST/PATH" names another host's
    ** file, which the engine never writes. */
    if (pl->file[0] && strncmp(pl->file, "//", 2) && srv->en->cfg &&
        workspace_inside(srv->en->cfg->workspace, pl->file, &e)) {
      rc = err_prefix(&e, "parameter 'file'");
      break;
    }
    rc = sched_put_skill(s, pl->id, pl->file[0] ? pl->file : NULL, pl->source, pl->source_len,
                         on_reply, p, &e);
    break;
  case SERVER_OP_DELETE_SKILL:
    rc = sched_unload_skill(s, pl->id, pl->file[0] ? pl->file : NULL, on_reply, p, &e);
    break;
  default: rc = err_set(&e, ERR_INTERNAL, "no control operation for this request"); break;
  }
  /* On success p may already be gone (a callback that fired at once): do not touch it. */
  if (rc == 0) return;
  if (e.code == 0) err_set(&e, rc, "%s", err_name(rc));
  pending_free(p);
  respond_err(srv, req, &e);
}

/* ---- reads ------------------------------------------------------------ */

/* GET /v1/runs: {"runs": [...], "next": id of the last run shown, or null},
** written as text from the store (no tree). */
static void list_runs(server_t *srv, h2o_req_t *req, const struct server_plan *pl) {
  buf_t b = BUF_INIT;
  err_t e;
  struct run_filter f = pl->filter;
  f.limit = pl->limit;
  char next[SERVER_ID_MAX + 1] = "";
  buf_reserve(&b, 16384);
  buf_puts(&b, "{\"runs\":");
  if (store_list_runs_json(srv->en->store, &f, &b, next, sizeof next, &e)) {
    buf_free(&b);
    respond_err(srv, req, &e);
    return;
  }
  buf_puts(&b, ",\"next\":");
  if (next[0]) jsontext_put_string(&b, next, strlen(next));
  else buf_puts(&b, "null");
  buf_puts(&b, "}");
  size_t len = b.len;
  server__respond(srv, req, 200, "application/json", buf_take(&b), len);
}

/* GET /v1/runs/{id}: the run record, with its steps unless ?steps=false,
** as text from the store. */
static void get_run(server_t *srv, h2o_req_t *req, const char *id, int with_steps) {
  buf_t b = BUF_INIT;
  err_t e;
  buf_reserve(&b, with_steps ? 4096 : 1024);
  if (store_run_json(srv->en->store, id, with_steps, &b, &e)) {
    buf_free(&b);
    respond_err(srv, req, &e);
    return;
  }
  size_t len = b.len;
  server__respond(srv, req, 200, "application/json", buf_take(&b), len);
}

/* An attach fired: the run ended (or the wait ran out): answer its record
** as GET /v1/runs/{id} does, read now that its end is durable. */
static void on_attach(void *arg, int ended) {
  struct pending *p = arg;
  server_t *srv = p->srv;
  char id[SERVER_ID_MAX + 1];
  (void)ended;
  memcpy(id, p->run_id, sizeof id);
  int with_steps = p->with_steps;
  p->watch = NULL;
  h2o_req_t *req = pending_detach(p);
  pending_free(p);
  if (req) get_run(srv, req, id, with_steps);
}

/* GET /v1/runs/{id}?wait=SECONDS: a run that has ended (or an unknown one)
** is answered at once; otherwise the answer waits for the run's end, or
** for the wait to run out, whichever comes first (sched_watch). */
static void attach(server_t *srv, h2o_req_t *req, const struct server_plan *pl) {
  struct pending *p = pending_new(srv, req, pl->op);
  snprintf(p->run_id, sizeof p->run_id, "%s", pl->id);
  p->with_steps = !pl->no_steps;
  err_t e = {0};
  int rc = sched_watch(srv->en->sched, pl->id, pl->wait_ms, on_attach, p, &p->watch, &e);
  if (rc == 0) return;
  pending_free(p);
  if (rc == 1) get_run(srv, req, pl->id, !pl->no_steps);
  else respond_err(srv, req, &e);
}

/* See server_int.h: attached clients are answered now, not at the end of
** the grace period: 503, so they attach again (to this engine once it is
** back, or to another). */
void server__attach_stop(server_t *srv) {
  for (struct pending *p = srv->pending, *next; p; p = next) {
    next = p->next;
    if (!p->watch) continue;
    sched_unwatch(srv->en->sched, p->watch);
    p->watch = NULL;
    h2o_req_t *req = pending_detach(p);
    pending_free(p);
    if (req) {
      h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL,
                     H2O_STRLIT("1"));
      server__respond_error(srv, req, 503, "unavailable",
                            "the engine is stopping: attach again (the run goes on when an "
                            "engine runs)");
    }
  }
}

/* GET /v1/skills: {"skills": [...]}. */
static void list_skills(server_t *srv, h2o_req_t *req) {
  cJSON *skills;
  err_t e;
  if (store_list_skills(srv->en->store, &skills, &e)) {
    respond_err(srv, req, &e);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "skills", skills);
  respond_cjson(srv, req, 200, o);
}

/* GET /v1/skills/{id}: the skill record. */
static void get_skill(server_t *srv, h2o_req_t *req, const char *id) {
  cJSON *skill;
  err_t e;
  if (store_get_skill(srv->en->store, id, &skill, &e)) respond_err(srv, req, &e);
  else respond_cjson(srv, req, 200, skill);
}

/* Prometheus text format 0.0.4. */
static void metrics(server_t *srv, h2o_req_t *req) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) mem_oom(BUFSIZ); /* open_memstream fails only for want of memory */
  const struct sched_stats *st = sched_stats(srv->en->sched);
  fprintf(f, "# HELP moonloop_active_runs Runs this process holds: executing, or waiting in memory (a request, a short sleep or wait, a child run).\n"
             "# TYPE moonloop_active_runs gauge\n"
             "moonloop_active_runs %d\n", sched_active(srv->en->sched));
  fprintf(f, "# HELP moonloop_resumes_total Run coroutine resumes.\n"
             "# TYPE moonloop_resumes_total counter\n"
             "moonloop_resumes_total %llu\n", (unsigned long long)st->resumes);
  fprintf(f, "# HELP moonloop_commits_total Journal groups committed.\n"
             "# TYPE moonloop_commits_total counter\n"
             "moonloop_commits_total %llu\n", (unsigned long long)st->commits);
  fprintf(f, "# HELP moonloop_lua_memory_bytes The Lua state's memory: every run and skill "
             "(capped by limits.total_memory).\n"
             "# TYPE moonloop_lua_memory_bytes gauge\n"
             "moonloop_lua_memory_bytes %zu\n", lrt_memory(srv->en->lrt));
  fprintf(f, "# HELP moonloop_committed_entries_total Journal entries committed.\n"
             "# TYPE moonloop_committed_entries_total counter\n"
             "moonloop_committed_entries_total %llu\n",
          (unsigned long long)st->committed_entries);
  cJSON *counts = NULL;
  err_t ce;
  if (!store_count_by_status(srv->en->store, &counts, &ce)) {
    fprintf(f, "# HELP moonloop_runs Runs in the database, by status.\n"
               "# TYPE moonloop_runs gauge\n");
    const cJSON *c;
    cJSON_ArrayForEach(c, counts)
      fprintf(f, "moonloop_runs{status=\"%s\"} %.0f\n", c->string, c->valuedouble);
    cJSON_Delete(counts);
  }
  cJSON *flow = NULL;
  if (!store_flow_counts(srv->en->store, &flow, &ce)) {
    /* Flow control: why runs wait, and the runs it skipped. */
    fprintf(f, "# HELP moonloop_runs_queued Queued runs, by what they wait for.\n"
               "# TYPE moonloop_runs_queued gauge\n");
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(flow, "queued"))
      fprintf(f, "moonloop_runs_queued{reason=\"%s\"} %.0f\n", c->string, c->valuedouble);
    fprintf(f, "# HELP moonloop_runs_skipped_total Runs skipped by flow control, by skill and reason.\n"
               "# TYPE moonloop_runs_skipped_total counter\n");
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(flow, "skipped"))
      fprintf(f, "moonloop_runs_skipped_total{skill=\"%s\",reason=\"%s\"} %.0f\n",
              cJSON_GetObjectItem(c, "skill")->valuestring, cJSON_GetObjectItem(c, "reason")->valuestring,
              cJSON_GetObjectItem(c, "n")->valuedouble);
    cJSON_Delete(flow);
  }
  fprintf(f, "# HELP moonloop_runs_finished_total Runs that ended in this process, by status.\n"
             "# TYPE moonloop_runs_finished_total counter\n"
             "moonloop_runs_finished_total{status=\"completed\"} %llu\n"
             "moonloop_runs_finished_total{status=\"failed\"} %llu\n"
             "moonloop_runs_finished_total{status=\"cancelled\"} %llu\n"
             "moonloop_runs_finished_total{status=\"skipped\"} %llu\n",
          (unsigned long long)st->runs_completed, (unsigned long long)st->runs_failed,
          (unsigned long long)st->runs_cancelled, (unsigned long long)st->runs_skipped);
  fprintf(f, "# HELP moonloop_step_duration_seconds Time from a step's start to its end.\n"
             "# TYPE moonloop_step_duration_seconds histogram\n");
  uint64_t cum = 0;
  for (int i = 0; i < SCHED_STEP_BUCKETS; i++) {
    cum += st->step_buckets[i];
    if (i == SCHED_STEP_BUCKETS - 1)
      fprintf(f, "moonloop_step_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    else
      fprintf(f, "moonloop_step_duration_seconds_bucket{le=\"%g\"} %llu\n",
              sched_step_bounds_ms[i] / 1000.0, (unsigned long long)cum);
  }
  fprintf(f, "moonloop_step_duration_seconds_sum %.3f\nmoonloop_step_duration_seconds_count %llu\n",
          st->step_sum_ms / 1000.0, (unsigned long long)st->step_count);
  fprintf(f, "# HELP moonloop_lease_takeovers_total Runs this process resumed after another stopped.\n"
             "# TYPE moonloop_lease_takeovers_total counter\n"
             "moonloop_lease_takeovers_total %llu\n", (unsigned long long)st->takeovers);
  fprintf(f, "# HELP moonloop_replays_total Runs replayed from their journals (after a takeover, or woken after an eviction).\n"
             "# TYPE moonloop_replays_total counter\n"
             "moonloop_replays_total %llu\n", (unsigned long long)st->replays);
  fprintf(f, "# HELP moonloop_leases_lost_total Times this process found its lease gone "
             "(another took its runs while it was stopped).\n"
             "# TYPE moonloop_leases_lost_total counter\n"
             "moonloop_leases_lost_total %llu\n", (unsigned long long)st->leases_lost);
  fprintf(f, "# HELP moonloop_commit_failures_total Journal commits that failed (tried again).\n"
             "# TYPE moonloop_commit_failures_total counter\n"
             "moonloop_commit_failures_total %llu\n", (unsigned long long)st->commit_failures);
  fprintf(f, "# HELP moonloop_writes_refused 1 while the database cannot be written (writes "
             "answer 503).\n"
             "# TYPE moonloop_writes_refused gauge\n"
             "moonloop_writes_refused %d\n", st->writes_refused);
  fprintf(f, "# HELP moonloop_ready_tasks Tasks ready to resume now (the loop's queue).\n"
             "# TYPE moonloop_ready_tasks gauge\n"
             "moonloop_ready_tasks %d\n", st->ready);
  fprintf(f, "# HELP moonloop_http_connections Open HTTP connections.\n"
             "# TYPE moonloop_http_connections gauge\n"
             "moonloop_http_connections %zu\n", srv->nconns);
  fprintf(f, "# HELP moonloop_http_requests_total HTTP requests answered, by status code.\n"
             "# TYPE moonloop_http_requests_total counter\n");
  for (int c = 100; c < SERVER_MAX_STATUS; c++)
    if (srv->codes[c])
      fprintf(f, "moonloop_http_requests_total{code=\"%d\"} %llu\n", c,
              (unsigned long long)srv->codes[c]);
  fprintf(f, "# HELP process_start_time_seconds Start time of the process since the epoch, "
             "in seconds.\n"
             "# TYPE process_start_time_seconds gauge\n"
             "process_start_time_seconds %.3f\n", srv->start_time);
  if (fclose(f) || !text) mem_oom(len); /* likewise its writes */
  server__respond(srv, req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

/* GET /v1/versions/{hash}: {"version", "skill", "file", "source"}. */
static void get_version(server_t *srv, h2o_req_t *req, const char *version) {
  char *source = NULL, *skill = NULL, *file = NULL;
  err_t e;
  if (store_get_version(srv->en->store, version, &source, &skill, &file, &e)) {
    respond_err(srv, req, &e);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "version", version);
  cJSON_AddItemToObject(o, "skill", skill ? cJSON_CreateString(skill) : cJSON_CreateNull());
  cJSON_AddItemToObject(o, "file", file ? cJSON_CreateString(file) : cJSON_CreateNull());
  cJSON_AddItemToObject(o, "source", source ? cJSON_CreateString(source) : cJSON_CreateNull());
  free(source), free(skill), free(file);
  respond_cjson(srv, req, 200, o);
}

/* GET /v1/stats and /v1/skills/{id}/stats: the store's figures. */
static void stats(server_t *srv, h2o_req_t *req, const struct server_plan *pl) {
  cJSON *o;
  err_t e;
  int rc = pl->op == SERVER_OP_SKILL_STATS ? store_stats_skill(srv->en->store, &pl->stats, &o, &e)
                                           : store_stats_overview(srv->en->store, &pl->stats, &o, &e);
  if (rc) respond_err(srv, req, &e);
  else respond_cjson(srv, req, 200, o);
}

/* GET /v1/events: {"events": [...], "next": id of the last event shown, or null}. */
static void list_events(server_t *srv, h2o_req_t *req, const struct server_plan *pl) {
  cJSON *events;
  err_t e;
  if (store_list_events(srv->en->store, &pl->evf, &events, &e)) {
    respond_err(srv, req, &e);
    return;
  }
  /* One more than the limit was asked for: its presence says there is a next page. */
  cJSON *next = cJSON_CreateNull();
  if (cJSON_GetArraySize(events) > pl->limit) {
    cJSON_DeleteItemFromArray(events, pl->limit);
    cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, pl->limit - 1), "id");
    if (cJSON_IsString(id)) {
      cJSON_Delete(next);
      next = cJSON_CreateString(id->valuestring);
    }
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "events", events);
  cJSON_AddItemToObject(o, "next", next);
  respond_cjson(srv, req, 200, o);
}

/* Headers of every dashboard file: its validator, revalidation on each use
** (a new binary serves new files at once), and a policy that lets the page
** load nothing but its own files and talk to nothing but this server. */
static void static_headers(h2o_req_t *req, const struct web_file *f) {
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ETAG, NULL, f->etag, strlen(f->etag));
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                 H2O_STRLIT("no-cache"));
  h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-content-type-options"), 0,
                        NULL, H2O_STRLIT("nosniff"));
  h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("content-security-policy"), 0,
                        NULL, H2O_STRLIT("default-src 'self'; img-src 'self' data:; "
                                         "object-src 'none'; base-uri 'none'; "
                                         "frame-ancestors 'none'; form-action 'self'"));
  h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("referrer-policy"), 0, NULL,
                        H2O_STRLIT("no-referrer"));
}

/* See server_int.h. */
int server__static(server_t *srv, h2o_req_t *req) {
  int get = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"));
  if (!get && !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"))) return 0;
  size_t plen = 0;
  while (plen < req->path.len && req->path.base[plen] != '?' && req->path.base[plen] != '#')
    plen++;
  const struct web_file *f = web_find(req->path.base, plen);
  if (!f) return 0;
  ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_IF_NONE_MATCH, -1);
  int fresh = i >= 0 && web_etag_matches(req->headers.entries[i].value.base,
                                         req->headers.entries[i].value.len, f->etag);
  static_headers(req, f);
  if (fresh) {
    /* No Content-Length on a 304 (RFC 9110 8.6 allows only the 200's). */
    req->res.status = 304;
    req->res.content_length = SIZE_MAX;
  } else {
    req->res.status = 200;
    req->res.content_length = f->len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, f->ctype,
                   strlen(f->ctype));
  }
  req->res.reason = reason_of(req->res.status);
  server__count(srv, req->res.status);
  static h2o_generator_t generator = {NULL, NULL};
  h2o_start_response(req, &generator);
  /* The bytes are the binary's own: nothing to free once sent. */
  h2o_iovec_t buf = h2o_iovec_init(f->data, f->len);
  h2o_send(req, &buf, fresh || is_head(req) ? 0 : 1, H2O_SEND_STATE_FINAL);
  return 1;
}

/* GET / when the dashboard's files were left out: a short page that says so. */
static void index_page(server_t *srv, h2o_req_t *req) {
  static const char page[] =
    "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>moonloop</title></head>\n"
    "<body><p>This moonloop was built without its dashboard (web/). The API: "
    "<a href=\"/v1/runs\">/v1/runs</a>, <a href=\"/v1/skills\">/v1/skills</a>, "
    "<a href=\"/metrics\">/metrics</a>.</p>\n</body></html>\n";
  char *body = mem_strdup(page);
  server__respond(srv, req, 200, "text/html; charset=utf-8", body, sizeof page - 1);
}


/* See server_int.h. */
void server__answer(server_t *srv, h2o_req_t *req, const struct server_plan *pl) {
  switch (pl->op) {
  case SERVER_OP_INDEX: index_page(srv, req); break;
  case SERVER_OP_METRICS: metrics(srv, req); break;
  case SERVER_OP_LIST_RUNS: list_runs(srv, req, pl); break;
  case SERVER_OP_GET_RUN:
    if (pl->wait_ms > 0 && !srv->stopping) attach(srv, req, pl);
    else get_run(srv, req, pl->id, !pl->no_steps);
    break;
  case SERVER_OP_LIST_SKILLS: list_skills(srv, req); break;
  case SERVER_OP_GET_SKILL: get_skill(srv, req, pl->id); break;
  case SERVER_OP_GET_VERSION: get_version(srv, req, pl->id); break;
  case SERVER_OP_STATS:
  case SERVER_OP_SKILL_STATS: stats(srv, req, pl); break;
  case SERVER_OP_LIST_EVENTS: list_events(srv, req, pl); break;
  default: control(srv, req, pl); break;
  }
}

/* See server_int.h. */
void server__pending_fail_all(server_t *srv, int status, const char *code, const char *message) {
  for (struct pending *p = srv->pending; p; p = p->next) {
    h2o_req_t *req = pending_detach(p);
    if (req) server__respond_error(srv, req, status, code, message);
  }
}

/* See server_int.h: watches still registered go first (the scheduler is
** still there). */
void server__pending_free_all(server_t *srv) {
  while (srv->pending) {
    struct pending *p = srv->pending;
    if (p->watch) sched_unwatch(srv->en->sched, p->watch);
    p->watch = NULL;
    pending_free(p);
  }
}
