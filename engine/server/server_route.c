/*
** server_route.c: routing and validating HTTP API requests into plans (see
** server_route.h). Everything here is a pure function of its arguments, so
** the fuzz target exercises exactly the code the server runs.
**
** The routes are one table, routes[] below (DESIGN.md's HTTP API): each
** route's method, path pattern, the operation it plans, the kind of its
** body and the handler that reads its query and body. Dispatch and the
** Allow header of a 405 come from it. PUT and DELETE /v1/skills/{id} take
** ?file=NAME (the sidecar's file); GET /v1/runs/{id} takes ?wait=SECONDS
** (attach).
**
** The dashboard's files (GET and HEAD of /, /app.js, /style.css: web.h) are
** answered by server.c before authentication and routing; INDEX answers /
** only in a build without them, and other methods on / (405).
**
** HEAD is taken wherever GET is. Order of checks: path (404), method (405),
** then query and body (400, 413), so a client learns the coarsest mistake
** first.
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "server/server_route.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <arpa/inet.h>
#include <openssl/crypto.h>

#define MAX_SEGMENTS 5

/* A decoded path segment. */
struct seg {
  char s[SERVER_ID_MAX * 3 + 1];
  size_t len;
  int too_long;
};

/* Copy at most 64 bytes of s into out as printable ASCII, for messages. */
static void printable(char *out, size_t n, const char *s, size_t len) {
  size_t max = 64, o = 0;
  for (size_t i = 0; i < len && i < max && o + 1 < n; i++) {
    unsigned char c = (unsigned char)s[i];
    out[o++] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
  }
  if (len > max && o + 4 < n) memcpy(out + o, "...", 3), o += 3;
  out[o] = 0;
}

/* The value of a hex digit, or -1. */
static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Percent-decode s[0..len) into out (at most cap - 1 bytes, NUL-terminated);
** plus_space turns '+' into ' ' (query strings). Returns the decoded length,
** -1 for a malformed escape, -2 when it does not fit. */
static long pct_decode(const char *s, size_t len, char *out, size_t cap, int plus_space) {
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    int c = (unsigned char)s[i];
    if (c == '%') {
      if (i + 2 >= len) return -1;
      int h = hexval((unsigned char)s[i + 1]), l = hexval((unsigned char)s[i + 2]);
      if (h < 0 || l < 0) return -1;
      c = h * 16 + l;
      i += 2;
    } else if (c == '+' && plus_space) {
      c = ' ';
    }
    if (o + 1 >= cap) return -2;
    out[o++] = (char)c;
  }
  out[o] = 0;
  return (long)o;
}

/* Run ids: ULIDs, 26 characters of Crockford's base 32. */
static int is_run_id(const char *s, size_t len) {
  if (len != 26) return 0;
  for (size_t i = 0; i < len; i++)
    if (!s[i] || !strchr("0123456789ABCDEFGHJKMNPQRSTVWXYZ", s[i])) return 0;
  return 1;
}

/* Versions: the SHA-256 of a source, 64 lowercase hex digits. */
static int is_version(const char *s, size_t len) {
  if (len != 64) return 0;
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

/* Skill ids: [a-z0-9][a-z0-9._-]*, at most SERVER_ID_MAX bytes. */
static int is_skill_id(const char *s, size_t len) {
  if (len == 0 || len > SERVER_ID_MAX) return 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             (i > 0 && (c == '.' || c == '_' || c == '-'));
    if (!ok) return 0;
  }
  return 1;
}

/* Whether the method (mlen bytes) is want. */
static int is_method(const char *m, size_t mlen, const char *want) {
  size_t n = strlen(want);
  return mlen == n && !memcmp(m, want, n);
}

/* See server_route.h. */
const char *server_error_code(int status, int code) {
  if (status == 405) return "method_not_allowed";
  if (status == 401) return "unauthenticated";
  if (status == 403) return "forbidden";
  if (status == 415) return "unsupported_media_type";
  if (status == 413) return "too_large";
  if (status == 503 && code != ERR_BUSY) return "unavailable";
  return err_name(code);
}

/* See server_route.h. */
int server_status_of(int code) {
  switch (code) {
  case ERR_INVALID: return 400;
  case ERR_NOTFOUND: return 404;
  case ERR_CONFLICT: return 409;
  case ERR_TOOBIG: return 413;
  case ERR_AUTH: return 401;
  case ERR_BUSY: return 503;
  default: return 500;
  }
}

/* See server_route.h. */
char *server_error_json(const char *code, const char *message) {
  cJSON *o = cJSON_CreateObject();
  cJSON *er = cJSON_AddObjectToObject(o, "error");
  cJSON_AddStringToObject(er, "code", code);
  cJSON_AddStringToObject(er, "message", message);
  char *s = jsontext_print_text(o);
  cJSON_Delete(o);
  return s;
}

/* See server_route.h. */
int server_auth_ok(const char *header, size_t hlen, const char *token, size_t toklen) {
  if (!token || !toklen) return 1;
  const char *got = "";
  size_t glen = 0;
  if (header && hlen > 7 && !strncasecmp(header, "Bearer ", 7)) {
    got = header + 7;
    glen = hlen - 7;
    while (glen && *got == ' ') got++, glen--;
    while (glen && (got[glen - 1] == ' ' || got[glen - 1] == '\t')) glen--;
  }
  /* The lengths are compared first, but the content comparison always runs
  ** over the whole token: when the lengths differ the token is compared
  ** with itself, so the time taken never depends on where a guess goes
  ** wrong. */
  int same_len = glen == toklen;
  int diff = CRYPTO_memcmp(same_len ? got : token, token, toklen);
  return same_len & (diff == 0);
}

/* Fill e and *status; returns code. */
static int fail(int *status, int st, err_t *e, int code, const char *fmt, ...)
  __attribute__((format(printf, 5, 6)));

static int fail(int *status, int st, err_t *e, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (e) {
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    e->code = code;
  }
  va_end(ap);
  *status = st;
  return code;
}

/* ---- who may ask: Host, Origin, Content-Type --------------------------- */

#define HOST_MAX 256

