// Whole-buffer writes to blocking descriptors: the one loop that retries EINTR and short writes, so no caller
// writes it again. Errors carry errno (Error::sysErrno) and say what was being written.
#pragma once

#include <string_view>

#include "dsec/common/Result.h"

namespace dsec {

// write(2) until all of `data` is written; "write <what>: <strerror>" otherwise.
Status writeAll(int fd, std::string_view data, std::string_view what);
// send(2) with MSG_NOSIGNAL (a peer that is gone is EPIPE, never SIGPIPE) until all of `data` is sent.
Status sendAll(int fd, std::string_view data, std::string_view what);

}  // namespace dsec
