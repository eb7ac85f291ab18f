/* store_pg.c: the PostgreSQL store: not there yet. */
#include "store/store_backend.h"

/* See store_backend.h. */
int store__pg_open(const char *url, enum store_durability d, store_t **out, err_t *e) {
  (void)url, (void)d, (void)out;
  return err_set(e, ERR_INVALID, "this moonloop has no PostgreSQL store yet");
}
