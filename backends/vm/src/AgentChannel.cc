// The node's client of dsec-guest-agent (AgentChannel.h, protocol in backends/vm/protocol/AgentProtocol.h).
// Every port is a non-blocking socket; every wait is a poll with a deadline; every frame is bounded by the parser
// and every message checked by its decoder. A port whose request ended anywhere but at its final answer is
// "dirty": the next request on it first says hello and skips what the guest still sends until the hello's answer.
#include "dsec/backends/vm/AgentChannel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "AgentProtocol.h"

namespace dsec::backends::vm {
namespace {

namespace proto = dsec::vm::protocol;
using Clock = std::chrono::steady_clock;

// How long past an exec's own timeout the guest may take to report it (it kills the group and reaps).
constexpr double kExecMarginSeconds = 10;
// A request without a timeout of its own waits this long for a free port.
constexpr double kPortWaitSeconds = 60;
// Saying hello again on a dirty port.
constexpr double kResyncSeconds = 10;
// File transfers: the longest a guest may stay silent, and the longest a transfer may take in all.
constexpr double kFileIdleSeconds = 30;
constexpr double kFileTotalSeconds = 3600;
constexpr double kShortRequestSeconds = 30;
constexpr double kReclaimSeconds = 120;
// What a hello skips (an abandoned request's output) before the port is given up.
constexpr size_t kResyncSkipBytes = 64u << 20;
constexpr size_t kMaxDirEntries = 1u << 20;
// An exec's stdin bytes sent inline in the request; more goes as stdin frames.
constexpr size_t kInlineStdinBytes = 64u << 10;

struct Deadline {
  Clock::time_point at = Clock::time_point::max();
  static Deadline in(double seconds) {
    if (seconds <= 0) return {};
    return {Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6))};
  }
  static Deadline never() { return {}; }
  bool expired() const { return at != Clock::time_point::max() && Clock::now() >= at; }
  // poll()'s timeout: -1 for never, else the milliseconds left (at least 0, at most a minute per round).
  int pollMs() const {
    if (at == Clock::time_point::max()) return 60000;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left + 1, 0, 60000));
  }
  Deadline min(const Deadline& o) const { return at < o.at ? *this : o; }
};

// Only printable ASCII of what the guest says reaches logs and callers.
std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, proto::kMaxErrorMessage)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  return out;
}

Error guestError(const proto::Frame& frame) {
  proto::ErrorMsg m;
  if (!m.decode(frame.payload)) return {ErrorCode::kUnavailable, "agent sent a malformed error"};
  std::string msg = "guest: " + sanitize(m.message);
  switch (m.err) {
    case ENOENT:
      return {ErrorCode::kNotFound, msg, m.err};
    case EEXIST:
      return {ErrorCode::kAlreadyExists, msg, m.err};
    case EINVAL:
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
    case E2BIG:
      return {ErrorCode::kInvalidArgument, msg, m.err};
    case EBUSY:
    case ENOTEMPTY:
    case ENODEV:
      return {ErrorCode::kConflict, msg, m.err};
    case EAGAIN:
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return {ErrorCode::kResourceExhausted, msg, m.err};
    default:
      return {ErrorCode::kSystem, msg, m.err};
  }
}

struct PortConn {
  int index = 0;
  UniqueFd fd;
  proto::FrameParser parser;
  uint32_t next_request = 1;
  bool busy = false;
  bool dirty = false;
  bool dead = false;
};

class ChannelImpl;

// The exclusive use of one port for one request. A request that ends without its final answer leaves the port
// dirty (finish() not called).
class PortLease {
 public:
  PortLease(ChannelImpl* channel, PortConn* port) : channel_(channel), port_(port) {}
  PortLease(const PortLease&) = delete;
  PortLease& operator=(const PortLease&) = delete;
  ~PortLease();
  PortConn& port() { return *port_; }
  void finish() { clean_ = true; }

 private:
  ChannelImpl* channel_;
  PortConn* port_;
  bool clean_ = false;
};

