// Streamed stdin of running execs (StdinFeeds.h).
#include "dsec/launcher/api/StdinFeeds.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "dsec/common/SigpipeBlock.h"
#include "dsec/common/Strings.h"

namespace dsec::launcher {

StdinFeed::StdinFeed(std::string sandbox_id, UniqueFd write_end, UniqueFd ended)
    : sandbox_id_(std::move(sandbox_id)), write_end_(std::move(write_end)), ended_(std::move(ended)) {}

bool StdinFeed::reserve(uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (reserved_ + bytes > kStdinBufferLimit) return false;
  reserved_ += bytes;
  return true;
}

void StdinFeed::release(uint64_t bytes) {
  std::lock_guard lock(mu_);
  reserved_ -= std::min(reserved_, bytes);
}

void StdinFeed::setControl(const std::shared_ptr<backends::ExecControl>& control) {
  std::lock_guard lock(mu_);
  control_ = control;
}

Status StdinFeed::signal(int sig) {
  std::shared_ptr<backends::ExecControl> control;
  {
    std::lock_guard lock(mu_);
    control = control_.lock();
  }
  if (!control) return Error::notFound("the exec has not started or has ended");
  return control->signal(sig);
}

void StdinFeed::end() {
  uint64_t one = 1;
  (void)!::write(ended_.get(), &one, sizeof one);
}

Status StdinFeed::write(const std::string& data, bool eof, uint64_t* written) {
  *written = 0;
  std::lock_guard lock(write_mu_);
  if (closed_) return Error(ErrorCode::kConflict, "the exec's stdin is already closed (EOF was sent)");
  SigpipeBlock no_sigpipe;
  size_t off = 0;
  while (off < data.size()) {
    pollfd fds[2] = {{write_end_.get(), POLLOUT, 0}, {ended_.get(), POLLIN, 0}};
    int rc = poll(fds, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "wait for the command's stdin");
    if (fds[1].revents != 0) return Error(ErrorCode::kConflict, "the command has exited");
    if (fds[0].revents & (POLLERR | POLLHUP)) return Error(ErrorCode::kConflict, "the command closed its stdin");
    ssize_t n = ::write(write_end_.get(), data.data() + off, data.size() - off);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0 && errno == EPIPE) return Error(ErrorCode::kConflict, "the command closed its stdin");
    if (n < 0) return Error::sys(errno, "write the command's stdin");
    off += static_cast<size_t>(n);
    *written = off;
  }
  if (eof) {
    write_end_.reset();
    closed_ = true;
  }
  return okStatus();
}

Result<OpenedFeed> StdinFeeds::open(const std::string& sandbox_id) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) return Error::sys(errno, "stdin pipe");
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  int fl = fcntl(write_end.get(), F_GETFL);
  if (fl < 0 || fcntl(write_end.get(), F_SETFL, fl | O_NONBLOCK) < 0) return Error::sys(errno, "stdin pipe flags");
  UniqueFd ended(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!ended) return Error::sys(errno, "eventfd");
  OpenedFeed opened{randomHex(24), std::move(read_end),
                    std::make_shared<StdinFeed>(sandbox_id, std::move(write_end), std::move(ended))};
  std::lock_guard lock(mu_);
  feeds_[opened.exec_id] = opened.feed;
  return opened;
}

Result<std::shared_ptr<StdinFeed>> StdinFeeds::find(const std::string& sandbox_id, const std::string& exec_id) {
  std::lock_guard lock(mu_);
  auto it = feeds_.find(exec_id);
  if (it == feeds_.end() || it->second->sandboxId() != sandbox_id) {
    return Error::notFound("no running exec '" + exec_id + "' with streamed stdin in sandbox " + sandbox_id);
  }
  return it->second;
}

void StdinFeeds::close(const std::string& exec_id) {
  std::shared_ptr<StdinFeed> feed;
  {
    std::lock_guard lock(mu_);
    auto it = feeds_.find(exec_id);
    if (it == feeds_.end()) return;
    feed = std::move(it->second);
    feeds_.erase(it);
  }
  feed->end();
}

}  // namespace dsec::launcher
