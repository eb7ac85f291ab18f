/*
** remote.c: one blocking request to a running engine's HTTP API (see
** remote.h), with libcurl's easy interface.
*/
#include "core/remote.h"
#include "base/mem.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONNECT_TIMEOUT_S 10L
#define TOTAL_TIMEOUT_S 330L  /* the longest wait the API allows, and a margin */

struct answer_buf {
  char *p;
  size_t len;
};

/* libcurl's write callback: gather the answer's body. */
static size_t on_data(char *ptr, size_t size, size_t n, void *arg) {
  struct answer_buf *b = arg;
  size_t add = size * n;
  char *np = mem_realloc(b->p, b->len + add + 1);
  memcpy(np + b->len, ptr, add);
  b->len += add;
  np[b->len] = 0;
  b->p = np;
  return add;
}

/* The ERR_* code for an HTTP error status. */
static int code_of_status(long status) {
  switch (status) {
  case 400: return ERR_INVALID;
  case 401: return ERR_AUTH;
  case 403: return ERR_AUTH;    /* a Host the engine does not answer (allowed_hosts) */
  case 404: return ERR_NOTFOUND;
  case 405: return ERR_INVALID;
  case 415: return ERR_INVALID;
  case 409: return ERR_CONFLICT;
  case 413: return ERR_TOOBIG;
  case 503: return ERR_BUSY;
  default: return ERR_INTERNAL;
  }
}

/* See remote.h. */
int remote_call(const struct config *cfg, const char *method, const char *path,
                const char *body, long *status, cJSON **answer, err_t *e) {
  *status = 0;
  if (answer) *answer = NULL;
  const char *base = cfg->server ? cfg->server : "";
  if (strncmp(base, "http://", 7) && strncmp(base, "https://", 8))
    return err_set(e, ERR_INVALID, "--server must be a URL such as http://127.0.0.1:8288, "
                   "got '%s'", base);
  size_t bl = strlen(base);
  while (bl && base[bl - 1] == '/') bl--;
  size_t ul = bl + strlen(path) + 1;
  char *url = mem_alloc(ul);
  snprintf(url, ul, "%.*s%s", (int)bl, base, path);

  CURL *h = curl_easy_init();
  if (!h) mem_oom(ul); /* only on a failed allocation (libcurl allocates through base/mem.h) */
  struct curl_slist *hdrs = NULL;
  char auth[1024];
  const char *tok = cfg->token_env ? getenv(cfg->token_env) : NULL;
  if (tok && *tok) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
    hdrs = curl_slist_append(hdrs, auth);
  }
  hdrs = curl_slist_append(hdrs, "Accept: application/json");
  hdrs = curl_slist_append(hdrs, "Expect:");
  if (body)
    hdrs = curl_slist_append(hdrs, !strcmp(method, "PUT") ? "Content-Type: text/x-lua; charset=utf-8"
                                                          : "Content-Type: application/json");
  struct answer_buf buf = {0};
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, TOTAL_TIMEOUT_S);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &buf);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "moonloop-cli");
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
  } else if (!strcmp(method, "HEAD")) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  }
  CURLcode cc = curl_easy_perform(h);
  int rc = 0;
  if (cc != CURLE_OK) {
    rc = err_set(e, ERR_IO, "cannot reach the engine at %.*s: %s", (int)bl, base,
                 *errbuf ? errbuf : curl_easy_strerror(cc));
  } else {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    cJSON *v = buf.p ? cJSON_ParseWithLength(buf.p, buf.len) : NULL;
    if (*status < 200 || *status >= 300) {
      cJSON *er = cJSON_GetObjectItemCaseSensitive(v, "error");
      cJSON *msg = cJSON_GetObjectItemCaseSensitive(er, "message");
      rc = code_of_status(*status);
      if (cJSON_IsString(msg)) err_set(e, rc, "%s", msg->valuestring);
      else err_set(e, rc, "the engine at %.*s answered HTTP %ld", (int)bl, base, *status);
      if (*status == 401 && e)
        err_prefix(e, "the engine at %.*s wants a token (set %s)", (int)bl, base,
                   cfg->token_env ? cfg->token_env : "MOONLOOP_TOKEN");
    }
    if (answer) *answer = v;
    else cJSON_Delete(v);
  }
  free(buf.p);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(h);
  free(url);
  return rc;
}