class ExecControlImpl : public ExecControl {
 public:
  ExecControlImpl(uint32_t request, bool tty) : request_(request), tty_(tty), wake_(eventfd(0, EFD_CLOEXEC)) {}
  Status resize(int rows, int cols) override {
    if (!tty_) return Error::invalid("resize: the command has no terminal");
    if (rows < 1 || rows > 10000 || cols < 1 || cols > 10000) return Error::invalid("resize: size out of range");
    proto::ResizeMsg m{static_cast<uint32_t>(rows), static_cast<uint32_t>(cols)};
    return queue(proto::encodeFrame(proto::FrameType::kResize, request_, m.encode()));
  }
  Status signal(int sig) override {
    if (sig < 1 || sig > 64) return Error::invalid("signal out of range");
    proto::SignalMsg m{static_cast<uint32_t>(sig)};
    return queue(proto::encodeFrame(proto::FrameType::kSignal, request_, m.encode()));
  }
  int wakeFd() const { return wake_.get(); }
  std::string take() {
    uint64_t n;
    (void)!::read(wake_.get(), &n, sizeof n);
    std::lock_guard lock(mu_);
    return std::exchange(queued_, {});
  }
  void end() {
    std::lock_guard lock(mu_);
    ended_ = true;
  }

 private:
  Status queue(std::string frame) {
    std::lock_guard lock(mu_);
    if (ended_) return Error::notFound("the command has ended");
    if (queued_.size() > (1u << 20)) return Error(ErrorCode::kResourceExhausted, "too many control requests queued");
    queued_ += frame;
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
    return okStatus();
  }
  uint32_t request_;
  bool tty_;
  UniqueFd wake_;
  std::mutex mu_;
  std::string queued_;
  bool ended_ = false;
};

class ChannelImpl : public AgentChannel {
 public:
  explicit ChannelImpl(std::vector<UniqueFd> fds) {
    uint64_t seed = 0;
    (void)!getrandom(&seed, sizeof seed, 0);
    nonce_ = seed;
    for (size_t i = 0; i < fds.size(); ++i) {
      auto p = std::make_unique<PortConn>();
      p->index = static_cast<int>(i);
      p->fd = std::move(fds[i]);
      int fl = fcntl(p->fd.get(), F_GETFL);
      fcntl(p->fd.get(), F_SETFL, fl | O_NONBLOCK);
      ports_.push_back(std::move(p));
    }
  }
  ~ChannelImpl() override { close(); }

  Status connectAll(double timeout_seconds) {
    if (ports_.empty()) return Error::invalid("no agent ports");
    Deadline deadline = Deadline::in(timeout_seconds > 0 ? timeout_seconds : 60);
    std::vector<std::pair<uint32_t, int64_t>> sent;
    for (auto& p : ports_) {
      uint32_t req = p->next_request++;
      int64_t nonce = static_cast<int64_t>(++nonce_);
      proto::HelloMsg hello{nonce};
      DSEC_TRY(sendFrame(*p, proto::encodeFrame(proto::FrameType::kHello, req, hello.encode()), deadline));
      sent.emplace_back(req, nonce);
    }
    // The agent answers every port at once; waiting for them in turn takes as long as the slowest.
    for (size_t i = 0; i < ports_.size(); ++i) {
      Status answered = awaitHelloResending(*ports_[i], sent[i].first, sent[i].second, deadline);
      if (!answered.ok()) return answered.error().wrap("agent port dsec." + std::to_string(i));
    }
    return okStatus();
  }

  // A hello can be lost where the guest sees its port's host side go and come back (a restored copy: its port was
  // connected to the snapshotted QEMU's socket): an unanswered hello is said again, with a new nonce, every half
  // second. The agent answers a port's hellos in order, so the answer to the last one sent comes after any
  // earlier one's, which awaitHello skips.
  Status awaitHelloResending(PortConn& port, uint32_t req, int64_t nonce, Deadline deadline) {
    constexpr double kResendSeconds = 0.5;
    for (;;) {
      Deadline step = Deadline::in(kResendSeconds);
      if (deadline.at < step.at) step = deadline;
      Status answered = awaitHello(port, req, nonce, step);
      if (answered.ok() || answered.error().code() != ErrorCode::kTimeout || deadline.expired()) return answered;
      req = port.next_request++;
      nonce = static_cast<int64_t>(++nonce_);
      DSEC_TRY(sendFrame(port, proto::encodeFrame(proto::FrameType::kHello, req, proto::HelloMsg{nonce}.encode()),
                         deadline));
    }
  }

