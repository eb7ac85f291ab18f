/*
** test_web.c: the dashboard's embedded files (web.h) and the routes that
** go with them (server_route.c): every file of web/ is in the table with its
** content type and ETag, If-None-Match is matched as RFC 9110 says, and
** /v1/versions/{hash} and ?parent= are routed and validated.
*/
#include "server/server_route.h"
#include "server/web.h"
#include "test.h"

#include <stdio.h>

/* The file of web/ named name, read from the source tree (MOONLOOP_SRC). */
static char *read_src(const char *name, size_t *len) {
  const char *src = getenv("MOONLOOP_SRC");
  char path[1024];
  snprintf(path, sizeof path, "%s/web/%s", src ? src : "../..", name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(1 << 20);
  *len = fread(buf, 1, 1 << 20, f);
  fclose(f);
  return buf;
}

TEST(files_are_embedded_with_types) {
  static const struct { const char *path, *file, *ctype; } want[] = {
    {"/", "index.html", "text/html; charset=utf-8"},
    {"/app.js", "app.js", "text/javascript; charset=utf-8"},
    {"/style.css", "style.css", "text/css; charset=utf-8"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const struct web_file *f = web_find(want[i].path, strlen(want[i].path));
    CHECK(f != NULL);
    if (!f) continue;
    CHECK_STR_EQ(f->ctype, want[i].ctype);
    CHECK_INT_EQ(strlen(f->etag), 18); /* quotes and 16 hex digits */
    CHECK(f->etag[0] == '"' && f->etag[17] == '"');
    CHECK_INT_EQ(f->data[f->len], 0);
    size_t len = 0;
    char *src = read_src(want[i].file, &len);
    CHECK(src != NULL);
    if (src) {
      CHECK_INT_EQ(f->len, len);
      CHECK(f->len == len && !memcmp(f->data, src, len));
    }
    free(src);
  }
  CHECK(web_find("/index.html", 11) == NULL);
  CHECK(web_find("/app.js?x", 9) == NULL);
  CHECK(web_find("", 0) == NULL);
}

TEST(if_none_match) {
  const char *e = "\"0123456789abcdef\"";
  CHECK(web_etag_matches(e, strlen(e), e));
  CHECK(web_etag_matches("*", 1, e));
  const char *list = "\"aaaa\", W/\"0123456789abcdef\"";
  CHECK(web_etag_matches(list, strlen(list), e));
  const char *sp = "  \"x\" ,\"0123456789abcdef\"  ";
  CHECK(web_etag_matches(sp, strlen(sp), e));
  CHECK(!web_etag_matches("\"0123456789abcde\"", 17, e));
  CHECK(!web_etag_matches("0123456789abcdef", 16, e));
  CHECK(!web_etag_matches("", 0, e));
  CHECK(!web_etag_matches(",,, ", 4, e));
}

/* Route a GET; returns the status (200 when routed). */
static int route_get(const char *target, struct server_plan *p, err_t *e) {
  int status = 0;
  memset(e, 0, sizeof *e);
  if (server_route("GET", 3, target, strlen(target), NULL, 0, NULL, 1764000000000LL, p, &status, e))
    return status;
  return 200;
}

TEST(versions_route) {
  struct server_plan p;
  err_t e;
  char target[128];
  const char *v = "a9cc528a3427129562dc1074a7cabfb0f7120e68b43a35a00bb02e9bb9421e92";
  snprintf(target, sizeof target, "/v1/versions/%s", v);
  CHECK_INT_EQ(route_get(target, &p, &e), 200);
  CHECK_INT_EQ(p.op, SERVER_OP_GET_VERSION);
  CHECK_STR_EQ(p.id, v);
  server_plan_free(&p);
  CHECK_INT_EQ(route_get("/v1/versions/abc", &p, &e), 404);
  CHECK_CONTAINS(e.msg, "64 lowercase hex digits");
  snprintf(target, sizeof target, "/v1/versions/%.63sG", v);
  CHECK_INT_EQ(route_get(target, &p, &e), 404);
  CHECK_INT_EQ(route_get("/v1/versions", &p, &e), 404);
  int status = 0;
  CHECK(server_route("POST", 4, target, strlen(target), NULL, 0, NULL, 0, &p, &status, &e) != 0);
  CHECK_INT_EQ(status, 405);
  CHECK_STR_EQ(p.allow, "GET, HEAD");
}

TEST(parent_filter) {
  struct server_plan p;
  err_t e;
  CHECK_INT_EQ(route_get("/v1/runs?parent=01M8M82YANDFRGAPTQG5DJ3A0Y&limit=5", &p, &e), 200);
  CHECK_STR_EQ(p.filter.parent_id, "01M8M82YANDFRGAPTQG5DJ3A0Y");
  CHECK_INT_EQ(p.limit, 5);
  CHECK_INT_EQ(route_get("/v1/runs?parent=", &p, &e), 200);
  CHECK(p.filter.parent_id == NULL);
  CHECK_INT_EQ(route_get("/v1/runs?parent=not%20an%20id", &p, &e), 400);
  CHECK_CONTAINS(e.msg, "parent");
  CHECK_INT_EQ(route_get("/v1/runs?parents=x", &p, &e), 400);
  CHECK_CONTAINS(e.msg, "parent)");
}

/* Dispatch and 405s come from one table: each path's methods, with HEAD
** wherever GET is, in the Allow header and the message. */
TEST(routes_and_allowed_methods) {
  static const struct {
    const char *method, *target;
    int status;
    enum server_op op;
    const char *allow;
  } cases[] = {
    {"GET", "/", 200, SERVER_OP_INDEX, "GET, HEAD"},
    {"HEAD", "/metrics", 200, SERVER_OP_METRICS, "GET, HEAD"},
    {"POST", "/metrics", 405, SERVER_OP_NONE, "GET, HEAD"},
    {"GET", "/v1/events", 200, SERVER_OP_LIST_EVENTS, "GET, HEAD, POST"},
    {"DELETE", "/v1/events", 405, SERVER_OP_NONE, "GET, HEAD, POST"},
    {"GET", "/v1/skills/demo", 200, SERVER_OP_GET_SKILL, "GET, HEAD, PUT, DELETE"},
    {"DELETE", "/v1/skills/demo", 200, SERVER_OP_DELETE_SKILL, "GET, HEAD, PUT, DELETE"},
    {"PATCH", "/v1/skills/demo", 405, SERVER_OP_NONE, "GET, HEAD, PUT, DELETE"},
    {"HEAD", "/v1/runs/01M8M82YANDFRGAPTQG5DJ3A0Y/cancel", 405, SERVER_OP_NONE, "POST"},
    {"POST", "/v1/runs/01M8M82YANDFRGAPTQG5DJ3A0Y/rerun", 200, SERVER_OP_RERUN, "POST"},
    {"POST", "/v1/runs/not-a-run/rerun", 404, SERVER_OP_NONE, "POST"},
    {"GET", "/v1/skills/demo/stats/", 200, SERVER_OP_SKILL_STATS, "GET, HEAD"},
    {"GET", "/v1/skills/demo/nothing", 404, SERVER_OP_NONE, ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct server_plan p;
    err_t e = {0};
    int status = 0;
    int rc = server_route(cases[i].method, strlen(cases[i].method), cases[i].target,
                          strlen(cases[i].target), NULL, 0, NULL, 1764000000000LL, &p, &status, &e);
    if (!rc) status = 200;
    if (status != cases[i].status || p.op != cases[i].op ||
        (status == 405 && strcmp(p.allow, cases[i].allow)))
      FAILF("%s %s: %d op %d allow '%s' (%s)", cases[i].method, cases[i].target, status, (int)p.op,
            p.allow, e.msg);
    if (status == 405) CHECK_CONTAINS(e.msg, cases[i].allow);
    server_plan_free(&p);
  }
}

/* The dashboard's trigger filter offers every kind, on_failure included. */
TEST(trigger_filter_takes_on_failure) {
  struct server_plan p;
  err_t e;
  CHECK_INT_EQ(route_get("/v1/runs?trigger=on_failure", &p, &e), 200);
  CHECK_STR_EQ(p.filter.trigger, "on_failure");
  CHECK_INT_EQ(route_get("/v1/runs?trigger=On-Failure", &p, &e), 400);
  CHECK_CONTAINS(e.msg, "on_failure");
}

int main(void) {
  RUN(files_are_embedded_with_types);
  RUN(if_none_match);
  RUN(versions_route);
  RUN(parent_filter);
  RUN(trigger_filter_takes_on_failure);
  RUN(routes_and_allowed_methods);
  return test_summary();
}
