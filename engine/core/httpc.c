/*
** httpc.c: the outgoing HTTP client (see httpc.h). One CURLM per httpc_t,
** driven by curl_multi_socket_action from the libuv loop:
**
**   - Sockets. curl tells us which sockets to watch through
**     CURLMOPT_SOCKETFUNCTION. Each watched socket gets one struct hsock
**     holding a uv_poll_t; curl_multi_assign ties it to the socket so curl
**     hands it back on every later call. CURL_POLL_IN, _OUT and _INOUT map to
**     UV_READABLE, UV_WRITABLE and both. On CURL_POLL_REMOVE the poll is
**     stopped at once (curl calls REMOVE before it closes the socket, so the
**     epoll registration is dropped while the fd still means that socket; see
**     sock_close) and then closed; the hsock is freed in its close callback.
**     A socket number curl reuses later gets a fresh hsock, never a closing
**     one. Idle connections in curl's cache are not watched (curl REMOVEs
**     them when their transfer ends).
**   - Time. CURLMOPT_TIMERFUNCTION drives one uv_timer_t: a timeout >= 0
**     (re)starts it as a one-shot, -1 stops it. curl is only ever entered
**     from the loop's poll and timer callbacks, never from inside its own.
**   - Completions. After every curl_multi_socket_action, dispatch() first
**     drains curl_multi_info_read completely, removing each finished easy
**     handle from the multi and moving the transfer to X_DONE in a local
**     batch; only then does it call the user callbacks, one by one. So user
**     code never runs while curl is on the stack or while curl's message
**     queue is being read, and a callback may start requests, cancel any
**     transfer (one pending in the same batch becomes X_CANCELLED and is
**     freed without its callback), or close the client (the teardown of the
**     multi waits until the outermost dispatch returns: h->depth).
**   - Never blocking. Name lookups run in curl's resolver threads; ending a
**     transfer mid-lookup detaches the thread (CURLOPT_QUICK_EXIT) instead
**     of joining it. At most HTTPC_MAX_CONNECTIONS connections are open at
**     once (file descriptors are finite); further requests wait inside curl,
**     and their timeout counts the wait.
**
** Invariants:
**   - A transfer is RUNNING (its easy handle is in the multi), DONE (removed,
**     waiting in a dispatch batch), DELIVERING (its callback is running),
**     CANCELLED (in a batch, will be freed unseen) or HELD (stopped at the
**     gate before it was sent: out of the multi, added again when the gate
**     opens). Every transfer that is not yet freed is on h->xfers. The
**     callback fires at most once, only in state DELIVERING, and the
**     transfer is freed when it returns.
**   - h->nactive counts RUNNING, DONE and HELD transfers; h->nheld the HELD.
**   - Every uv handle (the timer, each poll) is closed in exactly one place:
**     polls in sock_close (which unlinks the hsock from h->socks first, so
**     it cannot run twice for one poll), the timer in finish_close (guarded
**     by h->finished). h->nhandles counts handles whose close callback has
**     not run; h is freed, and `done` called, when it reaches 0 after
**     finish_close.
**   - Only http and https are allowed: checked on the URL in httpc_start and
**     enforced by curl (CURLOPT_PROTOCOLS_STR, CURLOPT_REDIR_PROTOCOLS_STR)
**     for every redirect, so a skill can never read file:// or the like.
*/
#include "core/httpc.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/fault.h"
#include "base/mem.h"

enum xstate { X_RUNNING, X_DONE, X_DELIVERING, X_CANCELLED, X_HELD };

struct httpc_xfer {
  httpc_t *h;
  CURL *easy;
  struct curl_slist *hdrs;   /* request headers */
  httpc_xfer *prev, *next;   /* h->xfers */
  httpc_xfer *next_done;     /* the dispatch batch */
  enum xstate state;
  CURLcode result;           /* set when it leaves X_RUNNING */
  int watch_err;             /* a uv error watching one of its sockets (fails it) */
  int too_big, hdr_too_big;
  int for_skill, to_self;    /* sent for a skill; refused: it would have connected to the API */
  char self_addr[64];        /* where to_self would have gone, for the message */
  int gated, stopped;        /* checked at the gate; stopped there this time */
  httpc_cb cb;
  void *ud;
  long timeout_ms;
  size_t max_response;
  uint64_t t0;               /* uv_hrtime at start */
  buf_t body;
  buf_t hdr;                 /* response headers as "name\0value\0" pairs */
  size_t nhdr, hdr_bytes;
  char *what;                /* "GET http://host/path" for messages (no user:password) */
  char errbuf[CURL_ERROR_SIZE];
};

struct hsock {
  uv_poll_t poll;
  httpc_t *h;
  curl_socket_t fd;
  struct hsock *prev, *next; /* h->socks: polls not yet closing */
};

struct httpc {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  httpc_xfer *xfers;         /* every transfer not yet freed */
  struct hsock *socks;       /* every poll not yet closing */
  size_t nactive;            /* RUNNING + DONE transfers */
  size_t nhandles;           /* uv handles whose close callback has not run */
  size_t nwatch_err;         /* RUNNING transfers with watch_err set */
  int depth;                 /* dispatch() frames on the stack */
  int closing, finished;
  size_t nheld;              /* HELD transfers */
  int (*gate_closed)(void *arg);
  void *gate_arg;
  void (*done)(void *);
  void *done_arg;
  struct sockaddr_storage self; /* the engine's API (httpc_set_self); family 0: none */
};

