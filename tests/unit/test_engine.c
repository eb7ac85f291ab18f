/* Unit tests of the engine in one process: runs to completion, replay from
** a journal, step id numbering, the backoff schedule, validation messages,
** and the sandbox. Under ASan+UBSan these cover the scheduler, the run
** context and the Lua runtime together. */
#include "base/units.h"
#include "core/engine.h"
#include "test.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <unistd.h>

static char dir[] = "/tmp/mlengine-XXXXXX";
static int counter;

struct result {
  int done;
  char *status, *output, *error;
};

static void on_done(const struct sched_result *r, void *arg) {
  struct result *res = arg;
  res->done = 1;
  res->status = strdup(r->status);
  res->output = r->output ? strdup(r->output) : NULL;
  res->error = r->error ? strdup(r->error) : NULL;
}

static void result_free(struct result *r) {
  free(r->status), free(r->output), free(r->error);
  memset(r, 0, sizeof *r);
}

static struct config cfg;
static int64_t slice_ms; /* the budget between yields for the next engine (0: default) */

static void open_engine(struct engine *en) {
  err_t e;
  char db[256];
  snprintf(db, sizeof db, "%s/e%d.db", dir, counter++);
  config_load(&cfg, NULL, &e);
  config_set(&cfg.db, db);
  cfg.backoff_ms = 5;
  if (slice_ms) cfg.slice_ms = slice_ms;
  if (engine_open(en, &cfg, SCHED_SOLO, 0, &e)) FAILF("engine_open: %s", e.msg);
}

static struct skill *load(struct engine *en, const char *src) {
  char path[256];
  snprintf(path, sizeof path, "%s/s%d.lua", dir, counter++);
  FILE *f = fopen(path, "w");
  fputs(src, f);
  fclose(f);
  struct skill *s = NULL;
  struct skill_error se;
  if (engine_load_file(en, path, 0, &s, &se)) FAILF("load: %s", se.err.msg);
  return s;
}

/* Run src to its end with input; fills res. */
static void run_src(const char *src, const char *input, struct result *res) {
  struct engine en;
  err_t e;
  open_engine(&en);
  struct skill *s = load(&en, src);
  char id[27];
  if (!s || sched_start(en.sched, &e) || sched_run_new(en.sched, s, NULL, input, NULL, id, &e)) {
    FAILF("start: %s", e.msg);
    engine_close(&en);
    config_free(&cfg);
    return;
  }
  sched_on_done(en.sched, id, on_done, res);
  engine_run(&en);
  engine_close(&en);
  config_free(&cfg);
}

TEST(a_run_goes_to_its_end) {
  struct result r = {0};
  run_src("return { run = function(ctx)\n"
          "  local a = ctx.step.run('a', function() return { x = ctx.input.n * 2 } end)\n"
          "  return a.x + 1\n"
          "end }\n", "{\"n\":20}", &r);
  CHECK(r.done);
  CHECK_STR_EQ(r.status, "completed");
  CHECK_STR_EQ(r.output, "41");
  result_free(&r);
}

