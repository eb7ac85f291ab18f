/*
** embed.h: the runtime's Lua files (the .lua files of lua/), compiled into the binary as
** text by cmake/embed.cmake. The table ends with a NULL name.
*/
#ifndef ML_EMBED_H
#define ML_EMBED_H
#include <stddef.h>

struct embed_file {
  const char *name; /* file name without ".lua" */
  const char *text;
  size_t len;
};

extern const struct embed_file embed_files[];

#endif