/* ---- curl_global_init, once per process ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc;

/* libcurl allocates through base/mem.h (its policy: engine_process_init). */
static void global_init(void) {
  g_init_rc = curl_global_init_mem(CURL_GLOBAL_DEFAULT, mem_alloc, free, mem_realloc, mem_strdup,
                                   mem_calloc);
}

/* See httpc.h. */
int httpc_global_init(err_t *e) {
  pthread_once(&g_once, global_init);
  if (g_init_rc != CURLE_OK)
    return err_set(e, ERR_INTERNAL, "could not initialise libcurl: %s", curl_easy_strerror(g_init_rc));
  return 0;
}

/* ---- small helpers ---- */

static void lower_ascii(char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] >= 'A' && s[i] <= 'Z') s[i] = (char)(s[i] - 'A' + 'a');
}

/* Whether a request may go over a kept-alive connection. libcurl sends a
** request again, unseen, on a new connection when a reused one closes
** before any byte of the answer: a server that read a POST and then died
** (or closed the connection on purpose) would get it twice, whatever the
** step's retries say. As Go's HTTP client does, only RFC 9110's idempotent
** methods, and requests that carry an Idempotency-Key (or
** X-Idempotency-Key) header, reuse connections; the others take a new one,
** on which nothing is sent twice. */
static int replayable(const char *method, const char *const *headers) {
  static const char *const idempotent[] = {"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"};
  for (size_t i = 0; i < sizeof idempotent / sizeof *idempotent; i++)
    if (!strcmp(method, idempotent[i])) return 1;
  for (const char *const *hp = headers; hp && *hp; hp++)
    if (!strncasecmp(*hp, "Idempotency-Key:", 16) || !strncasecmp(*hp, "X-Idempotency-Key:", 18))
      return 1;
  return 0;
}

/* An RFC 9110 token character (methods and header names). */
static int is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
  return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* "METHOD url" for messages: without user:password@, cut at 300 bytes.
** Returns a malloc'd string. */
static char *describe_request(const char *method, const char *url) {
  const char *auth = strstr(url, "://");
  size_t skip_from = 0, skip_to = 0;
  if (auth) {
    auth += 3;
    size_t alen = strcspn(auth, "/?#");
    const char *at = NULL;
    for (size_t i = 0; i < alen; i++)
      if (auth[i] == '@') at = auth + i;
    if (at) {
      skip_from = (size_t)(auth - url);
      skip_to = (size_t)(at + 1 - url);
    }
  }
  buf_t b = BUF_INIT;
  buf_printf(&b, "%s ", method);
  size_t ulen = strlen(url), kept = 0;
  for (size_t i = 0; i < ulen; i++) {
    if (i >= skip_from && i < skip_to) continue;
    if (kept++ == 300) {
      buf_puts(&b, "...");
      break;
    }
    buf_add(&b, url + i, 1);
  }
  return buf_take(&b);
}

/* Check that url parses and is http or https. */
static int check_url(const char *url, const char *what, err_t *e) {
  CURLU *u = curl_url();
  if (!u) mem_oom(sizeof(void *)); /* libcurl allocates through base/mem.h: it cannot be NULL */
  int rc = 0;
  char *scheme = NULL;
  CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
  if (uc)
    rc = err_set(e, ERR_INVALID, "invalid URL: %s (%s)", curl_url_strerror(uc), what);
  else if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK)
    rc = err_set(e, ERR_INVALID, "invalid URL: no scheme (%s)", what);
  else if (strcmp(scheme, "http") && strcmp(scheme, "https"))
    rc = err_set(e, ERR_INVALID, "refused: only http:// and https:// URLs are allowed, not %s:// (%s)",
                 scheme, what);
  curl_free(scheme);
  curl_url_cleanup(u);
  return rc;
}

/* ---- socket watching ---- */

static void dispatch(httpc_t *h);

/* One uv handle finished closing; the last one after finish_close frees h. */
static void handle_gone(httpc_t *h) {
  h->nhandles--;
  if (!h->finished || h->nhandles) return;
  void (*done)(void *) = h->done;
  void *arg = h->done_arg;
  free(h);
  if (done) done(arg);
}

static void on_sock_closed(uv_handle_t *hd) {
  struct hsock *k = hd->data;
  httpc_t *h = k->h;
  free(k);
  handle_gone(h);
}

static void on_timer_closed(uv_handle_t *hd) { handle_gone(hd->data); }

/* Stop watching k's socket now and close the poll. The one place a poll is
** closed; k leaves h->socks so it cannot happen twice. curl calls REMOVE
** before it closes a connection's socket, so the epoll registration goes
** while the fd still means that socket. (The threaded resolver's socketpair
** is the exception: curl closes it first. That is harmless: closing the fd
** dropped the registration and libuv ignores epoll_ctl's error; curl opens
** no other socket in between, so the number cannot have been reused.) */
static void sock_close(httpc_t *h, struct hsock *k) {
  uv_poll_stop(&k->poll);
  if (k->prev) k->prev->next = k->next;
  else h->socks = k->next;
  if (k->next) k->next->prev = k->prev;
  k->prev = k->next = NULL;
  if (h->multi) curl_multi_assign(h->multi, k->fd, NULL);
  uv_close((uv_handle_t *)&k->poll, on_sock_closed);
}

