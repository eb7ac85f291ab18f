/*
** trace.h: run records for people: the runs table and the trace tree
** that `moonloop runs`, `moonloop trace` and the REPL print. The records
** are DESIGN's JSON (from store_get_run / store_list_runs).
*/
#ifndef ML_TRACE_H
#define ML_TRACE_H
#include <stdint.h>
#include <stdio.h>

#include <cJSON.h>

/* A table of runs, newest first, one line each. */
void trace_print_runs(FILE *f, const cJSON *runs, int color, int64_t now_ms);

/* One run as a tree: its steps with a waterfall bar each, attempts,
** errors, logs, input and output. */
void trace_print_run(FILE *f, const cJSON *run, int color, int64_t now_ms);

/* The registered skills, one line each, with their cron triggers' next fire
** (relative to now) and their last load error. */
void trace_print_skills(FILE *f, const cJSON *skills, int color, int64_t now);

/* "3m ago", "in 2h" */
void trace_fmt_ago(int64_t then_ms, int64_t now_ms, char *out, size_t n);

#endif
