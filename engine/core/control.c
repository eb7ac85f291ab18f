/*
** control.c: control operations of a running engine (see sched.h): events,
** invoke, cancel, rerun, skill registration, for the HTTP server. Each
** validates at once, writes through the scheduler's open journal group,
** and answers once the write is durable: so an HTTP 2xx means what the
** CLI's exit 0 means.
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "core/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct reply {
  sched_t *s;
  sched_reply_cb cb;
  void *arg;
  int n;          /* entries to answer for (events) */
  char run_id[27];
  int64_t wait_ms;
  int replied;
};

static struct reply *reply_new(sched_t *s, sched_reply_cb cb, void *arg) {
  struct reply *r = mem_calloc(1, sizeof *r);
  r->s = s;
  r->cb = cb;
  r->arg = arg;
  return r;
}

static void answer(struct reply *r, int rc, const char *message, const char *json) {
  if (r->replied) return;
  r->replied = 1;
  struct sched_reply rep = {rc, message, json};
  r->cb(&rep, r->arg);
}

/* The request's group could not be committed (sched__after_request): its
** entries are dropped, and the writer hears why at once. */
static void on_write_failed(void *arg, const char *msg) {
  struct reply *r = arg;
  char m[1200];
  snprintf(m, sizeof m, "the engine cannot write to its database: %s; nothing was stored, try "
           "again later", msg);
  answer(r, ERR_BUSY, m, NULL);
  free(r);
}

/* ---- events ---- */

static void on_events(void *arg, const struct jentry *last) {
  struct reply *r = arg;
  cJSON *o = cJSON_CreateObject();
  cJSON *ids = cJSON_AddArrayToObject(o, "ids");
  for (int i = r->n - 1; i >= 0; i--) {
    const struct jentry *je = last - i;
    cJSON_AddItemToArray(ids, cJSON_CreateString(je->result ? je->result : je->u.event.id));
  }
  char *js = jsontext_print_text(o);
  cJSON_Delete(o);
  answer(r, 0, NULL, js);
  free(js);
  free(r);
}

int sched_send_events(sched_t *s, const cJSON *events, sched_reply_cb cb, void *arg, err_t *e) {
  int64_t limit = sched__opts(s)->event_limit, now = units_now_ms();
  if (sched__refuse_write(s, e)) return e->code;
  int n = cJSON_GetArraySize(events);
  if (!cJSON_IsArray(events) || n == 0)
    return err_set(e, ERR_INVALID, "expected an event {name, data, id?} or a non-empty list of them");
  const cJSON *ev;
  int i = 0;
  /* Validate all first: a bad event in a list changes nothing. */
  cJSON_ArrayForEach(ev, events) {
    i++;
    const cJSON *name = cJSON_GetObjectItem(ev, "name"), *id = cJSON_GetObjectItem(ev, "id");
    if (!cJSON_IsObject(ev) || !cJSON_IsString(name) || !*name->valuestring ||
        strlen(name->valuestring) > 256)
      return err_set(e, ERR_INVALID, "event %d: 'name' must be a string of 1 to 256 characters", i);
    if (id && !cJSON_IsNull(id) && (!cJSON_IsString(id) || strlen(id->valuestring) > 256))
      return err_set(e, ERR_INVALID, "event %d: 'id' must be a string of at most 256 characters", i);
    if (cJSON_IsString(id) &&
        store_event_key_clash(sched__opts(s)->store, id->valuestring, name->valuestring, e))
      return err_prefix(e, "event %d", i);
    char *data = jsontext_print_text(cJSON_GetObjectItem(ev, "data"));
    int64_t len = data ? (int64_t)strlen(data) : 4;
    free(data);
    if (len > limit) {
      char sz[32], lim[32];
      units_fmt_over(len, limit, sz, lim, sizeof sz);
      return err_set(e, ERR_TOOBIG, "event %d: its data is %s, over the limit of %s (limits.event)",
                     i, sz, lim);
    }
  }
  struct reply *r = reply_new(s, cb, arg);
  journal_t *j = sched__journal(s);
  size_t first = journal_count(j);
  cJSON_ArrayForEach(ev, events) {
    char id[27];
    ids_ulid(now, id);
    const cJSON *key = cJSON_GetObjectItem(ev, "id");
    char *data = jsontext_print_text(cJSON_GetObjectItem(ev, "data"));
    struct event_row er = {.id = id, .name = cJSON_GetObjectItem(ev, "name")->valuestring,
                           .data = data ? data : "null",
                           .idem = cJSON_IsString(key) ? key->valuestring : NULL, .ts = now};
    journal_event(j, &er);
    free(data);
    r->n++;
  }
  sched__after_request(s, first, on_events, on_write_failed, r);
  return 0;
}

