/*
** test_watcher.c: the workspace watcher against a recording registry (a
** sink that notes every op and answers ok a millisecond later), on a real
** folder with real file events: which files count, the first scan's
** batches (one load per id), a rename's unload before its load in one
** batch, quick writes ending on the last content, an id that moved.
*/
#include "test.h"

#include "base/ids.h"
#include "core/engine.h"
#include "sidecar/watcher.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_OPS 256

struct rec {
  enum watcher_op_kind kind;
  char rel[128], id[64], version[65];
  int batch;
};

static struct {
  uv_loop_t loop;
  uv_timer_t answer;
  struct engine rt;
  char dir[256];
  struct rec ops[MAX_OPS];
  void *tokens[MAX_OPS];
  int nops, nwaiting, batch, ready, loaded;
} T;

static void answer_all(uv_timer_t *t) {
  (void)t;
  int n = T.nwaiting;
  T.nwaiting = 0;
  T.batch++;
  for (int i = 0; i < n; i++) {
    struct watcher_result r = {0, NULL, NULL};
    watcher_done(T.tokens[i], &r);
  }
}

static int submit(void *ud, const struct watcher_op *op, void *token, err_t *e) {
  (void)ud, (void)e;
  if (T.nops < MAX_OPS) {
    struct rec *r = &T.ops[T.nops++];
    r->kind = op->kind;
    snprintf(r->rel, sizeof r->rel, "%s", op->rel);
    snprintf(r->id, sizeof r->id, "%s", op->id ? op->id : op->fallback_id ? op->fallback_id : "");
    snprintf(r->version, sizeof r->version, "%s", op->version ? op->version : "");
    r->batch = T.batch;
  }
  T.tokens[T.nwaiting++] = token;
  uv_timer_start(&T.answer, answer_all, 1, 0);
  return 0;
}

static void on_ready(void *arg, int loaded, int rejected) {
  (void)arg, (void)rejected;
  T.ready = 1;
  T.loaded = loaded;
}

