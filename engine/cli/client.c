/*
** client.c: the command line over the HTTP API (see client.h). Two layers:
** remote_call (core/remote.c: one request, its answer and its error as
** an err_t), then the commands, which print what the file mode prints (trace.c's tables and
** trees, the same JSON) and exit with the same statuses.
*/
#include "base/jsontext.h"
#include "cli/client.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/trace.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_MAX_MS 300000    /* the longest wait one request may ask for */
#define RETRY_US 200000       /* between tries while the engine cannot answer */
#define RETRY_FOR_MS 30000    /* how long an engine may be gone (a restart) */

/* ---- the commands ------------------------------------------------------- */

/* Print why a call failed; the exit status: bad input is a usage error,
** as in the file mode; anything else, an unknown skill or run included, is
** a failed request. */
static int fail_exit(const err_t *e) {
  return cli_fail(e->code == ERR_INVALID ? EXIT_USAGE : EXIT_FAILED, "%s", e->msg);
}

/* Append "&key=escaped value" to q. */
static void add_param(CURL *h, char *q, size_t n, const char *key, const char *val) {
  if (!val) return;
  char *esc = curl_easy_escape(h, val, 0);
  if (!esc) return;
  size_t used = strlen(q);
  snprintf(q + used, n - used, "%s%s=%s", used ? "&" : "?", key, esc);
  curl_free(esc);
}

/* s percent-encoded for a URL (free with curl_free), or NULL when out of
** memory. */
static char *url_escape(const char *s) {
  CURL *h = curl_easy_init();
  char *esc = h ? curl_easy_escape(h, s, 0) : NULL;
  if (h) curl_easy_cleanup(h);
  if (!esc) mem_oom(strlen(s) * 3 + 1); /* libcurl fails these only for want of memory */
  return esc;
}

/* Print a JSON value and a newline, as the file mode does. */
static void print_json(cJSON *v, int pretty) {
  char *s = pretty ? jsontext_print_pretty(v) : jsontext_print_text(v);
  printf("%s\n", s ? s : "null");
  free(s);
}

/* GET /v1/runs with c's filters as parameters: the list of runs (the
** caller frees it), or NULL after printing why, with the exit status in
** *exit_status. */
static cJSON *list_runs(struct cli *c, int *exit_status) {
  char path[2048] = "";
  CURL *h = curl_easy_init();
  if (!h) {
    *exit_status = cli_fail(EXIT_FAILED, "cannot start an HTTP request (libcurl)");
    return NULL;
  }
  add_param(h, path, sizeof path, "skill", c->skill);
  add_param(h, path, sizeof path, "status", c->status);
  add_param(h, path, sizeof path, "since", c->since);
  add_param(h, path, sizeof path, "trigger", c->trigger);
  add_param(h, path, sizeof path, "limit", c->limit);
  curl_easy_cleanup(h);
  char full[2100];
  snprintf(full, sizeof full, "/v1/runs%s", path);
  long status;
  cJSON *ans;
  err_t e;
  if (remote_call(&c->cfg, "GET", full, NULL, &status, &ans, &e)) {
    cJSON_Delete(ans);
    *exit_status = fail_exit(&e);
    return NULL;
  }
  cJSON *runs = cJSON_DetachItemFromObjectCaseSensitive(ans, "runs");
  cJSON_Delete(ans);
  if (!cJSON_IsArray(runs)) {
    cJSON_Delete(runs);
    *exit_status = cli_fail(EXIT_FAILED, "the engine's answer has no list of runs");
    return NULL;
  }
  return runs;
}

/* The runs list over HTTP (filters from c), or NULL after printing why. */
cJSON *client_list_runs(struct cli *c) {
  int st;
  return list_runs(c, &st);
}

/* moonloop runs --server: the list, as the file mode prints it. */
int client_runs(struct cli *c) {
  int st = EXIT_OK;
  cJSON *runs = list_runs(c, &st);
  if (!runs) return st;
  if (c->json) print_json(runs, 0);
  else trace_print_runs(stdout, runs, c->color, units_now_ms());
  cJSON_Delete(runs);
  return EXIT_OK;
}

/* GET /v1/runs/{id}: the run record, or NULL after printing why. */
static cJSON *get_run(struct cli *c, const char *id, int *exit_status) {
  char *esc = url_escape(id);
  char path[512];
  snprintf(path, sizeof path, "/v1/runs/%s", esc ? esc : "");
  curl_free(esc);
  long status;
  cJSON *run;
  err_t e;
  if (remote_call(&c->cfg, "GET", path, NULL, &status, &run, &e)) {
    cJSON_Delete(run);
    *exit_status = fail_exit(&e);
    return NULL;
  }
  return run;
}

/* Whether a run status is final (NULL is not). */
static int terminal(const char *s) {
  return vocab_run_ended(s);
}

/* The string at key k of o, or NULL. */
static const char *str_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Whether a failed call is worth trying again: the engine could not be
** reached, or answered 503 (it is stopping or starting). */
static int transient(const err_t *e) { return e->code == ERR_IO || e->code == ERR_BUSY; }

