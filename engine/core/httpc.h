/*
** httpc.h: the outgoing HTTP client. libcurl's multi interface driven by the
** engine's libuv loop: requests never block the loop and hundreds can be in
** flight at once. Only http:// and https:// URLs are allowed, also across
** redirects (at most 5 are followed).
**
**   httpc_t *h;
**   httpc_new(loop, &h, &e);
**   struct httpc_req r = {.url = "http://127.0.0.1:8080/x"};
**   httpc_start(h, &r, on_done, ud, &x, &e);   -- on_done fires later, once
**   ...
**   httpc_close(h, on_closed, arg);            -- before uv_loop_close
**
** All functions must be called on the loop's thread.
*/
#ifndef ML_HTTPC_H
#define ML_HTTPC_H
#include <stddef.h>
#include <uv.h>

#include "base/err.h"

typedef struct httpc httpc_t;          /* one per loop: a CURLM plus its uv handles */
typedef struct httpc_xfer httpc_xfer;  /* one request in flight */

#define HTTPC_DEFAULT_TIMEOUT_MS 30000L
#define HTTPC_DEFAULT_MAX_RESPONSE ((size_t)16 << 20)
#define HTTPC_MAX_HEADER_BYTES ((size_t)1 << 20) /* all response header lines together */
#define HTTPC_MAX_REDIRECTS 5
#define HTTPC_MAX_CONNECTIONS 256 /* open at once per httpc_t; more requests queue in curl */
#define HTTPC_USER_AGENT "moonloop/0.1"
/* The header every request sent for a skill carries (.for_skill): the
** engine's API refuses any request that has it, so a skill cannot reach
** the API of this or another engine through a name, a redirect or a proxy
** the address check below does not see. A skill cannot set it itself. */
#define HTTPC_SKILL_HEADER "Moonloop-From-Skill"

struct httpc_req {
  const char *method;                  /* "GET" default; an HTTP token ("PUT", "PATCH", ...) */
  const char *url;                     /* http:// or https:// only */
  const char *const *headers;          /* "Name: value" strings, NULL-terminated, may be NULL */
  const char *body; size_t body_len;   /* may be NULL/0; copied by httpc_start */
  long timeout_ms;                     /* whole transfer; 0 = default 30000 */
  size_t max_response;                 /* bytes of body; 0 = default 16 MB; over it the transfer fails */
  int for_skill;                       /* sent for a skill: carries HTTPC_SKILL_HEADER, and may not
                                          connect to the address given to httpc_set_self */
  int gated;                           /* held at the client's gate (httpc_set_gate) */
};

struct httpc_resp {
  int error;              /* 0, or a negative ERR_* code when the transfer failed (no status) */
  const char *reason;     /* NULL when error == 0, else a stable word for the cause: "timeout",
                             "connect", "dns", "tls", "too_big", "scheme" (a redirect to a
                             URL that is not http/https), "redirects", "invalid", "network",
                             "nomem", "internal", "self" (a skill's request to the engine's
                             own API, see httpc_set_self) */
  char errmsg[512];       /* "" when error == 0, else the cause with method and URL:
                             "timeout after 5000 ms (GET http://...)" */
  long status;            /* HTTP status when error == 0 (non-2xx is not an error) */
  const char *body; size_t body_len;       /* NUL-terminated; valid only during the callback */
  size_t nheaders;                         /* headers of the last response (after redirects) */
  const char *const *header_names, *const *header_values; /* lowercased names; valid during the callback */
  double total_ms;        /* time from httpc_start to completion */
};

typedef void (*httpc_cb)(const struct httpc_resp *resp, void *ud);

/* libcurl's global initialisation, once per process (any thread); its
** allocation goes through base/mem.h. httpc_new calls it; 0 or ERR_INTERNAL. */
int httpc_global_init(err_t *e);

/* Create a client on loop. Returns 0 and sets *out, or a negative code. */
int httpc_new(uv_loop_t *loop, httpc_t **out, err_t *e);

/* Start a request; cb fires exactly once (from the loop, never from inside
** httpc_start), unless httpc_cancel or httpc_close is called first. req and
** everything it points to may be freed once httpc_start returns. Bad input
** (a URL that is not http/https, a malformed method or header) fails here
** with ERR_INVALID and cb never fires. out may be NULL; the handle stays valid
** until cb returns or the request is cancelled. */
int httpc_start(httpc_t *h, const struct httpc_req *req, httpc_cb cb, void *ud,
                httpc_xfer **out, err_t *e);

/* Stop a request in flight; its callback never fires. Safe to call from any
** httpc callback, also on a request whose completion is already pending; a
** no-op on the request whose callback is running. NULL is ignored. */
void httpc_cancel(httpc_xfer *x);

/* The engine's own API address (IP and port; NULL: none): from now on a
** request with .for_skill fails (reason "self", ERR_AUTH) before it sends
** anything when any connection it opens, redirects included, goes to that
** address in any spelling: the name is resolved first, and when the API
** listens on a loopback or an unspecified address (0.0.0.0, ::), every
** loopback and unspecified address of that port counts as it (and, for an
** unspecified one, every address of this host's interfaces). */
void httpc_set_self(httpc_t *h, const struct sockaddr *addr);

/* Number of transfers whose callback has not fired yet (cancelled ones excluded). */
size_t httpc_active(const httpc_t *h);

/* The gate: a request started with req.gated is checked right before it
** is sent (after its connection is made, also after a redirect): while
** closed(arg) returns nonzero it does not go out, and waits, held, until
** httpc_gate_open. The engine closes it while it cannot show it still
** holds its lease: a request queued before the process was frozen must
** not go out after it resumes if its runs may be another's by then. A held
** request is sent from the start when the gate opens (its timeout counts
** again from there); cancelling it frees it. */
void httpc_set_gate(httpc_t *h, int (*closed)(void *arg), void *arg);
void httpc_gate_open(httpc_t *h);
/* Requests held at the gate now. */
size_t httpc_held(const httpc_t *h);

/* Cancel everything and close all handles; `done` fires (from the loop) once
** every uv handle is closed, then h is gone (done may be NULL). Safe to call
** from an httpc callback. Must be called before the loop is closed; after it,
** no other httpc_* call may use h or its transfers. */
void httpc_close(httpc_t *h, void (*done)(void *arg), void *arg);

#endif