/* ---- invoke ---- */

/* What an invoke needs across its commit: the run, and what to answer. */
struct invoke {
  struct reply r;        /* first: the reply's callback gets it back */
  struct skill *sk;
  char *trigger, *input;
  int64_t at, deadline_at;
};

/* Answer an invoke that waited: the run's outcome once it ended, else
** {"run_id", "status"} with the status it has now (queued, running,
** sleeping, waiting: still going when the wait ran out), as its record
** says it. */
static void reply_outcome(struct reply *r, int ended) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "run_id", r->run_id);
  cJSON *run = NULL;
  err_t e;
  if (ended && !store_get_run(sched__opts(r->s)->store, r->run_id, 0, &run, &e)) {
    const char *keys[] = {"status", "output", "error"};
    for (int i = 0; i < 3; i++) {
      cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(run, keys[i]);
      cJSON_AddItemToObject(o, keys[i], v ? v : cJSON_CreateNull());
    }
    cJSON_Delete(run);
  } else {
    char st[32];
    if (store_run_status(sched__opts(r->s)->store, r->run_id, st, sizeof st, &e)) snprintf(st, sizeof st, "running");
    cJSON_AddStringToObject(o, "status", st);
  }
  jsontext_fix_utf8(o);
  char *js = jsontext_print_text(o);
  cJSON_Delete(o);
  answer(r, 0, NULL, js);
  free(js);
}

/* The run ended, or the invoke's wait ran out. */
static void on_invoke_end(void *arg, int ended) {
  struct invoke *iv = arg;
  reply_outcome(&iv->r, ended);
  free(iv->trigger), free(iv->input);
  free(iv);
}

/* The run is durable: answer {"run_id"}, or wait for its end. A run that
** ended already (a repeated key's) is answered at once. */
static void answer_started(struct invoke *iv, int started_here) {
  struct reply *r = &iv->r;
  if (r->wait_ms > 0) {
    err_t e;
    struct sched_watch *w = NULL;
    int rc = started_here ? (sched__watch_add(r->s, r->run_id, r->wait_ms, on_invoke_end, iv), 0)
                          : sched_watch(r->s, r->run_id, r->wait_ms, on_invoke_end, iv, &w, &e);
    if (rc == 0) return;
    if (rc == 1) reply_outcome(r, 1);
    else answer(r, rc, e.msg, NULL);
  } else {
    char js[64] = "{\"run_id\":\"";
    size_t n = strlen(js), idl = strlen(r->run_id);
    memcpy(js + n, r->run_id, idl);
    memcpy(js + n + idl, "\"}", 3);
    answer(r, 0, NULL, js);
  }
  free(iv->trigger), free(iv->input);
  free(iv);
}

/* A run started at once is durable. */
static void on_run_queued(void *arg, const struct jentry *last) {
  (void)last;
  answer_started(arg, 1);
}

/* The group that creates the run could not be committed: nothing of it is
** stored, so a run started at once stops here too; the writer hears why. */
static void on_invoke_failed(void *arg, const char *msg) {
  struct invoke *iv = arg;
  struct reply *r = &iv->r;
  char m[1200];
  snprintf(m, sizeof m, "the engine cannot write to its database: %s; nothing was stored, "
           "try again later", msg);
  answer(r, ERR_BUSY, m, NULL);
  if (!iv->sk) sched__drop_run(r->s, r->run_id); /* (a keyed run had not started) */
  free(iv->trigger), free(iv->input);
  free(iv);
}

/* A keyed run's row was committed, or its key was found taken (the
** entry's result: the first run's id): start it here, or answer for the
** first run. */
static void on_keyed_row(void *arg, const struct jentry *je) {
  struct invoke *iv = arg;
  struct reply *r = &iv->r;
  if (je->result) {
    snprintf(r->run_id, sizeof r->run_id, "%s", je->result);
    answer_started(iv, 0);
    return;
  }
  err_t e;
  if (sched__start_existing(r->s, iv->sk, r->run_id, iv->trigger, iv->input, iv->at, &e)) {
    /* Its row is durable: whoever takes this process's runs over starts it. */
    fprintf(stderr, "moonloop: starting run %s: %s\n", r->run_id, e.msg);
  }
  answer_started(iv, 1);
}

