// Whole-buffer writes to blocking descriptors: the one loop that retries EINTR and short writes, so no caller
// writes it again. Errors carry errno (Error::sysErrno) and say what was being written.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "dsec/common/Result.h"

namespace dsec {

// write(2) until all of `data` is written; "write <what>: <strerror>" otherwise.
Status writeAll(int fd, std::string_view data, std::string_view what);
// send(2) with MSG_NOSIGNAL (a peer that is gone is EPIPE, never SIGPIPE) until all of `data` is sent.
Status sendAll(int fd, std::string_view data, std::string_view what);

// The most descriptors one message may carry (the kernel's SCM_MAX_FD).
inline constexpr size_t kMaxPassedFds = 253;
// One sendmsg(2) of `bytes` carrying `fds` (SCM_RIGHTS; none: a plain message), MSG_NOSIGNAL, EINTR retried.
// Returns how many bytes went (a stream socket may take fewer: the caller sends the rest with sendAll; the
// descriptors went with the first byte). Errors keep errno ("send <what>: ...").
Result<size_t> sendWithFds(int socket, std::string_view bytes, std::span<const int> fds, std::string_view what);

}  // namespace dsec
