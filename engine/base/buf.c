/*
** buf.c: growable NUL-terminated byte buffer (see buf.h).
*/
#include "base/buf.h"
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int buf_grow(buf_t *b, size_t need) {
  if (b->len + need + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + need + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) return ERR_NOMEM;
  b->p = p;
  b->cap = cap;
  return 0;
}

int buf_reserve(buf_t *b, size_t n) { return buf_grow(b, n); }

/* See buf.h: buf_add when the buffer must grow first. */
int buf__add_grow(buf_t *b, const void *s, size_t n) {
  if (buf_grow(b, n)) return ERR_NOMEM;
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
  return 0;
}

int buf_puts(buf_t *b, const char *s) { return buf_add(b, s, strlen(s)); }

int buf_printf(buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || buf_grow(b, (size_t)n)) return ERR_NOMEM;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

const char *buf_str(const buf_t *b) { return b->p ? b->p : ""; }

char *buf_take(buf_t *b) {
  char *p = b->p ? b->p : strdup("");
  b->p = NULL;
  b->len = b->cap = 0;
  return p;
}

void buf_reset(buf_t *b) {
  b->len = 0;
  if (b->p) b->p[0] = 0;
}

void buf_free(buf_t *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}
