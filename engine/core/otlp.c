/*
** otlp.c: OTLP/HTTP JSON export of finished runs (see otlp.h).
**
** Ids are derived from the run id, so exporting a run twice sends the same
** trace: traceId = SHA-256(run id)[0..16], the run's span = SHA-256(run
** id ":run")[0..8], a step's = SHA-256(run id ":" seq), an attempt's =
** SHA-256(run id ":" seq ":" n). A child run is its own trace whose root
** span links to the parent run's root span.
*/
#include "core/otlp.h"
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "core/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex_id(const char *seed, int bytes, char *out) {
  char h[65];
  ids_sha256_hex(seed, strlen(seed), h);
  memcpy(out, h, (size_t)bytes * 2);
  out[bytes * 2] = 0;
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Nanoseconds since the epoch as the decimal string OTLP JSON wants. */
static void add_time(cJSON *span, const char *key, const char *rfc, const char *fallback) {
  int64_t ms = 0;
  const char *t = rfc ? rfc : fallback;
  if (t && units_parse_rfc3339(t, &ms, NULL)) ms = 0;
  char buf[32];
  snprintf(buf, sizeof buf, "%lld000000", (long long)ms);
  cJSON_AddStringToObject(span, key, ms ? buf : "0");
}

static void attr_str(cJSON *attrs, const char *k, const char *v) {
  if (!v) return;
  cJSON *a = cJSON_CreateObject();
  cJSON_AddStringToObject(a, "key", k);
  cJSON *val = cJSON_AddObjectToObject(a, "value");
  cJSON_AddStringToObject(val, "stringValue", v);
  cJSON_AddItemToArray(attrs, a);
}

static void attr_int(cJSON *attrs, const char *k, double v) {
  cJSON *a = cJSON_CreateObject();
  cJSON_AddStringToObject(a, "key", k);
  cJSON *val = cJSON_AddObjectToObject(a, "value");
  char buf[32];
  snprintf(buf, sizeof buf, "%.0f", v);
  cJSON_AddStringToObject(val, "intValue", buf);
  cJSON_AddItemToArray(attrs, a);
}

/* A span with ids, name, times, and status from a record's status/error. */
static cJSON *span(cJSON *spans, const char *trace, const char *id, const char *parent,
                   const char *name, const cJSON *rec, const char *error) {
  cJSON *sp = cJSON_CreateObject();
  cJSON_AddStringToObject(sp, "traceId", trace);
  cJSON_AddStringToObject(sp, "spanId", id);
  if (parent) cJSON_AddStringToObject(sp, "parentSpanId", parent);
  cJSON_AddStringToObject(sp, "name", name);
  cJSON_AddNumberToObject(sp, "kind", 1);
  add_time(sp, "startTimeUnixNano", str(rec, "started_at"), str(rec, "created_at"));
  add_time(sp, "endTimeUnixNano", str(rec, "ended_at"), str(rec, "started_at"));
  const char *st = str(rec, "status");
  cJSON *status = cJSON_AddObjectToObject(sp, "status");
  int word = vocab_run_status(st);
  int failed = word == RUN_FAILED || word == RUN_CANCELLED;
  cJSON_AddNumberToObject(status, "code", failed ? 2 : word == RUN_COMPLETED ? 1 : 0);
  if (failed && error) cJSON_AddStringToObject(status, "message", error);
  cJSON_AddArrayToObject(sp, "attributes");
  cJSON_AddItemToArray(spans, sp);
  return sp;
}