/* Start a run here and answer as invoke does. Without a key the run starts
** at once, its row in the open group. With a key, its row goes first,
** alone, and the run starts once the store has kept it (a repeat of the
** key finds the first run instead): a run never executes steps for a row
** that a concurrent start of the same key lost. */
static int start_and_answer(sched_t *s, struct skill *sk, const char *trigger, const char *input,
                            const char *key, int64_t wait_ms, sched_reply_cb cb, void *arg,
                            err_t *e) {
  if (sched__refuse_write(s, e)) return e->code;
  struct invoke *iv = mem_calloc(1, sizeof *iv);
  iv->r.s = s, iv->r.cb = cb, iv->r.arg = arg, iv->r.wait_ms = wait_ms;
  size_t first = journal_count(sched__journal(s));
  if (!key) {
    if (sched_run_new(s, sk, trigger, input, NULL, iv->r.run_id, e)) {
      free(iv);
      return e->code;
    }
    sched__after_request(s, first, on_run_queued, on_invoke_failed, iv);
    return 0;
  }
  iv->sk = sk;
  iv->trigger = mem_strdup(trigger);
  iv->input = input ? mem_strdup(input) : NULL;
  iv->at = units_now_ms();
  /* With limits, the timeout counts from the grant (flowctl.c). */
  iv->deadline_at = sk->timeout_ms && !sk->nlimits ? iv->at + sk->timeout_ms : 0;
  ids_ulid(iv->at, iv->r.run_id);
  struct run_row row = {
    .id = iv->r.run_id, .skill = sk->id, .version = sk->version,
    .status = sk->nlimits ? "queued" : "running", /* with limits: started by their grant */
    .entry = "run", .trigger = trigger, .input = input, .owner = sched_owner(s),
    .created_at = iv->at, .started_at = sk->nlimits ? 0 : iv->at, .deadline_at = iv->deadline_at,
    .idem = key,
  };
  journal_run_new(sched__journal(s), &row);
  sched__after_request(s, first, on_keyed_row, on_invoke_failed, iv);
  return 0;
}

/* A keyed start of a skill that is not live (deleted, its file removed,
** failing to load) that repeats an earlier one: answered with the first
** run, as a repeat of a live skill's is (a client retrying a start while
** a deploy replaces the skill must not conclude that it never started).
** 0 when answered; else the caller's error stands. */
static int keyed_repeat(sched_t *s, const char *skill, const char *key, int64_t wait_ms,
                        sched_reply_cb cb, void *arg) {
  char id[27];
  err_t e;
  if (store_keyed_run(sched__opts(s)->store, skill, key, id, sizeof id, &e) != 1) return -1;
  struct invoke *iv = mem_calloc(1, sizeof *iv);
  iv->r.s = s, iv->r.cb = cb, iv->r.arg = arg, iv->r.wait_ms = wait_ms;
  snprintf(iv->r.run_id, sizeof iv->r.run_id, "%s", id);
  answer_started(iv, 0);
  return 0;
}

int sched_invoke(sched_t *s, const char *skill, const char *data_json, const char *key,
                 int64_t wait_ms, sched_reply_cb cb, void *arg, err_t *e) {
  struct skill *sk;
  if (sched__live_skill(s, skill, &sk, e)) {
    if (key && e->code == ERR_NOTFOUND && !keyed_repeat(s, skill, key, wait_ms, cb, arg)) return 0;
    if (e->code == ERR_BUSY) { /* the store could not be read: say what that means for the start */
      err_t why = *e;
      err_set(e, ERR_BUSY, "the engine cannot read its database: %s; nothing was stored, try "
              "again later", why.msg);
    }
    return e->code;
  }
  char trig[SCHED_KEY_MAX * 6 + 96];
  if (jsontext_invoke_trigger("http", key, trig, sizeof trig))
    return err_set(e, ERR_INVALID, "the key is too long (at most %d bytes)", SCHED_KEY_MAX);
  return start_and_answer(s, sk, trig, data_json ? data_json : "null", key, wait_ms, cb, arg, e);
}

/* ---- cancel and rerun ---- */

/* How long a cancel's answer waits for the run to stop (ms): a run stops
** at its next step, at once when it sleeps or waits, and one of another
** engine at that engine's next poll. */
#define CANCEL_WAIT_MS 5000