/* Attach: GET /v1/runs/{id}?wait= until the run has ended or wait_ms
** (-1: no end) has passed; the record then (caller frees), without its
** steps unless with_steps, or NULL after printing why. An engine that
** restarts meanwhile is waited for (up to RETRY_FOR_MS at a time), and
** attached to again. */
static cJSON *attach(struct cli *c, const char *id, int64_t wait_ms, int with_steps,
                     int *exit_status) {
  char *esc = url_escape(id);
  int64_t deadline = wait_ms >= 0 ? units_now_ms() + wait_ms : 0, failing_since = 0;
  for (;;) {
    int64_t left = deadline ? deadline - units_now_ms() : WAIT_MAX_MS;
    if (left < 0) left = 0;
    if (left > WAIT_MAX_MS) left = WAIT_MAX_MS;
    char path[512];
    snprintf(path, sizeof path, "/v1/runs/%s?wait=%.3f%s", esc ? esc : "", (double)left / 1000,
             with_steps ? "" : "&steps=false");
    long status;
    cJSON *run = NULL;
    err_t e;
    if (remote_call(&c->cfg, "GET", path, NULL, &status, &run, &e)) {
      cJSON_Delete(run);
      int64_t now = units_now_ms();
      if (!failing_since) failing_since = now;
      if (!transient(&e) || now - failing_since > RETRY_FOR_MS || (deadline && now >= deadline)) {
        curl_free(esc);
        *exit_status = fail_exit(&e);
        return NULL;
      }
      usleep(RETRY_US);
      continue;
    }
    failing_since = 0;
    if (terminal(str_of(run, "status")) || (deadline && units_now_ms() >= deadline)) {
      curl_free(esc);
      return run;
    }
    cJSON_Delete(run);
  }
}

/* moonloop trace --server [--wait SECONDS]: GET /v1/runs/{id}, attached
** first when waiting. */
int client_trace(struct cli *c) {
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop trace RUN_ID [--wait SECONDS]");
  int64_t wait_ms = 0;
  if (c->wait_for && cli_wait_arg(c->wait_for, &wait_ms)) return EXIT_USAGE;
  int st = EXIT_OK;
  cJSON *run = wait_ms > 0 ? attach(c, c->args[0], wait_ms, 1, &st) : get_run(c, c->args[0], &st);
  if (!run) return st;
  if (c->json) print_json(run, 0);
  else trace_print_run(stdout, run, c->color, units_now_ms());
  cJSON_Delete(run);
  return EXIT_OK;
}

/* moonloop skills --server: GET /v1/skills. */
int client_skills(struct cli *c) {
  long status;
  cJSON *ans;
  err_t e;
  if (remote_call(&c->cfg, "GET", "/v1/skills", NULL, &status, &ans, &e)) {
    cJSON_Delete(ans);
    return fail_exit(&e);
  }
  cJSON *skills = cJSON_GetObjectItemCaseSensitive(ans, "skills");
  if (!cJSON_IsArray(skills)) {
    cJSON_Delete(ans);
    return cli_fail(EXIT_FAILED, "the engine's answer has no list of skills");
  }
  if (c->json) print_json(skills, 0);
  else trace_print_skills(stdout, skills, c->color, units_now_ms());
  cJSON_Delete(ans);
  return EXIT_OK;
}

/* Print a finished run's result as the file mode does (cli_report_run):
** output on stdout, or the error on stderr (a null error is none); the
** exit status. */
static int report(const struct cli *c, const char *run_id, const char *status,
                  const cJSON *output, const cJSON *error) {
  char *out = output ? jsontext_print_text(output) : NULL;
  char *err = error && !cJSON_IsNull(error) ? jsontext_print_text(error) : NULL;
  int rc = cli_report_run(c, run_id, status, out, err);
  free(out);
  free(err);
  return rc;
}

