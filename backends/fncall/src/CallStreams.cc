// One call's pipes, agent side (CallStreams.h).
#include "CallStreams.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "dsec/common/SigpipeBlock.h"

namespace dsec::backends::fncall {
namespace {

constexpr size_t kReadChunk = 65536;
constexpr int kMaxIov = 64;
constexpr int kMaxDrainReads = 4096;  // 256 MiB

struct PipeEnds {
  UniqueFd read_end;
  UniqueFd write_end;
};

Result<PipeEnds> makePipe() {
  int fds[2];
  // Close-on-exec: other threads of the agent start processes, and a copy of a write end in one of them
  // would keep the pipe open.
  if (pipe2(fds, O_CLOEXEC) < 0) return Error::sys(errno, "pipe for a call");
  return PipeEnds{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// A fresh pipe end has no status flag but its access mode, which F_SETFL ignores: one syscall, no F_GETFL.
Status setNonBlocking(int fd) {
  if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0) return Error::sys(errno, "making a call's pipe non-blocking");
  return okStatus();
}

}  // namespace

CallStreams::CallStreams(const CallRequest& request, int64_t cap) : header_(encodeCallHeader(request)), cap_(cap) {
  segments_.reserve(3 + request.files.size());
  segments_.emplace_back(header_);
  segments_.emplace_back(request.code);
  for (const auto& [path, data] : request.files) segments_.emplace_back(data);
  segments_.emplace_back(request.stdin_data);
}

Result<std::unique_ptr<CallStreams>> CallStreams::open(const CallRequest& request) {
  std::unique_ptr<CallStreams> streams(new CallStreams(request, request.output_cap));
  CallStreams& s = *streams;
  DSEC_ASSIGN_OR_RETURN(PipeEnds in, makePipe());
  DSEC_ASSIGN_OR_RETURN(PipeEnds out, makePipe());
  DSEC_ASSIGN_OR_RETURN(PipeEnds err, makePipe());
  s.request_read_ = std::move(in.read_end);
  s.request_write_ = std::move(in.write_end);
  s.stdout_write_ = std::move(out.write_end);
  s.stdout_.fd = std::move(out.read_end);
  s.stderr_write_ = std::move(err.write_end);
  s.stderr_.fd = std::move(err.read_end);
  for (int fd : {s.request_write_.get(), s.stdout_.fd.get(), s.stderr_.fd.get()}) DSEC_TRY(setNonBlocking(fd));
  return streams;
}

ZygoteCallFds CallStreams::zygoteEnds() const {
  return {request_read_.get(), stdout_write_.get(), stderr_write_.get()};
}

void CallStreams::closeZygoteEnds() {
  request_read_.reset();
  stdout_write_.reset();
  stderr_write_.reset();
}

void CallStreams::addPollFds(std::vector<pollfd>* fds) const {
  if (request_write_) fds->push_back({request_write_.get(), POLLOUT, 0});
  if (stdout_.fd) fds->push_back({stdout_.fd.get(), POLLIN, 0});
  if (stderr_.fd) fds->push_back({stderr_.fd.get(), POLLIN, 0});
}

void CallStreams::handle(const pollfd* fds, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (fds[i].revents == 0) continue;
    if (fds[i].fd == request_write_.get()) {
      writeRequest();
    } else if (fds[i].fd == stdout_.fd.get()) {
      (void)readSome(&stdout_);
    } else if (fds[i].fd == stderr_.fd.get()) {
      (void)readSome(&stderr_);
    }
  }
}

void CallStreams::writeRequest() {
  if (!request_write_) return;
  SigpipeBlock no_sigpipe;  // the child may be gone (EPIPE): what is left of the request is dropped
  for (;;) {
    while (segment_ < segments_.size() && offset_ == segments_[segment_].size()) {
      ++segment_;
      offset_ = 0;
    }
    if (segment_ == segments_.size()) {
      request_write_.reset();  // all written: the call's stdin ends here
      return;
    }
    iovec iov[kMaxIov];
    int n = 0;
    for (size_t i = segment_; i < segments_.size() && n < kMaxIov; ++i) {
      const size_t skip = i == segment_ ? offset_ : 0;
      if (segments_[i].size() == skip) continue;
      iov[n++] = {const_cast<char*>(segments_[i].data() + skip), segments_[i].size() - skip};
    }
    ssize_t wrote = writev(request_write_.get(), iov, n);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0 && errno == EAGAIN) return;
    if (wrote < 0) {  // EPIPE: no reader left (the call ended without reading all of it)
      request_write_.reset();
      return;
    }
    auto left = static_cast<size_t>(wrote);
    while (left > 0) {
      const size_t take = std::min(left, segments_[segment_].size() - offset_);
      offset_ += take;
      left -= take;
      if (offset_ == segments_[segment_].size()) {
        ++segment_;
        offset_ = 0;
      }
    }
  }
}

CallStreams::ReadOutcome CallStreams::readSome(Output* out) {
  char buf[kReadChunk];
  ssize_t n;
  do {
    n = read(out->fd.get(), buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return ReadOutcome::kEmpty;
  if (n <= 0) {  // EOF: no writer left
    out->fd.reset();
    return ReadOutcome::kClosed;
  }
  const auto room = static_cast<size_t>(std::max<int64_t>(0, cap_ - static_cast<int64_t>(out->data.size())));
  const auto got = static_cast<size_t>(n);
  if (got > room) truncated_ = true;
  out->data.append(buf, std::min(got, room));
  return ReadOutcome::kMore;
}

void CallStreams::drain() {
  request_write_.reset();
  for (Output* out : {&stdout_, &stderr_}) {
    // Bounded: when the zygote could not kill everything (it then says so and the worker is replaced) a
    // writer may still be at it.
    for (int reads = 0; out->fd && reads < kMaxDrainReads; ++reads) {
      if (readSome(out) != ReadOutcome::kMore) break;
    }
  }
}

void CallStreams::finish(ExecResult* result) {
  result->stdout_data = std::move(stdout_.data);
  result->stderr_data = std::move(stderr_.data);
  result->truncated = truncated_;
}

}  // namespace dsec::backends::fncall