/* A cancelled run's end, or the cancel's wait ran out: answer what the run
** ended as. One that completed (or failed) before the cancel reached it
** was not cancelled, and the client hears so (409), where it was told
** "cancelled" whenever the run was still in memory when the cancel
** committed. */
static void on_cancel_end(void *arg, int ended) {
  struct reply *r = arg;
  cJSON *run = NULL;
  err_t e;
  char status[32] = "cancelling";
  if (ended && !store_get_run(sched__opts(r->s)->store, r->run_id, 0, &run, &e)) {
    const cJSON *st = cJSON_GetObjectItem(run, "status");
    if (cJSON_IsString(st)) snprintf(status, sizeof status, "%s", st->valuestring);
    cJSON_Delete(run);
  }
  if (ended && strcmp(status, "cancelled") && strcmp(status, "cancelling")) {
    char msg[160];
    snprintf(msg, sizeof msg, "run %s %s before the cancel reached it: nothing was cancelled",
             r->run_id, status);
    answer(r, ERR_CONFLICT, msg, NULL);
  } else {
    char js[96];
    snprintf(js, sizeof js, "{\"run_id\":\"%s\",\"status\":\"%s\"}", r->run_id, status);
    answer(r, 0, NULL, js);
  }
  free(r);
}

/* The cancel is durable: answer at once what the store decided (no such
** run, ended already, cancelled where no one held it), or, for a run an
** engine holds ("cancelling": it stops at its next step), once it ended. */
static void on_cancel(void *arg, const struct jentry *je) {
  struct reply *r = arg;
  const char *st = je->result;
  if (!st || !strcmp(st, "notfound")) {
    char msg[80];
    snprintf(msg, sizeof msg, "no run with id '%s'", r->run_id);
    answer(r, ERR_NOTFOUND, msg, NULL);
  } else if (!strncmp(st, "ended:", 6)) {
    char msg[120];
    snprintf(msg, sizeof msg, "run %s is already %s: nothing to cancel", r->run_id, st + 6);
    answer(r, ERR_CONFLICT, msg, NULL);
  } else if (!strcmp(st, "cancelling")) {
    /* Ours: stop it now rather than at the next poll. */
    if (sched__find(r->s, r->run_id)) sched__poll_now(r->s);
    struct sched_watch *w = NULL;
    err_t e;
    int rc = sched_watch(r->s, r->run_id, CANCEL_WAIT_MS, on_cancel_end, r, &w, &e);
    if (rc == 0) return;
    on_cancel_end(r, rc == 1);
    return;
  } else {
    char js[96];
    snprintf(js, sizeof js, "{\"run_id\":\"%s\",\"status\":\"%s\"}", r->run_id, st);
    answer(r, 0, NULL, js);
  }
  free(r);
}

int sched_cancel(sched_t *s, const char *run_id, sched_reply_cb cb, void *arg, err_t *e) {
  if (!run_id || strlen(run_id) != 26) return err_set(e, ERR_NOTFOUND, "no run with id '%.40s'", run_id ? run_id : "");
  if (sched__refuse_write(s, e)) return e->code;
  struct reply *r = reply_new(s, cb, arg);
  snprintf(r->run_id, sizeof r->run_id, "%s", run_id);
  struct cancel_row c = {.run_id = run_id, .reason = "cancelled over HTTP", .at = units_now_ms()};
  size_t first = journal_count(sched__journal(s));
  journal_cancel(sched__journal(s), &c);
  sched__after_request(s, first, on_cancel, on_write_failed, r);
  return 0;
}

/* See sched.h. A rerun of an event's run gets that event (ctx.event,
** run.lua): a skill that branches on its name takes the same path again. */
char *sched_rerun_trigger(const cJSON *run, const char *key) {
  cJSON *t = cJSON_CreateObject();
  cJSON_AddStringToObject(t, "kind", "rerun");
  cJSON_AddStringToObject(t, "run_id", cJSON_GetStringValue(cJSON_GetObjectItem(run, "id")));
  if (key) cJSON_AddStringToObject(t, "key", key);
  const cJSON *ev = cJSON_GetObjectItem(cJSON_GetObjectItem(run, "trigger"), "event");
  if (cJSON_IsObject(ev)) cJSON_AddItemToObject(t, "event", cJSON_Duplicate(ev, 1));
  char *trig = jsontext_print_text(t);
  cJSON_Delete(t);
  return trig;
}

