/*
** server_int.h: what server.c (the listener, connections, authentication,
** shutdown) and server_answer.c (answering requests from the store and the
** scheduler) share: the server's struct and the internal functions between
** the two. Not for other modules: they use server.h.
*/
#ifndef ML_SERVER_INT_H
#define ML_SERVER_INT_H
#include <h2o.h>

#include "server/server.h"
#include "server/server_route.h"

#define SERVER_MAX_STATUS 600 /* answers are counted by status below this */

struct conn;
struct pending;


struct server {
  struct engine *en;
  h2o_globalconf_t config;
  h2o_context_t ctx;
  h2o_accept_ctx_t accept_ctx;
  int config_open, ctx_open;
  uv_tcp_t *listener;       /* malloc'd: freed by its close callback */
  uv_timer_t grace;
  int grace_open, stopping;
  int ready, accept_waiting; /* server_ready called; a connection waits for it */
  struct conn *conns;
  size_t nconns, max_conns; /* open connections, and the most accepted at once */
  int full_said;            /* the line "at its limit of connections" was written */
  uv_timer_t relisten;      /* listening again after the descriptors ran out */
  int relisten_open;
  struct sockaddr_storage addr; /* the address listened on (its port too) */
  struct pending *pending;
  char *token;
  size_t toklen;
  struct server_limits lim;
  char url[96];
  char listen_host[272];    /* the listen address's host ("[::1]" for IPv6), for Host checks */
  const char *const *allowed_hosts; /* the configuration's allowed_hosts (NULL-terminated) */
  double start_time;        /* the process's start, seconds since the epoch */
  uint64_t codes[SERVER_MAX_STATUS];
};

/* Count an answer by status, for /metrics. */
void server__count(server_t *srv, int status);

/* Answer req with status and body (malloc'd; the request's pool frees it
** once sent, or at once when body is NULL: then a 500). */
void server__respond(server_t *srv, h2o_req_t *req, int status, const char *ctype, char *body,
                     size_t len);

/* Answer {"error": {"code", "message"}}. */
void server__respond_error(server_t *srv, h2o_req_t *req, int status, const char *code,
                           const char *message);

/* Answer a GET or HEAD of one of the dashboard's files (web.h) and return
** 1, or return 0 when req is no such request. The files hold no data, so
** this runs before authentication. */
int server__static(server_t *srv, h2o_req_t *req);

/* Answer a routed request: from the store at once, or through a scheduler
** control operation (later, from its callback). */
void server__answer(server_t *srv, h2o_req_t *req, const struct server_plan *pl);

/* Answer every request still waiting on the scheduler with an error (the
** grace period at shutdown is over); their records stay until freed. */
void server__pending_fail_all(server_t *srv, int status, const char *code, const char *message);

/* Answer every attached client (GET /v1/runs/{id}?wait=) at once with a
** 503 it can retry: the server is stopping. */
void server__attach_stop(server_t *srv);

/* Free every pending record (after the loop ended: no callback can fire). */
void server__pending_free_all(server_t *srv);

#endif
