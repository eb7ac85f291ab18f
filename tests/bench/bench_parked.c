/*
** bench_parked: many parked runs in one engine.
**
**   N runs (default 100,000) each wait for their own event; the engine
**   keeps at most limits.parked_runs of them in memory (default 10,000) and
**   evicts the rest. Prints the memory per parked run, then the time from
**   sending one run's event to that run's completion: it must not grow
**   with N (waking a run looks it up by index, it does not scan them all).
**
** Usage: bench_parked [runs] [parked_in_memory]
*/
#include "base/ids.h"
#include "base/units.h"
#include "core/engine.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/moonloop-parked-XXXXXX";

static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
  if (f) fclose(f);
  return kb;
}

struct watch {
  struct engine *en;
  int want;
  uv_timer_t t;
  const char *status;
};

static void check(uv_timer_t *t) {
  struct watch *w = t->data;
  struct run_filter f = {.status = w->status};
  int64_t n;
  err_t e;
  if (store_count_runs(w->en->store, &f, &n, &e)) return;
  if (n >= w->want) uv_stop(&w->en->loop);
}

/* Run the loop until `want` runs have `status`. */
static void run_until(struct engine *en, const char *status, int want, int every_ms) {
  struct watch w = {.en = en, .want = want, .status = status};
  uv_timer_init(&en->loop, &w.t);
  w.t.data = &w;
  uv_timer_start(&w.t, check, every_ms, every_ms);
  uv_run(&en->loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&w.t, NULL);
  uv_run(&en->loop, UV_RUN_NOWAIT);
}

struct done {
  int done;
  uint64_t at;
};

static void on_done(const struct sched_result *r, void *arg) {
  (void)r;
  struct done *d = arg;
  d->done = 1;
  d->at = units_mono_ns();
}

static void stop_when_done(uv_timer_t *t) {
  struct done *d = ((void **)t->data)[0];
  struct engine *en = ((void **)t->data)[1];
  if (d->done) uv_stop(&en->loop);
}

int main(int argc, char **argv) {
  engine_process_init(); /* allocation as the binary does it (base/mem.h) */
  int runs = argc > 1 ? atoi(argv[1]) : 100000;
  int in_memory = argc > 2 ? atoi(argv[2]) : 10000;
  if (!mkdtemp(dir)) return 1;
  struct config cfg;
  err_t e;
  config_load(&cfg, NULL, &e);
  char db[256], path[256];
  snprintf(db, sizeof db, "%s/parked.db", dir);
  config_set(&cfg.db, db);
  cfg.durability_full = 0;
  cfg.parked_runs = in_memory;
  struct engine en;
  if (engine_open(&en, &cfg, SCHED_SOLO, 0, &e)) {
    fprintf(stderr, "bench: %s\n", e.msg);
    return 1;
  }
  snprintf(path, sizeof path, "%s/waiter.lua", dir);
  FILE *f = fopen(path, "w");
  fputs("return { run = function(ctx)\n"
        "  ctx.step.run('before', function() return 1 end)\n"
        "  local ev = ctx.step.wait_for_event('go', { event = 'go-' .. ctx.input.i })\n"
        "  return ev.data\n"
        "end }\n", f);
  fclose(f);
  struct skill *s;
  struct skill_error se;
  if (engine_load_file(&en, path, 0, &s, &se) || sched_start(en.sched, &e)) {
    fprintf(stderr, "bench: %s\n", se.err.msg);
    return 1;
  }
  lrt_gc(en.lrt);
  size_t heap0 = lrt_memory(en.lrt);
  size_t used0 = mallinfo2().uordblks;
  long rss0 = rss_kb();
  uint64_t t0 = units_mono_ns();
  char target[27] = "";
  for (int i = 0; i < runs; i++) {
    char id[27], input[64];
    snprintf(input, sizeof input, "{\"i\":%d}", i);
    if (sched_run_new(en.sched, s, NULL, input, NULL, id, &e)) {
      fprintf(stderr, "bench: %s\n", e.msg);
      return 1;
    }
    if (i == runs / 2) memcpy(target, id, sizeof id);
    /* Let the loop take them in batches, as a server would. */
    if (i % 5000 == 4999) uv_run(&en.loop, UV_RUN_NOWAIT);
  }
  run_until(&en, "waiting", runs, 200);
  double secs = (double)(units_mono_ns() - t0) / 1e9;
  lrt_gc(en.lrt);
  malloc_trim(0);
  size_t heap1 = lrt_memory(en.lrt);
  size_t used1 = mallinfo2().uordblks;
  long rss1 = rss_kb();
  printf("%d runs parked waiting for events in %.1f s (%d kept in memory, the rest evicted)\n",
         runs, secs, in_memory);
  printf("  memory in use: %.0f bytes per parked run (%.0f MB in all), of which Lua heap %.0f bytes;\n"
         "  process RSS grew %.0f MB (peak allocations while the runs started are not all returned)\n",
         (double)(used1 - used0) / runs, (double)(used1 - used0) / 1048576.0,
         (double)(heap1 - heap0) / runs, (rss1 - rss0) / 1024.0);
  /* Wake the one in the middle: send its event (what `moonloop send` does). */
  struct done d = {0};
  sched_on_done(en.sched, target, on_done, &d);
  journal_t *j = journal_new();
  char evid[27], name[32];
  ids_ulid(units_now_ms(), evid);
  snprintf(name, sizeof name, "go-%d", runs / 2);
  struct event_row ev = {.id = evid, .name = name, .data = "{\"woke\":true}", .ts = units_now_ms()};
  journal_event(j, &ev);
  uint64_t w0 = units_mono_ns();
  if (store_commit(en.store, j, &e)) return 1;
  journal_free(j);
  uv_timer_t t;
  void *ctx[2] = {&d, &en};
  uv_timer_init(&en.loop, &t);
  t.data = ctx;
  uv_timer_start(&t, stop_when_done, 1, 1);
  uv_run(&en.loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  printf("  waking one run among them: %.1f ms from its event's commit to the run's end "
         "(includes the 50 ms poll of other processes' writes)\n",
         d.done ? (double)(d.at - w0) / 1e6 : -1.0);
  sched_stop(en.sched, 0);
  engine_close(&en);
  config_free(&cfg);
  if (getenv("BENCH_KEEP")) {
    printf("  (kept %s)\n", dir);
    return 0;
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) ? 1 : 0;
}