/* Split an authority ("name", "name:port", "[v6]:port") into its host,
** lowercased, without a trailing dot, brackets kept around an IPv6 address,
** and its port (-1 when it has none). Returns 0, or -1 for a malformed one:
** empty, a character no host name has, a port that is not 1 to 5 digits. */
static int split_authority(const char *s, size_t len, char *host, size_t cap, long *port) {
  size_t hl;
  *port = -1;
  if (len && s[0] == '[') {
    const char *close = memchr(s, ']', len);
    if (!close) return -1;
    hl = (size_t)(close - s) + 1;
    for (size_t i = 1; i + 1 < hl; i++)
      if (!isxdigit((unsigned char)s[i]) && s[i] != ':' && s[i] != '.') return -1;
  } else {
    hl = 0;
    while (hl < len && s[hl] != ':') hl++;
    for (size_t i = 0; i < hl; i++) {
      unsigned char c = (unsigned char)s[i];
      if (!isalnum(c) && c != '-' && c != '.' && c != '_') return -1;
    }
  }
  if (hl == 0 || hl >= cap) return -1;
  if (hl < len) {
    if (s[hl] != ':' || len - hl - 1 < 1 || len - hl - 1 > 5) return -1;
    long n = 0;
    for (size_t i = hl + 1; i < len; i++) {
      if (s[i] < '0' || s[i] > '9') return -1;
      n = n * 10 + (s[i] - '0');
    }
    if (n > 65535) return -1;
    *port = n;
  }
  for (size_t i = 0; i < hl; i++) host[i] = (char)tolower((unsigned char)s[i]);
  if (hl > 1 && host[hl - 1] == '.') hl--;
  host[hl] = 0;
  return 0;
}

/* Whether a host (as split_authority leaves it) is a loopback name. */
static int loopback_name(const char *h) {
  if (!strcmp(h, "localhost")) return 1;
  unsigned char a[16];
  if (inet_pton(AF_INET, h, a) == 1) return a[0] == 127;
  size_t n = strlen(h);
  char in[64];
  if (n < 3 || h[0] != '[' || n - 2 >= sizeof in) return 0;
  memcpy(in, h + 1, n - 2);
  in[n - 2] = 0;
  if (inet_pton(AF_INET6, in, a) != 1) return 0;
  static const unsigned char one[16] = {[15] = 1};
  static const unsigned char v4map[12] = {[10] = 0xff, [11] = 0xff};
  return !memcmp(a, one, 16) || (!memcmp(a, v4map, 12) && a[12] == 127);
}

/* See server_route.h. */
int server_host_ok(const char *host, size_t len, const char *listen_host,
                   const char *const *allowed) {
  char h[HOST_MAX], x[HOST_MAX];
  long port;
  if (!host || split_authority(host, len, h, sizeof h, &port)) return 0;
  if (loopback_name(h)) return 1;
  if (listen_host && !split_authority(listen_host, strlen(listen_host), x, sizeof x, &port) &&
      !strcmp(h, x))
    return 1;
  for (const char *const *a = allowed; a && *a; a++)
    if (!split_authority(*a, strlen(*a), x, sizeof x, &port) && !strcmp(h, x)) return 1;
  return 0;
}

/* See server_route.h. */
int server_origin_ok(const char *origin, size_t olen, const char *host, size_t hlen) {
  long dflt;
  size_t skip;
  if (!origin || !host) return 0;
  if (olen > 7 && !strncasecmp(origin, "http://", 7)) skip = 7, dflt = 80;
  else if (olen > 8 && !strncasecmp(origin, "https://", 8)) skip = 8, dflt = 443;
  else return 0;
  char oh[HOST_MAX], hh[HOST_MAX];
  long op, hp;
  if (split_authority(origin + skip, olen - skip, oh, sizeof oh, &op) ||
      split_authority(host, hlen, hh, sizeof hh, &hp))
    return 0;
  return !strcmp(oh, hh) && (op < 0 ? dflt : op) == (hp < 0 ? dflt : hp);
}

/* Whether a Content-Type value is the media type want (params, such as
** "; charset=utf-8", and case ignored). */
static int media_type_is(const char *ct, size_t len, const char *want) {
  while (len && (*ct == ' ' || *ct == '\t')) ct++, len--;
  size_t n = 0;
  while (n < len && ct[n] != ';' && ct[n] != ' ' && ct[n] != '\t') n++;
  size_t rest = n;
  while (rest < len && (ct[rest] == ' ' || ct[rest] == '\t')) rest++;
  return n == strlen(want) && !strncasecmp(ct, want, n) && (rest == len || ct[rest] == ';');
}

/* See server_route.h. */
int server_check_type(const struct server_plan *p, const char *ctype, size_t ctlen, size_t blen,
                      int *status, err_t *e) {
  char shown[80];
  printable(shown, sizeof shown, ctype ? ctype : "", ctype ? ctlen : 0);
  switch (p->body) {
  case SERVER_BODY_JSON:
    if ((blen || ctype) && !(ctype && media_type_is(ctype, ctlen, "application/json")))
      return fail(status, 415, e, ERR_INVALID, "a JSON body needs 'Content-Type: "
                  "application/json'%s%s%s (a browser can send other types to another site's "
                  "server without asking first, so the engine refuses them)",
                  ctype ? ", not '" : "", ctype ? shown : "", ctype ? "'" : "");
    return 0;
  case SERVER_BODY_LUA:
    if (!ctype || !media_type_is(ctype, ctlen, "text/x-lua"))
      return fail(status, 415, e, ERR_INVALID, "PUT /v1/skills/{id} takes Lua source with "
                  "'Content-Type: text/x-lua'%s%s%s", ctype ? ", not '" : "",
                  ctype ? shown : "", ctype ? "'" : "");
    return 0;
  default: return 0;
  }
}

/* What a route's handler reads of a request besides its path: the query,
** the body, the limits and the time. */
struct req {
  const char *q;
  size_t qlen;
  const char *body;
  size_t blen;
  const struct server_limits *lim;
  int64_t now_ms;
};

/* ---- bodies ------------------------------------------------------------ */

/* "an object", "a list", ... for messages. */
static const char *json_type(const cJSON *v) {
  if (cJSON_IsObject(v)) return "an object";
  if (cJSON_IsArray(v)) return "a list";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  return "something else";
}

/* Whether len bytes are JSON whitespace only (or none). */
static int only_space(const char *s, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
  return 1;
}

