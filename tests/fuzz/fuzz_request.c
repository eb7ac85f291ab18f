/*
** fuzz_request.c: a libFuzzer target for the HTTP API's request path.
** Raw bytes are parsed as an HTTP/1.1 request by picohttpparser (H2O's own
** parser, exported by libh2o), then go through what the server does with a
** request before it touches the engine: the Authorization check
** (server_auth_ok), the Host and Origin checks (server_host_ok,
** server_origin_ok), routing plus validation (server_route) and the body's
** type (server_check_type), with the same limits. Invariants checked on
** every input:
**   - an error has a status in {400, 404, 405, 413} and an error body that
**     is valid JSON and valid UTF-8;
**   - a plan has an operation, and what the scheduler will get is well
**     formed: a non-empty array of {name, data, id?} events with names of
**     1..256 bytes, invoke data that parses, a wait within 0..300 s, list
**     limits within 1..1000.
** Build and run: make fuzz (tests/fuzz/run.sh).
*/
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/jsontext.h"
#include "server/server_route.h"

/* picohttpparser's interface (libh2o exports it; no header is installed). */
struct phr_header {
  const char *name;
  size_t name_len;
  const char *value;
  size_t value_len;
};
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len,
                      const char **path, size_t *path_len, int *minor_version,
                      struct phr_header *headers, size_t *num_headers, size_t last_len);

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "fuzz_request: invariant failed: %s (line %d)\n", #cond, __LINE__); \
      abort();                                                                         \
    }                                                                                  \
  } while (0)

static int header_is(const struct phr_header *h, const char *name) {
  return h->name_len == strlen(name) && !strncasecmp(h->name, name, h->name_len);
}

static void check_error(int status, const err_t *e) {
  CHECK(status == 400 || status == 404 || status == 405 || status == 413);
  CHECK(memchr(e->msg, 0, sizeof e->msg) != NULL);
  char *json = server_error_json(server_error_code(status, e->code), e->msg);
  CHECK(json != NULL);
  CHECK(jsontext_utf8_valid(json, strlen(json)));
  cJSON *back = cJSON_Parse(json);
  CHECK(back != NULL);
  cJSON *msg = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(back, "error"),
                                                "message");
  CHECK(cJSON_IsString(msg) && !strcmp(msg->valuestring, e->msg));
  cJSON_Delete(back);
  free(json);
}

