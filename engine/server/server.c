/*
** server.c: the HTTP API on the engine's loop, with H2O's libuv build (see
** server.h): the listener, connections, authentication, routing (through
** server_route.c), H2O's own errors in the API's shape, and shutdown.
** Answers are server_answer.c's.
**
** H2O's own errors (a body over the 8 MB cap, a malformed chunked body) go
** through the host's fallback path; a filter there rewrites them into the
** API's JSON error shape, so every error a client sees has one format.
**
** Shutdown: H2O's context dispose runs the loop itself (uv_run NOWAIT), so
** it cannot be called from a loop callback. The handles H2O's context opens
** (timers, an async for its message queue) are unref'd at start, so the loop
** can end while they are open, and server_free disposes of the context after
** engine_run returns. Connections are never closed under H2O's feet: their
** sockets are shut down, and H2O closes them through its own path when its
** next read or write fails.
*/
#include "server/server.h"
#include "base/mem.h"
#include "base/units.h"
#include "server/server_int.h"
#include "base/fault.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>


#define GRACE_MS 5000           /* how long requests in flight may take at shutdown */
#define DEFAULT_TIMEOUT_MS 10000 /* to receive one request; to wait for the next */

/* One accepted connection; H2O owns it once h2o_accept is called, and
** tells us through on_conn_close when its socket is closed. */
struct conn {
  uv_tcp_t tcp; /* first: the close callback gets its address */
  server_t *srv;
  struct conn *prev, *next;
};

struct api_handler {
  h2o_handler_t super;
  server_t *srv;
};

struct errfix_filter {
  h2o_filter_t super;
  server_t *srv;
};

struct errfix_ostream {
  h2o_ostream_t super;
  h2o_iovec_t body;
};

/* ---- the handler -------------------------------------------------------- */

/* The value of the one header named name (len bytes in *len), NULL when
** absent; *dup is set when it appears more than once. */
static const char *one_header(h2o_req_t *req, const char *name, size_t nl, size_t *len, int *dup) {
  ssize_t i = h2o_find_header_by_str(&req->headers, name, nl, -1);
  *len = 0;
  *dup = 0;
  if (i < 0) return NULL;
  *dup = h2o_find_header_by_str(&req->headers, name, nl, i) >= 0;
  *len = req->headers.entries[i].value.len;
  return req->headers.entries[i].value.base;
}

/* Copy at most 100 bytes of s into out as printable ASCII (others as '?'),
** for messages. */
static void printable_copy(char *out, size_t n, const char *s, size_t len) {
  size_t o = 0;
  for (size_t i = 0; s && i < len && i < 100 && o + 1 < n; i++)
    out[o++] = s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\'' && s[i] != '"' ? s[i] : '?';
  out[o] = 0;
}

/* Whether the request's method changes state: anything but GET and HEAD
** (OPTIONS too: a browser's preflight for a request that would). */
static int changes_state(h2o_req_t *req) {
  return !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET")) &&
         !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
}