/* Mark the transfer of `easy` as failed by a uv error; dispatch() ends it. */
static void fail_watch(httpc_t *h, CURL *easy, int uverr) {
  httpc_xfer *x = NULL;
  if (!easy || curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x) != CURLE_OK || !x) return;
  if (x->state == X_RUNNING && !x->watch_err) h->nwatch_err++;
  if (!x->watch_err) x->watch_err = uverr;
}

static void on_poll(uv_poll_t *p, int status, int events) {
  struct hsock *k = p->data;
  httpc_t *h = k->h;
  curl_socket_t fd = k->fd; /* k may be closed while curl runs */
  int flags = 0, running = 0;
  if (status < 0) flags = CURL_CSELECT_ERR;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  curl_multi_socket_action(h->multi, fd, flags, &running);
  dispatch(h);
}

/* CURLMOPT_SOCKETFUNCTION: watch s for what curl asks, or stop watching it.
** Never returns -1: in curl 7.88 that marks the whole multi dead. A socket we
** cannot watch fails only its own transfer (fail_watch). */
static int on_curl_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp) {
  httpc_t *h = userp;
  struct hsock *k = socketp;
  if (what == CURL_POLL_REMOVE) {
    if (k) sock_close(h, k);
    return 0;
  }
  if (!k) {
    k = mem_calloc(1, sizeof *k);
    int rc = uv_poll_init_socket(h->loop, &k->poll, s);
    if (rc == UV_EEXIST) {
      /* A poll we still hold for this fd number means curl closed the old
      ** socket without REMOVE. Drop it (the kernel already dropped its epoll
      ** registration with the old socket) and watch the new one. */
      for (struct hsock *o = h->socks; o; o = o->next)
        if (o->fd == s) {
          sock_close(h, o);
          break;
        }
      rc = uv_poll_init_socket(h->loop, &k->poll, s);
    }
    if (rc) {
      free(k);
      fail_watch(h, easy, rc);
      return 0;
    }
    k->h = h;
    k->fd = s;
    k->poll.data = k;
    k->next = h->socks;
    if (h->socks) h->socks->prev = k;
    h->socks = k;
    h->nhandles++;
    curl_multi_assign(h->multi, s, k);
  }
  int ev = 0;
  if (what & CURL_POLL_IN) ev |= UV_READABLE;
  if (what & CURL_POLL_OUT) ev |= UV_WRITABLE;
  int rc = ev ? uv_poll_start(&k->poll, ev, on_poll) : uv_poll_stop(&k->poll);
  if (rc) fail_watch(h, easy, rc);
  return 0;
}

/* ---- the timer ---- */

static void on_timer(uv_timer_t *t) {
  httpc_t *h = t->data;
  int running = 0;
  curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  dispatch(h);
}

/* CURLMOPT_TIMERFUNCTION: -1 stops the timer, >= 0 (re)starts it one-shot. */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp) {
  (void)multi;
  httpc_t *h = userp;
  if (timeout_ms < 0) uv_timer_stop(&h->timer);
  else uv_timer_start(&h->timer, on_timer, (uint64_t)timeout_ms, 0);
  return 0;
}

/* ---- the gate ---- */

#if LIBCURL_VERSION_NUM >= 0x075000
/* CURLOPT_PREREQFUNCTION: the request is about to be sent. Stop it here
** while the gate is closed; dispatch() then holds it instead of ending it. */
static int on_prereq(void *ud, char *ip, char *local_ip, int port, int local_port) {
  (void)ip, (void)local_ip, (void)port, (void)local_port;
  httpc_xfer *x = ud;
  httpc_t *h = x->h;
  if (h->gate_closed && h->gate_closed(h->gate_arg)) {
    x->stopped = 1;
    return CURL_PREREQFUNC_ABORT;
  }
  return CURL_PREREQFUNC_OK;
}
#endif

/* ---- response data ---- */

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
  httpc_xfer *x = ud;
  size_t len = size * n;
  if (len > x->max_response - x->body.len) {
    x->too_big = 1;
    return 0; /* CURLE_WRITE_ERROR */
  }
  buf_add(&x->body, p, len);
  return len;
}

static int is_ows(char c) { return c == ' ' || c == '\t'; }