int sched_rerun(sched_t *s, const char *run_id, const char *key, sched_reply_cb cb, void *arg,
                err_t *e) {
  cJSON *run;
  if (store_get_run(sched__opts(s)->store, run_id, 0, &run, e)) return e->code;
  const char *skill_id = cJSON_GetObjectItem(run, "skill")->valuestring;
  struct skill *sk;
  char *version;
  int rc = store_rerun_version(sched__opts(s)->store, skill_id,
                               cJSON_GetObjectItem(run, "version")->valuestring, &version, e);
  if (!rc) {
    rc = sched__version_skill(s, version, &sk, e);
    free(version);
  }
  if (rc) {
    cJSON_Delete(run);
    return rc;
  }
  char *input = jsontext_print_text(cJSON_GetObjectItem(run, "input"));
  /* With a key (the skill's, as invoke's): a repeat answers the first. */
  char *trig = sched_rerun_trigger(run, key);
  rc = start_and_answer(s, sk, trig, input, key, 0, cb, arg, e);
  free(trig);
  free(input);
  cJSON_Delete(run);
  return rc;
}

/* ---- skills ---- */

struct put_ctx {
  struct reply *r;
  char *id;
  int rc;
  char *message;
};

/* put_source's write could not be committed: the load is refused with
** the reason (the sidecar tries again; its skill keeps its live version). */
static void on_put_failed(void *arg, const char *msg) {
  struct put_ctx *p = arg;
  char m[1200];
  snprintf(m, sizeof m, "the engine cannot write to its database: %s; nothing was stored, try "
           "again later", msg);
  answer(p->r, ERR_BUSY, m, NULL);
  free(p->id);
  free(p->message);
  free(p->r);
  free(p);
}

static void on_put(void *arg, const struct jentry *last) {
  struct put_ctx *p = arg;
  sched__live_forget(p->r->s);
  sched__skills_changed(p->r->s);
  cJSON *rec;
  err_t e;
  const char *refused = p->rc ? NULL : store_skill_refusal(last);
  if (refused) {
    /* The store refused it (a scope's limit clashes with a skill another
    ** engine registered meanwhile): kept as the skill's error. */
    free(p->message);
    p->message = mem_strdup(refused);
    p->rc = ERR_CONFLICT;
  }
  if (p->rc) {
    answer(p->r, p->rc, p->message, NULL);
  } else if (store_get_skill(sched__opts(p->r->s)->store, p->id, &rec, &e)) {
    if (e.code != ERR_NOTFOUND) answer(p->r, e.code, e.msg, NULL);
    else { /* an unregistered skill that never loaded: its record is gone */
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "id", p->id);
      cJSON_AddNullToObject(o, "version");
      cJSON_AddArrayToObject(o, "triggers");
      cJSON_AddArrayToObject(o, "versions");
      cJSON_AddNullToObject(o, "error");
      char *js = jsontext_print_text(o);
      cJSON_Delete(o);
      answer(p->r, 0, NULL, js);
      free(js);
    }
  } else {
    char *js = jsontext_print_text(rec);
    answer(p->r, 0, NULL, js);
    free(js);
    cJSON_Delete(rec);
  }
  free(p->id);
  free(p->message);
  free(p->r);
  free(p);
}

/* The skill a file registered last, or NULL (caller frees). */
static char *skill_of_file(sched_t *s, const char *file) {
  cJSON *all;
  err_t e;
  char *id = NULL;
  if (store_list_skills(sched__opts(s)->store, &all, &e)) return NULL;
  const cJSON *k;
  cJSON_ArrayForEach(k, all) {
    const cJSON *f = cJSON_GetObjectItem(k, "file");
    if (cJSON_IsString(f) && !strcmp(f->valuestring, file)) {
      id = mem_strdup(cJSON_GetObjectItem(k, "id")->valuestring);
      break;
    }
  }
  cJSON_Delete(all);
  return id;
}

