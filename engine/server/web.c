/*
** web.c: finding the dashboard's embedded files and matching their ETags
** (see web.h). The table itself is generated (embedded_web.c).
*/
#include "server/web.h"

#include <string.h>

/* See web.h. */
const struct web_file *web_find(const char *path, size_t len) {
  for (const struct web_file *f = web_files; f->path; f++)
    if (strlen(f->path) == len && !memcmp(f->path, path, len)) return f;
  return NULL;
}

/* See web.h. */
int web_etag_matches(const char *h, size_t hlen, const char *etag) {
  size_t elen = strlen(etag), i = 0;
  while (i < hlen) {
    /* One member of the comma-separated list, without spaces around it. */
    while (i < hlen && (h[i] == ' ' || h[i] == '\t' || h[i] == ',')) i++;
    size_t j = i;
    while (j < hlen && h[j] != ',') j++;
    size_t end = j;
    while (end > i && (h[end - 1] == ' ' || h[end - 1] == '\t')) end--;
    const char *m = h + i;
    size_t mlen = end - i;
    if (mlen == 1 && m[0] == '*') return 1;
    if (mlen > 2 && m[0] == 'W' && m[1] == '/') m += 2, mlen -= 2;
    if (mlen == elen && !memcmp(m, etag, elen)) return 1;
    i = j + 1;
  }
  return 0;
}
