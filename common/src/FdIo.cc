// Whole-buffer writes (FdIo.h).
#include "dsec/common/FdIo.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

Result<size_t> sendWithFds(int socket, std::string_view bytes, std::span<const int> fds, std::string_view what) {
  if (fds.size() > kMaxPassedFds) {
    return Error::invalid("send " + std::string(what) + ": " + std::to_string(fds.size()) + " descriptors (at most " +
                          std::to_string(kMaxPassedFds) + ")");
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    std::memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR) return Error::sys(errno, "send " + std::string(what));
  }
}

}  // namespace dsec