/* (PUT) The live skill other than id registered from file, or NULL
** (caller frees): a file name belongs to its skill, so a PUT cannot point
** another skill at it (and skills.deploy then write over it). */
static char *file_taken(sched_t *s, const char *id, const char *file) {
  cJSON *all;
  err_t e;
  char *other = NULL;
  if (store_list_skills(sched__opts(s)->store, &all, &e)) return NULL;
  const cJSON *k;
  cJSON_ArrayForEach(k, all) {
    const cJSON *f = cJSON_GetObjectItem(k, "file"), *v = cJSON_GetObjectItem(k, "version");
    const cJSON *kid = cJSON_GetObjectItem(k, "id");
    if (cJSON_IsString(f) && !strcmp(f->valuestring, file) && cJSON_IsString(v) &&
        cJSON_IsString(kid) && strcmp(kid->valuestring, id)) {
      other = mem_strdup(kid->valuestring);
      break;
    }
  }
  cJSON_Delete(all);
  return other;
}

/* (sidecar) The line of the source's `id = ...` (0 when there is none). */
static int id_line(const char *src, size_t len) {
  int line = 1;
  for (size_t i = 0; i + 1 < len; i++) {
    if (src[i] == '\n') line++;
    if (src[i] != 'i' || src[i + 1] != 'd') continue;
    char prev = i ? src[i - 1] : ' ';
    if (prev == '_' || prev == '.' || (prev >= 'a' && prev <= 'z') || (prev >= 'A' && prev <= 'Z') ||
        (prev >= '0' && prev <= '9'))
      continue;
    size_t j = i + 2;
    while (j < len && (src[j] == ' ' || src[j] == '\t')) j++;
    if (j + 1 < len && src[j] == '=' && src[j + 1] != '=') return line;
  }
  return 0;
}

/* The limit skill other (its limits JSON) gives scope with key path key
** (NULL: none), or 0 when it names no such scope. */
static int scope_limit(const char *limits, const char *scope, const char *key) {
  cJSON *list = limits ? cJSON_Parse(limits) : NULL;
  int lim = (int)store_scope_limit(list, scope, key);
  cJSON_Delete(list);
  return lim;
}

/* The limit that the file of a live skill gives (scope, key) as the file
** reads now (a change on its way to being loaded), or 0 (no such file or
** scope, or it does not load). */
static int scope_limit_on_disk(sched_t *s, const char *file, const char *scope, const char *key) {
  char *src;
  size_t len;
  struct skill_error se;
  struct skill *sk;
  if (!strncmp(file, "//", 2) || skills_read_file(file, &src, &len, &se.err)) return 0;
  int rc = skills_load(sched__opts(s)->skills, src, len, file, &sk, &se);
  free(src);
  return rc ? 0 : scope_limit(sk->limits, scope, key);
}

/* Whether sk names a concurrency scope that another live skill gives
** another limit (a run would start while the scope holds fewer runs than
** its own skill's limit says, so the skills would not share one limit):
** e says which skill and what limit. A skill whose file already says the
** new limit (both files changed, one loaded before the other) is not in
** the way: its id goes to ok (a cJSON array), for the store, which judges
** again when it writes (store_queue.c's store__scope_clash: another
** engine may register a skill meanwhile). */
static int scope_clash(sched_t *s, const struct skill *sk, const char *file, cJSON *ok, err_t *e) {
  cJSON *mine = sk->limits ? cJSON_Parse(sk->limits) : NULL, *all = NULL;
  err_t le;
  int rc = 0;
  if (!mine || store_list_skills(sched__opts(s)->store, &all, &le)) {
    cJSON_Delete(mine);
    return 0;
  }
  /* The registrations of the open group (a workspace's files load in
  ** one turn) count as live already. */
  journal_t *j = sched__journal(s);
  for (size_t i = 0; i < journal_count(j); i++) {
    const struct jentry *je = journal_entry(j, i);
    if (je->dropped || je->kind != J_SKILL || je->u.skill.op != SKILL_PUT) continue;
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "id", je->u.skill.id);
    cJSON_AddStringToObject(x, "version", je->u.skill.version);
    if (je->u.skill.file) cJSON_AddStringToObject(x, "file", je->u.skill.file);
    cJSON_AddItemToArray(all, x);
  }
  const cJSON *l;
  cJSON_ArrayForEach(l, mine) {
    const char *scope = cJSON_GetStringValue(cJSON_GetObjectItem(l, "scope"));
    const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(l, "key"));
    int want = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(l, "limit"));
    const cJSON *k;
    if (!scope) continue;
    cJSON_ArrayForEach(k, all) {
      const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(k, "id"));
      const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(k, "version"));
      const char *f = cJSON_GetStringValue(cJSON_GetObjectItem(k, "file"));
      struct skill *other;
      if (!id || !v || !strcmp(id, sk->id) || sched__version_skill(s, v, &other, &le)) continue;
      int has = scope_limit(other->limits, scope, key);
      if (!has || has == want) continue;
      if (f && scope_limit_on_disk(s, f, scope, key) == want) {
        cJSON_AddItemToArray(ok, cJSON_CreateString(id));
        continue;
      }
      rc = err_set(e, ERR_CONFLICT, "%s: concurrency scope '%s'%s%s has limit %d here, but skill '%s' "
                   "(%s) gives it limit %d: every skill naming a scope must give it the same limit",
                   file, scope, key ? ", key " : "", key ? key : "", want, id, f ? f : "?", has);
      break;
    }
    if (rc) break;
  }
  cJSON_Delete(all);
  cJSON_Delete(mine);
  return rc;
}