/* One header line. A status line starts a new response (a redirect, a 100
** Continue, a proxy's CONNECT reply): only the last response's headers stay. */
static size_t on_header(char *p, size_t size, size_t n, void *ud) {
  httpc_xfer *x = ud;
  size_t len = size * n, l = len;
  while (l && (p[l - 1] == '\r' || p[l - 1] == '\n')) l--;
  if (l >= 5 && memcmp(p, "HTTP/", 5) == 0) {
    buf_reset(&x->hdr);
    x->nhdr = 0;
    x->hdr_bytes = len;
    return len;
  }
  x->hdr_bytes += len;
  if (x->hdr_bytes > HTTPC_MAX_HEADER_BYTES) {
    x->hdr_too_big = 1;
    return 0;
  }
  if (l == 0) return len; /* end of this response's headers */
  while (l && is_ows(p[l - 1])) l--;
  if (is_ows(p[0])) { /* obsolete line folding: continue the last value */
    size_t i = 0;
    while (i < l && is_ows(p[i])) i++;
    if (!x->nhdr || i == l) return len;
    x->hdr.len--; /* drop the value's NUL, the buffer stays NUL-terminated */
    buf_add(&x->hdr, " ", 1);
    buf_add(&x->hdr, p + i, l - i);
    buf_add(&x->hdr, "", 1);
    return len;
  }
  const char *colon = memchr(p, ':', l);
  if (!colon || colon == p) return len; /* not a header; ignore */
  size_t nlen = (size_t)(colon - p), v = nlen + 1;
  while (v < l && is_ows(p[v])) v++;
  size_t at = x->hdr.len;
  buf_add(&x->hdr, p, nlen);
  buf_add(&x->hdr, "", 1);
  buf_add(&x->hdr, p + v, l - v);
  buf_add(&x->hdr, "", 1);
  lower_ascii(x->hdr.p + at, nlen);
  x->nhdr++;
  return len;
}

/* ---- errors ---- */

/* Fill r->error, r->reason and r->errmsg for a failed transfer. */
static void describe_error(httpc_xfer *x, struct httpc_resp *r) {
  char cause[400 + CURL_ERROR_SIZE];
  const char *detail = x->errbuf[0] ? x->errbuf : curl_easy_strerror(x->result);
  int code = ERR_IO;
  const char *reason = "network";
  CURLcode rc = x->result;
  if (x->to_self) {
    code = ERR_AUTH, reason = "self";
    snprintf(cause, sizeof cause, "refused: %s is this engine's own API, which a skill can use "
             "only when the configuration lists it in `deployers`", x->self_addr);
  } else if (x->watch_err) {
    code = ERR_INTERNAL, reason = "internal";
    snprintf(cause, sizeof cause, "could not watch the connection's socket: %s",
             uv_strerror(x->watch_err));
  } else if (x->too_big || rc == CURLE_FILESIZE_EXCEEDED) {
    code = ERR_TOOBIG, reason = "too_big";
    snprintf(cause, sizeof cause, "response too large: body over the limit of %zu bytes",
             x->max_response);
  } else if (x->hdr_too_big) {
    code = ERR_TOOBIG, reason = "too_big";
    snprintf(cause, sizeof cause, "response too large: headers over the limit of %zu bytes",
             HTTPC_MAX_HEADER_BYTES);
  } else {
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
      reason = "timeout";
      snprintf(cause, sizeof cause, "timeout after %ld ms", x->timeout_ms);
      break;
    case CURLE_COULDNT_CONNECT: {
      /* The host that failed may be a redirect's: take it from the effective URL. */
      char *eff = NULL, *host = NULL, *port = NULL;
      long oserr = 0;
      curl_easy_getinfo(x->easy, CURLINFO_EFFECTIVE_URL, &eff);
      curl_easy_getinfo(x->easy, CURLINFO_OS_ERRNO, &oserr);
      CURLU *u = curl_url();
      if (u && eff && curl_url_set(u, CURLUPART_URL, eff, 0) == CURLUE_OK) {
        curl_url_get(u, CURLUPART_HOST, &host, 0);
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
      }
      char why[CURL_ERROR_SIZE];
      if (oserr) snprintf(why, sizeof why, "%s", strerror((int)oserr));
      else snprintf(why, sizeof why, "%s", detail);
      if (why[0] >= 'A' && why[0] <= 'Z' && (why[1] < 'A' || why[1] > 'Z')) lower_ascii(why, 1);
      reason = "connect";
      snprintf(cause, sizeof cause, "could not connect to %s:%s (%s)", host ? host : "?",
               port ? port : "?", why);
      curl_free(host);
      curl_free(port);
      curl_url_cleanup(u);
      break;
    }
    case CURLE_COULDNT_RESOLVE_HOST:
      reason = "dns";
      snprintf(cause, sizeof cause, "DNS failure: %s", detail);
      break;
    case CURLE_COULDNT_RESOLVE_PROXY:
      reason = "dns";
      snprintf(cause, sizeof cause, "DNS failure for the proxy: %s", detail);
      break;
    case CURLE_UNSUPPORTED_PROTOCOL:
      code = ERR_INVALID, reason = "scheme";
      snprintf(cause, sizeof cause, "refused: only http:// and https:// are allowed, also in redirects (%s)",
               detail);
      break;
    case CURLE_TOO_MANY_REDIRECTS:
      reason = "redirects";
      snprintf(cause, sizeof cause, "too many redirects (more than %d)", HTTPC_MAX_REDIRECTS);
      break;
    case CURLE_URL_MALFORMAT:
      code = ERR_INVALID, reason = "invalid";
      snprintf(cause, sizeof cause, "invalid URL: %s", detail);
      break;
    case CURLE_SSL_CONNECT_ERROR: case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM: case CURLE_SSL_CIPHER: case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR: case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS: case CURLE_SSL_CLIENTCERT: case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED: case CURLE_SSL_CRL_BADFILE: case CURLE_USE_SSL_FAILED:
      reason = "tls";
      snprintf(cause, sizeof cause, "TLS error: %s", detail);
      break;
    case CURLE_GOT_NOTHING:
      snprintf(cause, sizeof cause, "the server closed the connection without a response");
      break;
    default:
      snprintf(cause, sizeof cause, "%s", detail);
      break;
    }
  }
  r->error = code;
  r->reason = reason;
  snprintf(r->errmsg, sizeof r->errmsg, "%.200s (%s)", cause, x->what);
}

