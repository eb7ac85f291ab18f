/*
** Unit tests for httpc.c over the real network stack on loopback: a Python
** stdlib server (tests/lib/httpc_peer.py) runs as a child process on an
** OS-chosen port. Each test runs its own uv loop and ends with httpc_close and
** uv_loop_close == 0, so a handle left open fails the test (and ASan/LSan see
** any leak).
*/
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "core/httpc.h"
#include "test.h"

static int g_port;
static pid_t g_peer = -1;

/* ---- the peer server ---- */

static int peer_start(void) {
  const char *src = getenv("MOONLOOP_SRC");
  char script[4096];
  if (src) snprintf(script, sizeof script, "%s/tests/lib/httpc_peer.py", src);
  else {
    snprintf(script, sizeof script, "%s", __FILE__); /* .../tests/unit/test_httpc.c */
    char *slash = strrchr(script, '/');
    if (slash) snprintf(slash, sizeof script - (size_t)(slash - script), "/../lib/httpc_peer.py");
  }
  int in[2], out[2];
  if (pipe(in) || pipe(out)) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    execlp("python3", "python3", script, (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  /* in[1] stays open (and is inherited by nothing else): when we exit, the peer sees EOF. */
  struct pollfd pf = {.fd = out[0], .events = POLLIN};
  char line[32];
  size_t n = 0;
  while (n < sizeof line - 1 && poll(&pf, 1, 15000) == 1) {
    ssize_t r = read(out[0], line + n, 1);
    if (r != 1) break;
    if (line[n++] == '\n') break;
  }
  line[n] = 0;
  close(out[0]);
  g_peer = pid;
  g_port = atoi(line);
  return g_port > 0 ? 0 : -1;
}

static void peer_stop(void) {
  if (g_peer > 0) {
    kill(g_peer, SIGTERM);
    waitpid(g_peer, NULL, 0);
  }
}

static const char *url(const char *path) {
  static char u[8][256];
  static int i;
  char *s = u[i++ % 8];
  snprintf(s, 256, "http://127.0.0.1:%d%s", g_port, path);
  return s;
}

/* ---- capturing responses ---- */

struct got {
  int fired;
  int error;
  char reason[32];
  char errmsg[512];
  long status;
  char *body;
  size_t body_len;
  char hdrs[8192]; /* "\nname=value" for each header, then "\n" */
  double total_ms;
};

static void got_free(struct got *g) {
  free(g->body);
  g->body = NULL;
}

static void capture(struct got *g, const struct httpc_resp *r) {
  g->fired++;
  g->error = r->error;
  snprintf(g->reason, sizeof g->reason, "%s", r->reason ? r->reason : "");
  snprintf(g->errmsg, sizeof g->errmsg, "%s", r->errmsg);
  g->status = r->status;
  free(g->body);
  g->body = malloc(r->body_len + 1);
  memcpy(g->body, r->body, r->body_len + 1); /* + its NUL */
  g->body_len = r->body_len;
  size_t n = 0;
  g->hdrs[0] = 0;
  for (size_t i = 0; i < r->nheaders; i++)
    n += (size_t)snprintf(g->hdrs + n, sizeof g->hdrs - n, "\n%s=%s", r->header_names[i],
                          r->header_values[i]);
  snprintf(g->hdrs + n, sizeof g->hdrs - n, "\n");
  g->total_ms = r->total_ms;
}

static void on_got(const struct httpc_resp *r, void *ud) { capture(ud, r); }

/* A fresh loop and client. */
static httpc_t *setup(uv_loop_t *loop) {
  err_t e;
  httpc_t *h = NULL;
  uv_loop_init(loop);
  if (httpc_new(loop, &h, &e)) FAILF("httpc_new: %s", e.msg);
  return h;
}

static void on_closed(void *arg) { (*(int *)arg)++; }

/* Close the client, run the loop dry and check every handle is gone. */
static void teardown(uv_loop_t *loop, httpc_t *h) {
  int closed = 0;
  httpc_close(h, on_closed, &closed);
  CHECK_INT_EQ(closed, 0); /* done fires from the loop, not from httpc_close */
  uv_run(loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(closed, 1);
  CHECK_INT_EQ(uv_loop_close(loop), 0);
}

/* Start a request; fail the test if it does not start. */
static httpc_xfer *start(httpc_t *h, const struct httpc_req *r, httpc_cb cb, void *ud) {
  err_t e;
  httpc_xfer *x = NULL;
  if (httpc_start(h, r, cb, ud, &x, &e)) FAILF("httpc_start %s: %s", r->url, e.msg);
  return x;
}

/* GET path and run the loop until it completes. */
static void get(httpc_t *h, uv_loop_t *loop, const char *path, size_t max, struct got *g) {
  struct httpc_req r = {.url = url(path), .max_response = max};
  start(h, &r, on_got, g);
  uv_run(loop, UV_RUN_DEFAULT);
}

/* ---- tests ---- */

TEST(get_status_body_headers) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  struct httpc_req r = {.url = url("/hello")};
  start(h, &r, on_got, &g);
  CHECK_INT_EQ(httpc_active(h), 1);
  CHECK_INT_EQ(g.fired, 0); /* never from inside httpc_start */
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.fired, 1);
  CHECK_INT_EQ(httpc_active(h), 0);
  CHECK_INT_EQ(g.error, 0);
  CHECK_STR_EQ(g.reason, "");
  CHECK_STR_EQ(g.errmsg, "");
  CHECK_INT_EQ(g.status, 200);
  CHECK_STR_EQ(g.body, "hello world");
  CHECK_INT_EQ(g.body_len, 11);
  CHECK_CONTAINS(g.hdrs, "\nx-test=yes\n");
  CHECK_CONTAINS(g.hdrs, "\nx-mixed-case=Value\n"); /* names lowercased, values kept */
  CHECK_CONTAINS(g.hdrs, "\ncontent-length=11\n");
  CHECK(g.total_ms > 0 && g.total_ms < 30000);
  got_free(&g);

  /* Compressed responses are accepted and decoded. */
  get(h, &loop, "/gzip", 0, &g);
  CHECK_INT_EQ(g.status, 200);
  CHECK_CONTAINS(g.hdrs, "\ncontent-encoding=gzip\n");
  CHECK_INT_EQ(g.body_len, 1100);
  CHECK(g.body && !strncmp(g.body, "hello gzip hello gzip", 21));
  got_free(&g);
  teardown(&loop, h);
}

TEST(post_echoes_body_and_headers) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  const char *hs[] = {"Content-Type: application/json", "X-Foo:  bar baz ", NULL};
  struct httpc_req r = {.method = "POST", .url = url("/echo"), .headers = hs,
                        .body = "{\"a\":1}", .body_len = 7};
  start(h, &r, on_got, &g);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.status, 200);
  CHECK_STR_EQ(g.body, "{\"a\":1}");
  CHECK_CONTAINS(g.hdrs, "\nx-method=POST\n");
  CHECK_CONTAINS(g.hdrs, "\nx-echo-content-type=application/json\n");
  CHECK_CONTAINS(g.hdrs, "\nx-echo-x-foo=bar baz\n");
  CHECK_CONTAINS(g.hdrs, "\nx-echo-user-agent=moonloop/0.1\n");
  CHECK(!strstr(g.hdrs, "\nx-echo-expect=")); /* no 100-continue round trip */
  got_free(&g);

  /* A PUT with a binary body (embedded NUL), copied at start: the caller's buffer may go. */
  char *bin = malloc(5);
  memcpy(bin, "a\0b\0c", 5);
  struct httpc_req p = {.method = "PUT", .url = url("/echo"), .body = bin, .body_len = 5};
  start(h, &p, on_got, &g);
  free(bin);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.status, 200);
  CHECK_INT_EQ(g.body_len, 5);
  CHECK(g.body && !memcmp(g.body, "a\0b\0c", 5));
  CHECK_CONTAINS(g.hdrs, "\nx-method=PUT\n");
  got_free(&g);

  /* DELETE without a body; HEAD gets headers only. */
  struct httpc_req d = {.method = "DELETE", .url = url("/echo")};
  start(h, &d, on_got, &g);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.status, 200);
  CHECK_CONTAINS(g.hdrs, "\nx-method=DELETE\n");
  CHECK_INT_EQ(g.body_len, 0);
  got_free(&g);
  struct httpc_req hd = {.method = "HEAD", .url = url("/hello")};
  start(h, &hd, on_got, &g);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.status, 200);
  CHECK_INT_EQ(g.body_len, 0);
  CHECK_CONTAINS(g.hdrs, "\nx-test=yes\n");
  got_free(&g);
  teardown(&loop, h);
}