/* Parse a JSON body, refusing NUL bytes, invalid UTF-8, and what json_parse refuses. */
static int parse_json(const char *body, size_t blen, cJSON **out, int *status, err_t *e) {
  *out = NULL;
  if (memchr(body, 0, blen))
    return fail(status, 400, e, ERR_INVALID, "malformed JSON: the body holds a NUL byte");
  if (!jsontext_utf8_valid(body, blen))
    return fail(status, 400, e, ERR_INVALID, "malformed JSON: the body is not valid UTF-8");
  err_t pe;
  if (jsontext_parse(body, blen, out, &pe)) {
    if (!strncmp(pe.msg, "invalid JSON", 12))
      return fail(status, 400, e, ERR_INVALID, "malformed JSON%s", pe.msg + 12);
    return fail(status, 400, e, ERR_INVALID, "malformed JSON: %s", pe.msg);
  }
  return 0;
}

/* Refuse keys of object o other than known (NULL-terminated), and repeats. */
static int check_keys(const cJSON *o, const char *const *known, const char *where,
                      const char *what, int *status, err_t *e) {
  for (const cJSON *k = o->child; k; k = k->next) {
    int ok = 0;
    for (const char *const *n = known; *n && !ok; n++) ok = k->string && !strcmp(*n, k->string);
    char name[80];
    printable(name, sizeof name, k->string ? k->string : "", k->string ? strlen(k->string) : 0);
    if (!ok)
      return fail(status, 400, e, ERR_INVALID, "%sunknown key '%s' (%s)", where, name, what);
    for (const cJSON *j = o->child; j != k; j = j->next)
      if (j->string && !strcmp(j->string, k->string))
        return fail(status, 400, e, ERR_INVALID, "%skey '%s' appears twice", where, name);
  }
  return 0;
}

/* A string field of 1..max bytes, or absent/null when optional. */
static int check_name(const cJSON *v, int optional, size_t max) {
  if (!v || cJSON_IsNull(v)) return optional;
  if (!cJSON_IsString(v) || !v->valuestring) return 0;
  size_t n = strlen(v->valuestring);
  return n > 0 && n <= max;
}

/* The bytes of v as compact JSON, and over-the-limit check. */
static int check_size(const cJSON *v, int64_t limit, const char *where, const char *what,
                      char **text, int *status, err_t *e) {
  char *s = v ? jsontext_print_text(v) : mem_strdup("null");
  int64_t n = (int64_t)strlen(s);
  if (limit > 0 && n > limit) {
    char a[32], b[32];
    units_fmt_over(n, limit, a, b, sizeof a);
    free(s);
    return fail(status, 413, e, ERR_TOOBIG, "%s%s is %s, over the limit of %s (limits.event)",
                where, what, a, b);
  }
  if (text) *text = s;
  else free(s);
  return 0;
}

/* One event of a POST /v1/events body, normalized into {name, data, id?}. */
static int check_event(cJSON *ev, const char *where, int64_t limit, cJSON *out, int *status,
                       err_t *e) {
  static const char *const keys[] = {"name", "data", "id", NULL};
  if (!cJSON_IsObject(ev))
    return fail(status, 400, e, ERR_INVALID, "%sexpected an event {name, data, id?}, got %s",
                where, json_type(ev));
  if (check_keys(ev, keys, where, "an event has name, data and id", status, e)) return e->code;
  cJSON *name = cJSON_GetObjectItemCaseSensitive(ev, "name");
  cJSON *id = cJSON_GetObjectItemCaseSensitive(ev, "id");
  if (!check_name(name, 0, SERVER_NAME_MAX))
    return fail(status, 400, e, ERR_INVALID,
                "%sname must be a non-empty string of at most %d bytes%s", where, SERVER_NAME_MAX,
                name ? "" : " (it is missing)");
  if (!check_name(id, 1, SERVER_NAME_MAX))
    return fail(status, 400, e, ERR_INVALID,
                "%sid (the idempotency key) must be a non-empty string of at most %d bytes",
                where, SERVER_NAME_MAX);
  cJSON *data = cJSON_GetObjectItemCaseSensitive(ev, "data");
  if (check_size(data, limit, where, "data", NULL, status, e)) return e->code;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", name->valuestring);
  cJSON *d = data ? cJSON_DetachItemViaPointer(ev, data) : cJSON_CreateNull();
  cJSON_AddItemToObject(o, "data", d);
  if (id && cJSON_IsString(id)) cJSON_AddStringToObject(o, "id", id->valuestring);
  cJSON_AddItemToArray(out, o);
  return 0;
}

/* POST /v1/events: one event or a list, into p->events (always a list). */
static int route_events(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  const char *body = r->body;
  size_t blen = r->blen;
  const struct server_limits *lim = r->lim;
  if (only_space(body, blen))
    return fail(status, 400, e, ERR_INVALID,
                "the body is empty: POST /v1/events takes {name, data, id?} or a list of them");
  cJSON *v;
  if (parse_json(body, blen, &v, status, e)) return e->code;
  cJSON *out = cJSON_CreateArray();
  int rc = 0, n = 0;
  if (cJSON_IsArray(v)) {
    int count = cJSON_GetArraySize(v);
    if (count == 0) rc = fail(status, 400, e, ERR_INVALID, "the list of events is empty");
    else if (count > SERVER_EVENTS_MAX)
      rc = fail(status, 413, e, ERR_TOOBIG, "too many events: %d (at most %d in one request)",
                count, SERVER_EVENTS_MAX);
    for (cJSON *ev = v->child; ev && !rc; ev = ev->next, n++) {
      char where[48];
      snprintf(where, sizeof where, "events[%d]: ", n);
      rc = check_event(ev, where, lim->event_limit, out, status, e);
    }
  } else if (cJSON_IsObject(v)) {
    rc = check_event(v, "", lim->event_limit, out, status, e);
    n = 1;
  } else {
    rc = fail(status, 400, e, ERR_INVALID,
              "expected an event {name, data, id?} or a list of them, got %s", json_type(v));
  }
  cJSON_Delete(v);
  if (rc) {
    cJSON_Delete(out);
    return rc;
  }
  p->events = out;
  p->nevents = n;
  return 0;
}

/* POST /v1/skills/{id}/invoke: {data, key?, wait?}; an empty body is {}. */
/* POST .../cancel and .../rerun act on the run as it is: no body, or an
** empty object; anything else (malformed JSON, a "data" to rerun with) is
** refused rather than ignored, so a client is not led to think it took. */
static int route_no_body(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  (void)p;
  if (only_space(r->body, r->blen)) return 0;
  cJSON *v;
  if (parse_json(r->body, r->blen, &v, status, e)) return e->code;
  int empty = cJSON_IsObject(v) && !v->child;
  cJSON_Delete(v);
  if (empty) return 0;
  return fail(status, 400, e, ERR_INVALID, "this request takes no body (or {}): it acts on the run "
              "as it is");
}