/* ---- transfers ---- */

/* Free x, which is no longer in the multi. */
static void xfer_free(httpc_t *h, httpc_xfer *x) {
  if (x->prev) x->prev->next = x->next;
  else h->xfers = x->next;
  if (x->next) x->next->prev = x->prev;
  curl_easy_cleanup(x->easy);
  curl_slist_free_all(x->hdrs);
  buf_free(&x->body);
  buf_free(&x->hdr);
  free(x->what);
  free(x);
}

/* Build the response of DONE transfer x and call its callback. */
static void deliver(httpc_t *h, httpc_xfer *x) {
  struct httpc_resp r;
  memset(&r, 0, sizeof r);
  const char **arr = NULL;
  r.total_ms = (double)(uv_hrtime() - x->t0) / 1e6;
  r.body = "";
  if (x->result != CURLE_OK || x->watch_err) {
    describe_error(x, &r);
  } else {
    if (x->nhdr) arr = mem_alloc(2 * x->nhdr * sizeof *arr);
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &r.status);
    r.body = buf_str(&x->body);
    r.body_len = x->body.len;
    const char *p = buf_str(&x->hdr);
    for (size_t i = 0; i < x->nhdr; i++) {
      arr[i] = p;
      p += strlen(p) + 1;
      arr[x->nhdr + i] = p;
      p += strlen(p) + 1;
    }
    r.nheaders = x->nhdr;
    r.header_names = arr;
    r.header_values = arr ? arr + x->nhdr : NULL;
  }
  x->state = X_DELIVERING;
  h->nactive--;
  x->cb(&r, x->ud);
  free(arr);
}

/* Take x out of the multi and into the batch. */
static void finish_running(httpc_t *h, httpc_xfer *x, CURLcode rc, httpc_xfer ***tail) {
  if (x->watch_err) h->nwatch_err--;
  curl_multi_remove_handle(h->multi, x->easy);
  x->result = rc;
  x->state = X_DONE;
  x->next_done = NULL;
  **tail = x;
  *tail = &x->next_done;
}

static void finish_close(httpc_t *h);

/* Collect every finished transfer, then call their callbacks (see the top of
** the file). Called after each curl_multi_socket_action. */
static void dispatch(httpc_t *h) {
  httpc_xfer *batch = NULL, **tail = &batch, *x, *next;
  h->depth++;
  if (h->nwatch_err) {
    for (x = h->xfers; x; x = next) {
      next = x->next;
      if (x->state == X_RUNNING && x->watch_err) finish_running(h, x, CURLE_COULDNT_CONNECT, &tail);
    }
  }
  CURLMsg *m;
  int left;
  while (h->multi && (m = curl_multi_info_read(h->multi, &left))) {
    if (m->msg != CURLMSG_DONE) continue;
    CURLcode rc = m->data.result; /* m dies with curl_multi_remove_handle */
    x = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
    if (!x || x->state != X_RUNNING) continue;
    if (x->stopped && rc == CURLE_ABORTED_BY_CALLBACK) {
      /* Stopped at the gate before it was sent: held, not ended. */
      if (x->watch_err) h->nwatch_err--;
      curl_multi_remove_handle(h->multi, x->easy);
      x->state = X_HELD;
      h->nheld++;
      continue;
    }
    if (rc == CURLE_OK && fault_hit(FAULT_HTTP_FAIL)) {
      /* The request went out and was answered; the step sees it fail. */
      rc = CURLE_RECV_ERROR;
      snprintf(x->errbuf, sizeof x->errbuf, "connection reset by peer (fault injected: http_fail)");
    }
    finish_running(h, x, rc, &tail);
  }
  while ((x = batch)) {
    batch = x->next_done;
    if (x->state == X_DONE) deliver(h, x);
    xfer_free(h, x);
  }
  h->depth--;
  if (h->closing && h->depth == 0) finish_close(h);
}

/* ---- a skill's requests never reach the engine's own API ---- */

/* The port of an address (host order), and whether it is loopback or
** unspecified: what "this host" means to a connect() on this machine. */
static int addr_port(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) return ntohs(((const struct sockaddr_in *)sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
  return -1;
}

/* The IPv4 address in sa (also one mapped into IPv6), in host order, or 0
** when there is none; *is4 says which. */
static uint32_t addr_v4(const struct sockaddr *sa, int *is4) {
  *is4 = 0;
  if (sa->sa_family == AF_INET) {
    *is4 = 1;
    return ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
  }
  const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(a)) {
    *is4 = 1;
    uint32_t v;
    memcpy(&v, a->s6_addr + 12, 4);
    return ntohl(v);
  }
  return 0;
}