TEST(non_2xx_is_not_an_error) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  get(h, &loop, "/status/404", 0, &g);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.status, 404);
  CHECK_STR_EQ(g.body, "status 404");
  got_free(&g);
  get(h, &loop, "/status/500", 0, &g);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.status, 500);
  CHECK_STR_EQ(g.body, "status 500");
  got_free(&g);
  teardown(&loop, h);
}

/* 300 requests at once, each held 200 ms by the server; a 5 ms uv timer
** keeps ticking meanwhile, which it cannot if anything blocks the loop. */
struct many {
  httpc_t *h;
  int done, ok;
  int ticks_while_active;
  uv_timer_t tick;
};

static void many_cb(const struct httpc_resp *r, void *ud) {
  struct many *m = ud;
  m->done++;
  if (r->error == 0 && r->status == 200 && !strcmp(r->body, "slept")) m->ok++;
  else if (m->ok == m->done - 1) fprintf(stderr, "first failure: %d %s\n", r->error, r->errmsg);
  if (m->done == 300) uv_timer_stop(&m->tick);
}

static void many_tick(uv_timer_t *t) {
  struct many *m = t->data;
  if (httpc_active(m->h) > 0) m->ticks_while_active++;
}

TEST(three_hundred_at_once_loop_not_blocked) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  get(h, &loop, "/stats/reset", 0, &g);
  got_free(&g);
  struct many m = {.h = h};
  uv_timer_init(&loop, &m.tick);
  m.tick.data = &m;
  uv_timer_start(&m.tick, many_tick, 5, 5);
  uint64_t t0 = uv_hrtime();
  for (int i = 0; i < 300; i++) {
    struct httpc_req r = {.url = url("/sleep/200")};
    start(h, &r, many_cb, &m);
  }
  CHECK_INT_EQ(httpc_active(h), 300);
  uv_run(&loop, UV_RUN_DEFAULT);
  double ms = (double)(uv_hrtime() - t0) / 1e6;
  CHECK_INT_EQ(m.done, 300);
  CHECK_INT_EQ(m.ok, 300);
  CHECK_INT_EQ(httpc_active(h), 0);
  CHECK(m.ticks_while_active >= 5);
  get(h, &loop, "/stats", 0, &g);
  int conc = g.body ? atoi(g.body + strlen("max_concurrent=")) : 0;
  printf("     300 requests (200 ms each at the server): %.0f ms, %d timer ticks meanwhile, "
         "server saw %d at once\n", ms, m.ticks_while_active, conc);
  /* They really were in flight together: one at a time would be 1. Not
  ** 300: a loaded machine's stand-in accepts them over some milliseconds
  ** (97 at once was seen under load). */
  CHECK(conc >= 30);
  got_free(&g);
  uv_close((uv_handle_t *)&m.tick, NULL);
  teardown(&loop, h);
}

