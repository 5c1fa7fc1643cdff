// The agent's side of the zygote's wire formats (zygote.py describes them): the control socket it takes
// from the zygote at start (pidfd_getfd), one message per call each way on it (the call's pipe ends go to
// the zygote as SCM_RIGHTS), and the header of the request stream the call's child reads.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends::fncall {

// Takes a copy of the zygote's fd `remote_fd` (its end of the control socketpair it made for the agent) with
// pidfd_getfd(2); it must be a socket.
Result<UniqueFd> takeControlSocket(int pidfd, int remote_fd);
// Sends "hello" and waits (until `deadline`, monotonicSeconds) for the zygote's "ok": from then on the
// zygote has closed its copy of our end and only the agent can talk to it.
Status greetZygote(int control, double deadline);

// The zygote's fds of one call: the request pipe's read end, stdout's and stderr's write ends.
using ZygoteCallFds = std::array<int, 3>;
// Hands one call to the zygote. kUnavailable when the zygote is gone (nothing ran).
Status sendCall(int control, double timeout_seconds, const ZygoteCallFds& fds);

struct ZygoteAnswer {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  bool clean = false;  // everything the call left is gone: the worker may take another call
  double duration_seconds = 0;
};
// Reads the zygote's answer to the call in flight once the control socket is readable: kUnavailable when
// the zygote exited, kInternal for a malformed answer.
Result<ZygoteAnswer> receiveAnswer(int control);

// Flags of CALL (zygote.py has the same values).
inline constexpr uint32_t kCallFreshInterpreter = 1;  // CallRequest::fresh_interpreter
// The start of the request stream: CALL (code length, number of files, flags) and FILE_ENTRY + path per
// file. The code, then each file's data (in the same order), then stdin follow it on the pipe.
std::string encodeCallHeader(const CallRequest& request);

}  // namespace dsec::backends::fncall