/* What the registry says to sk, loaded from source, as file's skill: 0,
** or ERR_CONFLICT when file is another skill's (a PUT or a deploy names
** want_id), the id is another existing file's, or a concurrency scope of
** sk has another limit in another live skill (scope_clash; ok gets the
** skills whose own files already agree). */
static int registry_refusal(sched_t *s, const struct skill *sk, const char *file,
                            const char *want_id, const char *source, size_t len, cJSON *ok,
                            struct skill_error *se) {
  char other[512];
  char *taken = want_id ? file_taken(s, want_id, file) : NULL;
  if (taken) {
    err_set(&se->err, ERR_CONFLICT, "%s is the file of skill '%s': a skill cannot be "
            "registered from another skill's file", file, taken);
    free(taken);
    return ERR_CONFLICT;
  }
  if (store_skill_held_elsewhere(sched__opts(s)->store, sk->id, file, other, sizeof other)) {
    /* (sidecar) The error points at the line that declares the id. */
    se->line = id_line(source, len);
    char where[600];
    snprintf(where, sizeof where, se->line ? "%s:%d" : "%s", file, se->line);
    return err_set(&se->err, ERR_CONFLICT, "%s: skill id '%s' is already defined by %s", where,
                   sk->id, other);
  }
  return scope_clash(s, sk, file, ok, &se->err);
}

/* See sched.h. */
int sched_skill_refusal(sched_t *s, const char *id, const char *file, const char *source,
                        size_t len, err_t *e) {
  struct skill *sk = NULL;
  struct skill_error se = {0};
  int rc = skills_load(sched__opts(s)->skills, source, len, file, &sk, &se);
  cJSON *ok = cJSON_CreateArray();
  if (!rc) rc = registry_refusal(s, sk, file, id, source, len, ok, &se);
  cJSON_Delete(ok);
  if (rc) *e = se.err;
  return rc;
}

/* Register (or reject) source as the file's skill; answer through cb. */
static int put_source(sched_t *s, const char *file, const char *want_id, const char *source,
                      size_t len, sched_reply_cb cb, void *arg, err_t *e) {
  if (sched__refuse_write(s, e)) return e->code;
  struct put_ctx *p = mem_calloc(1, sizeof *p);
  p->r = reply_new(s, cb, arg);
  int64_t now = units_now_ms();
  journal_t *j = sched__journal(s);
  size_t first = journal_count(j);
  struct skill *sk = NULL;
  struct skill_error se = {0};
  int rc = skills_load(sched__opts(s)->skills, source, len, file, &sk, &se);
  if (!rc && want_id && strcmp(sk->id, want_id))
    rc = err_set(&se.err, ERR_INVALID, "%s: the source declares id '%s', not '%s'", file, sk->id,
                 want_id);
  cJSON *scopes_ok = cJSON_CreateArray();
  if (!rc) rc = registry_refusal(s, sk, file, want_id, source, len, scopes_ok, &se);
  if (rc) {
    /* Keep the error on the skill's record; its live version stays. */
    char *id = want_id ? mem_strdup(want_id) : skill_of_file(s, file);
    if (!id) {
      char dflt[160];
      skills_default_id(file, dflt, sizeof dflt);
      id = mem_strdup(dflt);
    }
    if (sk && rc == ERR_CONFLICT) {
      free(id);
      id = mem_strdup(sk->id);
    }
    char at[40];
    units_rfc3339(now, at, sizeof at);
    cJSON *ej = cJSON_CreateObject();
    cJSON_AddStringToObject(ej, "message", se.err.msg);
    cJSON_AddStringToObject(ej, "file", file);
    if (se.line) cJSON_AddNumberToObject(ej, "line", se.line);
    else cJSON_AddNullToObject(ej, "line");
    cJSON_AddStringToObject(ej, "at", at);
    char *ejs = jsontext_print_text(ej);
    cJSON_Delete(ej);
    struct skill_row k = {.op = SKILL_ERROR, .id = id, .file = file, .error = ejs,
                          .updated_at = now};
    journal_skill(j, &k);
    free(ejs);
    p->id = id;
    p->rc = rc;
    p->message = mem_strdup(se.err.msg);
  } else {
    struct version_row v = {.version = sk->version, .skill = sk->id, .source = sk->source,
                            .file = file, .loaded_at = now, .triggers = sk->triggers};
    char *scopes = skills_scopes(sk), *limits = skills_slot_limits(sk);
    char *ok = cJSON_GetArraySize(scopes_ok) ? jsontext_print_text(scopes_ok) : NULL;
    struct skill_row k = {.op = SKILL_PUT, .id = sk->id, .version = sk->version, .file = file,
                          .description = sk->description, .triggers = sk->triggers,
                          .updated_at = now, .scopes = scopes, .scopes_ok = ok, .limits = limits};
    journal_version(j, &v);
    journal_skill(j, &k);
    free(scopes), free(ok), free(limits);
    p->id = mem_strdup(sk->id);
  }
  cJSON_Delete(scopes_ok);
  sched__after_request(s, first, on_put, on_put_failed, p);
  return 0;
}