TEST(timeout_has_clear_message) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  struct httpc_req r = {.url = url("/hang"), .timeout_ms = 300};
  start(h, &r, on_got, &g);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.fired, 1);
  CHECK_INT_EQ(g.error, ERR_IO);
  CHECK_STR_EQ(g.reason, "timeout");
  CHECK_CONTAINS(g.errmsg, "timeout after 300 ms");
  CHECK_CONTAINS(g.errmsg, url("/hang"));
  CHECK_CONTAINS(g.errmsg, "(GET ");
  CHECK_INT_EQ(g.status, 0);
  CHECK(g.total_ms >= 250 && g.total_ms < 20000);
  got_free(&g);
  teardown(&loop, h);
}

TEST(connection_refused) {
  /* A bound socket that does not listen: connecting to it is refused. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  CHECK(getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
  int port = ntohs(sa.sin_port);
  char u[64], where[64];
  snprintf(u, sizeof u, "http://127.0.0.1:%d/x", port);
  snprintf(where, sizeof where, "127.0.0.1:%d", port);

  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  struct httpc_req r = {.method = "POST", .url = u, .body = "x", .body_len = 1};
  start(h, &r, on_got, &g);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.fired, 1);
  CHECK_INT_EQ(g.error, ERR_IO);
  CHECK_STR_EQ(g.reason, "connect");
  CHECK_CONTAINS(g.errmsg, "could not connect to");
  CHECK_CONTAINS(g.errmsg, where);
  CHECK_CONTAINS(g.errmsg, "connection refused");
  CHECK_CONTAINS(g.errmsg, "(POST http://127.0.0.1:");
  printf("     %s\n", g.errmsg);
  got_free(&g);
  teardown(&loop, h);
  close(fd);
}

TEST(dns_failure) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  struct httpc_req r = {.url = "http://no-such-host.invalid/x", .timeout_ms = 10000};
  start(h, &r, on_got, &g);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.fired, 1);
  CHECK_INT_EQ(g.error, ERR_IO);
  CHECK_STR_EQ(g.reason, "dns");
  CHECK_CONTAINS(g.errmsg, "no-such-host.invalid");
  printf("     %s\n", g.errmsg);
  got_free(&g);
  teardown(&loop, h);
}

TEST(response_over_max_response) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  /* With a Content-Length... */
  get(h, &loop, "/big/100000", 1000, &g);
  CHECK_INT_EQ(g.error, ERR_TOOBIG);
  CHECK_STR_EQ(g.reason, "too_big");
  CHECK_CONTAINS(g.errmsg, "limit of 1000 bytes");
  CHECK_CONTAINS(g.errmsg, url("/big/100000"));
  CHECK_INT_EQ(g.body_len, 0);
  got_free(&g);
  /* ...and without one (chunked): the limit holds while the body arrives. */
  get(h, &loop, "/chunked/100000", 1000, &g);
  CHECK_INT_EQ(g.error, ERR_TOOBIG);
  CHECK_CONTAINS(g.errmsg, "limit of 1000 bytes");
  got_free(&g);
  /* Exactly at the limit is fine. */
  get(h, &loop, "/chunked/1000", 1000, &g);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.body_len, 1000);
  got_free(&g);
  get(h, &loop, "/big/1000", 1000, &g);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.body_len, 1000);
  got_free(&g);
  /* The default limit lets a 2 MB body through. */
  get(h, &loop, "/chunked/2000000", 0, &g);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.body_len, 2000000);
  got_free(&g);
  teardown(&loop, h);
}

