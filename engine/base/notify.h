/*
** notify.h: telling a service manager how the process is doing, as
** systemd's sd_notify(3) protocol says, without libsystemd: one datagram
** of "KEY=VALUE" lines to the AF_UNIX socket named by $NOTIFY_SOCKET (a
** path, or an abstract name written with a leading '@').
**
** `moonloop serve` sends READY=1 once its workspace's skills are
** registered and its API listens (a unit of Type=notify starts then), and
** STOPPING=1 when a signal asks it to stop.
*/
#ifndef ML_NOTIFY_H
#define ML_NOTIFY_H

#include "base/err.h"

/* Send state ("READY=1") to $NOTIFY_SOCKET. 0 when it was sent, or when
** there is no such variable (no service manager is listening: nothing to
** do); ERR_INVALID or ERR_IO with the reason otherwise. */
int notify_send(const char *state, err_t *e);

#endif
