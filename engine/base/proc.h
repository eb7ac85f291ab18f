/*
** proc.h: facts about processes on this host, for leases: a lease names
** its process by host, pid and start time, so a dead holder is noticed at
** once on the same host and a reused pid is not mistaken for it.
*/
#ifndef ML_PROC_H
#define ML_PROC_H

/* The start time of process pid (clock ticks since boot), or -1 if it is gone. */
long long proc_start_time(long pid);

/* This host's name (static storage). */
const char *proc_hostname(void);

/* Whether the process recorded as (pid, start) on this host is still alive. */
int proc_alive(long pid, long long start);

#endif
