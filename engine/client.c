/*
** client.c: the command line over the HTTP API (see client.h). Two layers:
** client_call (one request, its answer and its error as an err_t), then
** the commands, which print what the file mode prints (trace.c's tables and
** trees, the same JSON) and exit with the same statuses.
*/
#include "client.h"
#include "trace.h"
#include "units.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_S 10L
#define TOTAL_TIMEOUT_S 330L  /* the longest wait the API allows, and a margin */
#define INVOKE_WAIT_S 300     /* what invoke --wait asks for per request */
#define POLL_US 200000        /* between reads of a run still going after that */

struct answer_buf {
  char *p;
  size_t len;
};

/* libcurl's write callback: gather the answer's body. */
static size_t on_data(char *ptr, size_t size, size_t n, void *arg) {
  struct answer_buf *b = arg;
  size_t add = size * n;
  char *np = realloc(b->p, b->len + add + 1);
  if (!np) return 0;
  memcpy(np + b->len, ptr, add);
  b->len += add;
  np[b->len] = 0;
  b->p = np;
  return add;
}

/* The ERR_* code for an HTTP error status. */
static int code_of_status(long status) {
  switch (status) {
  case 400: return ERR_INVALID;
  case 401: return ERR_AUTH;
  case 403: return ERR_AUTH;    /* a Host the engine does not answer (allowed_hosts) */
  case 404: return ERR_NOTFOUND;
  case 405: return ERR_INVALID;
  case 415: return ERR_INVALID;
  case 409: return ERR_CONFLICT;
  case 413: return ERR_TOOBIG;
  case 503: return ERR_BUSY;
  default: return ERR_INTERNAL;
  }
}

/* See client.h. */
int client_call(const struct config *cfg, const char *method, const char *path,
                const char *body, long *status, cJSON **answer, err_t *e) {
  *status = 0;
  if (answer) *answer = NULL;
  const char *base = cfg->server ? cfg->server : "";
  if (strncmp(base, "http://", 7) && strncmp(base, "https://", 8))
    return err_set(e, ERR_INVALID, "--server must be a URL such as http://127.0.0.1:8288, "
                   "got '%s'", base);
  size_t bl = strlen(base);
  while (bl && base[bl - 1] == '/') bl--;
  size_t ul = bl + strlen(path) + 1;
  char *url = malloc(ul);
  if (!url) return err_set(e, ERR_NOMEM, "out of memory");
  snprintf(url, ul, "%.*s%s", (int)bl, base, path);

  CURL *h = curl_easy_init();
  if (!h) {
    free(url);
    return err_set(e, ERR_NOMEM, "cannot start an HTTP request (libcurl)");
  }
  struct curl_slist *hdrs = NULL;
  char auth[1024];
  const char *tok = cfg->token_env ? getenv(cfg->token_env) : NULL;
  if (tok && *tok) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
    hdrs = curl_slist_append(hdrs, auth);
  }
  hdrs = curl_slist_append(hdrs, "Accept: application/json");
  hdrs = curl_slist_append(hdrs, "Expect:");
  if (body)
    hdrs = curl_slist_append(hdrs, !strcmp(method, "PUT") ? "Content-Type: text/x-lua; charset=utf-8"
                                                          : "Content-Type: application/json");
  struct answer_buf buf = {0};
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, TOTAL_TIMEOUT_S);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &buf);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "moonloop-cli");
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
  } else if (!strcmp(method, "HEAD")) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  }
  CURLcode cc = curl_easy_perform(h);
  int rc = 0;
  if (cc != CURLE_OK) {
    rc = err_set(e, ERR_IO, "cannot reach the engine at %.*s: %s", (int)bl, base,
                 *errbuf ? errbuf : curl_easy_strerror(cc));
  } else {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    cJSON *v = buf.p ? cJSON_ParseWithLength(buf.p, buf.len) : NULL;
    if (*status < 200 || *status >= 300) {
      cJSON *er = cJSON_GetObjectItemCaseSensitive(v, "error");
      cJSON *msg = cJSON_GetObjectItemCaseSensitive(er, "message");
      rc = code_of_status(*status);
      if (cJSON_IsString(msg)) err_set(e, rc, "%s", msg->valuestring);
      else err_set(e, rc, "the engine at %.*s answered HTTP %ld", (int)bl, base, *status);
      if (*status == 401 && e)
        err_prefix(e, "the engine at %.*s wants a token (set %s)", (int)bl, base,
                   cfg->token_env ? cfg->token_env : "MOONLOOP_TOKEN");
    }
    if (answer) *answer = v;
    else cJSON_Delete(v);
  }
  free(buf.p);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(h);
  free(url);
  return rc;
}

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
  return esc;
}

