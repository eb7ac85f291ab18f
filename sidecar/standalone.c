/*
** standalone.c: the standalone sidecar (see standalone.h). One libuv loop
** holds the watcher, the HTTP client (httpc: libcurl multi on the loop)
** and the signal handlers. The watcher's ops wait in a FIFO; one request
** is in flight at a time, so the engine sees the changes in the watcher's
** order (an unload before the load that takes its id).
**
** Shutdown: the first SIGINT/SIGTERM stops the watcher, closes the signal
** handles and the HTTP client (a request in flight is dropped: the file is
** registered again, unchanged or not, at the next start), and the loop
** ends.
*/
#include "sidecar/standalone.h"
#include "base/mem.h"
#include "core/engine.h"
#include "core/httpc.h"
#include "core/remote.h"
#include "sidecar/watcher.h"

#include <cJSON.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REQUEST_TIMEOUT_MS 30000L

struct queued {
  const struct watcher_op *op;
  void *token;
  struct queued *next;
};

struct standalone {
  const struct config *cfg;
  uv_loop_t loop;
  uv_signal_t sigint, sigterm;
  httpc_t *http;
  watcher_t *w;
  char *base;        /* the server URL without a trailing '/' */
  char *auth;        /* "Authorization: Bearer ..." or NULL */
  struct queued *head, *tail;
  int busy, stopping;
};

/* Percent-encode s for a URL path segment or query value ('/' kept in
** values). Returns a malloc'd string. */
static char *pct(const char *s, int keep_slash) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = strlen(s);
  char *o = mem_alloc(n * 3 + 1), *p = o;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      *p++ = (char)c;
    } else {
      *p++ = '%';
      *p++ = hex[c >> 4];
      *p++ = hex[c & 15];
    }
  }
  *p = 0;
  return o;
}

/* The ERR_* code for an answer's status: 5xx is the engine's trouble, not
** the file's, so the watcher tries again. */
static int code_of(long status) {
  switch (status) {
  case 400: case 405: case 415: return ERR_INVALID;
  case 401: case 403: return ERR_AUTH;
  case 404: return ERR_NOTFOUND;
  case 409: return ERR_CONFLICT;
  case 413: return ERR_TOOBIG;
  default: return status >= 500 ? ERR_BUSY : ERR_INVALID;
  }
}

static void pump(struct standalone *sa);

/* The engine answered (or the request failed): tell the watcher, go on. */
static void on_answer(const struct httpc_resp *resp, void *ud) {
  struct standalone *sa = ud;
  struct queued *q = sa->head;
  sa->head = q->next;
  if (!sa->head) sa->tail = NULL;
  sa->busy = 0;
  char msg[1200];
  cJSON *v = NULL;
  struct watcher_result r = {0, NULL, msg};
  if (resp->error) {
    r.rc = ERR_IO;
    snprintf(msg, sizeof msg, "cannot reach the engine at %s: %s", sa->base, resp->errmsg);
  } else {
    v = resp->body_len ? cJSON_ParseWithLength(resp->body, resp->body_len) : NULL;
    if (resp->status >= 200 && resp->status < 300) {
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "id");
      r.id = cJSON_IsString(id) ? id->valuestring : NULL;
    } else {
      r.rc = code_of(resp->status);
      const cJSON *m = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(v, "error"), "message");
      if (resp->status == 401)
        snprintf(msg, sizeof msg, "the engine at %s wants a token (set %s)", sa->base,
                 sa->cfg->token_env ? sa->cfg->token_env : "MOONLOOP_TOKEN");
      else if (cJSON_IsString(m))
        snprintf(msg, sizeof msg, "%s", m->valuestring);
      else
        snprintf(msg, sizeof msg, "the engine at %s answered HTTP %ld", sa->base, resp->status);
    }
  }
  void *token = q->token;
  free(q);
  watcher_done(token, &r);
  cJSON_Delete(v);
  pump(sa);
}