TEST(replay_returns_recorded_results_without_running_bodies) {
  struct engine en;
  err_t e;
  open_engine(&en);
  struct skill *s = load(&en,
    "return { run = function(ctx)\n"
    "  local a = ctx.step.run('a', function() error('a must not run again') end)\n"
    "  local sum = 0\n"
    "  for i = 1, 3 do sum = sum + ctx.step.run('loop', function() return i * 100 end) end\n"
    "  return { a = a, sum = sum }\n"
    "end }\n");
  CHECK(sched_start(en.sched, &e) == 0);
  const char *id = "01REPLAY000000000000000000";
  journal_t *j = journal_new();
  struct run_row row = {.id = id, .skill = s->id, .version = s->version, .status = "running",
                        .trigger = "{\"kind\":\"invoke\"}", .input = "null",
                        .owner = sched_owner(en.sched), .created_at = 1, .started_at = 1};
  journal_run_new(j, &row);
  struct step_row a = {.run_id = id, .seq = 1, .id = "a", .kind = "run", .status = "completed",
                       .output = "5", .attempts = 1, .started_at = 2, .ended_at = 3};
  struct step_row l1 = {.run_id = id, .seq = 2, .id = "loop", .kind = "run",
                        .status = "completed", .output = "1", .attempts = 1};
  struct step_row l2 = {.run_id = id, .seq = 3, .id = "loop#2", .kind = "run",
                        .status = "completed", .output = "2", .attempts = 1};
  journal_step(j, &a);
  journal_step(j, &l1);
  journal_step(j, &l2);
  CHECK(store_commit(en.store, j, &e) == 0);
  journal_free(j);
  struct result r = {0};
  sched_on_done(en.sched, id, on_done, &r);
  CHECK(sched_adopt(en.sched, &row, &e) == 0);
  engine_run(&en);
  CHECK_STR_EQ(r.status, "completed");
  if (r.error) fprintf(stderr, "error: %s\n", r.error);
  CHECK_STR_EQ(r.output, "{\"a\":5,\"sum\":303}");
  cJSON *rec;
  CHECK(store_get_run(en.store, id, 1, &rec, &e) == 0);
  cJSON *steps = cJSON_GetObjectItem(rec, "steps");
  CHECK_INT_EQ(cJSON_GetArraySize(steps), 4);
  if (cJSON_GetArraySize(steps) == 4)
    CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(steps, 3), "id")->valuestring, "loop#3");
  cJSON_Delete(rec);
  result_free(&r);
  engine_close(&en);
  config_free(&cfg);
}

TEST(step_ids_are_numbered_per_id) {
  struct result r = {0};
  run_src("return { run = function(ctx)\n"
          "  local ids = {}\n"
          "  for i = 1, 2 do ctx.step.run('x', function() return i end) end\n"
          "  ctx.step.run('y', function() end)\n"
          "  ctx.step.run('x', function() return ctx.step_key end)\n"
          "  return 1\n"
          "end }\n", "null", &r);
  CHECK_STR_EQ(r.status, "completed");
  result_free(&r);
  /* The ids themselves are checked through a run record in the functional
  ** tests; here a repeated id must also work when a step fails its first
  ** attempt (numbering happens once per call, not per attempt). */
  run_src("return { retries = 2, run = function(ctx)\n"
          "  local n = 0\n"
          "  ctx.step.run('x', function() n = n + 1; if n < 2 then error('again') end end)\n"
          "  return ctx.step.run('x', function() return ctx.step_key:match(':(.*)$') end)\n"
          "end }\n", "null", &r);
  CHECK_STR_EQ(r.output, "\"x#2\"");
  result_free(&r);
}

TEST(backoff_schedule_doubles_with_equal_jitter_and_a_cap) {
  struct engine en;
  err_t e;
  open_engine(&en);
  lua_State *L = lrt_L(en.lrt);
  CHECK(lrt_require(en.lrt, "run", &e) == 0);
  for (int trial = 0; trial < 50; trial++) {
    for (int n = 1; n <= 12; n++) {
      lua_getfield(L, -1, "backoff_ms");
      luaL_dostring(L, "return { cfg = { backoff_ms = 1000, backoff_max_ms = 600000 } }");
      lua_pushnil(L);
      lua_pushinteger(L, n);
      lua_call(L, 3, 1);
      double d = lua_tonumber(L, -1), full = 1000.0 * (1 << (n - 1));
      lua_pop(L, 1);
      if (full > 600000) full = 600000;
      if (d < full / 2 - 1 || d > full) FAILF("backoff %d = %.0f, want within [%.0f, %.0f]", n, d, full / 2, full);
    }
  }
  lua_pop(L, 1);
  engine_close(&en);
  config_free(&cfg);
}

