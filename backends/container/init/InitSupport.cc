// dsec-sandbox-init: the state and helpers its parts share (InitSupport.h).
#include "InitSupport.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dsec::backends::sandbox_init {

int g_fds[proto::kMaxLowers + 1];
int g_nfds = 0;
char g_path[4096];
char g_opts[8192];
Config g_cfg;

size_t appendStr(char* buf, size_t pos, size_t cap, const char* s) {
  while (*s != '\0' && pos + 1 < cap) buf[pos++] = *s++;
  buf[pos] = '\0';
  return pos;
}

size_t appendNum(char* buf, size_t pos, size_t cap, long long v) {
  char tmp[24];
  int n = 0;
  bool neg = v < 0;
  unsigned long long u = neg ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  do {
    tmp[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0 && n < 22);
  if (neg) tmp[n++] = '-';
  while (n > 0 && pos + 1 < cap) buf[pos++] = tmp[--n];
  buf[pos] = '\0';
  return pos;
}

void writeAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    len -= static_cast<size_t>(n);
  }
}

[[noreturn]] void fail(const char* step, int err, const char* what) {
  char line[1024];
  size_t p = appendStr(line, 0, sizeof line, "err ");
  p = appendStr(line, p, sizeof line, step);
  p = appendStr(line, p, sizeof line, " ");
  p = appendNum(line, p, sizeof line, err);
  p = appendStr(line, p, sizeof line, " ");
  p = appendStr(line, p, sizeof line, what);
  p = appendStr(line, p, sizeof line, "\n");
  writeAll(proto::kStatusFd, line, p);
  _exit(1);
}

// Fails the step if the test harness armed a fault there.
void step(const char* name) {
  if (strcmp(g_cfg.fail_at, name) == 0) fail(name, 0, "injected fault");
}

void check(const char* step_name, int rc, const char* what) {
  if (rc < 0) fail(step_name, errno, what);
}

const char* joinPath(const char* a, const char* b) {
  size_t p = appendStr(g_path, 0, sizeof g_path, a);
  p = appendStr(g_path, p, sizeof g_path, "/");
  appendStr(g_path, p, sizeof g_path, b);
  return g_path;
}

int mkdirIfMissing(const char* path, mode_t mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST) return 0;
  return -1;
}

}  // namespace dsec::backends::sandbox_init
