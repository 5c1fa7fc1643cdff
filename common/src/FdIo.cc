// Whole-buffer writes (FdIo.h).
#include "dsec/common/FdIo.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace dsec {
namespace {

template <typename WriteOnce>
Status writeLoop(std::string_view data, const char* verb, std::string_view what, WriteOnce once) {
  while (!data.empty()) {
    ssize_t n = once(data);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, std::string(verb) + " " + std::string(what));
    data.remove_prefix(static_cast<size_t>(n));
  }
  return okStatus();
}

}  // namespace

Status writeAll(int fd, std::string_view data, std::string_view what) {
  return writeLoop(data, "write", what, [fd](std::string_view d) { return ::write(fd, d.data(), d.size()); });
}

Status sendAll(int fd, std::string_view data, std::string_view what) {
  return writeLoop(data, "send", what,
                   [fd](std::string_view d) { return ::send(fd, d.data(), d.size(), MSG_NOSIGNAL); });
}

}  // namespace dsec
