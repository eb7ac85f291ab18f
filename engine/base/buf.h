/*
** buf.h: a growable byte buffer, always NUL-terminated. Used to build text
** (JSON, tables for the terminal, SQL lists) without fixed-size arrays.
** Growing it cannot fail: it allocates through base/mem.h.
*/
#ifndef ML_BUF_H
#define ML_BUF_H
#include <stddef.h>
#include <string.h>

typedef struct buf {
  char *p;      /* NUL-terminated contents, or NULL while empty */
  size_t len;
  size_t cap;
} buf_t;

#define BUF_INIT {NULL, 0, 0}

/* Make room for n more bytes at once (a caller that knows about how much
** it writes saves the doublings). */
void buf_reserve(buf_t *b, size_t n);
/* Append n bytes. Inline while there is room: JSON answers are written a
** few bytes at a time. */
void buf__add_grow(buf_t *b, const void *s, size_t n);
static inline void buf_add(buf_t *b, const void *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    buf__add_grow(b, s, n);
    return;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}
/* Append a string literal (its length known at compile time). */
#define BUF_LIT(b, lit) buf_add((b), (lit), sizeof(lit) - 1)
/* Append a NUL-terminated string. */
void buf_puts(buf_t *b, const char *s);
/* Append printf-style formatted text. */
void buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Contents as a C string ("" while empty); stays owned by b. */
const char *buf_str(const buf_t *b);
/* Take the contents (caller frees) and reset b. Never NULL. */
char *buf_take(buf_t *b);
void buf_reset(buf_t *b);
void buf_free(buf_t *b);

#endif