/* Whether sa is a loopback (127/8, ::1) or unspecified (0.0.0.0, ::)
** address: a connect() to either reaches this host's loopback. */
static int addr_local(const struct sockaddr *sa) {
  int is4;
  uint32_t v = addr_v4(sa, &is4);
  if (is4) return (v >> 24) == 127 || v == 0;
  if (sa->sa_family != AF_INET6) return 0;
  const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(a) || IN6_IS_ADDR_UNSPECIFIED(a);
}

/* Whether a and b are the same IP address (an IPv4 one mapped into IPv6
** is the IPv4 one). */
static int addr_same(const struct sockaddr *a, const struct sockaddr *b) {
  int a4, b4;
  uint32_t va = addr_v4(a, &a4), vb = addr_v4(b, &b4);
  if (a4 || b4) return a4 && b4 && va == vb;
  if (a->sa_family != AF_INET6 || b->sa_family != AF_INET6) return 0;
  return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                 &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
}

/* Whether sa is one of this host's interface addresses. */
static int addr_of_host(const struct sockaddr *sa) {
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all)) return 0;
  int found = 0;
  for (struct ifaddrs *i = all; i && !found; i = i->ifa_next)
    found = i->ifa_addr && addr_same(i->ifa_addr, sa);
  freeifaddrs(all);
  return found;
}

/* Whether a connection to sa would reach the API at self (see httpc_set_self). */
static int reaches_self(const struct sockaddr *self, const struct sockaddr *sa) {
  if (!self->sa_family || addr_port(sa) != addr_port(self)) return 0;
  if (addr_same(sa, self)) return 1;
  /* An API on a specific outside address is reached by that address only. */
  if (!addr_local(self)) return 0;
  /* One on loopback (or everywhere) is reached by any loopback or
  ** unspecified address of its port: connect() to 0.0.0.0 or :: goes to
  ** the loopback, and 127.0.0.2 or ::1 for an API on 127.0.0.1 costs
  ** nothing to refuse. */
  if (addr_local(sa)) return 1;
  /* Listening on 0.0.0.0 or :: is listening on every address of the host. */
  int is4;
  uint32_t v = addr_v4(self, &is4);
  int unspecified = is4 ? v == 0 : IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)self)->sin6_addr);
  return unspecified && addr_of_host(sa);
}

/* CURLOPT_OPENSOCKETFUNCTION of a skill's request: every connection curl
** opens (the first, each redirect's, each address it tries) comes here
** with the address resolved, so no spelling of the name gets round it. */
static curl_socket_t open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a) {
  httpc_xfer *x = ud;
  (void)purpose;
  if (reaches_self((const struct sockaddr *)&x->h->self, &a->addr)) {
    char ip[INET6_ADDRSTRLEN] = "?";
    const struct sockaddr *sa = &a->addr;
    if (sa->sa_family == AF_INET)
      inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof ip);
    else if (sa->sa_family == AF_INET6)
      inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof ip);
    snprintf(x->self_addr, sizeof x->self_addr, sa->sa_family == AF_INET6 ? "[%s]:%d" : "%s:%d",
             ip, addr_port(sa));
    x->to_self = 1;
    return CURL_SOCKET_BAD;
  }
  return socket(a->family, a->socktype, a->protocol);
}

void httpc_set_self(httpc_t *h, const struct sockaddr *addr) {
  memset(&h->self, 0, sizeof h->self);
  if (!addr) return;
  size_t n = addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
             : addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : 0;
  memcpy(&h->self, addr, n);
}

/* Whether header line s ("Name: value", "Name;") is named name. */
static int header_named(const char *s, const char *name) {
  size_t n = strlen(name);
  return !strncasecmp(s, name, n) && (s[n] == ':' || s[n] == ';');
}

