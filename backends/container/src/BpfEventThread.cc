#include "BpfEventThread.h"

#include <bpf/libbpf.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>

#include "dsec/common/Logging.h"

namespace dsec::backends {
namespace {

// epoll data: which descriptor is ready.
constexpr uint64_t kRingToken = 0;
constexpr uint64_t kStopToken = 1;
constexpr uint64_t kFirstWatchToken = 2;

Status watchFd(int epoll_fd, int fd, uint64_t token) {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = token;
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) return Error::sys(errno, "watch an event descriptor");
  return okStatus();
}

}  // namespace

Result<std::unique_ptr<BpfEventThread>> BpfEventThread::start(std::string what, int ring_map_fd,
                                                              RecordHandler on_record, std::vector<Watch> also) {
  std::unique_ptr<BpfEventThread> reader(new BpfEventThread());
  reader->what_ = std::move(what);
  reader->on_record_ = std::move(on_record);
  reader->also_ = std::move(also);
  reader->ring_ = ring_buffer__new(ring_map_fd, &BpfEventThread::onRecord, reader.get(), nullptr);
  if (reader->ring_ == nullptr) return Error::sys(errno, "open the " + reader->what_ + "'s event ring");
  reader->epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  reader->stop_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!reader->epoll_ || !reader->stop_) return Error::sys(errno, "set up the " + reader->what_ + "'s event thread");
  // The ring's own epoll descriptor becomes readable when any of its rings has data.
  DSEC_TRY(watchFd(reader->epoll_.get(), ring_buffer__epoll_fd(reader->ring_), kRingToken));
  DSEC_TRY(watchFd(reader->epoll_.get(), reader->stop_.get(), kStopToken));
  for (size_t i = 0; i < reader->also_.size(); ++i) {
    DSEC_TRY(watchFd(reader->epoll_.get(), reader->also_[i].fd, kFirstWatchToken + i));
  }
  reader->thread_ = std::thread([r = reader.get()] { r->run(); });
  return reader;
}

BpfEventThread::~BpfEventThread() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
  if (ring_ != nullptr) ring_buffer__free(ring_);
  if (lost_ > 0) DSEC_LOG(kWarn, "container") << what_ << ": " << lost_ << " events lost to failed handling";
}

void BpfEventThread::run() {
  epoll_event events[8];
  while (true) {
    const int n = ::epoll_wait(epoll_.get(), events, 8, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      DSEC_LOG(kWarn, "container") << what_ << ": waiting for events failed: " << std::strerror(errno);
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == kStopToken) return;
      if (token == kRingToken) {
        const int rc = ring_buffer__consume(ring_);
        if (rc < 0 && rc != -EINTR) {
          DSEC_LOG(kWarn, "container") << what_ << ": reading events failed: " << std::strerror(-rc);
          return;
        }
      } else if (token - kFirstWatchToken < also_.size()) {
        also_[token - kFirstWatchToken].ready();
      }
    }
  }
}

int BpfEventThread::onRecord(void* ctx, void* data, size_t size) {
  // A C callback: nothing may escape it. A record lost to an allocation failure is only a lost report.
  try {
    static_cast<BpfEventThread*>(ctx)->on_record_(data, size);
  } catch (...) {
    static_cast<BpfEventThread*>(ctx)->lost_.fetch_add(1, std::memory_order_relaxed);
  }
  return 0;
}

}  // namespace dsec::backends
