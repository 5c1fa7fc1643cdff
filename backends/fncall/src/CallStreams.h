// One call's pipes, agent side. The agent makes them, hands the child's ends to the zygote (which passes
// them on to the call's child without reading them) and keeps its own: it writes the request stream (the
// header, code and files, then stdin) and reads stdout and stderr, keeping at most the output cap of each
// (the rest is read and dropped). So a call's data never passes through the forking zygote.
#pragma once

#include <poll.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ZygoteProtocol.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends::fncall {

class CallStreams {
 public:
  // Makes the pipes (close-on-exec; the agent's ends non-blocking). The request must outlive this object.
  // Not movable: the request stream's segments point into it.
  static Result<std::unique_ptr<CallStreams>> open(const CallRequest& request);
  CallStreams(const CallStreams&) = delete;
  CallStreams& operator=(const CallStreams&) = delete;

  // The zygote's ends, to send; closeZygoteEnds() once they are sent (or could not be).
  ZygoteCallFds zygoteEnds() const;
  void closeZygoteEnds();

  // The agent's ends that have work pending, to poll (appended to `fds`; handle() takes the same entries).
  void addPollFds(std::vector<pollfd>* fds) const;
  // Writes what the request pipe takes and reads what the output pipes hold, per the poll results.
  void handle(const pollfd* fds, size_t count);
  // Writes as much of the request as the pipe takes now (before the first poll: a small request fits).
  void writeRequest();
  // Reads whatever the output pipes still hold, without waiting: with every process of the call dead
  // (the zygote answered) that is the rest of its output.
  void drain();

  // Moves the output into the result (stdout_data, stderr_data, truncated).
  void finish(ExecResult* result);

 private:
  struct Output {
    UniqueFd fd;  // read end; closed at EOF
    std::string data;
  };
  enum class ReadOutcome { kMore, kEmpty, kClosed };
  CallStreams(const CallRequest& request, int64_t cap);
  ReadOutcome readSome(Output* out);

  std::vector<std::string_view> segments_;  // the request stream: header, code, file data, stdin
  std::string header_;
  size_t segment_ = 0;  // first segment not fully written
  size_t offset_ = 0;   // bytes of it written
  UniqueFd request_write_;
  Output stdout_;
  Output stderr_;
  int64_t cap_;
  bool truncated_ = false;
  UniqueFd request_read_, stdout_write_, stderr_write_;  // the zygote's (child's) ends until sent
};

}  // namespace dsec::backends::fncall