/* The body's "key" (an idempotency key, invoke's and rerun's) into p->key,
** when there is one; 400 when it is not 1 to SERVER_NAME_MAX bytes. */
static int take_key(const cJSON *v, struct server_plan *p, int *status, err_t *e) {
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(v, "key");
  if (!check_name(k, 1, SERVER_NAME_MAX))
    return fail(status, 400, e, ERR_INVALID,
                "key (the idempotency key) must be a non-empty string of at most %d bytes",
                SERVER_NAME_MAX);
  if (cJSON_IsString(k)) memcpy(p->key, k->valuestring, strlen(k->valuestring) + 1);
  return 0;
}

/* POST /v1/runs/{id}/rerun: no body, {} or {"key"}: an idempotency key,
** as invoke's (the skill's keys), so a rerun retried after a lost answer
** starts one run. */
static int route_rerun(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  static const char *const keys[] = {"key", NULL};
  if (only_space(r->body, r->blen)) return 0;
  cJSON *v;
  if (parse_json(r->body, r->blen, &v, status, e)) return e->code;
  int rc = 0;
  if (!cJSON_IsObject(v)) {
    rc = fail(status, 400, e, ERR_INVALID, "expected an object {key?}, got %s: a rerun runs "
              "again with the run's own input", json_type(v));
  } else if (!(rc = check_keys(v, keys, "", "rerun takes only key (a rerun runs again with the "
                               "run's own input)", status, e))) {
    rc = take_key(v, p, status, e);
  }
  cJSON_Delete(v);
  return rc;
}

static int route_invoke(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  const char *body = r->body;
  size_t blen = r->blen;
  const struct server_limits *lim = r->lim;
  static const char *const keys[] = {"data", "key", "wait", NULL};
  if (only_space(body, blen)) {
    p->data = mem_strdup("null");
    return 0;
  }
  cJSON *v;
  if (parse_json(body, blen, &v, status, e)) return e->code;
  int rc = 0;
  if (!cJSON_IsObject(v)) {
    rc = fail(status, 400, e, ERR_INVALID, "expected an object {data, key?, wait?}, got %s",
              json_type(v));
  } else if (!(rc = check_keys(v, keys, "", "invoke takes data, key and wait", status, e))) {
    rc = take_key(v, p, status, e);
    cJSON *w = cJSON_GetObjectItemCaseSensitive(v, "wait");
    if (rc) {
      /* the key was refused */
    } else if (!w || cJSON_IsNull(w) || cJSON_IsFalse(w)) p->wait_ms = 0;
    else if (cJSON_IsTrue(w)) p->wait_ms = SERVER_WAIT_DEFAULT_MS;
    else if (cJSON_IsNumber(w) && isfinite(w->valuedouble) && w->valuedouble >= 0 &&
             w->valuedouble <= SERVER_WAIT_MAX_MS / 1000)
      p->wait_ms = (int64_t)llround(w->valuedouble * 1000);
    else
      rc = fail(status, 400, e, ERR_INVALID,
                "wait must be true, false or a number of seconds from 0 to %d",
                SERVER_WAIT_MAX_MS / 1000);
    if (!rc)
      rc = check_size(cJSON_GetObjectItemCaseSensitive(v, "data"), lim->event_limit, "",
                      "data", &p->data, status, e);
  }
  cJSON_Delete(v);
  return rc;
}

/* ---- GET /v1/runs query -------------------------------------------------- */

/* The parameter of query q (qlen bytes) that starts at i: *j gets where it
** ends (the next '&' or qlen) and *eq where its '=' is (*j when it has none). */
static void split_param(const char *q, size_t qlen, size_t i, size_t *j, size_t *eq) {
  *j = i;
  while (*j < qlen && q[*j] != '&') (*j)++;
  *eq = i;
  while (*eq < *j && q[*eq] != '=') (*eq)++;
}

/* GET /v1/runs's query: skill, status, since, limit, before, trigger, parent. */
static int route_list(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  const char *q = r->q;
  size_t qlen = r->qlen;
  int64_t now_ms = r->now_ms;
  p->limit = SERVER_LIST_DEFAULT;
  size_t i = 0;
  while (i < qlen) {
    size_t j, eq;
    split_param(q, qlen, i, &j, &eq);
    char key[32], val[SERVER_ID_MAX * 2 + 1];
    long kl = pct_decode(q + i, eq - i, key, sizeof key, 1);
    long vl = eq < j ? pct_decode(q + eq + 1, j - eq - 1, val, sizeof val, 1) : 0;
    if (eq >= j) val[0] = 0;
    char shown[80];
    printable(shown, sizeof shown, q + i, eq - i);
    if (kl == -1 || vl == -1)
      return fail(status, 400, e, ERR_INVALID, "malformed percent-encoding in parameter '%s'",
                  shown);
    if (j == i) {
      i = j + 1;
      continue;
    }
    if (kl < 0 || (size_t)kl != strlen(key) ||
        (strcmp(key, "skill") && strcmp(key, "status") && strcmp(key, "since") &&
         strcmp(key, "limit") && strcmp(key, "before") && strcmp(key, "trigger") &&
         strcmp(key, "parent")))
      return fail(status, 400, e, ERR_INVALID, "unknown parameter '%s' (GET /v1/runs takes "
                  "skill, status, since, limit, before, trigger and parent)", shown);
    printable(shown, sizeof shown, val, vl > 0 ? (size_t)vl : 0);
    if (vl == -2 || (vl > 0 && (size_t)vl != strlen(val)))
      return fail(status, 400, e, ERR_INVALID, "parameter '%s' is too long or holds a NUL byte",
                  key);
    if (vl == 0) {
      /* An empty value is no filter, as HTML forms send it. */
    } else if (!strcmp(key, "skill")) {
      if (!is_skill_id(val, (size_t)vl))
        return fail(status, 400, e, ERR_INVALID, "skill: '%s' is not a skill id", shown);
      memcpy(p->skill, val, (size_t)vl + 1);
      p->filter.skill = p->skill;
    } else if (!strcmp(key, "status")) {
      if (!vocab_is_run_status(val))
        return fail(status, 400, e, ERR_INVALID, "status must be one of %s; got '%s'",
                    VOCAB_RUN_STATUSES, shown);
      memcpy(p->status, val, (size_t)vl + 1); /* one of the statuses: shorter than 16 */
      p->filter.status = p->status;
    } else if (!strcmp(key, "trigger")) {
      if (!vocab_is_trigger_kind(val))
        return fail(status, 400, e, ERR_INVALID, "trigger must be one of %s; got '%s'",
                    VOCAB_TRIGGER_KINDS, shown);
      memcpy(p->trigger, val, (size_t)vl + 1); /* a trigger kind: shorter than p->trigger */
      p->filter.trigger = p->trigger;
    } else if (!strcmp(key, "before") || !strcmp(key, "parent")) {
      /* Both hold a run id: before pages, parent lists a run's children. */
      int before = key[0] == 'b';
      if (!is_run_id(val, (size_t)vl))
        return fail(status, 400, e, ERR_INVALID, "%s: '%s' is not a run id (26 characters "
                    "such as 01J00000000000000000000000)", key, shown);
      char *dst = before ? p->before : p->parent;
      memcpy(dst, val, (size_t)vl + 1);
      if (before) p->filter.before = dst;
      else p->filter.parent_id = dst;
    } else if (!strcmp(key, "since")) {
      int64_t ms;
      err_t sub;
      if (!units_duration(val, &ms, &sub)) p->filter.since = now_ms - ms;
      else if (!units_parse_rfc3339(val, &ms, &sub)) p->filter.since = ms;
      else
        return fail(status, 400, e, ERR_INVALID, "since: expected a duration such as 7d or "
                    "an RFC 3339 time, got '%s'", shown);
      if (p->filter.since <= 0) p->filter.since = 1;
    } else { /* limit */
      long n = 0;
      int ok = vl <= 5;
      for (long k = 0; k < vl && ok; k++) {
        ok = val[k] >= '0' && val[k] <= '9';
        n = n * 10 + (val[k] - '0');
      }
      if (!ok || n < 1 || n > SERVER_LIST_MAX)
        return fail(status, 400, e, ERR_INVALID,
                    "limit must be a number from 1 to %d, got '%s'", SERVER_LIST_MAX, shown);
      p->limit = (int)n;
    }
    i = j + 1;
  }
  /* One more than asked: whether it comes back says if there is a next page. */
  p->filter.limit = p->limit + 1;
  return 0;
}

