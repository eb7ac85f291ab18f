/*
** modules.h: the C half of the skill modules that read and change the
** engine itself: `runs` (run history, for review loops) and `skills` (the
** registry: list, get, check, deploy). Their Lua half is lua/modules.lua.
*/
#ifndef ML_MODULES_H
#define ML_MODULES_H

struct engine;

/* Register core.runs_list, core.runs_get, core.skills_list, core.skills_get,
** core.skills_check and core.skills_deploy for this engine's runtime. */
void modules_register(struct engine *en);

#endif