/* Cancel: right after start, and once the request is on the wire. */
struct cancel_ctx {
  httpc_t *h;
  httpc_xfer *x;
  int fired;
};

static void count_cb(const struct httpc_resp *r, void *ud) {
  (void)r;
  ((struct cancel_ctx *)ud)->fired++;
}

static void cancel_later(uv_timer_t *t) {
  struct cancel_ctx *c = t->data;
  CHECK_INT_EQ(httpc_active(c->h), 2);
  httpc_cancel(c->x);
  CHECK_INT_EQ(httpc_active(c->h), 1);
  uv_close((uv_handle_t *)t, NULL);
}

TEST(cancel_before_completion) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct cancel_ctx c = {.h = h};
  struct httpc_req r1 = {.url = url("/sleep/100")};
  httpc_xfer *x1 = start(h, &r1, count_cb, &c);
  httpc_cancel(x1);
  CHECK_INT_EQ(httpc_active(h), 0);
  httpc_cancel(NULL);

  struct httpc_req r2 = {.url = url("/sleep/300")};
  c.x = start(h, &r2, count_cb, &c);
  struct got g = {0};
  struct httpc_req r3 = {.url = url("/sleep/500")}; /* outlives the cancelled ones */
  start(h, &r3, on_got, &g);
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  t.data = &c;
  uv_timer_start(&t, cancel_later, 100, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(c.fired, 0);
  CHECK_INT_EQ(g.fired, 1);
  CHECK_INT_EQ(g.status, 200);
  CHECK_INT_EQ(httpc_active(h), 0);
  got_free(&g);
  teardown(&loop, h);
}

