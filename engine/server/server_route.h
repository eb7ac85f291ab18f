/*
** server_route.h: the pure half of the HTTP API. From a request's method,
** target (path and query) and body it makes a plan: which store read or
** scheduler call answers it, with every argument already validated; or an
** error status (400, 404, 405, 413) with a message that says what is wrong.
**
** No socket, no H2O, no engine: server.c calls it for every request, and the
** fuzz target (tests/fuzz/fuzz_request.c) calls it on raw bytes. Invariants:
**   - a plan that server_route returns 0 for passes the scheduler's documented
**     preconditions that can be checked without the database (names, sizes,
**     shapes); what needs the database (unknown skill, finished run) is the
**     store's or the scheduler's to refuse;
**   - every string echoed into a message is printable ASCII (bytes outside it
**     become '?'), so an error body is always valid JSON and valid UTF-8;
**   - JSON bodies must be valid UTF-8 with no NUL byte (RFC 8259).
*/
#ifndef ML_SERVER_ROUTE_H
#define ML_SERVER_ROUTE_H
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "base/err.h"
#include "store/store.h"

#define SERVER_BODY_MAX ((size_t)8 << 20)  /* any request body */
#define SERVER_ID_MAX 128                  /* run and skill ids */
#define SERVER_NAME_MAX 256                /* event names and idempotency keys */
#define SERVER_EVENTS_MAX 10000            /* events in one POST /v1/events */
#define SERVER_WAIT_DEFAULT_MS 30000       /* invoke {"wait": true} */
#define SERVER_WAIT_MAX_MS 300000          /* invoke {"wait": 300}, GET /v1/runs/{id}?wait=300 at most */
#define SERVER_LIST_DEFAULT 100            /* GET /v1/runs without limit */
#define SERVER_LIST_MAX 1000
#define SERVER_FILE_MAX 1024               /* PUT/DELETE /v1/skills/{id}?file= */
#define SERVER_EVENTS_DEFAULT 50           /* GET /v1/events without limit */
#define SERVER_EVENTS_LIST_MAX 500

enum server_op {
  SERVER_OP_NONE,
  SERVER_OP_INDEX,       /* GET / */
  SERVER_OP_METRICS,     /* GET /metrics */
  SERVER_OP_LIST_RUNS,   /* GET /v1/runs */
  SERVER_OP_GET_RUN,     /* GET /v1/runs/{id}[?wait=SECONDS] */
  SERVER_OP_CANCEL,      /* POST /v1/runs/{id}/cancel */
  SERVER_OP_RERUN,       /* POST /v1/runs/{id}/rerun */
  SERVER_OP_EVENTS,      /* POST /v1/events */
  SERVER_OP_INVOKE,      /* POST /v1/skills/{id}/invoke */
  SERVER_OP_LIST_SKILLS, /* GET /v1/skills */
  SERVER_OP_GET_SKILL,   /* GET /v1/skills/{id} */
  SERVER_OP_PUT_SKILL,   /* PUT /v1/skills/{id}[?file=NAME] */
  SERVER_OP_DELETE_SKILL,/* DELETE /v1/skills/{id}[?file=NAME] (the standalone sidecar) */
  SERVER_OP_GET_VERSION, /* GET /v1/versions/{hash}: a version's source */
  SERVER_OP_STATS,       /* GET /v1/stats: every skill's health figures */
  SERVER_OP_SKILL_STATS, /* GET /v1/skills/{id}/stats: one skill's */
  SERVER_OP_LIST_EVENTS, /* GET /v1/events: recent events and the runs they started */
};

/* What a route's body is (server_check_type holds the Content-Type to it):
** none, JSON (application/json, when there is a body or a Content-Type at
** all), or a skill's Lua source (text/x-lua). */
enum server_body { SERVER_BODY_NONE, SERVER_BODY_JSON, SERVER_BODY_LUA };

/* What the route needs from the configuration. */
struct server_limits {
  int64_t event_limit; /* limits.event: bytes of one event's data (and invoke's data) */
  size_t body_max;     /* 0: SERVER_BODY_MAX */
};

