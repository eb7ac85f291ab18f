/*
** workspace.h: the one place the engine writes files for skills, and the
** check that keeps those files inside the workspace (docs/security.md,
** "Files").
**
** A path is inside the workspace when its real path (every symbolic link
** resolved, the workspace's own included) is below the workspace's real
** path. A path that does not exist yet is judged by its nearest existing
** folder, and its missing part may hold no "." or ".." component.
** Writing walks from the workspace down with O_NOFOLLOW, so a folder that
** is swapped for a link between the check and the write is refused, not
** followed; the file itself is replaced atomically (a temporary file in the
** same folder, renamed over it), so a link in its place is replaced, never
** written through.
*/
#ifndef ML_WORKSPACE_H
#define ML_WORKSPACE_H
#include <stddef.h>

#include "base/err.h"

/* 0 when path (relative to the working folder, or absolute) is inside the
** workspace ws; ERR_INVALID with a message naming both otherwise, and when
** the workspace does not exist. */
int workspace_inside(const char *ws, const char *path, err_t *e);

/* Write len bytes of data as the file at path, which must be inside ws
** (checked again here, on the real path): atomically and synced. The
** folders on the way must exist and be real folders, not links. Returns 0,
** ERR_INVALID (outside, or a link on the way) or ERR_IO. */
int workspace_write(const char *ws, const char *path, const char *data, size_t len, err_t *e);

#endif