/* Refuse, with a 403 the operator can act on, a request a web page could
** have made the browser send (docs/security.md):
**   - a Host that names neither this engine's listen address, a loopback
**     name nor one of allowed_hosts: a page whose own name was rebound to
**     this address (DNS rebinding) sends its name, and would otherwise
**     read and change everything as if it were the dashboard;
**   - on a request that changes state (and on preflights), an Origin that
**     is not the engine's own (scheme://Host), "null", or Sec-Fetch-Site
**     cross-site or same-site: another page, also one served from another
**     port of this machine (same-site), asking the browser to post here.
** A request without Origin or Sec-Fetch-Site is no browser's cross-origin
** request (browsers send Origin on every POST, PUT and DELETE to another
** origin), so the CLI, the sidecar and scripts pass. Returns 1 when it
** answered the request. */
static int refuse_foreign(server_t *srv, h2o_req_t *req) {
  size_t ml;
  int mdup;
  /* H2O keeps header names in lowercase: this is HTTPC_SKILL_HEADER. */
  if (one_header(req, H2O_STRLIT("moonloop-from-skill"), &ml, &mdup)) {
    server__respond_error(srv, req, 403, "forbidden", "this request comes from a skill (its http "
                          "module marks every request with " HTTPC_SKILL_HEADER "): only skills "
                          "the configuration lists in `deployers` may use the engine's API; "
                          "others read runs and skills through the runs and skills modules");
    return 1;
  }
  /* H2O keeps Host out of req->headers: it is the request's authority
  ** (HTTP/2's :authority; the last Host line of an HTTP/1 request). */
  const char *host = req->input.authority.base;
  size_t hl = req->input.authority.len;
  char shown[160], msg[1400];
  if (!server_host_ok(host, hl, srv->listen_host, srv->allowed_hosts)) {
    /* H2O fills in its host configuration's name, "default", when the
    ** request has no Host header (HTTP/1.0): refused too, as every browser
    ** sends one. */
    if (h2o_memis(host, hl, H2O_STRLIT("default"))) {
      server__respond_error(srv, req, 400, "invalid", "the request has no Host header (or Host "
                            "'default'): send the engine's address, as HTTP/1.1 requires");
      return 1;
    }
    printable_copy(shown, sizeof shown, host, hl);
    snprintf(msg, sizeof msg, "Host '%s' is not a name of this engine: only its listen address "
             "(%s), loopback names (localhost, 127.0.0.1, [::1]) and the configuration's "
             "allowed_hosts are answered, so that a web page whose name was rebound to this "
             "address cannot use the API. If this engine is reached by that name, add it: "
             "allowed_hosts = { \"%.*s\" }", shown, srv->listen_host,
             (int)(shown[0] == '[' ? strcspn(shown, "]") + (strchr(shown, ']') != NULL)
                                   : strcspn(shown, ":")), shown);
    server__respond_error(srv, req, 403, "forbidden", msg);
    return 1;
  }
  if (!changes_state(req)) return 0;
  size_t ol, fl;
  int odup, fdup;
  const char *origin = one_header(req, H2O_STRLIT("origin"), &ol, &odup);
  const char *site = one_header(req, H2O_STRLIT("sec-fetch-site"), &fl, &fdup);
  int bad_origin = odup || (origin && !server_origin_ok(origin, ol, host, hl));
  int cross = fdup || (site && (h2o_memis(site, fl, H2O_STRLIT("cross-site")) ||
                                h2o_memis(site, fl, H2O_STRLIT("same-site"))));
  if (!bad_origin && !cross) return 0;
  char why[400];
  if (bad_origin) {
    printable_copy(shown, sizeof shown, origin, ol);
    snprintf(why, sizeof why, odup ? "the request has more than one Origin header"
             : "Origin '%s' is not this engine's origin (http://%.*s)", shown, (int)hl, host);
  } else {
    printable_copy(shown, sizeof shown, site, fl);
    snprintf(why, sizeof why, "the browser says it comes from another site (Sec-Fetch-Site: %s)",
             fdup ? "given twice" : shown);
  }
  snprintf(msg, sizeof msg, "cross-origin request refused: %s. The API changes state only for "
           "its own pages and for clients that are not browsers (the CLI, scripts): a page on "
           "another site or another port cannot start runs, send events or deploy skills here",
           why);
  server__respond_error(srv, req, 403, "forbidden", msg);
  return 1;
}

