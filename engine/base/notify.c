/*
** notify.c: the sd_notify protocol in a few lines (see notify.h).
*/
#include "base/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* See notify.h. One datagram, sent from a socket opened for it: the
** message is tiny and sent twice in the life of a process. */
int notify_send(const char *state, err_t *e) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return 0;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path)
    return err_set(e, ERR_INVALID, "NOTIFY_SOCKET '%.100s' is not a socket path or an abstract "
                   "socket name ('@name')", path);
  memcpy(sa.sun_path, path, len);
  /* An abstract socket's name starts with a NUL byte, written '@'. */
  if (path[0] == '@') sa.sun_path[0] = 0;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return err_set(e, ERR_IO, "telling systemd %s: socket: %s", state, strerror(errno));
  size_t n = strlen(state);
  ssize_t sent = sendto(fd, state, n, MSG_NOSIGNAL, (struct sockaddr *)&sa,
                        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
  int err = errno;
  close(fd);
  if (sent != (ssize_t)n)
    return err_set(e, ERR_IO, "telling systemd %s through %s: %s", state, path,
                   sent < 0 ? strerror(err) : "a short write");
  return 0;
}
