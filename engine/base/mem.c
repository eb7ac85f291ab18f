/*
** mem.c: allocation that never returns NULL (see mem.h for the policy).
*/
#include "base/mem.h"
#include "base/fault.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* See mem.h. The message is written with one write(2) from a stack buffer:
** stdio could want memory itself. */
_Noreturn void mem_oom(size_t n) {
  char msg[320];
  int len = snprintf(msg, sizeof msg,
                     "moonloop: out of memory (the system refused %zu bytes): stopping now. "
                     "Everything acknowledged is durable; a restarted engine resumes every "
                     "unfinished run from its journal.\n", n);
  if (len > 0) {
    ssize_t w = write(2, msg, (size_t)len < sizeof msg ? (size_t)len : sizeof msg - 1);
    (void)w;
  }
  abort();
}

/* Each checks the test fault "alloc_fail" too: it makes the allocation
** fail as the system would (base/fault.h). */
void *mem_alloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p || fault_hit(FAULT_ALLOC_FAIL)) mem_oom(n);
  return p;
}

void *mem_calloc(size_t count, size_t size) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p || fault_hit(FAULT_ALLOC_FAIL)) mem_oom(count * size);
  return p;
}

void *mem_realloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q || fault_hit(FAULT_ALLOC_FAIL)) mem_oom(n);
  return q;
}

char *mem_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = mem_alloc(n);
  memcpy(p, s, n);
  return p;
}

char *mem_strndup(const char *s, size_t n) {
  size_t len = strnlen(s, n);
  char *p = mem_alloc(len + 1);
  memcpy(p, s, len);
  p[len] = 0;
  return p;
}

char *mem_vprintf(const char *fmt, va_list ap) {
  va_list again;
  va_copy(again, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  if (n < 0) n = 0; /* an encoding error: an empty string, as there is nothing to show */
  char *p = mem_alloc((size_t)n + 1);
  if (n) vsnprintf(p, (size_t)n + 1, fmt, again);
  else p[0] = 0;
  va_end(again);
  return p;
}

char *mem_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *p = mem_vprintf(fmt, ap);
  va_end(ap);
  return p;
}

/* The bound on cJSON's allocations of this thread (mem_json_bound). */
static _Thread_local size_t json_cap, json_used;
static _Thread_local int json_hit;

/* cJSON's hook: a block of n bytes, or NULL past the bound. A block is
** counted with the allocator's own 16 bytes of header. */
static void *cjson_alloc(size_t n) {
  if (json_cap) {
    if (json_hit || json_used > json_cap || n + 16 > json_cap - json_used) {
      json_hit = 1;
      return NULL;
    }
    json_used += n + 16;
  }
  return mem_alloc(n);
}

/* See mem.h. */
void mem_json_bound(size_t cap) {
  json_cap = cap;
  json_used = 0;
  json_hit = 0;
}

int mem_json_bound_hit(void) { return json_hit; }

/* See mem.h. cJSON, given hooks, grows its print buffers by copying
** instead of realloc: a few bytes copied once per printed value. */
void mem_init(void) {
  cJSON_Hooks h = {.malloc_fn = cjson_alloc, .free_fn = free};
  cJSON_InitHooks(&h);
}