/* Ten requests time out together: the loop is blocked past their deadline so
** curl reports all ten in one batch. The first callback cancels all the
** others (pending in its batch), itself (a no-op), and starts a new request. */
struct batch {
  httpc_t *h;
  httpc_xfer *x[10];
  int fired, closed, close_in_cb;
  struct got next;
  int start_rc;
};

static void batch_cb(const struct httpc_resp *r, void *ud) {
  struct batch *b = ud;
  b->fired++;
  if (r->error != ERR_IO) FAILF("want a timeout, got %d %s", r->error, r->errmsg);
  if (b->fired > 1) return;
  size_t active = httpc_active(b->h);
  if (active != 9) FAILF("httpc_active == %zu in the first callback, expected 9", active);
  for (int i = 0; i < 10; i++) httpc_cancel(b->x[i]);
  CHECK_INT_EQ(httpc_active(b->h), 0);
  err_t e;
  struct httpc_req n = {.url = url("/hello")};
  if (b->close_in_cb) {
    httpc_close(b->h, on_closed, &b->closed);
    httpc_close(b->h, on_closed, &b->closed); /* a second close is ignored */
    b->start_rc = httpc_start(b->h, &n, on_got, &b->next, NULL, &e);
    CHECK_CONTAINS(e.msg, "closing");
  } else {
    b->start_rc = httpc_start(b->h, &n, on_got, &b->next, NULL, &e);
  }
}

static void block_loop(uv_timer_t *t) {
  usleep(400 * 1000);
  uv_close((uv_handle_t *)t, NULL);
}

static void run_batch(int close_in_cb) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct batch b = {.h = h, .close_in_cb = close_in_cb};
  for (int i = 0; i < 10; i++) {
    struct httpc_req r = {.url = url("/hang"), .timeout_ms = 200};
    b.x[i] = start(h, &r, batch_cb, &b);
  }
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  uv_timer_start(&t, block_loop, 50, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(b.fired, 1);
  if (close_in_cb) {
    CHECK_INT_EQ(b.start_rc, ERR_CONFLICT);
    CHECK_INT_EQ(b.next.fired, 0);
    CHECK_INT_EQ(b.closed, 1);
    CHECK_INT_EQ(uv_loop_close(&loop), 0);
  } else {
    CHECK_INT_EQ(b.start_rc, 0);
    CHECK_INT_EQ(b.next.fired, 1);
    CHECK_INT_EQ(b.next.status, 200);
    CHECK_INT_EQ(httpc_active(h), 0);
    teardown(&loop, h);
  }
  got_free(&b.next);
}

TEST(cancel_others_pending_in_same_batch) { run_batch(0); }