/* Every request: refuse while stopping, authenticate, route, answer. */
static int on_req(h2o_handler_t *self, h2o_req_t *req) {
  server_t *srv = ((struct api_handler *)self)->srv;
  if (srv->stopping) {
    server__respond_error(srv, req, 503, "unavailable", "the engine is stopping");
    return 0;
  }
  if (refuse_foreign(srv, req)) return 0;
  /* The dashboard's page, script and style sheet hold no data: they are
  ** served without the token, so a browser (which cannot send a bearer
  ** token when it navigates) can load the page that then asks for it. */
  if (server__static(srv, req)) return 0;
  if (srv->toklen) {
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    const char *hv = i >= 0 ? req->headers.entries[i].value.base : NULL;
    size_t hl = i >= 0 ? req->headers.entries[i].value.len : 0;
    if (!server_auth_ok(hv, hl, srv->token, srv->toklen)) {
      h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_WWW_AUTHENTICATE, NULL,
                     H2O_STRLIT("Bearer realm=\"moonloop\""));
      server__respond_error(srv, req, 401, "unauthenticated",
                            hv ? "wrong token in the Authorization header"
                               : "no token: this engine requires 'Authorization: Bearer TOKEN'");
      return 0;
    }
  }
  struct server_plan pl;
  int status;
  err_t e = {0};
  if (server_route(req->method.base, req->method.len, req->path.base, req->path.len,
                   req->entity.base, req->entity.base ? req->entity.len : 0, &srv->lim,
                   units_now_ms(), &pl, &status, &e)) {
    if (status == 405 && pl.allow[0])
      h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL, pl.allow,
                     strlen(pl.allow));
    server__respond_error(srv, req, status, server_error_code(status, e.code), e.msg);
    return 0;
  }
  ssize_t ct = h2o_find_header(&req->headers, H2O_TOKEN_CONTENT_TYPE, -1);
  if (server_check_type(&pl, ct >= 0 ? req->headers.entries[ct].value.base : NULL,
                        ct >= 0 ? req->headers.entries[ct].value.len : 0,
                        req->entity.base ? req->entity.len : 0, &status, &e)) {
    server_plan_free(&pl);
    server__respond_error(srv, req, status, server_error_code(status, e.code), e.msg);
    return 0;
  }
  server__answer(srv, req, &pl);
  server_plan_free(&pl);
  return 0;
}

/* ---- H2O's own errors, in the API's shape ------------------------------- */

/* The ostream that replaces H2O's error text with the JSON body. */
static void errfix_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t n,
                        h2o_send_state_t state) {
  struct errfix_ostream *o = (struct errfix_ostream *)self;
  (void)bufs, (void)n;
  /* H2O's text is dropped; ours goes with the final call. */
  if (state == H2O_SEND_STATE_FINAL) h2o_ostream_send_next(self, req, &o->body, 1, state);
  else h2o_ostream_send_next(self, req, NULL, 0, state);
}

/* The filter on the fallback path: every response H2O makes itself passes
** here (and is counted); an error gets the JSON body and Content-Type. */
static void errfix_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot) {
  server_t *srv = ((struct errfix_filter *)self)->srv;
  int status = req->res.status;
  server__count(srv, status);
  if (status >= 400) {
    char msg[160];
    const char *code = status == 413 ? "too_large" : status >= 500 ? "internal" : "invalid";
    if (status == 413) {
      char lim[32];
      units_fmt_size((int64_t)srv->config.max_request_entity_size, lim, sizeof lim);
      snprintf(msg, sizeof msg, "the request body is over the limit of %s", lim);
    } else {
      snprintf(msg, sizeof msg, "malformed request: %s", req->res.reason ? req->res.reason : "?");
    }
    char *json = server_error_json(code, msg);
    size_t len = json ? strlen(json) : 0;
    h2o_iovec_t body = h2o_strdup(&req->pool, json ? json : "", len);
    free(json);
    req->res.content_length = len;
    h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE,
                   H2O_STRLIT("application/json"), 1);
    struct errfix_ostream *o =
      (struct errfix_ostream *)h2o_add_ostream(req, sizeof *o, slot);
    o->super.do_send = errfix_send;
    o->body = body;
    slot = &o->super.next;
  }
  h2o_setup_next_ostream(req, slot);
}

/* ---- connections ----------------------------------------------------------- */