/* ---- GET /v1/runs/{id} query ------------------------------------------ */

/* Its parameters: wait, seconds from 0 to 300 (attach: answer once the
** run has ended, or when the wait runs out), and steps, true (the default)
** or false: false answers the record as the run list has it, without its
** steps, logs and children, one indexed read instead of five. */
static int route_run_query(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  const char *q = r->q;
  size_t qlen = r->qlen;
  size_t i = 0;
  while (i < qlen) {
    size_t j, eq;
    split_param(q, qlen, i, &j, &eq);
    char shown[80], val[32];
    printable(shown, sizeof shown, q + i, eq - i);
    if (j == i) {
      i = j + 1;
      continue;
    }
    int is_wait = eq - i == 4 && !memcmp(q + i, "wait", 4);
    int is_steps = eq - i == 5 && !memcmp(q + i, "steps", 5);
    if (!is_wait && !is_steps)
      return fail(status, 400, e, ERR_INVALID, "unknown parameter '%s' (GET /v1/runs/{id} "
                  "takes only wait and steps)", shown);
    long vl = eq < j ? pct_decode(q + eq + 1, j - eq - 1, val, sizeof val, 1) : 0;
    if (vl == 0) { /* an empty value is the default, as forms send it (as the lists take it) */
      i = j + 1;
      continue;
    }
    if (is_steps) {
      int yes = vl > 0 && (!strcmp(val, "true") || !strcmp(val, "1"));
      int no = vl > 0 && (!strcmp(val, "false") || !strcmp(val, "0"));
      if (!yes && !no) {
        printable(shown, sizeof shown, q + eq + 1, eq < j ? j - eq - 1 : 0);
        return fail(status, 400, e, ERR_INVALID, "steps must be true or false, got '%s'", shown);
      }
      p->no_steps = no;
      i = j + 1;
      continue;
    }
    char *end = NULL;
    double secs = vl > 0 ? strtod(val, &end) : -1;
    if (vl <= 0 || !end || *end || !isfinite(secs) || secs < 0 ||
        secs > SERVER_WAIT_MAX_MS / 1000) {
      printable(shown, sizeof shown, q + eq + 1, eq < j ? j - eq - 1 : 0);
      return fail(status, 400, e, ERR_INVALID, "wait must be a number of seconds from 0 to %d, "
                  "got '%s'", SERVER_WAIT_MAX_MS / 1000, shown);
    }
    p->wait_ms = (int64_t)llround(secs * 1000);
    i = j + 1;
  }
  return 0;
}

/* ---- GET /v1/stats and /v1/events queries ----------------------------- */

/* One parameter of q at i, decoded into key and val (with its printable
** form in shown); *j gets where it ends. 1 when there is one, 0 for an
** empty one (skip it), or a code after filling e. */
static int next_param(const char *q, size_t qlen, size_t i, size_t *j, char *key, size_t kn,
                      char *val, size_t vn, long *vl, char *shown, size_t sn, int *status,
                      err_t *e) {
  size_t eq;
  split_param(q, qlen, i, j, &eq);
  if (*j == i) return 0;
  long kl = pct_decode(q + i, eq - i, key, kn, 1);
  *vl = eq < *j ? pct_decode(q + eq + 1, *j - eq - 1, val, vn, 1) : 0;
  if (eq >= *j) val[0] = 0;
  printable(shown, sn, q + i, eq - i);
  if (kl == -1 || *vl == -1)
    return fail(status, 400, e, ERR_INVALID, "malformed percent-encoding in parameter '%s'", shown);
  if (kl < 0 || (size_t)kl != strlen(key)) key[0] = 0; /* no known key: refused by the caller */
  if (*vl == -2 || (*vl > 0 && (size_t)*vl != strlen(val)))
    return fail(status, 400, e, ERR_INVALID, "parameter '%s' is too long or holds a NUL byte", shown);
  return 1;
}

/* A time parameter: a duration back from now ("7d") or an RFC 3339 time. */
static int param_time(const char *key, const char *val, int64_t now_ms, int64_t *out,
                      int *status, err_t *e) {
  int64_t ms;
  err_t sub;
  char shown[80];
  printable(shown, sizeof shown, val, strlen(val));
  if (!units_duration(val, &ms, &sub)) *out = now_ms - ms;
  else if (!units_parse_rfc3339(val, &ms, &sub)) *out = ms;
  else
    return fail(status, 400, e, ERR_INVALID, "%s: expected a duration such as 7d or an RFC 3339 "
                "time, got '%s'", key, shown);
  if (*out <= 0) *out = 1;
  return 0;
}

