/*
** buf.h: a growable byte buffer, always NUL-terminated. Used to build text
** (JSON, tables for the terminal, SQL lists) without fixed-size arrays.
*/
#ifndef ML_BUF_H
#define ML_BUF_H
#include <stddef.h>

typedef struct buf {
  char *p;      /* NUL-terminated contents, or NULL while empty */
  size_t len;
  size_t cap;
} buf_t;

#define BUF_INIT {NULL, 0, 0}

/* Append n bytes; returns 0 or ERR_NOMEM. */
int buf_add(buf_t *b, const void *s, size_t n);
/* Append a NUL-terminated string. */
int buf_puts(buf_t *b, const char *s);
/* Append printf-style formatted text. */
int buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Contents as a C string ("" while empty); stays owned by b. */
const char *buf_str(const buf_t *b);
/* Take the contents (caller frees) and reset b. Never NULL unless out of memory. */
char *buf_take(buf_t *b);
void buf_reset(buf_t *b);
void buf_free(buf_t *b);

#endif