/* Descriptors kept for everything but connections (the database and its
** WAL, the workspace's watches and files, skills' HTTP requests, logs),
** out of the limit on open files: a quarter of it, at most 512. */
static size_t fd_reserve(size_t limit) { return limit / 4 < 512 ? limit / 4 : 512; }

/* See server.h. */
size_t server_max_conns(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1u << 20)
    return 1u << 16;
  size_t n = (size_t)rl.rlim_cur - fd_reserve((size_t)rl.rlim_cur);
  if (n > 1u << 16) n = 1u << 16;
  return n < 16 ? 16 : n;
}

static void maybe_finish(server_t *srv);

static void on_accept(uv_stream_t *listener, int status);

/* H2O closed a connection's socket: forget it; the last one ends a stop.
** A connection that waited for room is taken now. */
static void on_conn_close(uv_handle_t *h) {
  struct conn *c = (struct conn *)h;
  server_t *srv = c->srv;
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  srv->nconns--;
  free(c);
  if (srv->accept_waiting && srv->ready && srv->listener && !srv->stopping &&
      srv->nconns < srv->max_conns) {
    srv->accept_waiting = 0;
    on_accept((uv_stream_t *)srv->listener, 0);
  }
  maybe_finish(srv);
}

/* Close callback of handles malloc'd on their own. */
static void free_handle(uv_handle_t *h) { free(h); }

/* Listen on srv->addr (again): 0, or libuv's error. */
static int listen_on(server_t *srv, uv_loop_t *loop) {
  uv_tcp_t *l = mem_calloc(1, sizeof *l);
  uv_tcp_init(loop, l);
  l->data = srv;
  int rc = uv_tcp_bind(l, (struct sockaddr *)&srv->addr, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)l, SOMAXCONN, on_accept);
  if (rc) {
    uv_close((uv_handle_t *)l, free_handle);
    return rc;
  }
  srv->listener = l;
  return 0;
}

/* The pause after the descriptors ran out is over: listen again (or wait
** another second). */
static void on_relisten(uv_timer_t *t) {
  server_t *srv = t->data;
  if (srv->stopping || srv->listener) return;
  int rc = listen_on(srv, t->loop);
  if (rc) {
    uv_timer_start(&srv->relisten, on_relisten, 1000, 0);
    return;
  }
  fprintf(stderr, "moonloop: listening again on %s (%zu connections open)\n", srv->url, srv->nconns);
}

/* accept failed for want of file descriptors (EMFILE, ENFILE): libuv would
** try again at once, for ever, holding the loop (timers, the lease's
** renewal, the close of idle connections would wait). Stop listening for
** a second instead: connections are refused meanwhile, and everything
** else goes on. */
static void out_of_descriptors(server_t *srv, uv_stream_t *listener, int status) {
  fprintf(stderr, "moonloop: cannot accept connections: %s (%zu open): refusing new ones "
          "for 1 s (raise the limit on open files, LimitNOFILE= for systemd)\n",
          uv_strerror(status), srv->nconns);
  uv_close((uv_handle_t *)listener, free_handle);
  srv->listener = NULL;
  srv->accept_waiting = 0;
  uv_timer_start(&srv->relisten, on_relisten, 1000, 0);
}

/* A new connection: track it, and hand it to H2O. Before server_ready, or
** while max_conns are open, it is left unaccepted: libuv then stops
** accepting until uv_accept is called (server_ready, or a connection's
** close, does), so connections wait in the backlog. */
static void on_accept(uv_stream_t *listener, int status) {
  server_t *srv = listener->data;
  if (fault_hit(FAULT_ACCEPT_EMFILE)) status = UV_EMFILE;
  if ((status == UV_EMFILE || status == UV_ENFILE) && !srv->stopping) {
    out_of_descriptors(srv, listener, status);
    return;
  }
  if (status != 0 || srv->stopping) return;
  if (!srv->ready || srv->nconns >= srv->max_conns) {
    if (srv->ready && !srv->full_said) {
      fprintf(stderr, "moonloop: %zu connections are open, the most this engine takes at once "
              "(its limit on open files, less a reserve): new ones wait until one closes\n",
              srv->nconns);
      srv->full_said = 1;
    }
    srv->accept_waiting = 1;
    return;
  }
  struct conn *c = mem_calloc(1, sizeof *c);
  uv_tcp_init(listener->loop, &c->tcp);
  if (uv_accept(listener, (uv_stream_t *)&c->tcp)) {
    uv_close((uv_handle_t *)&c->tcp, free_handle);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  c->srv = srv;
  c->next = srv->conns;
  if (c->next) c->next->prev = c;
  srv->conns = c;
  srv->nconns++;
  h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_close);
  h2o_accept(&srv->accept_ctx, sock);
}