  Status setup(const GuestSetup& setup, double timeout_seconds) override {
    proto::SetupMsg m;
    m.hostname = setup.hostname;
    if (setup.layer_disks < 0 || setup.layer_disks > 26) return Error::invalid("setup: 0 to 26 layer disks");
    m.layer_disks = static_cast<uint32_t>(setup.layer_disks);
    m.upper_bytes = std::max<int64_t>(0, setup.upper_bytes);
    m.pids = std::max<int64_t>(0, setup.pids);
    m.env = setup.env;
    m.init = setup.init;
    return simple(proto::FrameType::kSetup, m.encode(), timeout_seconds > 0 ? timeout_seconds : kShortRequestSeconds);
  }

  Status restored(const GuestRestored& restored, double timeout_seconds) override {
    proto::RestoredMsg m;
    m.hostname = restored.hostname;
    m.wall_clock_ns = static_cast<int64_t>(restored.wall_clock_unix * 1e9);
    m.entropy = restored.entropy;
    return simple(proto::FrameType::kRestored, m.encode(),
                  timeout_seconds > 0 ? timeout_seconds : kShortRequestSeconds);
  }

  Result<ExecResult> exec(const ExecRequest& request, ExecSink* sink) override;

  Status readFile(const std::string& path, int out_fd) override;
  Status writeFile(const std::string& path, uint32_t mode, int in_fd) override;

  Result<FileStat> stat(const std::string& path) override {
    proto::PathMsg m{path, 0, false};
    Deadline deadline = Deadline::in(kShortRequestSeconds);
    DSEC_ASSIGN_OR_RETURN(auto lease, acquire(deadline));
    DSEC_ASSIGN_OR_RETURN(uint32_t req, start(*lease, proto::FrameType::kStat, m, deadline));
    DSEC_ASSIGN_OR_RETURN(proto::Frame f, readReply(lease->port(), req, deadline));
    if (f.type == proto::FrameType::kError) {
      lease->finish();
      return guestError(f);
    }
    proto::StatEntry e;
    if (f.type != proto::FrameType::kStatReply || !e.decode(f.payload) || e.name.empty()) {
      return protocolError(*lease, "stat reply");
    }
    lease->finish();
    return toFileStat(e);
  }

  Result<std::vector<FileStat>> listDir(const std::string& path) override {
    proto::PathMsg m{path, 0, false};
    Deadline deadline = Deadline::in(kShortRequestSeconds * 4);
    DSEC_ASSIGN_OR_RETURN(auto lease, acquire(deadline));
    DSEC_ASSIGN_OR_RETURN(uint32_t req, start(*lease, proto::FrameType::kListDir, m, deadline));
    std::vector<FileStat> out;
    for (;;) {
      DSEC_ASSIGN_OR_RETURN(proto::Frame f, readReply(lease->port(), req, deadline));
      if (f.type == proto::FrameType::kOk) {
        lease->finish();
        return out;
      }
      if (f.type == proto::FrameType::kError) {
        lease->finish();
        return guestError(f);
      }
      proto::DirEntriesMsg batch;
      if (f.type != proto::FrameType::kDirEntries || !batch.decode(f.payload)) {
        return protocolError(*lease, "directory entries");
      }
      if (out.size() + batch.entries.size() > kMaxDirEntries) {
        return Error(ErrorCode::kResourceExhausted,
                     "listDir " + path + ": more than " + std::to_string(kMaxDirEntries) + " entries");
      }
      for (const auto& e : batch.entries) {
        if (e.name.empty() || e.name.find('/') != std::string::npos || e.name == "." || e.name == "..") {
          return protocolError(*lease, "a directory entry's name");
        }
        out.push_back(toFileStat(e));
      }
    }
  }

  Status remove(const std::string& path, bool recursive) override {
    proto::PathMsg m{path, 0, recursive};
    Deadline deadline = Deadline::in(kReclaimSeconds);
    DSEC_ASSIGN_OR_RETURN(auto lease, acquire(deadline));
    DSEC_ASSIGN_OR_RETURN(uint32_t req, start(*lease, proto::FrameType::kRemove, m, deadline));
    return okOrError(*lease, req, deadline);
  }

