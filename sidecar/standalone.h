/*
** standalone.h: `moonloop sidecar --workspace DIR --server URL`: the
** workspace watcher (watcher.h) as its own process, for a workspace on
** another host than the engine. Each change is registered through the
** HTTP API with the engine's own validation:
**
**   a file changed   PUT /v1/skills/{id}?file=//HOST/ABS/PATH   (body: the source)
**   a file deleted   DELETE /v1/skills/{id}?file=//HOST/ABS/PATH
**
** {id} is the id the source declares, learnt by loading it here first as
** `moonloop check` does (a source that does not load here is still sent,
** under the id the file held before or its default id, so the engine
** records the rejection on that skill). "//HOST/ABS/PATH" names the file
** in the registry (`moonloop skills` shows it); the engine counts such a
** file as existing until its sidecar deletes it, so duplicate ids are
** refused across hosts too. Requests go one at a time, in the watcher's
** order; a request the engine could not take (unreachable, 5xx) is tried
** again with a growing delay.
**
** Output: one line per file on stdout, as it is answered:
**   ok        hello.lua: skill 'hello', version 941f6671a2b3
**   rejected  bad.lua: //host/ws/bad.lua:3: unexpected symbol near 'end'
**   removed   old.lua: skill 'old' unregistered (the file is gone)
** and on stderr, once the first scan is registered:
**   moonloop: sidecar: watching DIR for URL (N skills, M rejected)
*/
#ifndef ML_STANDALONE_H
#define ML_STANDALONE_H
#include "base/err.h"
#include "lua/config.h"

/* Run the sidecar until SIGINT or SIGTERM: watch cfg->workspace, register
** with the engine at cfg->server. Returns 0, or fails at start (the engine
** cannot be reached or refused us, a bad URL) with e set. */
int standalone_run(const struct config *cfg, err_t *e);

#endif