/* Start the request of the queue's first op, if none is in flight. */
static void pump(struct standalone *sa) {
  while (!sa->busy && sa->head && !sa->stopping) {
    const struct watcher_op *op = sa->head->op;
    const char *id = op->id ? op->id : op->fallback_id;
    char *eid = pct(id ? id : "", 0), *efile = pct(op->path, 1);
    size_t ul = strlen(sa->base) + strlen(eid) + strlen(efile) + 32;
    char *url = mem_alloc(ul);
    err_t e = {0};
    snprintf(url, ul, "%s/v1/skills/%s?file=%s", sa->base, eid, efile);
    const char *hdrs[4] = {"Accept: application/json", NULL, NULL, NULL};
    int nh = 1;
    if (op->kind == WATCHER_LOAD) hdrs[nh++] = "Content-Type: text/x-lua; charset=utf-8";
    if (sa->auth) hdrs[nh++] = sa->auth;
    struct httpc_req req = {
      .method = op->kind == WATCHER_LOAD ? "PUT" : "DELETE", .url = url, .headers = hdrs,
      .body = op->kind == WATCHER_LOAD ? op->source : NULL,
      .body_len = op->kind == WATCHER_LOAD ? op->len : 0, .timeout_ms = REQUEST_TIMEOUT_MS,
    };
    int rc = httpc_start(sa->http, &req, on_answer, sa, NULL, &e);
    free(eid), free(efile), free(url);
    if (rc == 0) {
      sa->busy = 1;
      return;
    }
    /* It cannot be sent at all (a bad URL): the op fails, the queue goes on. */
    struct queued *q = sa->head;
    sa->head = q->next;
    if (!sa->head) sa->tail = NULL;
    struct watcher_result r = {e.code ? e.code : ERR_INVALID, NULL, e.msg};
    void *token = q->token;
    free(q);
    watcher_done(token, &r);
  }
}

/* The watcher's sink: queue the op. */
static int submit(void *ud, const struct watcher_op *op, void *token, err_t *e) {
  struct standalone *sa = ud;
  (void)e; /* queueing cannot fail */
  struct queued *q = mem_calloc(1, sizeof *q);
  q->op = op;
  q->token = token;
  if (sa->tail) sa->tail->next = q;
  else sa->head = q;
  sa->tail = q;
  /* Never answer from inside submit: the first request starts on the
  ** loop's next turn at the latest (pump is called from here, but a
  ** request's answer always comes from the loop). */
  pump(sa);
  return 0;
}

/* The first scan is registered: say what is watched, for where. */
static void on_ready(void *arg, int loaded, int rejected) {
  struct standalone *sa = arg;
  fprintf(stderr, "moonloop: sidecar: watching %s for %s (%d skill%s, %d rejected)\n",
          sa->cfg->workspace, sa->base, loaded, loaded == 1 ? "" : "s", rejected);
  fflush(stderr);
}

/* SIGINT, SIGTERM: stop watching, drop the request in flight, let the loop end. */
static void on_signal(uv_signal_t *h, int signum) {
  struct standalone *sa = h->data;
  if (sa->stopping) return;
  sa->stopping = 1;
  fprintf(stderr, "moonloop: sidecar: %s, stopping\n",
          signum == SIGINT ? "interrupted" : "terminated");
  watcher_stop(sa->w);
  uv_close((uv_handle_t *)&sa->sigint, NULL);
  uv_close((uv_handle_t *)&sa->sigterm, NULL);
  httpc_close(sa->http, NULL, NULL);
  sa->http = NULL;
}