int httpc_start(httpc_t *h, const struct httpc_req *req, httpc_cb cb, void *ud,
                httpc_xfer **out, err_t *e) {
  if (out) *out = NULL;
  if (!h || !req || !cb) return err_set(e, ERR_INVALID, "httpc_start: no client, request or callback");
  const char *method = req->method && *req->method ? req->method : "GET";
  const char *url = req->url ? req->url : "";
  size_t mlen = strlen(method);
  for (size_t i = 0; i < mlen; i++)
    if (!is_tchar((unsigned char)method[i]) || mlen > 32)
      return err_set(e, ERR_INVALID, "invalid HTTP method '%.40s' (%.300s)", method, url);
  char *what = describe_request(method, url);
  int rc = 0;
  if (h->closing) rc = err_set(e, ERR_CONFLICT, "the HTTP client is closing (%s)", what);
  else if (!*url) rc = err_set(e, ERR_INVALID, "no URL (%s)", what);
  else if (req->timeout_ms < 0)
    rc = err_set(e, ERR_INVALID, "negative timeout %ld ms (%s)", req->timeout_ms, what);
  else if (req->body_len && !req->body)
    rc = err_set(e, ERR_INVALID, "body_len %zu without a body (%s)", req->body_len, what);
  else rc = check_url(url, what, e);
  for (const char *const *hp = req->headers; !rc && hp && *hp; hp++) {
    const char *s = *hp;
    size_t n = 0;
    while (is_tchar((unsigned char)s[n])) n++;
    if (n == 0 || (s[n] != ':' && !(s[n] == ';' && !s[n + 1])) || strpbrk(s, "\r\n"))
      rc = err_set(e, ERR_INVALID, "invalid request header '%.100s' (want \"Name: value\") (%s)", s, what);
    else if (req->for_skill && header_named(s, HTTPC_SKILL_HEADER))
      rc = err_set(e, ERR_INVALID, "the header %s is the engine's: a skill cannot set it (%s)",
                   HTTPC_SKILL_HEADER, what);
  }
  if (rc) {
    free(what);
    return rc;
  }

  httpc_xfer *x = mem_calloc(1, sizeof *x);
  x->h = h;
  x->what = what;
  x->cb = cb;
  x->ud = ud;
  x->timeout_ms = req->timeout_ms ? req->timeout_ms : HTTPC_DEFAULT_TIMEOUT_MS;
  x->max_response = req->max_response ? req->max_response : HTTPC_DEFAULT_MAX_RESPONSE;
  x->easy = curl_easy_init();
  if (!x->easy) mem_oom(sizeof *x); /* only on a failed allocation (libcurl is initialised) */

  /* Request headers: the caller's, plus an empty Expect (no 100-continue
  ** round trip for large bodies) unless the caller set one. */
  int has_expect = 0;
  for (const char *const *hp = req->headers; hp && *hp; hp++) {
    if (!strncasecmp(*hp, "expect:", 7) || !strncasecmp(*hp, "expect;", 7)) has_expect = 1;
    x->hdrs = curl_slist_append(x->hdrs, *hp);
  }
  if (!has_expect) x->hdrs = curl_slist_append(x->hdrs, "Expect:");
  if (req->for_skill) {
    x->hdrs = curl_slist_append(x->hdrs, HTTPC_SKILL_HEADER ": 1");
    x->for_skill = 1;
  }

  CURLcode cc = CURLE_OK;
#define SET(opt, val) \
  do { \
    if (cc == CURLE_OK) cc = curl_easy_setopt(x->easy, opt, val); \
  } while (0)
  SET(CURLOPT_PRIVATE, (void *)x);
  SET(CURLOPT_URL, url);
  SET(CURLOPT_NOSIGNAL, 1L);
  /* Ending a transfer while its name is still being resolved would otherwise
  ** join the resolver thread, blocking the loop until getaddrinfo returns
  ** (seconds with a slow DNS server); this detaches it instead. */
  SET(CURLOPT_QUICK_EXIT, 1L);
  SET(CURLOPT_PROTOCOLS_STR, "http,https");
  SET(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  SET(CURLOPT_FOLLOWLOCATION, 1L);
  SET(CURLOPT_MAXREDIRS, (long)HTTPC_MAX_REDIRECTS);
  SET(CURLOPT_ACCEPT_ENCODING, "");
  SET(CURLOPT_USERAGENT, HTTPC_USER_AGENT);
  SET(CURLOPT_TIMEOUT_MS, x->timeout_ms);
  SET(CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)(x->max_response > (size_t)INT64_MAX ? INT64_MAX : (int64_t)x->max_response));
  SET(CURLOPT_HTTPHEADER, x->hdrs);
  SET(CURLOPT_WRITEFUNCTION, on_body);
  SET(CURLOPT_WRITEDATA, (void *)x);
  SET(CURLOPT_HEADERFUNCTION, on_header);
  SET(CURLOPT_HEADERDATA, (void *)x);
  SET(CURLOPT_ERRORBUFFER, x->errbuf);
  if (req->for_skill) {
    SET(CURLOPT_OPENSOCKETFUNCTION, open_socket);
    SET(CURLOPT_OPENSOCKETDATA, (void *)x);
  }
#if LIBCURL_VERSION_NUM >= 0x075000
  if (req->gated) {
    x->gated = 1;
    SET(CURLOPT_PREREQFUNCTION, on_prereq);
    SET(CURLOPT_PREREQDATA, (void *)x);
  }
#endif
  /* POST uses plain POSTFIELDS so that a 301/302/303 turns it into a GET as
  ** browsers do; other methods are custom requests, with the body if any. */
  int has_body = req->body != NULL || !strcmp(method, "POST");
  if (!strcmp(method, "GET") && !has_body) SET(CURLOPT_HTTPGET, 1L);
  else if (!strcmp(method, "HEAD") && !has_body) SET(CURLOPT_NOBODY, 1L);
  else if (strcmp(method, "POST")) SET(CURLOPT_CUSTOMREQUEST, method);
  if (has_body) {
    SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    SET(CURLOPT_COPYPOSTFIELDS, req->body ? req->body : "");
  }
  if (!replayable(method, req->headers)) SET(CURLOPT_FRESH_CONNECT, 1L);
#undef SET
  if (cc != CURLE_OK) {
    rc = err_set(e, ERR_INTERNAL, "could not set up the request: %s (%s)", curl_easy_strerror(cc), what);
    goto fail;
  }

  x->t0 = uv_hrtime();
  x->state = X_RUNNING;
  x->next = h->xfers;
  if (h->xfers) h->xfers->prev = x;
  h->xfers = x;
  CURLMcode mc = curl_multi_add_handle(h->multi, x->easy);
  if (mc != CURLM_OK) {
    rc = err_set(e, ERR_INTERNAL, "could not start the request: %s (%s)",
                 curl_multi_strerror(mc), what);
    xfer_free(h, x);
    return rc;
  }
  h->nactive++;
  if (out) *out = x;
  return 0;

fail:
  if (x->easy) curl_easy_cleanup(x->easy);
  curl_slist_free_all(x->hdrs);
  free(x->what);
  free(x);
  return rc;
}

