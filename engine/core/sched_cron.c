/*
** sched_cron.c: cron triggers, part of the scheduler. In serve mode every
** cron trigger of every live skill gets a timer in the heap at its next
** tick. A tick fires through the store (J_CRON), which compares it with
** the last tick fired for (skill, spec): across several engines on one
** database each tick starts exactly one run.
**
** Missed ticks (the engine was down): when the next tick after the last
** one fired is already past, one catch-up run is started for the latest
** missed tick, not one per missed tick. A skill registered for the first
** time starts counting from now: it does not fire for ticks before it
** existed. So does a trigger that comes back while the engine runs (its
** schedule changed and changed back, its file deleted and written again):
** its ticks in between were paused on purpose, not missed.
*/
#include "base/cron.h"
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/term.h"
#include "base/units.h"
#include "core/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cron_entry {
  sched_t *s;
  char *skill, *version, *expr, *tz, *key;
  cron_t *cron;
  struct stimer timer;
  struct cron_entry *next;
};

static struct cron_entry *crons_of(sched_t *s);
static void set_crons(sched_t *s, struct cron_entry *list);

static void entry_free(struct cron_entry *c) {
  cron_free(c->cron);
  free(c->skill), free(c->version), free(c->expr), free(c->tz), free(c->key);
  free(c);
}

struct fire_ctx {
  sched_t *s;
  char *skill, *version, *trigger;
  char id[27];
  int64_t at;
};

static void on_fired(void *arg, const struct jentry *je) {
  struct fire_ctx *f = arg;
  if (je->result) {
    err_t e;
    struct skill *sk;
    if (sched__version_skill(f->s, f->version, &sk, &e) ||
        sched__start_existing(f->s, sk, f->id, f->trigger, "null", f->at, &e))
      term_printf(stderr, "moonloop: cron run of %s: %s\n", f->skill, e.msg);
  }
  free(f->skill), free(f->version), free(f->trigger);
  free(f);
}

/* Fire c for tick: create its run in the store if no engine did yet.
** A catch-up run says so in its trigger, for whoever reads it at 9 a.m. */
static void fire(struct cron_entry *c, int64_t tick, int catch_up) {
  sched_t *s = c->s;
  struct fire_ctx *f = mem_calloc(1, sizeof *f);
  int64_t now = units_now_ms();
  char ts[40];
  units_rfc3339(tick, ts, sizeof ts);
  cJSON *t = cJSON_CreateObject();
  cJSON_AddStringToObject(t, "kind", "cron");
  cJSON_AddStringToObject(t, "cron", c->expr);
  if (c->tz) cJSON_AddStringToObject(t, "tz", c->tz);
  cJSON_AddStringToObject(t, "tick", ts);
  if (catch_up) cJSON_AddTrueToObject(t, "catch_up");
  f->trigger = jsontext_print_text(t);
  cJSON_Delete(t);
  f->s = s;
  f->skill = mem_strdup(c->skill);
  f->version = mem_strdup(c->version);
  f->at = now;
  ids_ulid(now, f->id);
  struct cron_row cr = {
    .skill = c->skill, .spec = c->key, .tick = tick,
    .run = {.id = f->id, .skill = c->skill, .version = c->version, .status = "running",
            .entry = "run", .trigger = f->trigger, .input = "null", .owner = sched_owner(s),
            .created_at = now, .started_at = now},
  };
  journal_cron(sched__journal(s), &cr);
  sched__after_entry(s, on_fired, f);
}

static void arm(struct cron_entry *c, int64_t after) {
  int64_t next = cron_next(c->cron, after);
  if (next > 0) sched__timer_start(c->s, &c->timer, next);
}

static void on_tick(struct stimer *tm) {
  struct cron_entry *c = (struct cron_entry *)((char *)tm - offsetof(struct cron_entry, timer));
  int64_t tick = tm->at;
  fire(c, tick, 0);
  int64_t now = units_now_ms();
  arm(c, now > tick ? now : tick);
}

