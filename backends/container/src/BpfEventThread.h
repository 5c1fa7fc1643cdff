// One thread that reads a BPF ring buffer, and any other descriptors the owner names (a netlink socket), and hands
// what arrives to callbacks. The egress filter and the file watch each own one. Waiting is one epoll_wait with no
// timeout: stopping wakes it through an eventfd, so nothing polls and a stop is immediate.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

struct ring_buffer;

namespace dsec::backends {

class BpfEventThread {
 public:
  // One record of the ring; runs on the thread. Must not throw (it is called from libbpf).
  using RecordHandler = std::function<void(const void* data, size_t size)>;
  // Another descriptor: ready() runs on the thread when it can be read.
  struct Watch {
    int fd = -1;
    std::function<void()> ready;
  };

  // Reads the ring buffer map ring_map_fd; `what` names the owner in log lines.
  static Result<std::unique_ptr<BpfEventThread>> start(std::string what, int ring_map_fd, RecordHandler on_record,
                                                       std::vector<Watch> also = {});
  ~BpfEventThread();  // stops and joins the thread
  BpfEventThread(const BpfEventThread&) = delete;
  BpfEventThread& operator=(const BpfEventThread&) = delete;

 private:
  BpfEventThread() = default;
  void run();
  static int onRecord(void* ctx, void* data, size_t size);

  std::string what_;
  RecordHandler on_record_;
  std::vector<Watch> also_;
  ::ring_buffer* ring_ = nullptr;
  UniqueFd epoll_;
  UniqueFd stop_;  // eventfd
  std::thread thread_;
  std::atomic<uint64_t> lost_{0};  // records whose handler threw
};

}  // namespace dsec::backends
