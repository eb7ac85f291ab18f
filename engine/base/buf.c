/*
** buf.c: growable NUL-terminated byte buffer (see buf.h).
*/
#include "base/buf.h"
#include "base/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for need more bytes and the NUL, doubling. */
static void buf_grow(buf_t *b, size_t need) {
  if (b->len + need + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + need + 1) cap *= 2;
  b->p = mem_realloc(b->p, cap);
  b->cap = cap;
}

void buf_reserve(buf_t *b, size_t n) { buf_grow(b, n); }

/* See buf.h: buf_add when the buffer must grow first. */
void buf__add_grow(buf_t *b, const void *s, size_t n) {
  buf_grow(b, n);
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void buf_puts(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }

/* See buf.h. A format vsnprintf cannot print (an encoding error) adds
** nothing. */
void buf_printf(buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  buf_grow(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

const char *buf_str(const buf_t *b) { return b->p ? b->p : ""; }

char *buf_take(buf_t *b) {
  char *p = b->p ? b->p : mem_strdup("");
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