/* First arming: record a new trigger's start, or catch up once (fresh:
** the trigger was not live in this engine a moment ago, while the engine
** ran: it starts counting from now, as a new one). */
static void start_entry(struct cron_entry *c, int fresh) {
  sched_t *s = c->s;
  int64_t now = units_now_ms();
  int64_t last = store_cron_last(sched__opts(s)->store, c->skill, c->key);
  if (!last || fresh) {
    struct cron_row cr = {.skill = c->skill, .spec = c->key, .tick = now};
    journal_cron(sched__journal(s), &cr);
  } else {
    int64_t next = cron_next(c->cron, last);
    if (next > 0 && next <= now) {
      int64_t latest = next, n;
      for (int i = 0; i < 1000000 && (n = cron_next(c->cron, latest)) > 0 && n <= now; i++)
        latest = n;
      fire(c, latest, 1);
    }
  }
  arm(c, now);
}

/* See run.h. Until the workspace is registered (sched_triggers_live), the
** registry still holds the triggers of the last start: a catch-up fired
** from them would follow a cron expression that may be gone (one read from
** env, say). */
void sched__skills_changed(sched_t *s) {
  if (sched__opts(s)->mode != SCHED_SERVE || !sched__triggers_live(s)) return;
  /* Rebuild the entries from the registry; the old ones say which
  ** triggers were live a moment ago (after the first build). */
  struct cron_entry *old = crons_of(s);
  int built = sched__crons_built(s);
  for (struct cron_entry *c = old; c; c = c->next) sched__timer_stop(s, &c->timer);
  set_crons(s, NULL);
  cJSON *skills;
  err_t e;
  if (store_list_skills(sched__opts(s)->store, &skills, &e)) {
    fprintf(stderr, "moonloop: reading skills for cron: %s\n", e.msg);
    for (struct cron_entry *c = old, *n; c; c = n) {
      n = c->next;
      entry_free(c);
    }
    return;
  }
  struct cron_entry *list = NULL;
  const cJSON *sk, *t;
  cJSON_ArrayForEach(sk, skills) {
    const cJSON *ver = cJSON_GetObjectItem(sk, "version");
    if (!cJSON_IsString(ver)) continue;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(sk, "triggers")) {
      const cJSON *expr = cJSON_GetObjectItem(t, "cron"), *tz = cJSON_GetObjectItem(t, "tz");
      if (!cJSON_IsString(expr)) continue;
      struct cron_entry *c = mem_calloc(1, sizeof *c);
      if (cron_parse(expr->valuestring, cJSON_IsString(tz) ? tz->valuestring : NULL, &c->cron, &e)) {
        term_printf(stderr, "moonloop: skill %s: %s\n", cJSON_GetObjectItem(sk, "id")->valuestring,
                    e.msg);
        free(c);
        continue;
      }
      char key[400];
      snprintf(key, sizeof key, "%s|%s", expr->valuestring, cJSON_IsString(tz) ? tz->valuestring : "");
      c->s = s;
      c->skill = mem_strdup(cJSON_GetObjectItem(sk, "id")->valuestring);
      c->version = mem_strdup(ver->valuestring);
      c->expr = mem_strdup(expr->valuestring);
      c->tz = cJSON_IsString(tz) ? mem_strdup(tz->valuestring) : NULL;
      c->key = mem_strdup(key);
      c->timer.fn = on_tick;
      c->next = list;
      list = c;
      int was_live = 0;
      for (struct cron_entry *o = old; o && !was_live; o = o->next)
        was_live = !strcmp(o->skill, c->skill) && !strcmp(o->key, c->key);
      start_entry(c, built && !was_live);
    }
  }
  cJSON_Delete(skills);
  for (struct cron_entry *c = old, *n; c; c = n) {
    n = c->next;
    entry_free(c);
  }
  set_crons(s, list);
}

void sched__crons_free(sched_t *s) {
  for (struct cron_entry *c = crons_of(s), *n; c; c = n) {
    n = c->next;
    sched__timer_stop(s, &c->timer);
    entry_free(c);
  }
  set_crons(s, NULL);
}

static struct cron_entry *crons_of(sched_t *s) { return sched__crons(s); }
static void set_crons(sched_t *s, struct cron_entry *list) { sched__set_crons(s, list); }
