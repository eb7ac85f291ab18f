/*
** bench_core: the durable core's figures.
**
**   1. durable steps per second: 10,000 runs of 10 steps in one process,
**      with durability "full" and "normal";
**   2. a step's own overhead on the loop thread (resume, step API, JSON,
**      journal append, yield), median and p99;
**   3. memory per parked run: 10,000 runs asleep in step.sleep.
**
** Usage: bench_core [runs] [steps]   (defaults 10000 10)
*/
#include "base/units.h"
#include "core/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/moonloop-bench-XXXXXX";

static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
  if (f) fclose(f);
  return kb;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static struct skill *load(struct engine *en, const char *name, const char *src) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s.lua", dir, name);
  write_file(path, src);
  struct skill *s;
  struct skill_error se;
  if (engine_load_file(en, path, 0, &s, &se)) {
    fprintf(stderr, "bench: %s\n", se.err.msg);
    exit(1);
  }
  return s;
}

static void throughput(int full, int runs, int steps) {
  struct config cfg;
  err_t e;
  config_load(&cfg, "/dev/null/none", &e); /* defaults; the path does not exist */
  config_load(&cfg, NULL, &e);
  char db[256];
  snprintf(db, sizeof db, "%s/tp-%s.db", dir, full ? "full" : "normal");
  config_set(&cfg.db, db);
  cfg.durability_full = full;
  struct engine en;
  if (engine_open(&en, &cfg, SCHED_SOLO, 0, &e)) {
    fprintf(stderr, "bench: %s\n", e.msg);
    exit(1);
  }
  char src[512];
  snprintf(src, sizeof src,
           "return { run = function(ctx)\n"
           "  local sum = 0\n"
           "  for i = 1, %d do sum = sum + ctx.step.run(\"s\", function() return i end) end\n"
           "  return sum\n"
           "end }\n", steps);
  struct skill *s = load(&en, "tp", src);
  sched_stats_enable(en.sched, (size_t)runs * (steps + 1));
  if (sched_start(en.sched, &e)) exit(1);
  uint64_t t0 = units_mono_ns();
  for (int i = 0; i < runs; i++) {
    char id[27];
    if (sched_run_new(en.sched, s, NULL, "null", NULL, id, &e)) {
      fprintf(stderr, "bench: %s\n", e.msg);
      exit(1);
    }
  }
  engine_run(&en);
  double secs = (double)(units_mono_ns() - t0) / 1e9;
  const struct sched_stats *st = sched_stats(en.sched);
  size_t n = st->nsamples;
  qsort(st->samples, n, sizeof *st->samples, cmp_u32);
  double total_steps = (double)runs * steps;
  printf("durability %-6s  %d runs x %d steps: %.2f s, %.0f durable steps/s, "
         "%llu commit groups (%.0f entries each)\n",
         full ? "full" : "normal", runs, steps, secs, total_steps / secs,
         (unsigned long long)st->commits,
         st->commits ? (double)st->committed_entries / (double)st->commits : 0.0);
  printf("  step overhead on the loop thread: median %.1f us, p99 %.1f us (%zu samples)\n",
         n ? st->samples[n / 2] / 1e3 : 0.0, n ? st->samples[n * 99 / 100] / 1e3 : 0.0, n);
  engine_close(&en);
  config_free(&cfg);
}

struct park_check {
  struct engine *en;
  int want;
  uv_timer_t t;
};

static void check_parked(uv_timer_t *t) {
  struct park_check *pc = t->data;
  struct run_filter f = {.status = "sleeping", .limit = pc->want + 1};
  cJSON *runs;
  err_t e;
  if (store_list_runs(pc->en->store, &f, &runs, &e)) return;
  int n = cJSON_GetArraySize(runs);
  cJSON_Delete(runs);
  if (n >= pc->want) uv_stop(&pc->en->loop);
}

static void parked(int runs) {
  struct config cfg;
  err_t e;
  config_load(&cfg, NULL, &e);
  char db[256];
  snprintf(db, sizeof db, "%s/park.db", dir);
  config_set(&cfg.db, db);
  cfg.durability_full = 0;
  struct engine en;
  if (engine_open(&en, &cfg, SCHED_SOLO, 0, &e)) exit(1);
  struct skill *s = load(&en, "park",
                         "return { run = function(ctx)\n"
                         "  local v = ctx.step.run(\"before\", function() return 1 end)\n"
                         "  ctx.step.sleep(\"nap\", \"1h\")\n"
                         "  return v\n"
                         "end }\n");
  if (sched_start(en.sched, &e)) exit(1);
  lrt_gc(en.lrt);
  size_t heap0 = lrt_memory(en.lrt);
  long rss0 = rss_kb();
  for (int i = 0; i < runs; i++) {
    char id[27];
    if (sched_run_new(en.sched, s, NULL, "null", NULL, id, &e)) exit(1);
  }
  struct park_check pc = {.en = &en, .want = runs};
  uv_timer_init(&en.loop, &pc.t);
  pc.t.data = &pc;
  uv_timer_start(&pc.t, check_parked, 100, 100);
  uv_run(&en.loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&pc.t, NULL);
  lrt_gc(en.lrt);
  size_t heap1 = lrt_memory(en.lrt);
  long rss1 = rss_kb();
  printf("parked runs: %d asleep; Lua heap %.0f bytes per run, process RSS %.0f bytes per run\n",
         runs, (double)(heap1 - heap0) / runs, (double)(rss1 - rss0) * 1024.0 / runs);
  sched_stop(en.sched, 0);
  engine_close(&en);
  config_free(&cfg);
}

int main(int argc, char **argv) {
  engine_process_init(); /* allocation as the binary does it (base/mem.h) */
  int runs = argc > 1 ? atoi(argv[1]) : 10000;
  int steps = argc > 2 ? atoi(argv[2]) : 10;
  if (!mkdtemp(dir)) return 1;
  throughput(1, runs, steps);
  throughput(0, runs, steps);
  parked(runs);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) return 1;
  return 0;
}