  Result<GuestUsage> usage() override {
    Deadline deadline = Deadline::in(kShortRequestSeconds);
    DSEC_ASSIGN_OR_RETURN(auto lease, acquire(deadline));
    uint32_t req = lease->port().next_request++;
    DSEC_TRY(sendFrame(lease->port(), proto::encodeFrame(proto::FrameType::kUsage, req, {}), deadline));
    DSEC_ASSIGN_OR_RETURN(proto::Frame f, readReply(lease->port(), req, deadline));
    if (f.type == proto::FrameType::kError) {
      lease->finish();
      return guestError(f);
    }
    proto::UsageMsg m;
    if (f.type != proto::FrameType::kUsageReply || !m.decode(f.payload)) return protocolError(*lease, "usage reply");
    lease->finish();
    return GuestUsage{m.memory_used, m.pids};
  }

  Status reclaim() override { return simple(proto::FrameType::kReclaim, {}, kReclaimSeconds); }

  void close() override {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    // shutdown, not close: requests in flight still poll these fds; they wake with a hangup and fail.
    for (auto& p : ports_) shutdown(p->fd.get(), SHUT_RDWR);
    cv_.notify_all();
  }

  void release(PortConn* port, bool clean) {
    std::lock_guard lock(mu_);
    port->busy = false;
    if (!clean) port->dirty = true;
    cv_.notify_all();
  }

 private:
  static FileStat toFileStat(const proto::StatEntry& e) {
    static const char* kTypes[] = {"file", "dir", "symlink", "other"};
    FileStat s;
    s.name = e.name;
    s.type = kTypes[static_cast<int>(e.type)];
    s.size = e.size;
    s.mode = e.mode;
    s.mtime = e.mtime;
    return s;
  }

  Error unavailable(const std::string& what) const {
    std::lock_guard lock(mu_);
    return {ErrorCode::kUnavailable, closed_ ? "the VM is going away (channel closed)" : what};
  }

  Error protocolError(PortLease& lease, const std::string& what) {
    (void)lease;  // not finished: the port is said hello to before its next use
    return {ErrorCode::kUnavailable, "agent protocol error: unexpected or malformed " + what};
  }

  // A free port, made clean (hello) when its last request was abandoned. Waits until the deadline.
  Result<std::unique_ptr<PortLease>> acquire(Deadline deadline) {
    for (;;) {
      PortConn* chosen = nullptr;
      {
        std::unique_lock lock(mu_);
        for (;;) {
          if (closed_) return Error(ErrorCode::kUnavailable, "the VM is going away (channel closed)");
          bool any_alive = false;
          for (auto& p : ports_) {
            if (p->dead) continue;
            any_alive = true;
            if (!p->busy && (chosen == nullptr || (chosen->dirty && !p->dirty))) chosen = p.get();
          }
          if (!any_alive) return Error(ErrorCode::kUnavailable, "no agent port answers any more");
          if (chosen != nullptr) break;
          if (deadline.at == Clock::time_point::max()) {
            cv_.wait(lock);
          } else if (cv_.wait_until(lock, deadline.at) == std::cv_status::timeout) {
            return Error(ErrorCode::kTimeout, "every agent port is busy");
          }
        }
        chosen->busy = true;
      }
      auto lease = std::make_unique<PortLease>(this, chosen);
      if (!chosen->dirty) return lease;
      int64_t nonce = static_cast<int64_t>(++nonce_);
      uint32_t req = chosen->next_request++;
      Deadline resync = deadline.min(Deadline::in(kResyncSeconds));
      Status said = sendFrame(
          *chosen, proto::encodeFrame(proto::FrameType::kHello, req, proto::HelloMsg{nonce}.encode()), resync);
      if (said.ok()) said = awaitHello(*chosen, req, nonce, resync);
      if (said.ok()) {
        std::lock_guard lock(mu_);
        chosen->dirty = false;
        return lease;
      }
      {
        std::lock_guard lock(mu_);
        chosen->dead = true;  // it will not be used again; a later request takes another port
      }
      if (deadline.expired()) return said.error();
    }
  }