/* Run the loop for ms milliseconds. */
static void spin(int ms) {
  uint64_t end = uv_hrtime() + (uint64_t)ms * 1000000;
  while (uv_hrtime() < end) {
    uv_update_time(&T.loop);
    uv_run(&T.loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
}

static void put(const char *rel, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", T.dir, rel);
  FILE *f = fopen(p, "w");
  fputs(text, f);
  fclose(f);
}

static void skill(const char *rel, const char *id, const char *mark) {
  char src[256];
  snprintf(src, sizeof src, "return { id = \"%s\", run = function() return \"%s\" end }\n", id,
           mark);
  put(rel, src);
}

static const struct rec *find(const char *rel, enum watcher_op_kind kind, int from) {
  for (int i = from; i < T.nops; i++)
    if (!strcmp(T.ops[i].rel, rel) && T.ops[i].kind == kind) return &T.ops[i];
  return NULL;
}

static watcher_t *start(void) {
  struct watcher_opts o = {
    .loop = &T.loop, .root = T.dir, .skills = T.rt.skills,
    .sink = {.ud = NULL, .submit = submit}, .on_ready = on_ready,
  };
  watcher_t *w = NULL;
  err_t e;
  CHECK(watcher_start(&o, &w, &e) == 0);
  return w;
}

TEST(which_files_count) {
  CHECK(watcher_counts("a.lua"));
  CHECK(watcher_counts("health_check.lua"));
  CHECK(!watcher_counts(".a.lua"));
  CHECK(!watcher_counts(".#a.lua"));
  CHECK(!watcher_counts("#a.lua#"));
  CHECK(!watcher_counts("a.lua~"));
  CHECK(!watcher_counts("a.lua.swp"));
  CHECK(!watcher_counts("a.lua.tmp"));
  CHECK(!watcher_counts("a.tmp"));
  CHECK(!watcher_counts(".lua"));
}

TEST(batches_renames_quick_writes_and_moved_ids) {
  skill("a.lua", "x", "a");
  skill("b.lua", "x", "b");
  skill("c.lua", "c", "c");
  put(".hidden.lua", "not lua {{");
  put("c.lua~", "not lua {{");
  watcher_t *w = start();
  for (int i = 0; i < 200 && !T.ready; i++) spin(5);
  CHECK(T.ready);
  CHECK_INT_EQ(T.loaded, 3);
  /* First scan: a (x) and c together; b, which claims x too, in the next batch. */
  const struct rec *a = find("a.lua", WATCHER_LOAD, 0), *b = find("b.lua", WATCHER_LOAD, 0),
                   *c = find("c.lua", WATCHER_LOAD, 0);
  CHECK(a && b && c);
  if (a && b && c) {
    CHECK_STR_EQ(a->id, "x");
    CHECK_INT_EQ(a->batch, c->batch);
    CHECK_INT_EQ(b->batch, a->batch + 1);
  }
  CHECK(!find(".hidden.lua", WATCHER_LOAD, 0) && !find("c.lua~", WATCHER_LOAD, 0));

  /* A rename: the old name lets go of x before the new one takes it, in one batch. */
  int mark = T.nops;
  char from[512], to[512];
  snprintf(from, sizeof from, "%s/a.lua", T.dir);
  snprintf(to, sizeof to, "%s/z.lua", T.dir);
  CHECK(rename(from, to) == 0);
  spin(400);
  const struct rec *un = find("a.lua", WATCHER_UNLOAD, mark), *ld = find("z.lua", WATCHER_LOAD, mark);
  CHECK(un && ld);
  if (un && ld) {
    CHECK(un < ld);
    CHECK_INT_EQ(un->batch, ld->batch);
    CHECK_STR_EQ(un->id, "x");
  }

  /* Twenty quick writes: the last content is what gets loaded. */
  mark = T.nops;
  char src[256];
  for (int i = 0; i < 20; i++) {
    snprintf(src, sizeof src, "return { id = \"c\", run = function() return %d end }\n", i);
    put("c.lua", src);
    usleep(4000);
  }
  spin(500);
  int loads = 0;
  const struct rec *last = NULL;
  for (int i = mark; i < T.nops; i++)
    if (!strcmp(T.ops[i].rel, "c.lua")) loads++, last = &T.ops[i];
  char want[65];
  ids_sha256_hex(src, strlen(src), want);
  CHECK(loads >= 1 && loads <= 3); /* debounced: not one per write (3: a slow machine's pauses) */
  CHECK(last && !strcmp(last->version, want));

  /* Unchanged content: nothing. */
  mark = T.nops;
  put("c.lua", src);
  spin(300);
  CHECK_INT_EQ(T.nops, mark);

  /* A file that declares another id: load the new one, then unload the old one. */
  skill("c.lua", "c2", "moved");
  spin(400);
  const struct rec *nl = find("c.lua", WATCHER_LOAD, mark), *ou = find("c.lua", WATCHER_UNLOAD, mark);
  CHECK(nl && ou);
  if (nl && ou) {
    CHECK_STR_EQ(nl->id, "c2");
    CHECK_STR_EQ(ou->id, "c");
    CHECK(ou->batch > nl->batch);
  }
  watcher_stop(w);
  spin(20);
  watcher_free(w);
}

int main(void) {
  snprintf(T.dir, sizeof T.dir, "/tmp/mltest-watcher-XXXXXX");
  if (!mkdtemp(T.dir)) return 1;
  struct config cfg;
  err_t e;
  if (config_load(&cfg, NULL, &e)) {
    fprintf(stderr, "config: %s\n", e.msg);
    return 1;
  }
  memset(&T.rt, 0, sizeof T.rt);
  if (engine_open_runtime(&T.rt, &cfg, &e) || lrt_boot(T.rt.lrt, &e)) {
    fprintf(stderr, "runtime: %s\n", e.msg);
    return 1;
  }
  uv_loop_init(&T.loop);
  uv_timer_init(&T.loop, &T.answer);
  RUN(which_files_count);
  RUN(batches_renames_quick_writes_and_moved_ids);
  uv_close((uv_handle_t *)&T.answer, NULL);
  uv_run(&T.loop, UV_RUN_DEFAULT);
  uv_loop_close(&T.loop);
  engine_close(&T.rt);
  config_free(&cfg);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", T.dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", T.dir);
  return test_summary();
}