/* GET /v1/stats's and /v1/skills/{id}/stats's query: since (default 7d),
** until (default now), interval (a duration; default: picked by the store). */
static int route_stats(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  const char *q = r->q;
  size_t qlen = r->qlen;
  int64_t now_ms = r->now_ms;
  p->stats.since = now_ms - 7 * 86400000LL;
  p->stats.until = now_ms;
  size_t i = 0, j;
  while (i < qlen) {
    char key[32], val[80], shown[80];
    long vl;
    int rc = next_param(q, qlen, i, &j, key, sizeof key, val, sizeof val, &vl, shown,
                        sizeof shown, status, e);
    if (rc < 0) return rc;
    i = j + 1;
    if (!rc || vl == 0) continue; /* an empty value is the default, as forms send it */
    if (!strcmp(key, "since") || !strcmp(key, "until")) {
      if (param_time(key, val, now_ms, key[0] == 's' ? &p->stats.since : &p->stats.until, status, e))
        return e->code;
    } else if (!strcmp(key, "interval")) {
      err_t sub;
      if (units_duration(val, &p->stats.interval, &sub) || p->stats.interval <= 0) {
        printable(shown, sizeof shown, val, (size_t)vl);
        return fail(status, 400, e, ERR_INVALID, "interval: expected a duration such as 1h, "
                    "got '%s'", shown);
      }
    } else {
      return fail(status, 400, e, ERR_INVALID, "unknown parameter '%s' (the figures take since, "
                  "until and interval)", shown);
    }
  }
  if (p->stats.until <= p->stats.since)
    return fail(status, 400, e, ERR_INVALID, "the window is empty: since must come before until");
  return 0;
}

/* GET /v1/events's query: limit, before (an event id: the next page). */
static int route_events_list(const struct req *r, struct server_plan *p, int *status,
                             err_t *e) {
  const char *q = r->q;
  size_t qlen = r->qlen;
  p->evf.limit = SERVER_EVENTS_DEFAULT;
  size_t i = 0, j;
  while (i < qlen) {
    char key[32], val[SERVER_ID_MAX + 1], shown[80];
    long vl;
    int rc = next_param(q, qlen, i, &j, key, sizeof key, val, sizeof val, &vl, shown,
                        sizeof shown, status, e);
    if (rc < 0) return rc;
    i = j + 1;
    if (!rc || vl == 0) continue;
    if (!strcmp(key, "before")) {
      printable(shown, sizeof shown, val, (size_t)vl);
      if (!is_run_id(val, (size_t)vl))
        return fail(status, 400, e, ERR_INVALID, "before: '%s' is not an event id (26 characters "
                    "such as 01J00000000000000000000000)", shown);
      memcpy(p->before, val, (size_t)vl + 1);
      p->evf.before = p->before;
    } else if (!strcmp(key, "limit")) {
      long n = 0;
      int ok = vl <= 5;
      for (long k = 0; k < vl && ok; k++) {
        ok = val[k] >= '0' && val[k] <= '9';
        n = n * 10 + (val[k] - '0');
      }
      if (!ok || n < 1 || n > SERVER_EVENTS_LIST_MAX) {
        printable(shown, sizeof shown, val, (size_t)vl);
        return fail(status, 400, e, ERR_INVALID, "limit must be a number from 1 to %d, got '%s'",
                    SERVER_EVENTS_LIST_MAX, shown);
      }
      p->evf.limit = (int)n;
    } else {
      return fail(status, 400, e, ERR_INVALID, "unknown parameter '%s' (GET /v1/events takes "
                  "limit and before)", shown);
    }
  }
  /* One more than asked: whether it comes back says if there is a next page. */
  p->limit = p->evf.limit;
  p->evf.limit++;
  return 0;
}

/* ---- PUT and DELETE /v1/skills/{id} query ----------------------------- */

/* Refuse a file name with a ".." component (anywhere: it could lead out
** of the workspace once joined or resolved), and a "//HOST/PATH" (the
** standalone sidecar's) without a host or an absolute path after it.
** Whether a local name is inside the workspace needs the file system: the
** server checks that (workspace_inside). */
static int file_name_bad(const char *f, int *status, err_t *e) {
  char shown[80];
  printable(shown, sizeof shown, f, strlen(f));
  for (const char *c = f; *c;) {
    size_t n = strcspn(c, "/");
    if (n == 2 && c[0] == '.' && c[1] == '.')
      return fail(status, 400, e, ERR_INVALID, "parameter 'file' ('%s') has a '..' part: a "
                  "skill's file is named by its path inside the workspace", shown);
    c += n;
    while (*c == '/') c++;
  }
  if (!strncmp(f, "//", 2)) {
    size_t hl = strcspn(f + 2, "/");
    if (hl == 0 || f[2 + hl] != '/' || !f[3 + hl])
      return fail(status, 400, e, ERR_INVALID, "parameter 'file' ('%s'): a remote file is "
                  "named //HOST/PATH (as moonloop sidecar sends it)", shown);
  }
  return 0;
}

/* The only parameter: file, the name of the skill's file (the standalone
** sidecar's "//HOST/PATH"): printable UTF-8, at most SERVER_FILE_MAX bytes. */
static int route_file(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  const char *q = r->q;
  size_t qlen = r->qlen;
  size_t i = 0;
  while (i < qlen) {
    size_t j, eq;
    split_param(q, qlen, i, &j, &eq);
    char shown[80];
    printable(shown, sizeof shown, q + i, eq - i);
    if (j == i) {
      i = j + 1;
      continue;
    }
    if (eq - i != 4 || memcmp(q + i, "file", 4))
      return fail(status, 400, e, ERR_INVALID, "unknown parameter '%s' (this path takes only "
                  "file)", shown);
    long vl = eq < j ? pct_decode(q + eq + 1, j - eq - 1, p->file, sizeof p->file, 1) : 0;
    if (vl == -1)
      return fail(status, 400, e, ERR_INVALID, "malformed percent-encoding in parameter 'file'");
    if (vl == -2)
      return fail(status, 400, e, ERR_INVALID, "parameter 'file' is longer than %d bytes",
                  SERVER_FILE_MAX);
    int ok = jsontext_utf8_valid(p->file, (size_t)vl);
    for (long k = 0; k < vl && ok; k++) ok = (unsigned char)p->file[k] >= 0x20 && p->file[k] != 0x7f;
    if (!ok) {
      p->file[0] = 0;
      return fail(status, 400, e, ERR_INVALID, "parameter 'file' must be printable UTF-8");
    }
    if (file_name_bad(p->file, status, e)) {
      p->file[0] = 0;
      return e->code;
    }
    i = j + 1;
  }
  return 0;
}