/* Shut down the socket of every open connection (how: SHUT_RD or
** SHUT_RDWR). H2O notices at its next read or write and closes the
** connection through its own path; nothing is closed under its feet. */
static void shutdown_conns(server_t *srv, int how) {
  for (struct conn *c = srv->conns; c; c = c->next) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0) shutdown(fd, how);
  }
}

/* While stopping, once no connection is left: close the last handle, so
** the loop can end. */
static void maybe_finish(server_t *srv) {
  if (!srv->stopping || srv->nconns || !srv->grace_open) return;
  uv_close((uv_handle_t *)&srv->grace, NULL);
  srv->grace_open = 0;
  if (srv->relisten_open) uv_close((uv_handle_t *)&srv->relisten, NULL);
  srv->relisten_open = 0;
}

/* The grace period is over: answer what still waits, and close what is left. */
static void on_grace(uv_timer_t *t) {
  server_t *srv = t->data;
  server__pending_fail_all(srv, 503, "unavailable",
                           "the engine stopped before this request finished; it may still "
                           "take effect (retry with the same idempotency key)");
  shutdown_conns(srv, SHUT_RDWR);
  maybe_finish(srv);
}

void server_stop(server_t *srv) {
  if (!srv || srv->stopping) return;
  srv->stopping = 1;
  if (srv->listener) {
    uv_close((uv_handle_t *)srv->listener, free_handle);
    srv->listener = NULL;
  }
  /* Idle connections are woken by end-of-file and closed by H2O; those
  ** with a request in flight finish it first (no keep-alive while stopping). */
  shutdown_conns(srv, SHUT_RD);
  server__attach_stop(srv);
  uv_timer_start(&srv->grace, on_grace, GRACE_MS, 0);
  maybe_finish(srv);
}

/* ---- starting ------------------------------------------------------------- */

/* Whether an address is loopback: 127.0.0.0/8, ::1, or ::ffff:127.x. */
static int is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) return 1;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) return a->sin6_addr.s6_addr[12] == 127;
  }
  return 0;
}

/* Parse "HOST:PORT" / "[V6]:PORT" into an address (resolving a host name);
** name (may be NULL) gets the host as written, brackets kept. */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, char *name, size_t nn,
                        err_t *e) {
  char host[256];
  const char *colon = strrchr(listen, ':');
  const char *h = listen;
  size_t hl = colon ? (size_t)(colon - listen) : 0;
  if (!colon || hl == 0 || hl >= sizeof host || !colon[1])
    return err_set(e, ERR_INVALID, "listen address '%s' must be HOST:PORT, such as "
                   "127.0.0.1:8288", listen);
  if (name) snprintf(name, nn, "%.*s", (int)hl, listen);
  if (h[0] == '[') {
    if (hl < 3 || h[hl - 1] != ']')
      return err_set(e, ERR_INVALID, "listen address '%s': an IPv6 host goes in brackets, "
                     "such as [::1]:8288", listen);
    h++, hl -= 2;
  }
  memcpy(host, h, hl);
  host[hl] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 0 || port > 65535)
    return err_set(e, ERR_INVALID, "listen address '%s': the port must be a number from 0 "
                   "to 65535", listen);
  memset(ss, 0, sizeof *ss);
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0) return 0;
  if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0) return 0;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &ai);
  if (rc || !ai)
    return err_set(e, ERR_INVALID, "listen address '%s': cannot resolve '%s': %s", listen,
                   host, gai_strerror(rc));
  memcpy(ss, ai->ai_addr, ai->ai_addrlen);
  if (ss->ss_family == AF_INET) ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  else ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
  freeaddrinfo(ai);
  return 0;
}