TEST(close_from_inside_a_callback) { run_batch(1); }

/* Each completion starts the next request: 5 in a chain. */
struct chain {
  httpc_t *h;
  int n, ok;
};

static void chain_cb(const struct httpc_resp *r, void *ud) {
  struct chain *c = ud;
  if (r->error == 0 && r->status == 200) c->ok++;
  if (++c->n < 5) {
    err_t e;
    struct httpc_req q = {.url = url("/hello")};
    if (httpc_start(c->h, &q, chain_cb, c, NULL, &e)) FAILF("start from callback: %s", e.msg);
  }
}

TEST(start_from_completion_callback) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct chain c = {.h = h};
  struct httpc_req r = {.url = url("/hello")};
  start(h, &r, chain_cb, &c);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(c.n, 5);
  CHECK_INT_EQ(c.ok, 5);
  teardown(&loop, h);
}

/* 1000 requests with 200 in flight, each completion starting the next. */
struct waves {
  httpc_t *h;
  int started, done, ok;
};

static void waves_cb(const struct httpc_resp *r, void *ud) {
  struct waves *w = ud;
  w->done++;
  if (r->error == 0 && r->status == 200) w->ok++;
  if (w->started < 1000) {
    w->started++;
    struct httpc_req q = {.url = url("/hello")};
    start(w->h, &q, waves_cb, w);
  }
}

TEST(thousand_requests_two_hundred_in_flight) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct waves w = {.h = h};
  uint64_t t0 = uv_hrtime();
  for (; w.started < 200; w.started++) {
    struct httpc_req q = {.url = url("/hello")};
    start(h, &q, waves_cb, &w);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  double ms = (double)(uv_hrtime() - t0) / 1e6;
  CHECK_INT_EQ(w.done, 1000);
  CHECK_INT_EQ(w.ok, 1000);
  printf("     1000 requests, 200 in flight: %.0f ms (%.0f req/s)\n", ms, 1000 / (ms / 1000));
  teardown(&loop, h);
}

TEST(redirects_followed) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  get(h, &loop, "/redirect/3", 0, &g);
  CHECK_INT_EQ(g.error, 0);
  CHECK_INT_EQ(g.status, 200);
  CHECK_STR_EQ(g.body, "hello world");
  CHECK_CONTAINS(g.hdrs, "\nx-test=yes\n");
  CHECK(!strstr(g.hdrs, "\nlocation=")); /* only the last response's headers */
  CHECK(!strstr(g.hdrs, "\nx-hop="));
  got_free(&g);

  get(h, &loop, "/redirect/5", 0, &g); /* 5 redirects: allowed */
  CHECK_INT_EQ(g.status, 200);
  got_free(&g);
  get(h, &loop, "/redirect/6", 0, &g);
  CHECK_INT_EQ(g.error, ERR_IO);
  CHECK_STR_EQ(g.reason, "redirects");
  CHECK_CONTAINS(g.errmsg, "too many redirects (more than 5)");
  got_free(&g);

  /* A POST answered with 302 goes on as a GET, as browsers do. */
  struct httpc_req p = {.method = "POST", .url = url("/redirect-to?url=/echo"), .body = "x",
                        .body_len = 1};
  start(h, &p, on_got, &g);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.status, 200);
  CHECK_CONTAINS(g.hdrs, "\nx-method=GET\n");
  got_free(&g);
  teardown(&loop, h);
}