  // Reads frames until the hello's answer, skipping what an abandoned request still sends.
  Status awaitHello(PortConn& port, uint32_t req, int64_t nonce, Deadline deadline) {
    size_t skipped = 0;
    for (;;) {
      DSEC_ASSIGN_OR_RETURN(proto::Frame f, readFrame(port, deadline));
      proto::HelloMsg answer;
      if (f.type == proto::FrameType::kHelloOk && f.request == req && answer.decode(f.payload) &&
          answer.nonce == nonce) {
        return okStatus();
      }
      skipped += proto::kHeaderBytes + f.payload.size();
      if (skipped > kResyncSkipBytes) return Error(ErrorCode::kUnavailable, "the agent does not answer hello");
    }
  }

  Status sendFrame(PortConn& port, const std::string& bytes, Deadline deadline) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(port.fd.get(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN) return unavailable("agent port: " + std::string(strerror(errno)));
      if (deadline.expired()) return Error(ErrorCode::kTimeout, "the agent does not read its port");
      pollfd p{port.fd.get(), POLLOUT, 0};
      poll(&p, 1, deadline.pollMs());
    }
    return okStatus();
  }

  // Fills the parser from the socket; an error at hangup.
  Status fill(PortConn& port) {
    char buf[proto::kMaxChunk + proto::kHeaderBytes];
    ssize_t n = ::recv(port.fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      port.parser.append(buf, static_cast<size_t>(n));
      return okStatus();
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return okStatus();
    return unavailable(n == 0 ? "the agent's port closed (the VM is gone?)"
                              : "agent port: " + std::string(strerror(errno)));
  }

  // The next frame (none read past the parser's bound).
  Result<proto::Frame> readFrame(PortConn& port, Deadline deadline) {
    for (;;) {
      proto::Frame f;
      switch (port.parser.next(&f)) {
        case proto::FrameParser::Status::kFrame:
          return f;
        case proto::FrameParser::Status::kError:
          return Error(ErrorCode::kUnavailable,
                       std::string("agent protocol error: ") + proto::headerErrorName(port.parser.error()));
        case proto::FrameParser::Status::kNeedMore:
          break;
      }
      if (deadline.expired()) return Error(ErrorCode::kTimeout, "the agent did not answer in time");
      pollfd p{port.fd.get(), POLLIN, 0};
      int r = poll(&p, 1, deadline.pollMs());
      if (r < 0 && errno != EINTR) return Error::sys(errno, "poll");
      if (r > 0) DSEC_TRY(fill(port));
    }
  }

  // A frame of request req (another request's frame is a protocol error: the guest is confused or lying).
  Result<proto::Frame> readReply(PortConn& port, uint32_t req, Deadline deadline) {
    DSEC_ASSIGN_OR_RETURN(proto::Frame f, readFrame(port, deadline));
    if (f.request != req) {
      return Error(ErrorCode::kUnavailable, "agent protocol error: an answer for request " + std::to_string(f.request) +
                                                " while waiting for " + std::to_string(req));
    }
    return f;
  }

  template <typename Msg>
  Result<uint32_t> start(PortLease& lease, proto::FrameType type, const Msg& msg, Deadline deadline) {
    std::string payload = msg.encode();
    if (payload.size() > proto::kMaxPayload) return Error::invalid("request too large");
    uint32_t req = lease.port().next_request++;
    DSEC_TRY(sendFrame(lease.port(), proto::encodeFrame(type, req, payload), deadline));
    return req;
  }

  Status okOrError(PortLease& lease, uint32_t req, Deadline deadline) {
    DSEC_ASSIGN_OR_RETURN(proto::Frame f, readReply(lease.port(), req, deadline));
    if (f.type == proto::FrameType::kOk && f.payload.empty()) {
      lease.finish();
      return okStatus();
    }
    if (f.type == proto::FrameType::kError) {
      lease.finish();
      return guestError(f);
    }
    return protocolError(lease, "answer");
  }

  Status simple(proto::FrameType type, const std::string& payload, double timeout_seconds) {
    if (payload.size() > proto::kMaxPayload) return Error::invalid("request too large");
    Deadline deadline = Deadline::in(timeout_seconds);
    DSEC_ASSIGN_OR_RETURN(auto lease, acquire(deadline));
    uint32_t req = lease->port().next_request++;
    DSEC_TRY(sendFrame(lease->port(), proto::encodeFrame(type, req, payload), deadline));
    return okOrError(*lease, req, deadline);
  }

  friend class ExecRun;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<PortConn>> ports_;
  bool closed_ = false;
  std::atomic<uint64_t> nonce_{0};

 public:
  // For ExecRun and the file transfers.
  Result<std::unique_ptr<PortLease>> acquirePort(Deadline d) { return acquire(d); }
  Status send(PortConn& p, const std::string& bytes, Deadline d) { return sendFrame(p, bytes, d); }
  Status fillPort(PortConn& p) { return fill(p); }
  Result<proto::Frame> reply(PortConn& p, uint32_t req, Deadline d) { return readReply(p, req, d); }
  Error unavailableError(const std::string& what) const { return unavailable(what); }
};

