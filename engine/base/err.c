/*
** err.c: filling and naming error records (see err.h).
*/
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int err_set(err_t *e, int code, const char *fmt, ...) {
  if (e) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->code = code;
  }
  return code;
}

int err_prefix(err_t *e, const char *fmt, ...) {
  if (!e) return ERR_INTERNAL;
  char pre[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  size_t np = strlen(pre), cap = sizeof e->msg;
  if (np + 2 >= cap) np = cap - 3;
  /* Shift the old message right, keeping it NUL-terminated, then write the prefix. */
  size_t nold = strlen(e->msg);
  if (np + 2 + nold >= cap) nold = cap - np - 3;
  memmove(e->msg + np + 2, e->msg, nold);
  e->msg[np + 2 + nold] = 0;
  memcpy(e->msg, pre, np);
  e->msg[np] = ':';
  e->msg[np + 1] = ' ';
  return e->code;
}

const char *err_name(int code) {
  switch (code) {
  case ERR_OK: return "ok";
  case ERR_INVALID: return "invalid";
  case ERR_NOTFOUND: return "not_found";
  case ERR_CONFLICT: return "conflict";
  case ERR_TOOBIG: return "too_large";
  case ERR_IO: return "io";
  case ERR_BUSY: return "busy";
  case ERR_NOMEM: return "no_memory";
  case ERR_AUTH: return "unauthenticated";
  default: return "internal";
  }
}
