/*
** bench_http.c: a small HTTP/1.1 load generator for the benchmarks, for
** what wrk cannot do: send exactly TOTAL requests over CONNS keep-alive
** connections and time them (wrk always runs for its full duration).
**
**   bench_http HOST:PORT METHOD PATH BODY TOTAL CONNS [KEYED]
**
** BODY is sent as application/json ("" for none). With KEYED 1, each
** request's body gets a unique idempotency key: "%K" in BODY is replaced
** by a fresh key. Prints one line:
**
**   RESULT requests=N seconds=S req_per_s=R p50_ms=.. p90_ms=.. p99_ms=.. max_ms=.. errors=E
**
** errors counts answers outside 2xx and broken connections. One thread,
** epoll, non-blocking sockets; answers are read by Content-Length (the
** engine always sends one).
*/
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
  int fd;
  char in[65536];
  size_t inlen;
  char *out;
  size_t outlen, outoff;
  double sent_at;
  int busy;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static const char *g_method, *g_path, *g_body, *g_host;
static int g_keyed;
static long g_seq;

/* Build the next request into c->out. */
static void make_request(struct conn *c) {
  char body[8192];
  const char *b = g_body;
  if (g_keyed) {
    const char *k = strstr(g_body, "%K");
    char key[64];
    snprintf(key, sizeof key, "k-%ld-%ld", (long)getpid(), ++g_seq);
    if (k) {
      snprintf(body, sizeof body, "%.*s%s%s", (int)(k - g_body), g_body, key, k + 2);
      b = body;
    }
  }
  size_t bl = strlen(b);
  free(c->out);
  c->out = malloc(bl + 512);
  c->outlen = (size_t)sprintf(c->out,
                              "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                              "Content-Length: %zu\r\n\r\n%s",
                              g_method, g_path, g_host, bl, b);
  c->outoff = 0;
  c->sent_at = now_s();
  c->busy = 1;
}

/* Whether c->in holds a whole answer; *status and *used when it does. */
static int parse_answer(struct conn *c, int *status, size_t *used) {
  c->in[c->inlen < sizeof c->in ? c->inlen : sizeof c->in - 1] = 0;
  char *end = strstr(c->in, "\r\n\r\n");
  if (!end) return 0;
  size_t head = (size_t)(end - c->in) + 4;
  long len = 0;
  for (char *p = c->in; p < end; p = strstr(p, "\r\n") + 2) {
    if (!strncasecmp(p, "content-length:", 15)) len = strtol(p + 15, NULL, 10);
    if (!strstr(p, "\r\n")) break;
  }
  if (c->inlen < head + (size_t)len) return 0;
  *status = atoi(c->in + 9);
  *used = head + (size_t)len;
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: bench_http HOST:PORT METHOD PATH BODY TOTAL CONNS [KEYED]\n");
    return 2;
  }
  g_host = argv[1];
  g_method = argv[2];
  g_path = argv[3];
  g_body = argv[4];
  long total = atol(argv[5]);
  int nconn = atoi(argv[6]);
  g_keyed = argc > 7 && atoi(argv[7]);
  char host[256];
  snprintf(host, sizeof host, "%s", g_host);
  char *colon = strrchr(host, ':');
  if (!colon) return 2;
  *colon = 0;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, host, &sa.sin_addr);

  int ep = epoll_create1(0);
  struct conn *conns = calloc((size_t)nconn, sizeof *conns);
  double *lat = calloc((size_t)total, sizeof *lat);
  long sent = 0, done = 0, errors = 0;
  double t0 = now_s();
  for (int i = 0; i < nconn; i++) {
    struct conn *c = &conns[i];
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa)) {
      perror("connect");
      return 1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    if (sent < total) {
      make_request(c);
      sent++;
      ssize_t w = write(c->fd, c->out, c->outlen);
      if (w > 0) c->outoff = (size_t)w;
    }
  }
  struct epoll_event evs[256];
  while (done < total) {
    int n = epoll_wait(ep, evs, 256, 60000);
    if (n <= 0) break;
    for (int k = 0; k < n; k++) {
      struct conn *c = evs[k].data.ptr;
      ssize_t r = read(c->fd, c->in + c->inlen, sizeof c->in - 1 - c->inlen);
      if (r <= 0) {
        if (r < 0 && errno == EAGAIN) continue;
        errors++, done++;
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->busy = 0;
        continue;
      }
      c->inlen += (size_t)r;
      int status;
      size_t used;
      while (c->busy && parse_answer(c, &status, &used)) {
        lat[done++] = now_s() - c->sent_at;
        if (status < 200 || status > 299) errors++;
        memmove(c->in, c->in + used, c->inlen - used);
        c->inlen -= used;
        c->busy = 0;
        if (sent < total) {
          make_request(c);
          sent++;
          ssize_t w = write(c->fd, c->out, c->outlen);
          if (w > 0) c->outoff = (size_t)w;
        }
      }
    }
  }
  double secs = now_s() - t0;
  qsort(lat, (size_t)done, sizeof *lat, cmp_double);
#define PCT(p) (done ? lat[(size_t)((double)(done - 1) * (p))] * 1000 : 0)
  printf("RESULT requests=%ld seconds=%.3f req_per_s=%.0f p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f "
         "max_ms=%.2f errors=%ld\n",
         done, secs, done / secs, PCT(0.5), PCT(0.9), PCT(0.99), PCT(1.0), errors);
  return errors ? 1 : 0;
}
