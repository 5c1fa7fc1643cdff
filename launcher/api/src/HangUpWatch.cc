#include "dsec/launcher/api/HangUpWatch.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dsec/common/Logging.h"

namespace dsec::launcher {

HangUpWatch::~HangUpWatch() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
}

Status HangUpWatch::startLocked() {
  if (thread_.joinable()) return okStatus();
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  stop_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_ || !stop_) return Error::sys(errno, "set up the watch on streams' connections");
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 0;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, stop_.get(), &event) != 0) {
    return Error::sys(errno, "set up the watch on streams' connections");
  }
  thread_ = std::thread([this] { run(); });
  return okStatus();
}

Result<uint64_t> HangUpWatch::watch(int socket_fd, std::shared_ptr<backends::ExecControl> control) {
  std::lock_guard lock(mu_);
  DSEC_TRY(startLocked());
  const uint64_t token = next_token_++;
  epoll_event event{};
  event.events = EPOLLRDHUP | EPOLLONESHOT;  // once is enough: the command is killed
  event.data.u64 = token;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, socket_fd, &event) != 0) {
    return Error::sys(errno, "watch a stream's connection for its client's hang-up");
  }
  watched_[token] = Watched{socket_fd, std::move(control)};
  return token;
}

void HangUpWatch::unwatch(uint64_t token) {
  std::lock_guard lock(mu_);
  auto found = watched_.find(token);
  if (found == watched_.end()) return;
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, found->second.fd, nullptr);
  watched_.erase(found);
}

void HangUpWatch::run() {
  epoll_event events[16];
  while (true) {
    const int n = ::epoll_wait(epoll_.get(), events, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      DSEC_LOG(kWarn, "api") << "watching streams' connections failed: " << std::strerror(errno);
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) return;  // stop
      std::lock_guard lock(mu_);
      auto found = watched_.find(events[i].data.u64);
      if (found == watched_.end()) continue;  // unwatched meanwhile
      // The command is reaped or not: ExecControl signals nothing once it is.
      (void)found->second.control->signal(SIGKILL);
    }
  }
}

}  // namespace dsec::launcher