/* A parameter given twice (?limit=1&limit=5): refused, naming it, rather
** than one of the two taken silently. Keys compare as decoded. */
static int twice_param(const char *q, size_t qlen, int *status, err_t *e) {
  char keys[16][32];
  int n = 0;
  for (size_t i = 0, j, eq; i < qlen && n < 16; i = j + 1) {
    split_param(q, qlen, i, &j, &eq);
    if (j == i) continue;
    long kl = pct_decode(q + i, eq - i, keys[n], sizeof keys[n], 1);
    if (kl <= 0 || (size_t)kl != strlen(keys[n])) continue; /* the handler refuses it */
    for (int k = 0; k < n; k++) {
      if (strcmp(keys[k], keys[n])) continue;
      char shown[80];
      printable(shown, sizeof shown, keys[n], (size_t)kl);
      return fail(status, 400, e, ERR_INVALID, "parameter '%s' is given twice: give it once", shown);
    }
    n++;
  }
  return 0;
}

/* ---- the route table -------------------------------------------------- */

/* See server_route.h. */
void server_plan_free(struct server_plan *p) {
  cJSON_Delete(p->events);
  free(p->data);
  p->events = NULL;
  p->data = NULL;
}

/* PUT /v1/skills/{id}: the body is the skill's source, and ?file= names
** its file. */
static int route_put_skill(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  if (r->blen == 0)
    return fail(status, 400, e, ERR_INVALID, "the body is empty: PUT /v1/skills/{id} takes "
                "the skill's Lua source");
  p->source = r->body;
  p->source_len = r->blen;
  return route_file(r, p, status, e);
}

/* GET /v1/skills/{id}/stats: the figures of the skill of the path. */
static int route_skill_stats(const struct req *r, struct server_plan *p, int *status, err_t *e) {
  int rc = route_stats(r, p, status, e);
  p->stats.skill = p->id;
  return rc;
}

/* What names a path's {id}: a run (a ULID), a skill, a version (a hash). */
enum id_kind { ID_NONE, ID_RUN, ID_SKILL, ID_VERSION };

/* The API, one route per method and path (DESIGN.md's HTTP API; the table
** at the top of this file). A pattern's "{id}" or "{hash}" segment is the
** id of the route's kind; GET takes HEAD too. Dispatch and the Allow
** header of a 405 (the methods of every route of the path, in this order)
** come from here; the handler reads the query and the body into the plan,
** whose body kind server_check_type holds the Content-Type to. */
static const struct route {
  const char *method, *pattern;
  enum id_kind id;
  enum server_op op;
  enum server_body body;
  int (*handler)(const struct req *r, struct server_plan *p, int *status, err_t *e);
} routes[] = {
  {"GET", "/", ID_NONE, SERVER_OP_INDEX, SERVER_BODY_NONE, NULL},
  {"GET", "/metrics", ID_NONE, SERVER_OP_METRICS, SERVER_BODY_NONE, NULL},
  {"GET", "/v1/runs", ID_NONE, SERVER_OP_LIST_RUNS, SERVER_BODY_NONE, route_list},
  {"GET", "/v1/runs/{id}", ID_RUN, SERVER_OP_GET_RUN, SERVER_BODY_NONE, route_run_query},
  {"POST", "/v1/runs/{id}/cancel", ID_RUN, SERVER_OP_CANCEL, SERVER_BODY_JSON, route_no_body},
  {"POST", "/v1/runs/{id}/rerun", ID_RUN, SERVER_OP_RERUN, SERVER_BODY_JSON, route_rerun},
  {"GET", "/v1/events", ID_NONE, SERVER_OP_LIST_EVENTS, SERVER_BODY_NONE, route_events_list},
  {"POST", "/v1/events", ID_NONE, SERVER_OP_EVENTS, SERVER_BODY_JSON, route_events},
  {"GET", "/v1/stats", ID_NONE, SERVER_OP_STATS, SERVER_BODY_NONE, route_stats},
  {"GET", "/v1/skills", ID_NONE, SERVER_OP_LIST_SKILLS, SERVER_BODY_NONE, NULL},
  {"GET", "/v1/skills/{id}", ID_SKILL, SERVER_OP_GET_SKILL, SERVER_BODY_NONE, NULL},
  {"PUT", "/v1/skills/{id}", ID_SKILL, SERVER_OP_PUT_SKILL, SERVER_BODY_LUA, route_put_skill},
  {"DELETE", "/v1/skills/{id}", ID_SKILL, SERVER_OP_DELETE_SKILL, SERVER_BODY_NONE, route_file},
  {"GET", "/v1/skills/{id}/stats", ID_SKILL, SERVER_OP_SKILL_STATS, SERVER_BODY_NONE,
   route_skill_stats},
  {"POST", "/v1/skills/{id}/invoke", ID_SKILL, SERVER_OP_INVOKE, SERVER_BODY_JSON, route_invoke},
  {"GET", "/v1/versions/{hash}", ID_VERSION, SERVER_OP_GET_VERSION, SERVER_BODY_NONE, NULL},
};
#define NROUTES (sizeof routes / sizeof routes[0])

/* Whether the decoded segments match pattern ("{...}" matches any one). */
static int path_matches(const char *pattern, const struct seg *segs, int nseg) {
  const char *at = pattern + 1; /* past the leading '/' */
  for (int k = 0; k < nseg; k++) {
    size_t n = strcspn(at, "/");
    if (n == 0) return 0; /* the pattern ends first */
    if (at[0] != '{' && (segs[k].len != n || memcmp(segs[k].s, at, n))) return 0;
    at += n;
    if (*at == '/') at++;
  }
  return *at == 0;
}

/* Whether a route of method m takes a request's method (GET takes HEAD). */
static int takes_method(const char *m, const char *method, size_t mlen) {
  return is_method(method, mlen, m) || (!strcmp(m, "GET") && is_method(method, mlen, "HEAD"));
}

