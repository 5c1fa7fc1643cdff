#include "NetnsPool.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "dsec/common/Logging.h"

namespace dsec::backends {
namespace {

void loopbackUp() {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
    (void)ioctl(fd, SIOCSIFFLAGS, &ifr);
  }
  close(fd);
}

}  // namespace

NetnsPool::NetnsPool(size_t target) : target_(target) {
  if (target_ > 0) thread_ = std::thread([this] { run(); });
}

NetnsPool::~NetnsPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

UniqueFd NetnsPool::take() {
  std::lock_guard lock(mu_);
  if (ready_.empty()) return UniqueFd();
  UniqueFd fd = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
  return fd;
}

// Runs in its own thread: unshare(CLONE_NEWNET) affects only this thread, which returns to the host
// namespace after each one.
void NetnsPool::run() {
  UniqueFd host(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!host) return;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || ready_.size() < target_; });
      if (stop_) return;
    }
    if (unshare(CLONE_NEWNET) < 0) {
      DSEC_LOG(kWarn, "container") << "netns pool: unshare: " << strerror(errno) << "; pool disabled";
      return;
    }
    UniqueFd ns(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (ns) loopbackUp();
    if (setns(host.get(), CLONE_NEWNET) < 0) {
      // This thread is stuck in a private namespace: it must not do anything else.
      DSEC_LOG(kError, "container") << "netns pool: cannot return to the host namespace: " << strerror(errno);
      return;
    }
    if (!ns) continue;
    std::lock_guard lock(mu_);
    ready_.push_back(std::move(ns));
  }
}

}  // namespace dsec::backends
