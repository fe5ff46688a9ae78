// An LD_PRELOAD shim for tests: write, pwrite, pwrite64, writev and pwritev fail with errno
// TESSERA_SHIM_ERRNO on the MPI rank TESSERA_SHIM_RANK (PMI_RANK) for files whose path holds
// TESSERA_SHIM_MATCH, as a quota (EDQUOT), an I/O error (EIO) or a full disk (ENOSPC) seen by
// that rank alone would.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int failing(int fd) {
  const char* rank = getenv("TESSERA_SHIM_RANK");
  const char* me = getenv("PMI_RANK");
  const char* match = getenv("TESSERA_SHIM_MATCH");
  if (!rank || !me || !match || strcmp(rank, me) != 0) return 0;
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  if (!strstr(path, match)) return 0;
  errno = atoi(getenv("TESSERA_SHIM_ERRNO") ? getenv("TESSERA_SHIM_ERRNO") : "5");
  return 1;
}

#define NEXT(name) static __typeof__(name)* next_##name; if (!next_##name) next_##name = dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void* buf, size_t n) {
  NEXT(write);
  return failing(fd) ? -1 : next_write(fd, buf, n);
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t at) {
  NEXT(pwrite);
  return failing(fd) ? -1 : next_pwrite(fd, buf, n, at);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t at) {
  NEXT(pwrite64);
  return failing(fd) ? -1 : next_pwrite64(fd, buf, n, at);
}
ssize_t writev(int fd, const struct iovec* v, int n) {
  NEXT(writev);
  return failing(fd) ? -1 : next_writev(fd, v, n);
}
ssize_t pwritev(int fd, const struct iovec* v, int n, off_t at) {
  NEXT(pwritev);
  return failing(fd) ? -1 : next_pwritev(fd, v, n, at);
}