/* "http://IP:PORT" ("http://[IP6]:PORT") for the address bound. */
static void format_url(const struct sockaddr_storage *ss, char *out, size_t n) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    uv_ip4_name(a, ip, sizeof ip);
    snprintf(out, n, "http://%s:%d", ip, ntohs(a->sin_port));
  } else {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    uv_ip6_name(a, ip, sizeof ip);
    snprintf(out, n, "http://[%s]:%d", ip, ntohs(a->sin6_port));
  }
}

/* The process's start time in seconds since the epoch (boot time plus the
** start in clock ticks); the server's start if /proc cannot tell. */
static double process_start(void) {
  double now = (double)units_now_ms() / 1000;
  FILE *f = fopen("/proc/self/stat", "r");
  if (!f) return now;
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  unsigned long long ticks = 0;
  /* Field 22 (starttime); the text after ')' starts at field 3. */
  for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
  if (!p || sscanf(p + 1, "%llu", &ticks) != 1) return now;
  f = fopen("/proc/stat", "r");
  if (!f) return now;
  unsigned long long btime = 0;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "btime %llu", &btime) == 1) break;
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  if (!btime || hz <= 0) return now;
  return (double)btime + (double)ticks / (double)hz;
}

/* H2O's context opens handles (timers, an async) that would keep the loop
** alive forever: unref every handle it added. */
struct handle_set {
  uv_handle_t **h;
  size_t n, cap;
};

/* uv_walk callbacks: note the handles before H2O's context, unref the new ones. */
static void collect_handle(uv_handle_t *h, void *arg) {
  struct handle_set *s = arg;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    s->h = mem_realloc(s->h, cap * sizeof *s->h);
    s->cap = cap;
  }
  s->h[s->n++] = h;
}

static void unref_new(uv_handle_t *h, void *arg) {
  struct handle_set *s = arg;
  for (size_t i = 0; i < s->n; i++)
    if (s->h[i] == h) return;
  uv_unref(h);
}