PortLease::~PortLease() { channel_->release(port_, clean_); }

// One exec on one port: an event loop over the port, the caller's stdin fd and the control's wake fd.
class ExecRun {
 public:
  ExecRun(ChannelImpl& channel, const ExecRequest& request, ExecSink* sink)
      : channel_(channel), request_(request), sink_(sink) {}

  Result<ExecResult> run() {
    if (request_.argv.empty() || request_.argv[0].empty()) return Error::invalid("exec: empty argv");
    if (request_.tty && !request_.stdin_data.empty()) return Error::invalid("exec: stdin data with a terminal");
    if (request_.tty &&
        (request_.tty_rows < 1 || request_.tty_rows > 10000 || request_.tty_cols < 1 || request_.tty_cols > 10000)) {
      return Error::invalid("exec: terminal size out of range");
    }
    auto t0 = Clock::now();
    deadline_ =
        request_.timeout_seconds > 0 ? Deadline::in(request_.timeout_seconds + kExecMarginSeconds) : Deadline::never();
    DSEC_ASSIGN_OR_RETURN(
        lease_, channel_.acquirePort(request_.timeout_seconds > 0 ? deadline_ : Deadline::in(kPortWaitSeconds)));
    PortConn& port = lease_->port();
    proto::ExecMsg m;
    m.argv = request_.argv;
    m.env = request_.env;
    m.cwd = request_.cwd.empty() ? "/" : request_.cwd;
    m.tty = request_.tty;
    m.rows = static_cast<uint32_t>(request_.tty ? request_.tty_rows : 24);
    m.cols = static_cast<uint32_t>(request_.tty ? request_.tty_cols : 80);
    m.timeout_ms =
        request_.timeout_seconds > 0 ? std::max<int64_t>(1, static_cast<int64_t>(request_.timeout_seconds * 1000)) : 0;
    m.output_cap = std::max<int64_t>(0, request_.output_cap);
    if (request_.stdin_fd >= 0) {
      m.stdin_stream = true;
      stdin_open_ = true;
    } else if (request_.stdin_data.size() > kInlineStdinBytes) {
      m.stdin_stream = true;
      stdin_rest_ = request_.stdin_data;  // sent as frames, then EOF
    } else {
      m.stdin_data = request_.stdin_data;
    }
    std::string payload = m.encode();
    if (payload.size() > proto::kMaxPayload) return Error::invalid("exec: argv and environment too large");
    req_ = port.next_request++;
    out_ = proto::encodeFrame(proto::FrameType::kExec, req_, payload);
    if (!stdin_rest_.empty()) queueStdinFromData();

    Result<ExecResult> result = loop(port);
    if (control_) control_->end();
    if (result.ok()) result->duration_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return result;
  }

 private:
  void queueStdinFromData() {
    // Queued a chunk at a time as the port drains (the loop calls this while out_ is short).
    size_t n = std::min(stdin_rest_.size(), proto::kMaxChunk);
    out_ += proto::encodeFrame(proto::FrameType::kStdin, req_, std::string_view(stdin_rest_.data(), n));
    stdin_rest_.erase(0, n);
    if (stdin_rest_.empty()) out_ += proto::encodeFrame(proto::FrameType::kStdinEof, req_, {});
  }

  void cancel() {
    if (cancelled_) return;
    cancelled_ = true;
    out_ += proto::encodeFrame(proto::FrameType::kCancel, req_, {});
    // The guest kills it at once; it has the margin to say so.
    deadline_ = deadline_.min(Deadline::in(kExecMarginSeconds));
  }