/* A validated request. Strings live in the plan (or, for source, in the
** request body the caller still holds); free with server_plan_free. */
struct server_plan {
  enum server_op op;
  int head;                        /* HEAD: answer as GET, without a body */
  char id[SERVER_ID_MAX + 1];      /* the run or skill id (or version hash) of the path */
  /* LIST_RUNS: filter's strings point into the arrays below. limit is what
  ** the client asked for; filter.limit is one more, to know whether there
  ** is a next page. */
  struct run_filter filter;
  int limit;
  char skill[SERVER_ID_MAX + 1], status[16], trigger[16], before[SERVER_ID_MAX + 1];
  char parent[SERVER_ID_MAX + 1];  /* LIST_RUNS ?parent=: the children of a run */
  cJSON *events;                   /* EVENTS: a JSON array of {name, data, id?} (owned) */
  int nevents;
  char *data;                      /* INVOKE: the input as JSON text (owned) */
  int64_t wait_ms;                 /* INVOKE: 0 answers once queued; GET_RUN: ?wait= (attach) */
  int no_steps;                    /* GET_RUN: ?steps=false: the record without its steps */
  char key[SERVER_NAME_MAX + 1];   /* INVOKE: the idempotency key, "" when none */
  const char *source;              /* PUT_SKILL: the Lua source (the body) */
  size_t source_len;
  char file[SERVER_FILE_MAX + 1];  /* PUT_SKILL, DELETE_SKILL: ?file=, "" when absent */
  enum server_body body;           /* the route's body kind */
  char allow[48];                  /* a 405: the methods the path takes (its Allow header) */
  struct stats_query stats;        /* STATS, SKILL_STATS: since (default 7d), until, interval */
  struct event_filter evf;         /* LIST_EVENTS: before points into before[] */
};

/* Route one request. target is the request target as sent (path and
** optional query, percent-encoded). Returns 0 with *p filled, or a negative
** ERR_* code with *status (400, 404, 405, 413) and e's message set; p is
** then empty (server_plan_free is still safe). now_ms resolves since=7d. */
int server_route(const char *method, size_t mlen, const char *target, size_t tlen,
                 const char *body, size_t blen, const struct server_limits *lim, int64_t now_ms,
                 struct server_plan *p, int *status, err_t *e);

/* Release what a plan owns (events, data). */
void server_plan_free(struct server_plan *p);

/* Route and forget: for the fuzz target and tests. Returns 0 or the code. */
int server_route_check(const char *method, const char *path, const char *body, size_t len,
                       int *status, err_t *e);

/* The "code" of an error body for an HTTP status and an ERR_* code:
** err_name(code), except 405 "method_not_allowed", 401 "unauthenticated",
** 403 "forbidden" and 415 "unsupported_media_type". */
const char *server_error_code(int status, int code);

/* The HTTP status for an ERR_* code: ERR_INVALID 400, ERR_NOTFOUND 404,
** ERR_CONFLICT 409, ERR_TOOBIG 413, ERR_AUTH 401, ERR_BUSY 503, else 500. */
int server_status_of(int code);

/* {"error": {"code": code, "message": message}} as JSON text (malloc'd), or NULL. */
char *server_error_json(const char *code, const char *message);

/* ---- who may ask (DNS rebinding, cross-site requests; docs/security.md) ---- */

/* Whether a Host header value (len bytes, "name", "name:port", "[v6]:port")
** names this engine: a loopback name (localhost, 127.0.0.0/8, [::1], with
** or without a port), listen_host (the host of the listen address, brackets
** around an IPv6 address; may be NULL) or one of allowed (NULL-terminated,
** may be NULL). Names compare without case and without a trailing dot; the
** port is not compared (a rebinding page has another name, whatever the
** port). A malformed or empty value is refused. */
int server_host_ok(const char *host, size_t len, const char *listen_host,
                   const char *const *allowed);

/* Whether an Origin header value is the engine's own origin for a request
** whose Host is host: "http://HOST" or "https://HOST", the same host name
** and the same port once the scheme's default port is filled in. "null",
** a path or a malformed value are refused. */
int server_origin_ok(const char *origin, size_t olen, const char *host, size_t hlen);

/* Check the Content-Type of a routed request (p from server_route): JSON
** bodies (every POST) need application/json when they carry a body or a
** Content-Type at all; PUT /v1/skills/{id} needs text/x-lua. Those are
** types a browser can send to another origin only after a preflight, which
** the server refuses. Returns 0, or ERR_INVALID with *status 415 and e's
** message saying what to send. ctype may be NULL (no header). */
int server_check_type(const struct server_plan *p, const char *ctype, size_t ctlen, size_t blen,
                      int *status, err_t *e);

/* Whether an Authorization header value carries "Bearer <token>". The
** token is compared in constant time (CRYPTO_memcmp over the whole token,
** whatever the header's length). */
int server_auth_ok(const char *header, size_t hlen, const char *token, size_t toklen);

#endif
