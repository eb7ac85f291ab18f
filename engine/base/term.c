/*
** term.c: escaping text from skills for the terminal (see term.h).
*/
#include "base/term.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s (at most len bytes) and its
** code point, or 0 when s does not start one (overlong forms, surrogates
** and values past U+10FFFF are not valid). */
static size_t utf8_seq(const unsigned char *s, size_t len, uint32_t *cp) {
  unsigned char c = s[0];
  size_t n;
  uint32_t v, min;
  if (c < 0x80) return *cp = c, 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2, v = c & 0x1f, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef) n = 3, v = c & 0x0f, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, v = c & 0x07, min = 0x10000;
  else return 0;
  if (len < n) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cp = v;
  return n;
}

/* Whether a code point is one that term.h says to escape. */
static int dangerous(uint32_t cp) {
  if (cp < 0x20) return cp != '\n' && cp != '\t';
  if (cp == 0x7f) return 1;
  if (cp >= 0x80 && cp <= 0x9f) return 1;
  return cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

/* See term.h. */
int term_is_clean(const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    size_t n = utf8_seq(p + i, len - i, &cp);
    if (!n || dangerous(cp)) return 0;
    i += n;
  }
  return 1;
}

/* See term.h. */
void term_escape(buf_t *b, const char *s, size_t len, int json) {
  const unsigned char *p = (const unsigned char *)s;
  size_t run = 0; /* start of the clean stretch not yet appended */
  for (size_t i = 0; i < len;) {
    uint32_t cp = 0;
    size_t n = utf8_seq(p + i, len - i, &cp);
    if (n && !dangerous(cp)) {
      i += n;
      continue;
    }
    if (i > run) buf_add(b, s + run, i - run);
    char esc[16];
    /* A byte that is not UTF-8 cannot be in JSON text: there it is
    ** U+FFFD, as the API's answers show it. */
    if (!n && json) snprintf(esc, sizeof esc, "\\ufffd"), n = 1;
    else if (!n) snprintf(esc, sizeof esc, "\\x%02x", p[i]), n = 1;
    else if (cp < 0x80 && !json) snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
    else snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
    buf_puts(b, esc);
    i += n;
    run = i;
  }
  if (len > run) buf_add(b, s + run, len - run);
}

/* See term.h. */
char *term_dup(const char *s, int json) {
  if (!s) return NULL;
  buf_t b = BUF_INIT;
  term_escape(&b, s, strlen(s), json);
  return buf_take(&b);
}

/* See term.h. */
void term_fputs(const char *s, FILE *f, int json) {
  if (!s) return;
  size_t len = strlen(s);
  if (term_is_clean(s, len)) {
    fwrite(s, 1, len, f);
    return;
  }
  buf_t b = BUF_INIT;
  term_escape(&b, s, len, json);
  fwrite(buf_str(&b), 1, b.len, f);
  buf_free(&b);
}

/* See term.h. */
int term_printf(FILE *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = mem_vprintf(fmt, ap);
  va_end(ap);
  term_fputs(s, f, 0);
  int n = (int)strlen(s);
  free(s);
  return n;
}

/* See term.h. */
const char *term_str(struct term_strs *a, const char *s) {
  if (!s || term_is_clean(s, strlen(s))) return s;
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 8;
    a->v = mem_realloc(a->v, cap * sizeof *a->v);
    a->cap = cap;
  }
  char *e = term_dup(s, 0);
  a->v[a->n++] = e;
  return e;
}

/* See term.h. */
void term_strs_free(struct term_strs *a) {
  for (size_t i = 0; i < a->n; i++) free(a->v[i]);
  free(a->v);
  memset(a, 0, sizeof *a);
}
