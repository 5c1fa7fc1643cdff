// Streamed stdin of running execs, and signals to them (POST /v1/sandboxes/{id}/exec/stream with "stdin_stream": true,
// then POST /v1/sandboxes/{id}/exec/{exec}/stdin; docs/api.md). Each such exec reads its stdin from a pipe whose write
// end the node keeps here under a random exec id. Writes wait for the pipe to take them (backpressure: a command that
// does not read holds its writer, not node memory); what the node holds for one exec at a time is capped
// (kStdinBufferLimit): a write over what is left of it is refused with 413 or 429.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::launcher {

// Bytes of stdin the node holds for one exec at once (request bodies read, not yet in the pipe).
constexpr uint64_t kStdinBufferLimit = uint64_t{1} << 20;

class StdinFeed {
 public:
  StdinFeed(std::string sandbox_id, UniqueFd write_end, UniqueFd ended);
  const std::string& sandboxId() const { return sandbox_id_; }
  // Holds `bytes` of the exec's buffer for one write; false when they do not fit (then nothing is held).
  bool reserve(uint64_t bytes);
  void release(uint64_t bytes);
  // Writes all of data into the command's stdin, waiting while the pipe is full, until the exec ends
  // (kConflict: the command exited or closed its stdin, with the bytes written so far in *written), then, with
  // eof, closes it (the command reads EOF). Writes of one exec are taken one at a time, in arrival order.
  Status write(const std::string& data, bool eof, uint64_t* written);
  // The exec ended: writers waiting stop at once.
  void end();
  // The running command (set as it starts): signal() sends sig to its process group; kNotFound once it ended.
  void setControl(const std::shared_ptr<backends::ExecControl>& control);
  Status signal(int sig);

 private:
  const std::string sandbox_id_;
  std::mutex write_mu_;  // one write at a time
  UniqueFd write_end_;   // under write_mu_; closed at EOF
  bool closed_ = false;  // under write_mu_
  UniqueFd ended_;       // an eventfd, readable once the exec ended
  std::mutex mu_;
  uint64_t reserved_ = 0;
  std::weak_ptr<backends::ExecControl> control_;  // under mu_
};

// A new exec's feed: its id, the read end of its pipe (the command's stdin) and the feed itself.
struct OpenedFeed {
  std::string exec_id;
  UniqueFd read_end;
  std::shared_ptr<StdinFeed> feed;
};

// The node's feeds by exec id.
class StdinFeeds {
 public:
  // Makes a pipe and a feed for a new exec.
  Result<OpenedFeed> open(const std::string& sandbox_id);
  // The feed of exec_id in sandbox_id; kNotFound when there is none (unknown, ended, another sandbox's).
  Result<std::shared_ptr<StdinFeed>> find(const std::string& sandbox_id, const std::string& exec_id);
  // The exec ended: its feed goes away and its writers stop.
  void close(const std::string& exec_id);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<StdinFeed>> feeds_;
};

}  // namespace dsec::launcher