cJSON *otlp_trace_of(const cJSON *run, const char *service) {
  const char *run_id = str(run, "id");
  if (!run_id) return NULL;
  char trace[33], root[17], seed[128];
  hex_id(run_id, 16, trace);
  snprintf(seed, sizeof seed, "%s:run", run_id);
  hex_id(seed, 8, root);
  cJSON *req = cJSON_CreateObject();
  cJSON *rs = cJSON_CreateObject();
  cJSON_AddItemToArray(cJSON_AddArrayToObject(req, "resourceSpans"), rs);
  cJSON *res = cJSON_AddObjectToObject(rs, "resource");
  attr_str(cJSON_AddArrayToObject(res, "attributes"), "service.name", service ? service : "moonloop");
  cJSON *ss = cJSON_CreateObject();
  cJSON_AddItemToArray(cJSON_AddArrayToObject(rs, "scopeSpans"), ss);
  cJSON *scope = cJSON_AddObjectToObject(ss, "scope");
  cJSON_AddStringToObject(scope, "name", "moonloop");
  cJSON *spans = cJSON_AddArrayToObject(ss, "spans");

  const cJSON *err = cJSON_GetObjectItem(run, "error");
  char name[200];
  snprintf(name, sizeof name, "run %s", str(run, "skill") ? str(run, "skill") : "?");
  cJSON *rsp = span(spans, trace, root, NULL, name, run, str(err, "message"));
  cJSON *ra = cJSON_GetObjectItem(rsp, "attributes");
  attr_str(ra, "moonloop.run_id", run_id);
  attr_str(ra, "moonloop.skill", str(run, "skill"));
  attr_str(ra, "moonloop.version", str(run, "version"));
  attr_str(ra, "moonloop.status", str(run, "status"));
  const cJSON *trig = cJSON_GetObjectItem(run, "trigger");
  attr_str(ra, "moonloop.trigger.kind", str(trig, "kind"));
  const cJSON *ev = cJSON_GetObjectItem(trig, "event");
  attr_str(ra, "moonloop.trigger.event", str(ev, "name"));
  attr_str(ra, "moonloop.trigger.event_id", str(ev, "id"));
  attr_str(ra, "moonloop.error", str(err, "message"));
  const char *parent = str(run, "parent_id");
  if (parent) {
    attr_str(ra, "moonloop.parent_run_id", parent);
    char ptrace[33], pspan[17];
    hex_id(parent, 16, ptrace);
    snprintf(seed, sizeof seed, "%s:run", parent);
    hex_id(seed, 8, pspan);
    cJSON *link = cJSON_CreateObject();
    cJSON_AddStringToObject(link, "traceId", ptrace);
    cJSON_AddStringToObject(link, "spanId", pspan);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(rsp, "links"), link);
  }
  const cJSON *p;
  cJSON_ArrayForEach(p, cJSON_GetObjectItem(run, "steps")) {
    const cJSON *seq = cJSON_GetObjectItem(p, "seq");
    char sid[17];
    snprintf(seed, sizeof seed, "%s:%d", run_id, seq ? seq->valueint : 0);
    hex_id(seed, 8, sid);
    snprintf(name, sizeof name, "%s %s", str(p, "kind") ? str(p, "kind") : "step",
             str(p, "id") ? str(p, "id") : "?");
    cJSON *ssp = span(spans, trace, sid, root, name, p, str(p, "error"));
    cJSON *sa = cJSON_GetObjectItem(ssp, "attributes");
    attr_str(sa, "moonloop.step.id", str(p, "id"));
    attr_str(sa, "moonloop.step.kind", str(p, "kind"));
    attr_str(sa, "moonloop.step.status", str(p, "status"));
    attr_int(sa, "moonloop.step.attempts", cJSON_GetArraySize(cJSON_GetObjectItem(p, "attempts")));
    const cJSON *usage = cJSON_GetObjectItem(p, "usage"), *u;
    cJSON_ArrayForEach(u, usage)
      if (cJSON_IsNumber(u)) {
        char k[80];
        snprintf(k, sizeof k, "llm.usage.%s", u->string);
        attr_int(sa, k, u->valuedouble);
      }
    const cJSON *l;
    cJSON *events = cJSON_AddArrayToObject(ssp, "events");
    cJSON_ArrayForEach(l, cJSON_GetObjectItem(p, "logs")) {
      cJSON *e = cJSON_CreateObject();
      add_time(e, "timeUnixNano", str(l, "ts"), NULL);
      cJSON_AddStringToObject(e, "name", str(l, "msg") ? str(l, "msg") : "");
      attr_str(cJSON_AddArrayToObject(e, "attributes"), "level", str(l, "level"));
      cJSON_AddItemToArray(events, e);
    }
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(p, "attempts")) {
      const cJSON *n = cJSON_GetObjectItem(a, "n");
      char aid[17];
      snprintf(seed, sizeof seed, "%s:%d:%d", run_id, seq ? seq->valueint : 0, n ? n->valueint : 0);
      hex_id(seed, 8, aid);
      snprintf(name, sizeof name, "attempt %d", n ? n->valueint : 0);
      cJSON *asp = span(spans, trace, aid, sid, name, a, str(a, "error"));
      cJSON *aa = cJSON_GetObjectItem(asp, "attributes");
      attr_int(aa, "moonloop.attempt", n ? n->valuedouble : 0);
      attr_str(aa, "moonloop.error", str(a, "error"));
    }
  }
  return req;
}

/* ---- sending ---- */

struct export {
  struct engine *en;
  char *body;
  int tries;
  uv_timer_t timer;
};

static void send_export(struct export *x);

static void export_free(uv_handle_t *h) {
  struct export *x = h->data;
  free(x->body);
  free(x);
}

static void on_retry(uv_timer_t *t) { send_export(t->data); }

static void on_sent(const struct httpc_resp *resp, void *ud) {
  struct export *x = ud;
  int ok = !resp->error && resp->status >= 200 && resp->status < 300;
  if (ok || x->tries >= 3) {
    if (!ok)
      fprintf(stderr, "moonloop: OTLP export to %s failed, trace dropped: %s\n",
              x->en->cfg->otlp_endpoint, resp->error ? resp->errmsg : "non-2xx answer");
    uv_close((uv_handle_t *)&x->timer, export_free);
    return;
  }
  uv_timer_start(&x->timer, on_retry, 500u << x->tries, 0);
}

static void send_export(struct export *x) {
  char url[1024];
  snprintf(url, sizeof url, "%s/v1/traces", x->en->cfg->otlp_endpoint);
  const char *headers[] = {"Content-Type: application/json", NULL};
  struct httpc_req req = {.method = "POST", .url = url, .headers = headers, .body = x->body,
                          .body_len = strlen(x->body), .timeout_ms = 10000};
  err_t e;
  x->tries++;
  if (httpc_start(x->en->http, &req, on_sent, x, NULL, &e)) {
    fprintf(stderr, "moonloop: OTLP export: %s\n", e.msg);
    uv_close((uv_handle_t *)&x->timer, export_free);
  }
}

static void on_finish(const struct sched_result *r, void *arg) {
  struct engine *en = arg;
  cJSON *run;
  err_t e;
  if (store_get_run(en->store, r->run_id, 1, &run, &e)) return;
  jsontext_fix_utf8(run);
  cJSON *req = otlp_trace_of(run, en->cfg->otlp_service);
  cJSON_Delete(run);
  if (!req) return;
  struct export *x = mem_calloc(1, sizeof *x);
  x->en = en;
  x->body = jsontext_print_text(req);
  cJSON_Delete(req);
  uv_timer_init(&en->loop, &x->timer);
  x->timer.data = x;
  send_export(x);
}

void otlp_start(struct engine *en) {
  if (en->cfg->otlp_endpoint && *en->cfg->otlp_endpoint && en->sched)
    sched_on_finish(en->sched, on_finish, en);
}