/* Whether the path's id of kind k is well formed; else the answer: 404
** (no such thing), 400 for the id of a skill being put. */
static int check_id(enum id_kind k, const struct seg *s, enum server_op op, int *status,
                    err_t *e) {
  char id[80];
  printable(id, sizeof id, s->s, s->len);
  if (k == ID_VERSION) {
    if (s->too_long || !is_version(s->s, s->len))
      return fail(status, 404, e, ERR_NOTFOUND, "no skill version '%s': a version is the 64 "
                  "lowercase hex digits of its source's SHA-256", id);
    return 0;
  }
  int skill = k == ID_SKILL;
  if (!s->too_long && (skill ? is_skill_id(s->s, s->len) : is_run_id(s->s, s->len))) return 0;
  if (op == SERVER_OP_PUT_SKILL)
    return fail(status, 400, e, ERR_INVALID, "bad skill id '%s': it must match "
                "[a-z0-9][a-z0-9._-]* and have at most %d characters", id, SERVER_ID_MAX);
  if (s->too_long)
    return fail(status, 404, e, ERR_NOTFOUND, "no %s has an id that long (over %d bytes)",
                skill ? "skill" : "run", SERVER_ID_MAX * 3);
  if (skill) return fail(status, 404, e, ERR_NOTFOUND, "no skill '%s' is registered", id);
  return fail(status, 404, e, ERR_NOTFOUND, "no run with id '%s'", id);
}

/* See server_route.h. */
int server_route(const char *method, size_t mlen, const char *target, size_t tlen,
                 const char *body, size_t blen, const struct server_limits *lim, int64_t now_ms,
                 struct server_plan *p, int *status, err_t *e) {
  memset(p, 0, sizeof *p);
  struct server_limits dl = {.event_limit = 1 << 20, .body_max = SERVER_BODY_MAX};
  if (!lim) lim = &dl;
  size_t body_max = lim->body_max ? lim->body_max : SERVER_BODY_MAX;
  if (!body) blen = 0, body = "";
  *status = 200;

  /* Split the target into path and query, and the path into decoded segments. */
  size_t plen = 0;
  while (plen < tlen && target[plen] != '?' && target[plen] != '#') plen++;
  int has_q = plen < tlen && target[plen] == '?';
  const char *q = has_q ? target + plen + 1 : "";
  size_t qlen = has_q ? tlen - plen - 1 : 0; /* "?" alone: q points at the end, qlen 0 */
  for (size_t k = 0; k < qlen; k++)
    if (q[k] == '#') qlen = k;
  char shown[80];
  printable(shown, sizeof shown, target, plen);
  if (plen == 0 || target[0] != '/')
    return fail(status, 404, e, ERR_NOTFOUND, "no such path: '%s'", shown);
  size_t end = plen;
  if (end > 1 && target[end - 1] == '/') end--;
  struct seg segs[MAX_SEGMENTS];
  int nseg = 0;
  size_t i = 1;
  while (i < end) {
    size_t j = i;
    while (j < end && target[j] != '/') j++;
    if (nseg == MAX_SEGMENTS)
      return fail(status, 404, e, ERR_NOTFOUND, "no such path: '%s'", shown);
    long n = pct_decode(target + i, j - i, segs[nseg].s, sizeof segs[nseg].s, 0);
    if (n == -1)
      return fail(status, 400, e, ERR_INVALID, "malformed percent-encoding in the path '%s'",
                  shown);
    segs[nseg].too_long = n == -2;
    segs[nseg].len = n < 0 ? 0 : (size_t)n;
    nseg++;
    i = j + 1;
  }
  p->head = is_method(method, mlen, "HEAD");

  /* The route of the path and method; the path's other methods make the
  ** Allow header of a 405. */
  const struct route *rt = NULL, *path = NULL;
  for (size_t k = 0; k < NROUTES && !rt; k++) {
    if (path ? strcmp(path->pattern, routes[k].pattern) /* only one path matches */
             : !path_matches(routes[k].pattern, segs, nseg))
      continue;
    if (!path) path = &routes[k];
    if (takes_method(routes[k].method, method, mlen)) rt = &routes[k];
  }
  if (!path)
    return fail(status, 404, e, ERR_NOTFOUND, "no such path: '%s' (the API is under /v1: "
                "runs, events, skills, versions, stats)", shown);
  if (!rt) {
    for (const struct route *k = path; k < routes + NROUTES; k++) {
      if (strcmp(path->pattern, k->pattern)) continue;
      size_t at = strlen(p->allow);
      snprintf(p->allow + at, sizeof p->allow - at, "%s%s%s", at ? ", " : "", k->method,
               strcmp(k->method, "GET") ? "" : ", HEAD");
    }
    char m[80];
    printable(m, sizeof m, method, mlen);
    return fail(status, 405, e, ERR_INVALID, "%s is not allowed on %s (allowed: %s)", m,
                path->pattern, p->allow);
  }

  if (rt->id) {
    /* The id is the path's one placeholder: the segment where the pattern has it. */
    int at = 0;
    for (const char *c = rt->pattern + 1; *c != '{'; c++) at += *c == '/';
    if (check_id(rt->id, &segs[at], rt->op, status, e)) return e->code;
    memcpy(p->id, segs[at].s, segs[at].len);
    p->id[segs[at].len] = 0;
  }
  p->op = rt->op;
  p->body = rt->body;

  if (blen > body_max) {
    char a[32], b[32];
    units_fmt_over((int64_t)blen, (int64_t)body_max, a, b, sizeof a);
    p->op = SERVER_OP_NONE;
    return fail(status, 413, e, ERR_TOOBIG, "the body is %s, over the limit of %s", a, b);
  }
  struct req r = {.q = q, .qlen = qlen, .body = body, .blen = blen, .lim = lim, .now_ms = now_ms};
  int rc = twice_param(q, qlen, status, e);
  if (!rc && rt->handler) rc = rt->handler(&r, p, status, e);
  if (rc) {
    server_plan_free(p);
    p->op = SERVER_OP_NONE;
  }
  return rc;
}

/* See server_route.h. */
int server_route_check(const char *method, const char *path, const char *body, size_t len,
                       int *status, err_t *e) {
  struct server_plan p;
  struct server_limits lim = {.event_limit = 1 << 20, .body_max = SERVER_BODY_MAX};
  int rc = server_route(method, strlen(method), path, strlen(path), body, len, &lim,
                        units_now_ms(), &p, status, e);
  server_plan_free(&p);
  return rc;
}