int server_start(struct engine *en, const char *listen, server_t **out, err_t *e) {
  *out = NULL;
  struct sockaddr_storage ss;
  if (!listen || !*listen) listen = "127.0.0.1:8288";
  char listen_host[272];
  if (parse_listen(listen, &ss, listen_host, sizeof listen_host, e)) return e->code;
  const char *tok_env = en->cfg && en->cfg->token_env ? en->cfg->token_env : "MOONLOOP_TOKEN";
  const char *tok = getenv(tok_env);
  if ((!tok || !*tok) && !is_loopback((struct sockaddr *)&ss))
    return err_set(e, ERR_AUTH, "refusing to listen on %s without an API token: set %s "
                   "(the variable named by token_env) so clients must send "
                   "'Authorization: Bearer TOKEN', or listen on a loopback address such as "
                   "127.0.0.1:8288", listen, tok_env);
  server_t *srv = mem_calloc(1, sizeof *srv);
  srv->en = en;
  snprintf(srv->listen_host, sizeof srv->listen_host, "%s", listen_host);
  srv->allowed_hosts = en->cfg ? (const char *const *)en->cfg->allowed_hosts : NULL;
  if (tok && *tok) {
    srv->token = mem_strdup(tok);
    srv->toklen = strlen(tok);
  }
  srv->lim.event_limit = en->cfg ? en->cfg->event_limit : 1 << 20;
  srv->lim.body_max = SERVER_BODY_MAX;
  srv->start_time = process_start();

  srv->max_conns = server_max_conns();
  memcpy(&srv->addr, &ss, sizeof ss);
  int rc = listen_on(srv, &en->loop);
  int namelen = sizeof ss;
  if (!rc) rc = uv_tcp_getsockname(srv->listener, (struct sockaddr *)&ss, &namelen);
  if (rc) {
    if (srv->listener) uv_close((uv_handle_t *)srv->listener, free_handle);
    free(srv->token);
    free(srv);
    return err_set(e, ERR_IO, "cannot listen on %s: %s", listen, uv_strerror(rc));
  }
  memcpy(&srv->addr, &ss, sizeof ss); /* with the port chosen for port 0 */
  /* Skills' own HTTP requests may not come back here (httpc_set_self). */
  if (en->http) httpc_set_self(en->http, (struct sockaddr *)&ss);
  format_url(&ss, srv->url, sizeof srv->url);

  int64_t timeout = DEFAULT_TIMEOUT_MS;
  const char *tv = getenv("MOONLOOP_HTTP_TIMEOUT");
  err_t sub;
  if (tv && *tv && (units_duration(tv, &timeout, &sub) || timeout <= 0))
    timeout = DEFAULT_TIMEOUT_MS;

  h2o_config_init(&srv->config);
  srv->config_open = 1;
  srv->config.server_name = h2o_iovec_init(H2O_STRLIT("moonloop"));
  srv->config.max_request_entity_size = SERVER_BODY_MAX;
  srv->config.http1.req_timeout = (uint64_t)timeout;
  srv->config.http1.upgrade_to_http2 = 0;
  srv->config.http2.idle_timeout = (uint64_t)timeout;
  h2o_hostconf_t *host =
    h2o_config_register_host(&srv->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
  h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
  struct api_handler *hd = (struct api_handler *)h2o_create_handler(path, sizeof *hd);
  hd->super.on_req = on_req;
  hd->srv = srv;
  struct errfix_filter *ef =
    (struct errfix_filter *)h2o_create_filter(&host->fallback_path, sizeof *ef);
  ef->super.on_setup_ostream = errfix_setup;
  ef->srv = srv;

  struct handle_set before = {0};
  uv_walk(&en->loop, collect_handle, &before);
  h2o_context_init(&srv->ctx, &en->loop, &srv->config);
  uv_walk(&en->loop, unref_new, &before);
  free(before.h);
  srv->ctx_open = 1;
  srv->accept_ctx.ctx = &srv->ctx;
  srv->accept_ctx.hosts = srv->config.hosts;

  uv_timer_init(&en->loop, &srv->grace);
  srv->grace.data = srv;
  srv->grace_open = 1;
  uv_timer_init(&en->loop, &srv->relisten);
  uv_unref((uv_handle_t *)&srv->relisten); /* it never keeps the loop alive */
  srv->relisten.data = srv;
  srv->relisten_open = 1;
  *out = srv;
  return 0;
}

/* See server.h: accept the connection libuv holds, which starts the
** listener again. */
void server_ready(server_t *srv) {
  if (!srv || srv->ready) return;
  srv->ready = 1;
  if (srv->accept_waiting && srv->listener) {
    srv->accept_waiting = 0;
    on_accept((uv_stream_t *)srv->listener, 0);
  }
}

const char *server_url(const server_t *srv) { return srv ? srv->url : ""; }

void server_free(server_t *srv) {
  if (!srv) return;
  /* Normally all closed by now; this is for a loop that ended otherwise. */
  if (srv->listener) uv_close((uv_handle_t *)srv->listener, free_handle);
  if (srv->grace_open) uv_close((uv_handle_t *)&srv->grace, NULL);
  if (srv->relisten_open) uv_close((uv_handle_t *)&srv->relisten, NULL);
  if (srv->ctx_open) h2o_context_dispose(&srv->ctx); /* runs the loop once (NOWAIT) */
  if (srv->config_open) h2o_config_dispose(&srv->config);
  server__pending_free_all(srv);
  free(srv->token);
  free(srv);
}
