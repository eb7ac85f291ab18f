/*
** modules.h: the C half of the skill modules that read and change the
** engine itself: `runs` (run history, for review loops) and `skills` (the
** registry: list, get, check, deploy). Their Lua half is lua/modules.lua.
*/
#ifndef ML_MODULES_H
#define ML_MODULES_H

#include <lua.h>

struct engine;
struct task;

/* Register core.runs_list, core.runs_get, core.runs_cancel, core.skills_list,
** core.skills_get, core.skills_check and core.skills_deploy for this
** engine's runtime. */
void modules_register(struct engine *en);

/* OP_CANCEL's handler, modules_op_cancel (declared by core/op.h): journal
** the cancel, park the task until it is durable, then resume it with
** {run_id, status} as JSON, or nil and a message (no such run, or it had
** ended). */

#endif