static void check_plan(const struct server_plan *p) {
  CHECK(p->op != SERVER_OP_NONE);
  switch (p->op) {
  case SERVER_OP_EVENTS: {
    CHECK(cJSON_IsArray(p->events));
    int n = cJSON_GetArraySize(p->events);
    CHECK(n >= 1 && n == p->nevents && n <= SERVER_EVENTS_MAX);
    for (cJSON *ev = p->events->child; ev; ev = ev->next) {
      cJSON *name = cJSON_GetObjectItemCaseSensitive(ev, "name");
      CHECK(cJSON_IsString(name));
      size_t len = strlen(name->valuestring);
      CHECK(len >= 1 && len <= SERVER_NAME_MAX);
      CHECK(cJSON_GetObjectItemCaseSensitive(ev, "data") != NULL);
      char *s = cJSON_PrintUnformatted(ev);
      CHECK(s && jsontext_utf8_valid(s, strlen(s)));
      free(s);
    }
    break;
  }
  case SERVER_OP_INVOKE: {
    CHECK(p->data != NULL);
    cJSON *d = cJSON_Parse(p->data);
    CHECK(d != NULL);
    cJSON_Delete(d);
    CHECK(p->wait_ms >= 0 && p->wait_ms <= SERVER_WAIT_MAX_MS);
    CHECK(p->id[0] != 0);
    break;
  }
  case SERVER_OP_LIST_RUNS:
    CHECK(p->limit >= 1 && p->limit <= SERVER_LIST_MAX && p->filter.limit == p->limit + 1);
    break;
  case SERVER_OP_GET_RUN:
  case SERVER_OP_CANCEL:
  case SERVER_OP_RERUN:
  case SERVER_OP_GET_SKILL:
    CHECK(p->id[0] != 0 && strlen(p->id) <= SERVER_ID_MAX);
    break;
  case SERVER_OP_PUT_SKILL: CHECK(p->source && p->source_len > 0); break;
  default: break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *method, *path;
  size_t mlen, plen, nh = 64;
  int minor;
  struct phr_header hdrs[64];
  int n = phr_parse_request((const char *)data, size, &method, &mlen, &path, &plen, &minor, hdrs,
                            &nh, 0);
  if (n <= 0) return 0;
  /* The body: what follows the headers, cut at Content-Length when given. */
  size_t blen = size - (size_t)n;
  const char *auth = NULL, *host = NULL, *origin = NULL, *ctype = NULL;
  size_t alen = 0, hlen = 0, olen = 0, ctlen = 0;
  for (size_t i = 0; i < nh; i++) {
    if (header_is(&hdrs[i], "content-length")) {
      size_t cl = 0;
      for (size_t k = 0; k < hdrs[i].value_len && k < 10; k++)
        if (hdrs[i].value[k] >= '0' && hdrs[i].value[k] <= '9')
          cl = cl * 10 + (size_t)(hdrs[i].value[k] - '0');
      if (cl < blen) blen = cl;
    } else if (header_is(&hdrs[i], "authorization")) {
      auth = hdrs[i].value;
      alen = hdrs[i].value_len;
    } else if (header_is(&hdrs[i], "host")) {
      host = hdrs[i].value, hlen = hdrs[i].value_len;
    } else if (header_is(&hdrs[i], "origin")) {
      origin = hdrs[i].value, olen = hdrs[i].value_len;
    } else if (header_is(&hdrs[i], "content-type")) {
      ctype = hdrs[i].value, ctlen = hdrs[i].value_len;
    }
  }
  /* Copies of exactly the right size, so ASan sees any read past the end. */
  char *m = malloc(mlen ? mlen : 1), *t = malloc(plen ? plen : 1), *b = malloc(blen ? blen : 1);
  if (!m || !t || !b) abort();
  memcpy(m, method, mlen);
  memcpy(t, path, plen);
  memcpy(b, data + n, blen);

  static const char token[] = "fuzz-token-0123456789";
  int ok = server_auth_ok(auth, alen, token, sizeof token - 1);
  if (ok) CHECK(alen >= sizeof token - 1 + 7);

  /* A Host the checks take is one of the names they know; an Origin they
  ** take names that Host. */
  static const char *const allowed[] = {"loop.example.com", NULL};
  char *hc = host ? strndup(host, hlen) : NULL, *oc = origin ? strndup(origin, olen) : NULL;
  if (hc && server_host_ok(hc, hlen, "127.0.0.1", allowed))
    CHECK(!strncasecmp(hc, "localhost", 9) || !strncasecmp(hc, "127.", 4) ||
          !strncasecmp(hc, "loop.example.com", 16) || hc[0] == '[');
  if (hc && oc && server_origin_ok(oc, olen, hc, hlen))
    CHECK(!strncasecmp(oc, "http://", 7) || !strncasecmp(oc, "https://", 8));
  free(hc), free(oc);

  struct server_limits lim = {.event_limit = 4096, .body_max = 1 << 20};
  struct server_plan plan;
  int status = 0;
  err_t e = {0};
  int rc = server_route(m, mlen, t, plen, blen ? b : NULL, blen, &lim, 1764000000000LL, &plan,
                        &status, &e);
  if (rc) {
    CHECK(rc < 0);
    check_error(status, &e);
    CHECK(plan.op == SERVER_OP_NONE && plan.events == NULL && plan.data == NULL);
  } else {
    CHECK(status == 200);
    check_plan(&plan);
    err_t te = {0};
    if (server_check_type(&plan, ctype, ctlen, blen, &status, &te)) {
      CHECK(status == 415);
      CHECK(memchr(te.msg, 0, sizeof te.msg) != NULL);
    }
  }
  server_plan_free(&plan);
  free(m);
  free(t);
  free(b);
  return 0;
}
