// The zygote's wire formats, agent side (see ZygoteProtocol.h and zygote.py).
#include "ZygoteProtocol.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dsec/common/FdIo.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::fncall {
namespace {

constexpr size_t kAnswerBytes = 4 + 4 + 1 + 1 + 8;  // zygote.py ANSWER: ">iiBBd"

void appendBigEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t bigEndianAt(const char* s, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

bool zygoteGone(int err) { return err == EPIPE || err == ECONNRESET || err == ECONNREFUSED || err == ENOTCONN; }

}  // namespace

Result<UniqueFd> takeControlSocket(int pidfd, int remote_fd) {
  if (remote_fd < 0) return Error::internal("the zygote named no control socket");
  // The new fd is close-on-exec (pidfd_getfd always sets it).
  UniqueFd fd(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0)));
  if (!fd) return Error::sys(errno, "pidfd_getfd of the zygote's control socket");
  struct stat st {};
  if (fstat(fd.get(), &st) < 0) return Error::sys(errno, "fstat the zygote's control socket");
  if (!S_ISSOCK(st.st_mode)) return Error::internal("the zygote's control fd is not a socket");
  return fd;
}

Status greetZygote(int control, double deadline) {
  if (send(control, "hello", 5, MSG_NOSIGNAL) != 5) return Error::sys(errno, "greeting the zygote");
  for (;;) {
    double left = deadline - monotonicSeconds();
    pollfd p{control, POLLIN, 0};
    int rc = poll(&p, 1, left <= 0 ? 0 : static_cast<int>(left * 1000) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "poll the zygote's control socket");
    if (rc == 0) return Error(ErrorCode::kTimeout, "the zygote did not answer the greeting in time");
    char buf[8];
    ssize_t n = recv(control, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "reading the zygote's greeting");
    if (n == 2 && std::memcmp(buf, "ok", 2) == 0) return okStatus();
    return n == 0 ? Error(ErrorCode::kUnavailable, "the zygote exited")
                  : Error::internal("bad greeting from the zygote");
  }
}

Status sendCall(int control, double timeout_seconds, const ZygoteCallFds& fds) {
  std::string payload;
  uint64_t bits = 0;
  static_assert(sizeof bits == sizeof timeout_seconds);
  std::memcpy(&bits, &timeout_seconds, sizeof bits);
  appendBigEndian(&payload, bits, 8);
  auto sent = sendWithFds(control, payload, fds, "a call to the zygote");
  if (!sent.ok() && zygoteGone(sent.error().sysErrno())) return Error(ErrorCode::kUnavailable, "the zygote exited");
  if (!sent.ok()) return sent.error();
  if (*sent != payload.size()) return Error::sys(EIO, "short send of a call to the zygote");  // SOCK_SEQPACKET
  return okStatus();
}

Result<ZygoteAnswer> receiveAnswer(int control) {
  char buf[kAnswerBytes + 1];
  ssize_t n;
  do {
    n = recv(control, buf, sizeof buf, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n == 0 || (n < 0 && zygoteGone(errno))) return Error(ErrorCode::kUnavailable, "the zygote exited");
  if (n < 0) return Error::sys(errno, "reading the zygote's answer");
  if (static_cast<size_t>(n) != kAnswerBytes) {
    return Error::internal("the zygote sent an answer of " + std::to_string(n) + " bytes");
  }
  ZygoteAnswer a;
  a.exit_code = static_cast<int32_t>(static_cast<uint32_t>(bigEndianAt(buf, 4)));
  a.signal = static_cast<int32_t>(static_cast<uint32_t>(bigEndianAt(buf + 4, 4)));
  a.timed_out = buf[8] != 0;
  a.clean = buf[9] != 0;
  const uint64_t duration_bits = bigEndianAt(buf + 10, 8);
  std::memcpy(&a.duration_seconds, &duration_bits, sizeof a.duration_seconds);
  return a;
}

std::string encodeCallHeader(const CallRequest& request) {
  std::string header;
  size_t size = 8 + 4 + 4;
  for (const auto& [path, data] : request.files) size += 4 + 8 + path.size();
  header.reserve(size);
  appendBigEndian(&header, request.code.size(), 8);
  appendBigEndian(&header, request.files.size(), 4);
  appendBigEndian(&header, request.fresh_interpreter ? kCallFreshInterpreter : 0, 4);
  for (const auto& [path, data] : request.files) {
    appendBigEndian(&header, path.size(), 4);
    appendBigEndian(&header, data.size(), 8);
    header += path;
  }
  return header;
}

}  // namespace dsec::backends::fncall