static void expect_check(struct engine *en, const char *src, const char *want, int line) {
  struct skill_error se;
  if (skills_check(en->skills, src, strlen(src), "k.lua", NULL, &se) == 0) {
    FAILF("expected '%s' for %s", want, src);
    return;
  }
  CHECK_CONTAINS(se.err.msg, want);
  if (line) CHECK_INT_EQ(se.line, line);
}

TEST(validation_messages_name_file_line_and_key) {
  struct engine en;
  open_engine(&en);
  expect_check(&en, "return {\n  run = function() end,\n  retires = 2,\n}\n",
               "k.lua:3: unknown key 'retires' in the skill table (did you mean 'retries'?)", 3);
  expect_check(&en, "return { run = function() end\n", "k.lua:", 0);
  expect_check(&en, "return 1\n", "must return a table", 0);
  expect_check(&en, "return {\n run = function() end,\n triggers = { { cron = '* * *' } } }\n",
               "k.lua:3: trigger 1: bad cron expression '* * *'", 3);
  struct skill_error se;
  char *id = NULL;
  const char *ok = "return { description = 'fine', run = function() end }";
  CHECK(skills_check(en.skills, ok, strlen(ok), "dir/my_skill.lua", &id, &se) == 0);
  CHECK_STR_EQ(id, "my-skill");
  free(id);
  engine_close(&en);
  config_free(&cfg);
}

TEST(sandbox_hides_the_host) {
  struct result r = {0};
  run_src("local reach = {}\n"
          "for _, n in ipairs({ 'load', 'loadstring', 'dofile', 'loadfile', 'require', 'package',\n"
          "  'debug', 'io', 'ffi', 'jit', 'coroutine', 'collectgarbage', 'getfenv', 'setfenv',\n"
          "  'newproxy', 'module', 'gcinfo' }) do\n"
          "  if rawget(_G, n) ~= nil then reach[#reach + 1] = n end\n"
          "end\n"
          "if string.dump then reach[#reach + 1] = 'string.dump' end\n"
          "if pcall(function() return ('').dump end) and ('').dump then reach[#reach + 1] = 'meta.dump' end\n"
          "if getmetatable('') then reach[#reach + 1] = 'string metatable' end\n"
          "if os.execute or os.getenv or os.exit then reach[#reach + 1] = 'os' end\n"
          "local leaked = table.concat(reach, ',')\n"
          "return { run = function(ctx) return leaked end }\n", "null", &r);
  CHECK_STR_EQ(r.status, "completed");
  CHECK_STR_EQ(r.output, "\"\"");
  result_free(&r);
}

TEST(runaway_code_is_stopped_and_the_run_fails) {
  struct result r = {0};
  slice_ms = 200;
  run_src("return { run = function(ctx)\n"
          "  ctx.step.run('spin', function() while true do end end)\n"
          "end }\n", "null", &r);
  CHECK_STR_EQ(r.status, "failed");
  CHECK_CONTAINS(r.error, "without yielding");
  result_free(&r);
  slice_ms = 10000; /* so that memory, not time, stops the hog even on a loaded machine */
  run_src("return { run = function(ctx)\n"
          "  local t = {}\n"
          "  ctx.step.run('hog', function() while true do t[#t + 1] = ('x'):rep(4096) .. #t end end)\n"
          "end }\n", "null", &r);
  CHECK_STR_EQ(r.status, "failed");
  CHECK_CONTAINS(r.error, "memory");
  result_free(&r);
  slice_ms = 0;
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  RUN(a_run_goes_to_its_end);
  RUN(replay_returns_recorded_results_without_running_bodies);
  RUN(step_ids_are_numbered_per_id);
  RUN(backoff_schedule_doubles_with_equal_jitter_and_a_cap);
  RUN(validation_messages_name_file_line_and_key);
  RUN(sandbox_hides_the_host);
  RUN(runaway_code_is_stopped_and_the_run_fails);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) return 1;
  return test_summary();
}
