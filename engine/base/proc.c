/*
** proc.c: process facts from /proc (see proc.h).
*/
#include "base/proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long long proc_start_time(long pid) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(line, 1, sizeof line - 1, f);
  fclose(f);
  line[n] = 0;
  /* The command name (field 2) may hold spaces and parentheses: skip past
  ** its last ')', then field 22 (starttime) is the 20th field after it. */
  char *p = strrchr(line, ')');
  if (!p) return -1;
  p++;
  for (int field = 3; field < 22 && p; field++) p = strchr(p + 1, ' ');
  if (!p) return -1;
  /* A zombie still has a /proc entry: it counts as gone. */
  char *state = strrchr(line, ')') + 2;
  if (*state == 'Z' || *state == 'X') return -1;
  return strtoll(p + 1, NULL, 10);
}

const char *proc_hostname(void) {
  static char name[256];
  if (!name[0] && gethostname(name, sizeof name - 1) != 0) strcpy(name, "localhost");
  return name;
}

int proc_alive(long pid, long long start) {
  long long now = proc_start_time(pid);
  return now >= 0 && now == start;
}
