/*
** err.h: the error record. Functions that can fail return 0 on success or a
** negative ERR_* code, and fill an err_t with a message the caller can show
** as it is (it names what is wrong; it never needs the code to make sense).
*/
#ifndef ML_ERR_H
#define ML_ERR_H
#include <stddef.h>

enum {
  ERR_OK = 0,
  ERR_INVALID = -1,   /* bad input: usage, malformed JSON, broken Lua */
  ERR_NOTFOUND = -2,  /* unknown skill, run, file */
  ERR_CONFLICT = -3,  /* state forbids it: run already finished, lease held */
  ERR_TOOBIG = -4,    /* over a configured size limit */
  ERR_IO = -5,        /* the store or the file system failed */
  ERR_BUSY = -6,      /* try again later */
  ERR_NOMEM = -7,     /* a Lua state over its memory budget (the engine's own allocations
                      ** never fail: base/mem.h) */
  ERR_AUTH = -8,
  ERR_INTERNAL = -9,
};

typedef struct err {
  int code;
  char msg[1024];
} err_t;

/* Fill e (which may be NULL) with code and a printf-style message; returns code. */
int err_set(err_t *e, int code, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));

/* Prefix e's message with "prefix: ", keeping its code; returns the code. */
int err_prefix(err_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A short name for a code: "invalid", "not_found", ...; used in API error bodies. */
const char *err_name(int code);

#endif