/* "//HOST/ABSOLUTE/ROOT/": the prefix of this workspace's files in the
** registry (malloc'd). */
static char *file_prefix(const char *root) {
  char host[256] = "localhost", cwd[PATH_MAX] = "";
  if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = 0;
  while (root[0] == '.' && root[1] == '/') root += 2;
  if (root[0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = 0;
  size_t n = strlen(host) + strlen(cwd) + strlen(root) + 8;
  char *p = mem_alloc(n);
  if (root[0] == '/') snprintf(p, n, "//%s%s", host, root);
  else if (!strcmp(root, ".")) snprintf(p, n, "//%s%s", host, cwd);
  else snprintf(p, n, "//%s%s/%s", host, cwd, root);
  size_t l = strlen(p);
  while (l > 2 && p[l - 1] == '/') p[--l] = 0;
  p[l] = '/';
  p[l + 1] = 0;
  return p;
}

/* See standalone.h. */
int standalone_run(const struct config *cfg, err_t *e) {
  struct standalone sa;
  memset(&sa, 0, sizeof sa);
  sa.cfg = cfg;
  const char *server = cfg->server;
  if (!server || (strncmp(server, "http://", 7) && strncmp(server, "https://", 8)))
    return err_set(e, ERR_INVALID, "--server must be the engine's URL, such as "
                   "http://127.0.0.1:8288, got '%s'", server ? server : "");
  if (!cfg->workspace || !*cfg->workspace)
    return err_set(e, ERR_INVALID, "--workspace must name the folder to watch");
  sa.base = mem_strdup(server);
  size_t bl = strlen(sa.base);
  while (bl && sa.base[bl - 1] == '/') sa.base[--bl] = 0;
  const char *tok = cfg->token_env ? getenv(cfg->token_env) : NULL;
  if (tok && *tok) sa.auth = mem_printf("Authorization: Bearer %s", tok);
  char *prefix = file_prefix(cfg->workspace);

  /* What the engine holds from this workspace already (files deleted
  ** while no sidecar ran are unregistered by the first batch). */
  long status;
  cJSON *ans = NULL;
  if (remote_call(cfg, "GET", "/v1/skills", NULL, &status, &ans, e)) {
    cJSON_Delete(ans);
    free(sa.base), free(sa.auth), free(prefix);
    return e->code;
  }
  const cJSON *skills = cJSON_GetObjectItemCaseSensitive(ans, "skills");
  size_t nk;
  struct watcher_known *known = watcher_known_of(skills, &nk);

  /* A Lua runtime of our own, to learn each source's id. */
  struct engine rt;
  memset(&rt, 0, sizeof rt);
  int rc = engine_open_runtime(&rt, cfg, e);
  if (!rc) rc = lrt_boot(rt.lrt, e);
  if (!rc && uv_loop_init(&sa.loop)) rc = err_set(e, ERR_INTERNAL, "cannot create the event loop");
  int loop_open = !rc;
  if (!rc) rc = httpc_new(&sa.loop, &sa.http, e);
  if (!rc) {
    struct watcher_opts o = {
      .loop = &sa.loop, .root = cfg->workspace, .prefix = prefix, .skills = rt.skills,
      .sink = {.ud = &sa, .submit = submit},
      .log = stdout, .log_prefix = "", .log_rel = 1,
      .status_log = stderr, .status_prefix = "moonloop: sidecar: ",
      .on_ready = on_ready, .ready_arg = &sa,
      .known = known, .nknown = nk,
    };
    rc = watcher_start(&o, &sa.w, e);
  }
  free(known);
  cJSON_Delete(ans);
  if (!rc) {
    uv_signal_init(&sa.loop, &sa.sigint);
    uv_signal_init(&sa.loop, &sa.sigterm);
    sa.sigint.data = sa.sigterm.data = &sa;
    uv_signal_start(&sa.sigint, on_signal, SIGINT);
    uv_signal_start(&sa.sigterm, on_signal, SIGTERM);
    uv_run(&sa.loop, UV_RUN_DEFAULT);
  } else if (sa.http) {
    httpc_close(sa.http, NULL, NULL);
  }
  if (loop_open) {
    uv_run(&sa.loop, UV_RUN_DEFAULT);
    uv_loop_close(&sa.loop);
  }
  while (sa.head) {
    struct queued *q = sa.head;
    sa.head = q->next;
    free(q);
  }
  watcher_free(sa.w);
  engine_close(&rt);
  free(sa.base), free(sa.auth), free(prefix);
  return rc;
}