  // Output of one stream: capped here as well (the guest's cap is its own word).
  void output(bool is_stdout, const std::string& data) {
    int64_t& kept = is_stdout ? kept_out_ : kept_err_;
    int64_t room = std::max<int64_t>(0, request_.output_cap - kept);
    size_t n = static_cast<size_t>(std::min<int64_t>(room, static_cast<int64_t>(data.size())));
    if (n < data.size()) result_.truncated = true;
    kept += static_cast<int64_t>(n);
    if (n == 0 || cancelled_) return;
    if (sink_ == nullptr) {
      (is_stdout ? result_.stdout_data : result_.stderr_data).append(data, 0, n);
      return;
    }
    bool more = is_stdout ? sink_->onStdout(data.data(), n) : sink_->onStderr(data.data(), n);
    if (!more) cancel();
  }

  Result<ExecResult> loop(PortConn& port) {
    for (;;) {
      // Frames already parsed first.
      for (;;) {
        proto::Frame f;
        auto st = port.parser.next(&f);
        if (st == proto::FrameParser::Status::kError) {
          return Error(ErrorCode::kUnavailable,
                       std::string("agent protocol error: ") + proto::headerErrorName(port.parser.error()));
        }
        if (st == proto::FrameParser::Status::kNeedMore) break;
        if (f.request != req_)
          return Error(ErrorCode::kUnavailable, "agent protocol error: a frame of another request");
        bool done = false;
        DSEC_TRY(onFrame(f, &done));
        if (done) {
          lease_->finish();
          return std::move(result_);
        }
      }
      if (deadline_.expired()) {
        return Error(ErrorCode::kTimeout, cancelled_ ? "the agent did not stop the command"
                                                     : "the agent did not report the command's end in time");
      }
      if (!stdin_rest_.empty() && out_.size() < (256u << 10)) queueStdinFromData();
      pollfd fds[3];
      int n = 0;
      fds[n++] = {port.fd.get(), static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0};
      int stdin_i = -1, wake_i = -1;
      if (stdin_open_ && started_ && out_.size() < (256u << 10)) {
        stdin_i = n;
        fds[n++] = {request_.stdin_fd, POLLIN, 0};
      }
      if (control_) {
        wake_i = n;
        fds[n++] = {control_->wakeFd(), POLLIN, 0};
      }
      int r = poll(fds, static_cast<nfds_t>(n), deadline_.pollMs());
      if (r < 0 && errno != EINTR) return Error::sys(errno, "poll");
      if (r <= 0) continue;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) DSEC_TRY(channel_.fillPort(port));
      if ((fds[0].revents & POLLOUT) && !out_.empty()) {
        ssize_t w = ::send(port.fd.get(), out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) out_.erase(0, static_cast<size_t>(w));
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
          return channel_.unavailableError("agent port: " + std::string(strerror(errno)));
        }
      }
      if (stdin_i >= 0 && fds[stdin_i].revents) {
        char buf[proto::kMaxChunk];
        ssize_t got = ::read(request_.stdin_fd, buf, sizeof buf);
        if (got > 0) {
          out_ += proto::encodeFrame(proto::FrameType::kStdin, req_, std::string_view(buf, static_cast<size_t>(got)));
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
          stdin_open_ = false;
          out_ += proto::encodeFrame(proto::FrameType::kStdinEof, req_, {});
        }
      }
      if (wake_i >= 0 && fds[wake_i].revents) out_ += control_->take();
    }
  }

  Status onFrame(const proto::Frame& f, bool* done) {
    switch (f.type) {
      case proto::FrameType::kError:
        if (started_) break;
        *done = true;
        lease_->finish();
        return guestError(f);
      case proto::FrameType::kStarted:
        if (started_) break;
        started_ = true;
        control_ = std::make_shared<ExecControlImpl>(req_, request_.tty);
        if (sink_ != nullptr && !sink_->onStarted(control_)) cancel();
        return okStatus();
      case proto::FrameType::kStdout:
      case proto::FrameType::kStderr:
        if (!started_) break;
        output(f.type == proto::FrameType::kStdout, f.payload);
        return okStatus();
      case proto::FrameType::kExit: {
        proto::ExitMsg m;
        if (!started_ || !m.decode(f.payload)) break;
        result_.exit_code = m.exit_code;
        result_.signal = m.signal;
        result_.timed_out = m.timed_out;
        result_.truncated = result_.truncated || m.truncated;
        *done = true;
        return okStatus();
      }
      default:
        break;
    }
    return Error(ErrorCode::kUnavailable, "agent protocol error: unexpected frame during an exec");
  }

  ChannelImpl& channel_;
  const ExecRequest& request_;
  ExecSink* sink_;
  std::unique_ptr<PortLease> lease_;
  std::shared_ptr<ExecControlImpl> control_;
  Deadline deadline_;
  uint32_t req_ = 0;
  std::string out_;         // bytes for the port
  std::string stdin_rest_;  // stdin data still to frame
  bool stdin_open_ = false, started_ = false, cancelled_ = false;
  int64_t kept_out_ = 0, kept_err_ = 0;
  ExecResult result_;
};