int sched_put_skill(sched_t *s, const char *id, const char *file, const char *source,
                    size_t len, sched_reply_cb cb, void *arg, err_t *e) {
  char dflt[300];
  if (!file || !*file) {
    snprintf(dflt, sizeof dflt, "%s.lua", id);
    file = dflt;
  }
  return put_source(s, file, id, source, len, cb, arg, e);
}

int sched_load_file(sched_t *s, const char *path, const char *source, size_t len,
                    sched_reply_cb cb, void *arg, err_t *e) {
  return put_source(s, path, NULL, source, len, cb, arg, e);
}

/* Journal the removal of id's live version; answer its record once durable. */
static int unload_id(sched_t *s, char *id, const char *path, sched_reply_cb cb, void *arg,
                     err_t *e) {
  if (sched__refuse_write(s, e)) {
    free(id);
    return e->code;
  }
  struct put_ctx *p = mem_calloc(1, sizeof *p);
  p->r = reply_new(s, cb, arg);
  struct skill_row k = {.op = SKILL_REMOVE, .id = id, .file = path, .updated_at = units_now_ms()};
  size_t first = journal_count(sched__journal(s));
  journal_skill(sched__journal(s), &k);
  p->id = id;
  sched__after_request(s, first, on_put, on_put_failed, p);
  return 0;
}

int sched_unload_file(sched_t *s, const char *path, sched_reply_cb cb, void *arg, err_t *e) {
  char *id = skill_of_file(s, path);
  if (!id) return err_set(e, ERR_NOTFOUND, "no skill was registered from %s", path);
  return unload_id(s, id, path, cb, arg, e);
}

/* (sidecar) DELETE /v1/skills/{id}, and a file that let go of its id. */
int sched_unload_skill(sched_t *s, const char *id, const char *file, sched_reply_cb cb,
                       void *arg, err_t *e) {
  cJSON *rec;
  if (store_get_skill(sched__opts(s)->store, id, &rec, e)) return e->code;
  const cJSON *f = cJSON_GetObjectItem(rec, "file"), *v = cJSON_GetObjectItem(rec, "version");
  int rc = 0;
  if (file && (!cJSON_IsString(f) || strcmp(f->valuestring, file)))
    rc = err_set(e, ERR_NOTFOUND, "skill '%s' is not registered from %s (its file is %s)", id,
                 file, cJSON_IsString(f) ? f->valuestring : "unknown");
  else if (!cJSON_IsString(v) && cJSON_IsNull(cJSON_GetObjectItem(rec, "error")))
    rc = err_set(e, ERR_NOTFOUND, "skill '%s' has no live version: nothing to unregister", id);
  char *path = rc ? NULL : mem_strdup(cJSON_IsString(f) ? f->valuestring : "");
  cJSON_Delete(rec);
  if (rc) return rc;
  rc = unload_id(s, mem_strdup(id), path, cb, arg, e);
  free(path);
  return rc;
}
