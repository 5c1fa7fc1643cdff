// Watches the connections of running streamed execs for their client's hang-up and kills the command then. A
// command that prints nothing would otherwise never learn its client is gone (the node sees a closed connection
// only when it writes) and keep its thread, files and processes until it ends or times out. One thread for every
// watched connection (epoll), started at first use.
//
// A hang-up is the peer closing its side (EPOLLRDHUP), as a client does when it goes; a client that shuts down only
// its sending side while it still reads the stream is taken for gone too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::launcher {

class HangUpWatch {
 public:
  HangUpWatch() = default;
  ~HangUpWatch();
  HangUpWatch(const HangUpWatch&) = delete;
  HangUpWatch& operator=(const HangUpWatch&) = delete;

  // From now until unwatch(token), a hang-up of socket_fd's peer sends SIGKILL through control. The caller
  // unwatches before the connection is closed.
  Result<uint64_t> watch(int socket_fd, std::shared_ptr<backends::ExecControl> control);
  void unwatch(uint64_t token);

 private:
  struct Watched {
    int fd = -1;
    std::shared_ptr<backends::ExecControl> control;
  };
  Status startLocked();
  void run();

  std::mutex mu_;
  UniqueFd epoll_;
  UniqueFd stop_;  // eventfd
  std::thread thread_;
  uint64_t next_token_ = 1;  // 0 is the stop event's
  std::map<uint64_t, Watched> watched_;
};

}  // namespace dsec::launcher
