/*
** web.h: the dashboard's files (web/index.html, web/app.js, web/style.css),
** compiled into the binary by cmake/embed_web.cmake and served by the HTTP
** API at GET / (index.html), /app.js and /style.css.
**
** The files are static: they hold no data, only the page that fetches
** /v1/... with the token the user types (so they are served without one; see
** server.h). Each has a strong ETag (a prefix of its SHA-256), so a browser
** revalidates with If-None-Match and gets a 304 until the binary changes.
** The table ends with a NULL path.
*/
#ifndef ML_WEB_H
#define ML_WEB_H
#include <stddef.h>

struct web_file {
  const char *path;          /* "/" for index.html, else "/NAME" */
  const char *ctype;         /* Content-Type */
  const unsigned char *data; /* the bytes (NUL-terminated, not counted in len) */
  size_t len;
  const char *etag;          /* "\"<16 hex digits>\"", quotes included */
};

extern const struct web_file web_files[];

/* The file served at path (len bytes, no query), or NULL. */
const struct web_file *web_find(const char *path, size_t len);

/* Whether an If-None-Match header value (a list of ETags, or "*") names
** etag. Weak validators (W/"...") match too, as RFC 9110 says for GET. */
int web_etag_matches(const char *header, size_t hlen, const char *etag);

#endif