void httpc_cancel(httpc_xfer *x) {
  if (!x) return;
  httpc_t *h = x->h;
  switch (x->state) {
  case X_RUNNING:
    if (x->watch_err) h->nwatch_err--;
    h->nactive--;
    curl_multi_remove_handle(h->multi, x->easy);
    xfer_free(h, x);
    break;
  case X_DONE: /* pending in a dispatch batch, which frees it */
    x->state = X_CANCELLED;
    h->nactive--;
    break;
  case X_HELD:
    h->nheld--;
    h->nactive--;
    xfer_free(h, x);
    break;
  case X_DELIVERING:
  case X_CANCELLED:
    break;
  }
}

size_t httpc_active(const httpc_t *h) { return h ? h->nactive : 0; }

void httpc_set_gate(httpc_t *h, int (*closed)(void *arg), void *arg) {
  h->gate_closed = closed;
  h->gate_arg = arg;
}

size_t httpc_held(const httpc_t *h) { return h ? h->nheld : 0; }

/* Send the held requests again from the start; one that cannot be added
** back fails through its callback like any transfer. */
void httpc_gate_open(httpc_t *h) {
  if (!h || !h->nheld || h->closing) return;
  httpc_xfer *batch = NULL, **tail = &batch, *x, *next;
  h->depth++;
  for (x = h->xfers; x; x = next) {
    next = x->next;
    if (x->state != X_HELD) continue;
    h->nheld--;
    x->stopped = 0;
    buf_reset(&x->body);
    buf_reset(&x->hdr);
    x->nhdr = x->hdr_bytes = 0;
    x->errbuf[0] = 0;
    x->state = X_RUNNING;
    if (curl_multi_add_handle(h->multi, x->easy) != CURLM_OK) {
      x->result = CURLE_OUT_OF_MEMORY;
      x->state = X_DONE;
      x->next_done = NULL;
      *tail = x;
      tail = &x->next_done;
    }
  }
  while ((x = batch)) {
    batch = x->next_done;
    if (x->state == X_DONE) deliver(h, x);
    xfer_free(h, x);
  }
  h->depth--;
  if (h->closing && h->depth == 0) finish_close(h);
}

/* ---- life cycle ---- */

int httpc_new(uv_loop_t *loop, httpc_t **out, err_t *e) {
  *out = NULL;
  int rc = httpc_global_init(e);
  if (rc) return rc;
  httpc_t *h = mem_calloc(1, sizeof *h);
  h->loop = loop;
  h->multi = curl_multi_init();
  if (!h->multi) mem_oom(sizeof *h); /* only on a failed allocation (libcurl is initialised) */
  CURLMcode mc = CURLM_OK;
#define MSET(opt, val) \
  do { \
    if (mc == CURLM_OK) mc = curl_multi_setopt(h->multi, opt, val); \
  } while (0)
  MSET(CURLMOPT_SOCKETFUNCTION, on_curl_socket);
  MSET(CURLMOPT_SOCKETDATA, (void *)h);
  MSET(CURLMOPT_TIMERFUNCTION, on_curl_timer);
  MSET(CURLMOPT_TIMERDATA, (void *)h);
  MSET(CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)HTTPC_MAX_CONNECTIONS);
#undef MSET
  rc = mc == CURLM_OK ? uv_timer_init(loop, &h->timer) : 0;
  if (mc != CURLM_OK || rc) {
    curl_multi_cleanup(h->multi);
    free(h);
    return err_set(e, ERR_INTERNAL, "could not set up the HTTP client: %s",
                   mc != CURLM_OK ? curl_multi_strerror(mc) : uv_strerror(rc));
  }
  h->timer.data = h;
  h->nhandles = 1;
  *out = h;
  return 0;
}

/* Tear down the multi and close the handles; runs once, outside dispatch. */
static void finish_close(httpc_t *h) {
  if (h->finished) return;
  h->finished = 1;
  while (h->socks) sock_close(h, h->socks); /* normally none: curl sent REMOVE for each */
  curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, NULL);
  curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, NULL);
  curl_multi_cleanup(h->multi);
  h->multi = NULL;
  uv_close((uv_handle_t *)&h->timer, on_timer_closed);
}

void httpc_close(httpc_t *h, void (*done)(void *arg), void *arg) {
  if (!h || h->closing) return;
  h->closing = 1;
  h->done = done;
  h->done_arg = arg;
  httpc_xfer *x, *next;
  for (x = h->xfers; x; x = next) {
    next = x->next;
    httpc_cancel(x);
  }
  if (h->depth == 0) finish_close(h);
}