/* moonloop invoke --server [--key KEY] [--wait]: POST
** /v1/skills/{id}/invoke; --wait attaches to the run until it ends. With a
** key the start itself is retried while the engine cannot answer (a
** repeat of the key cannot start a second run); without one it is not. */
int client_invoke(struct cli *c) {
  if (c->nargs != 1)
    return cli_fail(EXIT_USAGE, "usage: moonloop invoke SKILL [--data JSON] [--key KEY] [--wait]");
  char *data = cli_data_json(c);
  if (!data) return EXIT_USAGE;
  cJSON *req = cJSON_CreateObject();
  cJSON *d = cJSON_Parse(data);
  free(data);
  cJSON_AddItemToObject(req, "data", d ? d : cJSON_CreateNull());
  if (c->key) cJSON_AddStringToObject(req, "key", c->key);
  if (c->wait) cJSON_AddNumberToObject(req, "wait", WAIT_MAX_MS / 1000);
  char *body = jsontext_print_text(req);
  cJSON_Delete(req);
  char *esc = url_escape(c->args[0]);
  char path[512];
  snprintf(path, sizeof path, "/v1/skills/%s/invoke", esc);
  curl_free(esc);
  long status;
  cJSON *ans;
  err_t e;
  int rc;
  for (int64_t since = units_now_ms();; usleep(RETRY_US)) {
    ans = NULL;
    rc = remote_call(&c->cfg, "POST", path, body, &status, &ans, &e);
    if (!rc || !c->key || !transient(&e) || units_now_ms() - since > RETRY_FOR_MS) break;
    cJSON_Delete(ans);
  }
  free(body);
  if (rc) {
    cJSON_Delete(ans);
    return fail_exit(&e);
  }
  const char *run_id = str_of(ans, "run_id");
  if (!run_id) {
    cJSON_Delete(ans);
    return cli_fail(EXIT_FAILED, "the engine's answer has no run_id");
  }
  if (!c->wait) {
    if (c->json) printf("{\"run_id\":\"%s\"}\n", run_id);
    else printf("%s\n", run_id);
    cJSON_Delete(ans);
    return EXIT_OK;
  }
  fprintf(stderr, "run %s\n", run_id);
  fflush(stderr);
  /* The answer came when the run ended, or when the wait ran out: then
  ** attach to the run until it ends (its output and error are all it
  ** needs: not its steps). */
  cJSON *rec = ans;
  if (!terminal(str_of(ans, "status"))) {
    int st = EXIT_OK;
    rec = attach(c, run_id, -1, 0, &st);
    if (!rec) {
      cJSON_Delete(ans);
      return st;
    }
  }
  rc = report(c, run_id, str_of(rec, "status"), cJSON_GetObjectItemCaseSensitive(rec, "output"),
              cJSON_GetObjectItemCaseSensitive(rec, "error"));
  if (rec != ans) cJSON_Delete(rec);
  cJSON_Delete(ans);
  return rc;
}

/* A run id goes into a path as it is: only ULID characters are allowed. */
static int valid_run_id(const char *id) {
  if (!*id || strlen(id) > 40) return 0;
  for (const char *p = id; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z')))
      return 0;
  return 1;
}

/* moonloop send --server: POST /v1/events with one event. */
int client_send(struct cli *c, const char *data) {
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddStringToObject(ev, "name", c->args[0]);
  cJSON *d = cJSON_Parse(data);
  cJSON_AddItemToObject(ev, "data", d ? d : cJSON_CreateNull());
  if (c->id) cJSON_AddStringToObject(ev, "id", c->id);
  char *body = jsontext_print_text(ev);
  cJSON_Delete(ev);
  long status;
  cJSON *ans = NULL;
  err_t e;
  int rc = remote_call(&c->cfg, "POST", "/v1/events", body, &status, &ans, &e);
  free(body);
  if (rc) {
    cJSON_Delete(ans);
    return fail_exit(&e);
  }
  const cJSON *id = cJSON_GetArrayItem(cJSON_GetObjectItem(ans, "ids"), 0);
  if (!cJSON_IsString(id)) {
    cJSON_Delete(ans);
    return cli_fail(EXIT_FAILED, "the engine's answer has no event id");
  }
  if (c->json) printf("{\"id\":\"%s\"}\n", id->valuestring);
  else printf("%s\n", id->valuestring);
  cJSON_Delete(ans);
  return EXIT_OK;
}

/* POST /v1/runs/{id}/{action} and print the answer's fields. */
static int run_action(struct cli *c, const char *action) {
  if (!valid_run_id(c->args[0])) return cli_fail(EXIT_FAILED, "no run with id '%.40s'", c->args[0]);
  char path[128];
  snprintf(path, sizeof path, "/v1/runs/%s/%s", c->args[0], action);
  long status;
  cJSON *ans = NULL;
  err_t e;
  /* rerun --key: the idempotency key, in the body. */
  cJSON *body = cJSON_CreateObject();
  if (c->key) cJSON_AddStringToObject(body, "key", c->key);
  char *bj = jsontext_print_text(body);
  cJSON_Delete(body);
  int rc = remote_call(&c->cfg, "POST", path, bj, &status, &ans, &e);
  free(bj);
  if (rc) {
    cJSON_Delete(ans);
    return fail_exit(&e);
  }
  const char *run_id = str_of(ans, "run_id"), *st = str_of(ans, "status");
  if (c->json) {
    char *s = jsontext_print_text(ans);
    printf("%s\n", s);
    free(s);
  } else if (!strcmp(action, "cancel")) {
    printf("%s %s\n", vocab_run_status(st) == RUN_CANCELLED ? "cancelled" : "cancelling", c->args[0]);
  } else {
    printf("%s\n", run_id ? run_id : "?");
  }
  cJSON_Delete(ans);
  return EXIT_OK;
}

/* moonloop cancel / rerun --server. */
int client_cancel(struct cli *c) { return run_action(c, "cancel"); }
int client_rerun(struct cli *c) { return run_action(c, "rerun"); }
