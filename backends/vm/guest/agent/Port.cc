#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include "GuestAgent.h"

namespace dsec::guest {

Port::Read Port::nextFrame(proto::Frame* out) {
  switch (parser_.next(out)) {
    case proto::FrameParser::Status::kFrame:
      return Read::kFrame;
    case proto::FrameParser::Status::kError:
      return Read::kBad;
    case proto::FrameParser::Status::kNeedMore:
      break;
  }
  return Read::kNone;
}

bool Port::pump() {
  char buf[proto::kMaxChunk];
  for (;;) {
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n > 0) {
      parser_.append(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buf) return true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    return false;  // 0: the host side is not connected
  }
}

Port::Read Port::read(proto::Frame* out, int timeout_ms) {
  for (;;) {
    Read r = nextFrame(out);
    if (r != Read::kNone) return r;
    pollfd p{fd_, POLLIN, 0};
    int n = poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return Read::kNone;
    if (!pump()) return Read::kHangup;
  }
}

bool Port::send(proto::FrameType type, uint32_t request, std::string_view payload) {
  std::string frame = proto::encodeFrame(type, request, payload);
  size_t done = 0;
  while (done < frame.size()) {
    ssize_t n = ::write(fd_, frame.data() + done, frame.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd_, POLLOUT, 0};
      int r = poll(&p, 1, 1000);
      if (r > 0 && (p.revents & (POLLHUP | POLLERR)) && !(p.revents & POLLOUT)) return false;
      continue;
    }
    return false;
  }
  return true;
}

bool Port::sendChunks(proto::FrameType type, uint32_t request, const char* data, size_t size) {
  while (size > 0) {
    size_t n = size < proto::kMaxChunk ? size : proto::kMaxChunk;
    if (!send(type, request, std::string_view(data, n))) return false;
    data += n;
    size -= n;
  }
  return true;
}

bool Port::sendError(uint32_t request, int err, const std::string& message) {
  proto::ErrorMsg m;
  m.err = err > 0 && err < 4096 ? err : EIO;
  m.message = message;
  return send(proto::FrameType::kError, request, m.encode());
}

}  // namespace dsec::guest