TEST(only_http_and_https) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct got g = {0};
  err_t e;
  const char *bad[] = {"file:///etc/passwd", "FILE:///etc/passwd", "ftp://127.0.0.1/x",
                       "gopher://127.0.0.1/x", "dict://127.0.0.1/x"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    struct httpc_req r = {.url = bad[i]};
    httpc_xfer *x = (httpc_xfer *)&g;
    CHECK_INT_EQ(httpc_start(h, &r, on_got, &g, &x, &e), ERR_INVALID);
    CHECK(x == NULL);
    CHECK_CONTAINS(e.msg, "only http:// and https://");
    CHECK_CONTAINS(e.msg, bad[i]);
  }
  CHECK_CONTAINS(e.msg, "not dict://");

  /* Malformed input is refused before anything goes on the wire. */
  struct httpc_req nourl = {.url = "127.0.0.1/no-scheme"};
  CHECK_INT_EQ(httpc_start(h, &nourl, on_got, &g, NULL, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "invalid URL");
  struct httpc_req badm = {.method = "GET /x HTTP/1.1\r\nX:", .url = url("/hello")};
  CHECK_INT_EQ(httpc_start(h, &badm, on_got, &g, NULL, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "invalid HTTP method");
  const char *inj[] = {"X-A: 1\r\nX-B: 2", NULL};
  struct httpc_req badh = {.url = url("/hello"), .headers = inj};
  CHECK_INT_EQ(httpc_start(h, &badh, on_got, &g, NULL, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "invalid request header");
  CHECK_INT_EQ(httpc_active(h), 0);

  /* A redirect to file:// is refused by curl itself. */
  get(h, &loop, "/redirect-to?url=file:///etc/passwd", 0, &g);
  CHECK_INT_EQ(g.fired, 1);
  CHECK_INT_EQ(g.error, ERR_INVALID);
  CHECK_STR_EQ(g.reason, "scheme");
  CHECK_CONTAINS(g.errmsg, "only http:// and https://");
  CHECK(g.body && !strstr(g.body, "root:"));
  printf("     %s\n", g.errmsg);
  got_free(&g);
  /* So is one to ftp://, which curl would follow by default. */
  char to_ftp[128];
  snprintf(to_ftp, sizeof to_ftp, "/redirect-to?url=ftp://127.0.0.1:%d/x", g_port);
  get(h, &loop, to_ftp, 0, &g);
  CHECK_INT_EQ(g.error, ERR_INVALID);
  CHECK_STR_EQ(g.reason, "scheme");
  CHECK_CONTAINS(g.errmsg, "ftp");
  got_free(&g);
  teardown(&loop, h);
}

/* httpc_close with requests in flight: no callback fires, everything closes. */
/* The gate: a gated request is not sent while the gate is closed, and is
** sent once it opens; cancelling or closing frees a held one. */
static int gate_flag;
static int gate_closed(void *arg) {
  (void)arg;
  return gate_flag;
}

static void stop_loop(uv_timer_t *t) { uv_stop(t->loop); }

/* Run the loop for ms. */
static void run_for(uv_loop_t *loop, uint64_t ms) {
  uv_timer_t t;
  uv_timer_init(loop, &t);
  uv_timer_start(&t, stop_loop, ms, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
}

TEST(a_gated_request_waits_for_the_gate) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  httpc_set_gate(h, gate_closed, NULL);
  gate_flag = 1;
  struct got g = {0}, u = {0}, seen = {0};
  struct httpc_req gr = {.url = url("/mark/gated"), .gated = 1};
  struct httpc_req ur = {.url = url("/mark/free")};
  start(h, &gr, on_got, &g);
  start(h, &ur, on_got, &u);
  run_for(&loop, 300);
  CHECK_INT_EQ(u.fired, 1); /* not gated: it went out */
  CHECK_INT_EQ(g.fired, 0);
  CHECK_INT_EQ(httpc_held(h), 1);
  CHECK_INT_EQ(httpc_active(h), 1);
  struct httpc_req sr = {.url = url("/seen/gated")};
  start(h, &sr, on_got, &seen);
  run_for(&loop, 300);
  CHECK_STR_EQ(seen.body, "0"); /* the peer never saw it */
  gate_flag = 0;
  httpc_gate_open(h);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(g.fired, 1);
  CHECK_INT_EQ(g.status, 200);
  CHECK_STR_EQ(g.body, "1"); /* sent once */
  CHECK_INT_EQ(httpc_held(h), 0);
  got_free(&g), got_free(&u), got_free(&seen);

  /* Held, then cancelled: freed, its callback never fires. */
  gate_flag = 1;
  struct cancel_ctx c = {.h = h};
  struct httpc_req cr = {.url = url("/mark/cancelled"), .gated = 1};
  httpc_xfer *x = start(h, &cr, count_cb, &c);
  run_for(&loop, 300);
  CHECK_INT_EQ(httpc_held(h), 1);
  httpc_cancel(x);
  CHECK_INT_EQ(httpc_held(h), 0);
  CHECK_INT_EQ(httpc_active(h), 0);
  /* Held when the client closes: freed with it (teardown checks the handles). */
  struct httpc_req lr = {.url = url("/mark/left"), .gated = 1};
  start(h, &lr, count_cb, &c);
  run_for(&loop, 300);
  CHECK_INT_EQ(httpc_held(h), 1);
  teardown(&loop, h);
  CHECK_INT_EQ(c.fired, 0);
}

static void close_now(uv_timer_t *t) {
  struct cancel_ctx *c = t->data;
  CHECK_INT_EQ(httpc_active(c->h), 40);
  httpc_close(c->h, on_closed, &c->fired);
  uv_close((uv_handle_t *)t, NULL);
}

TEST(close_with_transfers_in_flight) {
  uv_loop_t loop;
  httpc_t *h = setup(&loop);
  struct cancel_ctx c = {.h = h}, never = {0};
  for (int i = 0; i < 20; i++) {
    struct httpc_req r = {.url = url(i % 2 ? "/hang" : "/sleep/1000")};
    start(h, &r, count_cb, &never);
    struct httpc_req p = {.method = "POST", .url = url("/sleep/1000"), .body = "abc", .body_len = 3};
    start(h, &p, count_cb, &never);
  }
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  t.data = &c;
  uv_timer_start(&t, close_now, 100, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_INT_EQ(c.fired, 1); /* the done callback, once */
  CHECK_INT_EQ(never.fired, 0);
  CHECK_INT_EQ(uv_loop_close(&loop), 0);

  /* Closing a client that never did anything. */
  h = setup(&loop);
  teardown(&loop, h);
  /* Closing right after starting (nothing has touched the network yet). */
  h = setup(&loop);
  struct httpc_req r = {.url = url("/hello")};
  start(h, &r, count_cb, &never);
  teardown(&loop, h);
  CHECK_INT_EQ(never.fired, 0);
}

int main(void) {
  /* The peer is on loopback; a proxy from the environment must not get in the way. */
  unsetenv("http_proxy"), unsetenv("HTTP_PROXY"), unsetenv("https_proxy");
  unsetenv("HTTPS_PROXY"), unsetenv("all_proxy"), unsetenv("ALL_PROXY");
  signal(SIGPIPE, SIG_IGN);
  if (peer_start()) {
    fprintf(stderr, "could not start tests/lib/httpc_peer.py\n");
    peer_stop();
    return 1;
  }
  RUN(get_status_body_headers);
  RUN(post_echoes_body_and_headers);
  RUN(non_2xx_is_not_an_error);
  RUN(three_hundred_at_once_loop_not_blocked);
  RUN(timeout_has_clear_message);
  RUN(connection_refused);
  RUN(dns_failure);
  RUN(response_over_max_response);
  RUN(cancel_before_completion);
  RUN(cancel_others_pending_in_same_batch);
  RUN(close_from_inside_a_callback);
  RUN(start_from_completion_callback);
  RUN(thousand_requests_two_hundred_in_flight);
  RUN(redirects_followed);
  RUN(only_http_and_https);
  RUN(close_with_transfers_in_flight);
  RUN(a_gated_request_waits_for_the_gate);
  peer_stop();
  return test_summary();
}