/* Print a JSON value and a newline, as the file mode does. */
static void print_json(const cJSON *v, int pretty) {
  char *s = pretty ? cJSON_Print(v) : cJSON_PrintUnformatted(v);
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
  if (client_call(&c->cfg, "GET", full, NULL, &status, &ans, &e)) {
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
  if (client_call(&c->cfg, "GET", path, NULL, &status, &run, &e)) {
    cJSON_Delete(run);
    *exit_status = fail_exit(&e);
    return NULL;
  }
  return run;
}

/* moonloop trace --server: GET /v1/runs/{id}. */
int client_trace(struct cli *c) {
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop trace RUN_ID");
  int st = EXIT_OK;
  cJSON *run = get_run(c, c->args[0], &st);
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
  if (client_call(&c->cfg, "GET", "/v1/skills", NULL, &status, &ans, &e)) {
    cJSON_Delete(ans);
    return fail_exit(&e);
  }
  cJSON *skills = cJSON_GetObjectItemCaseSensitive(ans, "skills");
  if (!cJSON_IsArray(skills)) {
    cJSON_Delete(ans);
    return cli_fail(EXIT_FAILED, "the engine's answer has no list of skills");
  }
  if (c->json) print_json(skills, 0);
  else trace_print_skills(stdout, skills, c->color);
  cJSON_Delete(ans);
  return EXIT_OK;
}

/* Whether a run status is final (NULL is not). */
static int terminal(const char *s) {
  return s && (!strcmp(s, "completed") || !strcmp(s, "failed") || !strcmp(s, "cancelled"));
}

/* The string at key k of o, or NULL. */
static const char *str_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Print a finished run's result as the file mode does (cli_report_run):
** output on stdout, or the error on stderr (a null error is none); the
** exit status. */
static int report(const struct cli *c, const char *run_id, const char *status,
                  const cJSON *output, const cJSON *error) {
  char *out = output ? cJSON_PrintUnformatted(output) : NULL;
  char *err = error && !cJSON_IsNull(error) ? cJSON_PrintUnformatted(error) : NULL;
  int rc = cli_report_run(c, run_id, status, out, err);
  free(out);
  free(err);
  return rc;
}

/* moonloop invoke --server [--wait]: POST /v1/skills/{id}/invoke. */
int client_invoke(struct cli *c) {
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop invoke SKILL [--data JSON] [--wait]");
  char *data = cli_data_json(c);
  if (!data) return EXIT_USAGE;
  size_t bl = strlen(data) + 64;
  char *body = malloc(bl);
  char *esc = url_escape(c->args[0]);
  if (!body || !esc) {
    free(body), free(data), curl_free(esc);
    return cli_fail(EXIT_FAILED, "out of memory");
  }
  if (c->wait) snprintf(body, bl, "{\"data\":%s,\"wait\":%d}", data, INVOKE_WAIT_S);
  else snprintf(body, bl, "{\"data\":%s}", data);
  free(data);
  char path[512];
  snprintf(path, sizeof path, "/v1/skills/%s/invoke", esc);
  curl_free(esc);
  long status;
  cJSON *ans;
  err_t e;
  int rc = client_call(&c->cfg, "POST", path, body, &status, &ans, &e);
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
  ** read the run until it ends, as the file mode does. */
  cJSON *rec = ans;
  while (!terminal(str_of(rec, "status"))) {
    usleep(POLL_US);
    int st = EXIT_OK;
    cJSON *run = get_run(c, run_id, &st);
    if (!run) {
      cJSON_Delete(ans);
      if (rec != ans) cJSON_Delete(rec);
      return st;
    }
    if (rec != ans) cJSON_Delete(rec);
    rec = run;
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
  char *body = cJSON_PrintUnformatted(ev);
  cJSON_Delete(ev);
  long status;
  cJSON *ans = NULL;
  err_t e;
  int rc = client_call(&c->cfg, "POST", "/v1/events", body, &status, &ans, &e);
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
  int rc = client_call(&c->cfg, "POST", path, "{}", &status, &ans, &e);
  if (rc) {
    cJSON_Delete(ans);
    return fail_exit(&e);
  }
  const char *run_id = str_of(ans, "run_id"), *st = str_of(ans, "status");
  if (c->json) {
    char *s = cJSON_PrintUnformatted(ans);
    printf("%s\n", s);
    free(s);
  } else if (!strcmp(action, "cancel")) {
    printf("%s %s\n", st && !strcmp(st, "cancelled") ? "cancelled" : "cancelling", c->args[0]);
  } else {
    printf("%s\n", run_id ? run_id : "?");
  }
  cJSON_Delete(ans);
  return EXIT_OK;
}

/* moonloop cancel / rerun --server. */
int client_cancel(struct cli *c) { return run_action(c, "cancel"); }
int client_rerun(struct cli *c) { return run_action(c, "rerun"); }
