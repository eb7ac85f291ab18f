/*
** otlp.h: OpenTelemetry export. Every run that ends in this engine is sent
** to the configured collector as one trace over OTLP/HTTP (JSON): a root
** span for the run, a child span per step, and under each step a span per
** attempt; log lines are span events, LLM usage and errors attributes.
** Export is best effort: it never holds a run up, and a collector that is
** down costs a few retries, then the trace is dropped (the run's history
** stays in the database; the export is a copy).
*/
#ifndef ML_OTLP_H
#define ML_OTLP_H

#include <cJSON.h>

struct engine;

/* Start exporting the runs of en to cfg->otlp_endpoint (no-op when unset). */
void otlp_start(struct engine *en);

/* The OTLP JSON (ExportTraceServiceRequest) of a run record with steps. */
cJSON *otlp_trace_of(const cJSON *run, const char *service);

#endif