Result<ExecResult> ChannelImpl::exec(const ExecRequest& request, ExecSink* sink) {
  ExecRun run(*this, request, sink);
  return run.run();
}

Status ChannelImpl::readFile(const std::string& path, int out_fd) {
  Deadline total = Deadline::in(kFileTotalSeconds);
  DSEC_ASSIGN_OR_RETURN(auto lease, acquire(Deadline::in(kPortWaitSeconds)));
  DSEC_ASSIGN_OR_RETURN(uint32_t req, start(*lease, proto::FrameType::kReadFile, proto::PathMsg{path, 0, false},
                                            total.min(Deadline::in(kFileIdleSeconds))));
  for (;;) {
    DSEC_ASSIGN_OR_RETURN(proto::Frame f, readReply(lease->port(), req, total.min(Deadline::in(kFileIdleSeconds))));
    if (f.type == proto::FrameType::kDataEof && f.payload.empty()) {
      lease->finish();
      return okStatus();
    }
    if (f.type == proto::FrameType::kError) {
      lease->finish();
      return guestError(f);
    }
    if (f.type != proto::FrameType::kData) return protocolError(*lease, "file data");
    size_t done = 0;
    while (done < f.payload.size()) {
      ssize_t n = ::write(out_fd, f.payload.data() + done, f.payload.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Error::sys(errno, "readFile " + path + ": writing out");
      done += static_cast<size_t>(n);
    }
  }
}

Status ChannelImpl::writeFile(const std::string& path, uint32_t mode, int in_fd) {
  if (mode > 07777) return Error::invalid("writeFile: bad mode");
  Deadline total = Deadline::in(kFileTotalSeconds);
  auto idle = [&] { return total.min(Deadline::in(kFileIdleSeconds)); };
  DSEC_ASSIGN_OR_RETURN(auto lease, acquire(Deadline::in(kPortWaitSeconds)));
  PortConn& port = lease->port();
  DSEC_ASSIGN_OR_RETURN(uint32_t req,
                        start(*lease, proto::FrameType::kWriteFile, proto::PathMsg{path, mode, false}, idle()));
  DSEC_ASSIGN_OR_RETURN(proto::Frame ready, readReply(port, req, idle()));
  if (ready.type == proto::FrameType::kError) {
    lease->finish();
    return guestError(ready);
  }
  if (ready.type != proto::FrameType::kOk || !ready.payload.empty()) return protocolError(*lease, "write answer");
  char buf[proto::kMaxChunk];
  for (;;) {
    ssize_t n = ::read(in_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "writeFile " + path + ": reading in");  // the port stays dirty
    if (n == 0) break;
    DSEC_TRY(sendFrame(
        port, proto::encodeFrame(proto::FrameType::kData, req, std::string_view(buf, static_cast<size_t>(n))), idle()));
    if (total.expired()) return Error(ErrorCode::kTimeout, "writeFile " + path + ": took too long");
  }
  DSEC_TRY(sendFrame(port, proto::encodeFrame(proto::FrameType::kDataEof, req, {}), idle()));
  return okOrError(*lease, req, idle());
}

}  // namespace

Result<std::unique_ptr<AgentChannel>> AgentChannel::connect(std::vector<UniqueFd> ports, double timeout_seconds) {
  auto channel = std::make_unique<ChannelImpl>(std::move(ports));
  DSEC_TRY(channel->connectAll(timeout_seconds));
  return std::unique_ptr<AgentChannel>(std::move(channel));
}

}  // namespace dsec::backends::vm
