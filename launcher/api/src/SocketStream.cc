// SocketStream (HttpServer.h): blocking reads and writes over a non-blocking socket, each wait a poll() bounded by
// the inactivity timeout, the stop eventfd, an optional deadline and an optional floor on the peer's rate.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <boost/asio/error.hpp>
#include <cerrno>
#include <cmath>

#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {

namespace net = boost::asio;

void SocketStream::setDeadline(double monotonic_seconds) {
  deadline_ = monotonic_seconds;
  expired_ = false;
}

void SocketStream::startRateFloor(double grace_seconds, double min_bytes_per_second) {
  floor_active_ = true;
  floor_grace_ = grace_seconds;
  floor_rate_ = min_bytes_per_second;
  floor_waited_ = 0;
  floor_received_ = 0;
  expired_ = false;
}

void SocketStream::stopRateFloor() { floor_active_ = false; }

bool SocketStream::wait(short events, boost::system::error_code& ec) {
  const bool floor = floor_active_ && (events & POLLIN);
  for (;;) {
    int timeout = timeout_ms_;
    bool limited = false;  // the wait is cut short by the deadline or the rate floor, not by inactivity
    double now = (deadline_ > 0 || floor) ? monotonicSeconds() : 0;
    auto limitTo = [&](double left) {
      if (left <= 0) return false;
      double ms = std::ceil(left * 1000);
      if (ms < timeout) {
        timeout = static_cast<int>(ms);
        limited = true;
      }
      return true;
    };
    if ((deadline_ > 0 && !limitTo(deadline_ - now)) ||
        (floor && !limitTo(floor_grace_ + static_cast<double>(floor_received_) / floor_rate_ - floor_waited_))) {
      expired_ = true;
      ec = net::error::timed_out;
      return false;
    }
    struct pollfd fds[2] = {{fd_, events, 0}, {stop_fd_, POLLIN, 0}};
    int n = ::poll(fds, stop_fd_ >= 0 ? 2 : 1, timeout);
    if (floor) floor_waited_ += monotonicSeconds() - now;
    if (n < 0) {
      if (errno == EINTR) continue;
      ec = boost::system::error_code(errno, boost::system::system_category());
      return false;
    }
    if (n == 0) {
      if (limited) continue;  // the next round finds the deadline passed
      ec = net::error::timed_out;
      return false;
    }
    if (stop_fd_ >= 0 && (fds[1].revents & POLLIN)) {
      ec = net::error::operation_aborted;
      return false;
    }
    return true;  // ready, or an error the next recv/send reports
  }
}

size_t SocketStream::readSome(void* data, size_t size, boost::system::error_code& ec) {
  for (;;) {
    ssize_t n = ::recv(fd_, data, size, 0);
    if (n > 0) {
      if (floor_active_) floor_received_ += static_cast<uint64_t>(n);
      ec = {};
      return static_cast<size_t>(n);
    }
    if (n == 0) {
      ec = net::error::eof;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait(POLLIN, ec)) return 0;
      continue;
    }
    ec = boost::system::error_code(errno, boost::system::system_category());
    return 0;
  }
}

size_t SocketStream::writeSome(struct iovec* iov, int count, boost::system::error_code& ec) {
  for (;;) {
    struct msghdr msg {};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      ec = {};
      return static_cast<size_t>(n);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait(POLLOUT, ec)) return 0;
      continue;
    }
    ec = boost::system::error_code(errno, boost::system::system_category());
    return 0;
  }
}

}  // namespace dsec::launcher
