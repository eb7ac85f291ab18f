/*
** server.h: the HTTP API of `moonloop serve` (DESIGN.md, "HTTP API"), served
** by H2O on the engine's own libuv loop: no thread, no lock; a request is
** answered from the store's reader connection at once, or handed to a
** scheduler control operation whose callback answers it later.
**
** Lifecycle (all on the loop thread):
**
**   server_start ---> server_ready ---> serving ---> server_stop ---> draining ---> closed
**   (bind, listen:    (the workspace's              (listener closed;   (pending answers
**   connections wait   skills are                   idle connections    arrive, or 503
**   in the backlog)    registered: accept)          woken to close)     after the grace)
**
**   The loop ends once every connection has closed; then server_free
**   (outside the loop: H2O's context dispose runs the loop itself).
**
** Invariants: a request whose client went away before its scheduler
** callback fired is never touched again (the pending answer is marked
** abandoned by a dispose callback in the request's memory pool); every
** response carries Content-Length (but a 304, which has no body); every error is {"error": {"code",
** "message"}}.
**
** Authentication: when the variable named by the configuration's token_env
** (MOONLOOP_TOKEN) is set and not empty, every path, /metrics included,
** needs `Authorization: Bearer TOKEN`, except GET and HEAD of the
** dashboard's static files (/, /app.js, /style.css: web.h), which hold no
** data; the page asks for the token and sends it with its own requests.
** Without a token the server
** binds loopback addresses only (127.0.0.0/8, ::1, localhost) and refuses
** any other with ERR_AUTH.
**
** Web pages (docs/security.md): before anything else, a request whose Host
** is not the listen address's host, a loopback name or one of the
** configuration's allowed_hosts is refused (403), and so is a request that
** is not GET or HEAD whose Origin is another origin or "null", or whose
** Sec-Fetch-Site is cross-site or same-site; after routing, a JSON body
** without application/json or Lua source without text/x-lua (415). A
** request carrying HTTPC_SKILL_HEADER came from a skill and is refused.
**
** MOONLOOP_HTTP_TIMEOUT (a duration, default 10s) bounds how long a client
** may take to send one request's headers and body, and how long an idle
** keep-alive connection stays open: slow clients are dropped.
*/
#ifndef ML_SERVER_H
#define ML_SERVER_H
#include "base/err.h"
#include "core/engine.h"

typedef struct server server_t;

/* Start serving the HTTP API of en (opened in SCHED_SERVE mode and started)
** on listen, "HOST:PORT" ("[::1]:PORT" for IPv6; port 0 picks a free one).
** Fails with ERR_INVALID (a malformed address), ERR_AUTH (a non-loopback
** address without a token) or ERR_IO (cannot bind); then nothing is left
** open but handles already closing on the loop. */
int server_start(struct engine *en, const char *listen, server_t **out, err_t *e);

/* Start accepting connections: serve calls it once the workspace's skills
** are registered. Until then the port is bound and listening, and clients
** that connect wait in the backlog: nobody is answered before the skills
** are there (no 404 for a skill about to be registered). */
void server_ready(server_t *s);

/* The most connections a server accepts at once: the limit on open files
** (engine_process_init raises it to the hard limit) less a reserve for
** the database, the workspace and skills' requests, so that clients
** holding connections cannot take the descriptors the rest needs. More
** wait in the listen backlog until one closes (idle ones are closed after
** the request timeout, 10 s). */
size_t server_max_conns(void);

/* The address actually bound, as a URL: "http://127.0.0.1:8288". */
const char *server_url(const server_t *s);

/* Stop accepting, answer or close every connection, and let the loop end:
** requests waiting on the scheduler get their answer if it comes within
** the grace period (5 s), else 503. Safe to call twice. */
void server_stop(server_t *s);

/* Free everything, after the loop has ended (engine_run returned) and
** before engine_close. Disposes of H2O's context, which runs the loop once. */
void server_free(server_t *s);

#endif
