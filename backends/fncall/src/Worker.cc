#include "Worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ZygoteScript.h"
#include "dsec/common/Logging.h"
#include "dsec/common/SigpipeBlock.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::fncall {
namespace {

constexpr const char* kLog = "fncall";
// The worker's memory limit while the zygote starts (before any call sets its own).
constexpr int64_t kStartMemoryBytes = 512LL << 20;
// On top of the call's timeout: the zygote's own cleanup after a call, on a loaded machine.
constexpr double kAnswerGraceSeconds = 30;
constexpr size_t kMaxHeaderBytes = size_t{1} << 20;
constexpr size_t kMaxStderrLog = 4096;
constexpr size_t kReadAheadBytes = 16384;

int pollMs(double deadline) {
  double left = deadline - monotonicSeconds();
  return left <= 0 ? 0 : static_cast<int>(left * 1000) + 1;
}

// The zygote protocol's fixed headers (zygote.py: REQUEST, FILE_ENTRY, ANSWER), all big-endian.
constexpr size_t kRequestBytes = 8 + 8 + 8 + 8 + 4;
constexpr size_t kFileEntryBytes = 4 + 8;
constexpr size_t kAnswerBytes = 4 + 4 + 1 + 1 + 1 + 8 + 8 + 8;

void appendBigEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t bigEndianAt(const std::string& s, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(s[off + static_cast<size_t>(i)]);
  return v;
}

std::string encodeRequest(const CallRequest& r) {
  size_t total = kRequestBytes + r.code.size() + r.stdin_data.size();
  for (const auto& [path, data] : r.files) total += kFileEntryBytes + path.size() + data.size();
  std::string frame;
  frame.reserve(total);
  uint64_t timeout_bits = 0;
  static_assert(sizeof timeout_bits == sizeof r.timeout_seconds);
  std::memcpy(&timeout_bits, &r.timeout_seconds, sizeof timeout_bits);
  appendBigEndian(&frame, timeout_bits, 8);
  appendBigEndian(&frame, static_cast<uint64_t>(r.output_cap), 8);
  appendBigEndian(&frame, r.code.size(), 8);
  appendBigEndian(&frame, r.stdin_data.size(), 8);
  appendBigEndian(&frame, r.files.size(), 4);
  for (const auto& [path, data] : r.files) {
    appendBigEndian(&frame, path.size(), 4);
    appendBigEndian(&frame, data.size(), 8);
    frame += path;
  }
  frame += r.code;
  frame += r.stdin_data;
  for (const auto& [path, data] : r.files) frame += data;
  return frame;
}

}  // namespace

Worker::Worker(WorkerConfig config, std::unique_ptr<Sandbox> sandbox)
    : config_(std::move(config)), sandbox_(std::move(sandbox)) {}

Worker::~Worker() { (void)destroy(); }

Result<std::unique_ptr<Worker>> Worker::start(const WorkerConfig& config, const WorkerSandboxFactory& factory) {
  SandboxSpec spec;
  spec.id = config.id;
  spec.image = config.image;
  spec.memory_bytes = kStartMemoryBytes;
  spec.pids = config.pids;
  spec.disk_bytes = config.disk_bytes;
  spec.network = NetworkMode::kNone;
  spec.read_only_root = true;
  spec.env = {{"LANG", "C.UTF-8"}, {"PYTHONDONTWRITEBYTECODE", "1"}};
  auto sandbox = factory(config.image, spec);
  if (!sandbox.ok()) return sandbox.error().wrap("fncall worker for " + config.image);
  if (!*sandbox) return Error::internal("fncall worker factory returned no sandbox");
  std::unique_ptr<Worker> worker(new Worker(config, std::move(*sandbox)));
  // From here the destructor (destroy) undoes whatever was done when a step fails.
  if (auto st = worker->spawnZygote(); !st.ok()) {
    Status destroyed = worker->destroy();
    if (!destroyed.ok()) DSEC_LOG(kWarn, kLog) << "cleaning up " << config.id << ": " << destroyed.error().toString();
    return st.error().wrap("starting fncall worker " + config.id + " on " + config.image);
  }
  return worker;
}

Status Worker::spawnZygote() {
  ExecRequest req;
  req.argv = {config_.python, "-B", "-c", kZygoteScript, languageName(config_.language)};
  req.cwd = "/";
  auto proc = sandbox_->spawn(req);
  if (!proc.ok()) {
    if (proc.error().code() == ErrorCode::kNotFound) {
      return Error::notFound("image " + config_.image + " has no " + config_.python +
                             " (fncall workers need a Python 3 interpreter on the image's PATH)");
    }
    return proc.error();
  }
  zygote_ = std::move(*proc);
  zygote_pidfd_ = zygote_.pidfd.get();
  int fl = fcntl(zygote_.stderr_fd.get(), F_GETFL);
  if (fl >= 0) fcntl(zygote_.stderr_fd.get(), F_SETFL, fl | O_NONBLOCK);

  auto ready = readFrame(monotonicSeconds() + config_.ready_timeout_seconds);
  if (!ready.ok()) {
    drainStderr();
    return ready.error().wrap("waiting for the zygote");
  }
  try {
    auto j = nlohmann::json::parse(*ready);
    if (!j.value("ready", false)) return Error::internal("zygote sent something else than ready: " + *ready);
  } catch (const nlohmann::json::exception& e) {
    return Error::internal(std::string("zygote sent a bad ready frame: ") + e.what());
  }
  auto usage = sandbox_->usage();
  if (!usage.ok()) return usage.error().wrap("reading worker usage");
  baseline_memory_ = usage->memory_bytes;
  oom_kills_ = usage->oom_kills;
  return okStatus();
}

Status Worker::readExact(std::string* out, size_t n, double deadline) {
  size_t have = out->size();
  out->resize(have + n);
  // What an earlier read took ahead first: an answer (header and payloads) usually arrives in one read.
  size_t off = std::min(n, pending_.size() - pending_pos_);
  std::memcpy(out->data() + have, pending_.data() + pending_pos_, off);
  pending_pos_ += off;
  if (pending_pos_ == pending_.size()) {
    pending_.clear();
    pending_pos_ = 0;
  }
  while (off < n) {
    pollfd p{zygote_.stdout_fd.get(), POLLIN, 0};
    int rc = poll(&p, 1, pollMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "poll zygote");
    if (rc == 0) return Error(ErrorCode::kTimeout, "the zygote did not answer in time");
    const size_t want = n - off;
    ssize_t got;
    if (want < kReadAheadBytes) {
      // Small reads (the length, the header) take whatever else is there too.
      char buf[kReadAheadBytes];
      got = read(zygote_.stdout_fd.get(), buf, sizeof buf);
      if (got > 0) {
        const size_t take = std::min(want, static_cast<size_t>(got));
        std::memcpy(out->data() + have + off, buf, take);
        pending_.assign(buf + take, static_cast<size_t>(got) - take);
        pending_pos_ = 0;
        off += take;
        continue;
      }
    } else {
      got = read(zygote_.stdout_fd.get(), out->data() + have + off, want);
    }
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) return Error::sys(errno, "read from zygote");
    if (got == 0) return Error(ErrorCode::kUnavailable, "the zygote exited");
    off += static_cast<size_t>(got);
  }
  return okStatus();
}

Result<std::string> Worker::readFrame(double deadline) {
  std::string len;
  DSEC_TRY(readExact(&len, 4, deadline));
  uint32_t n = (static_cast<uint32_t>(static_cast<unsigned char>(len[0])) << 24) |
               (static_cast<uint32_t>(static_cast<unsigned char>(len[1])) << 16) |
               (static_cast<uint32_t>(static_cast<unsigned char>(len[2])) << 8) |
               static_cast<uint32_t>(static_cast<unsigned char>(len[3]));
  if (n > kMaxHeaderBytes) return Error::internal("zygote frame header too large");
  std::string header;
  DSEC_TRY(readExact(&header, n, deadline));
  return header;
}

Status Worker::writeAll(const std::string& data, double deadline) {
  SigpipeBlock no_sigpipe;
  size_t off = 0;
  while (off < data.size()) {
    pollfd p{zygote_.stdin_fd.get(), POLLOUT, 0};
    int rc = poll(&p, 1, pollMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "poll zygote stdin");
    if (rc == 0) return Error(ErrorCode::kTimeout, "the zygote did not take the request in time");
    ssize_t n = write(zygote_.stdin_fd.get(), data.data() + off, data.size() - off);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      if (errno == EPIPE) return Error(ErrorCode::kUnavailable, "the zygote exited");
      return Error::sys(errno, "write to zygote");
    }
    off += static_cast<size_t>(n);
  }
  return okStatus();
}

void Worker::drainStderr() {
  if (!zygote_.stderr_fd) return;
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = read(zygote_.stderr_fd.get(), buf, sizeof buf);
    if (n <= 0) break;
    if (text.size() < kMaxStderrLog) text.append(buf, static_cast<size_t>(n));
  }
  if (!text.empty()) DSEC_LOG(kWarn, kLog) << "zygote of " << config_.id << ": " << text.substr(0, kMaxStderrLog);
}

bool Worker::oomKilledSince() {
  auto usage = sandbox_->usage();
  if (!usage.ok()) return false;
  bool killed = usage->oom_kills > oom_kills_;
  oom_kills_ = usage->oom_kills;
  return killed;
}

bool Worker::dead() const {
  if (!zygote_.pidfd) return true;
  pollfd p{zygote_.pidfd.get(), POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

void Worker::kill() {
  int fd = zygote_pidfd_.load();
  if (fd >= 0) (void)syscall(SYS_pidfd_send_signal, fd, SIGKILL, nullptr, 0);
}

Result<ExecResult> Worker::call(const CallRequest& request, bool* healthy, bool* started) {
  *healthy = false;
  *started = false;
  const double start = monotonicSeconds();
  ++calls_;
  // The call's memory on top of what the worker itself uses (interpreter, loaded modules).
  const int64_t limit = ((request.memory_bytes + baseline_memory_ + (1 << 20) - 1) >> 20) << 20;
  if (limit != memory_limit_ && !limit_unsupported_) {
    Status set = sandbox_->setMemoryLimit(limit);
    if (!set.ok() && set.error().code() == ErrorCode::kUnsupported) {
      limit_unsupported_ = true;  // a sandbox wrapper that cannot: the creation-time limit stays
      DSEC_LOG(kWarn, kLog) << config_.id << ": per-call memory limits unavailable: " << set.error().message();
    } else if (!set.ok()) {
      if (dead()) return Error(ErrorCode::kUnavailable, "fncall worker " + config_.id + " died while idle");
      *started = true;  // not retried elsewhere: the call's memory may be what does not fit
      return set.error().wrap("setting the memory limit of fncall worker " + config_.id);
    } else {
      memory_limit_ = limit;
    }
  }

  const double deadline = start + request.timeout_seconds + kAnswerGraceSeconds;
  Status sent = writeAll(encodeRequest(request), deadline);
  // A write refused (EPIPE) means no zygote read the request: nothing ran.
  *started = sent.ok() || sent.error().code() != ErrorCode::kUnavailable;
  if (!*started) return Error(ErrorCode::kUnavailable, "fncall worker " + config_.id + " died while idle");
  std::string answer;
  Status got = sent.ok() ? readExact(&answer, kAnswerBytes, deadline) : sent;
  if (!got.ok()) {
    drainStderr();
    if (got.error().code() == ErrorCode::kTimeout) kill();
    // The zygote died under the call: an OOM kill is the call's result, anything else an error.
    pollfd p{zygote_.pidfd.get(), POLLIN, 0};
    (void)poll(&p, 1, 2000);
    if (oomKilledSince()) {
      ExecResult r;
      r.oom_killed = true;
      r.signal = SIGKILL;
      r.exit_code = 128 + SIGKILL;
      r.stderr_data = "fncall: the call ran out of memory and took its worker down\n";
      r.duration_seconds = monotonicSeconds() - start;
      return r;
    }
    return Error(ErrorCode::kUnavailable,
                 "fncall worker " + config_.id + " died during the call: " + got.error().message());
  }
  ExecResult r;
  r.exit_code = static_cast<int32_t>(static_cast<uint32_t>(bigEndianAt(answer, 0, 4)));
  r.signal = static_cast<int32_t>(static_cast<uint32_t>(bigEndianAt(answer, 4, 4)));
  r.timed_out = answer[8] != 0;
  r.truncated = answer[9] != 0;
  const bool clean = answer[10] != 0;
  const uint64_t duration_bits = bigEndianAt(answer, 11, 8);
  std::memcpy(&r.duration_seconds, &duration_bits, sizeof r.duration_seconds);
  const uint64_t out_n = bigEndianAt(answer, 19, 8);
  const uint64_t err_n = bigEndianAt(answer, 27, 8);
  // Each stream holds at most the cap the zygote was given: anything else is a broken zygote.
  if (out_n > static_cast<uint64_t>(request.output_cap) || err_n > static_cast<uint64_t>(request.output_cap)) {
    kill();
    return Error::internal("fncall worker " + config_.id + " sent a bad answer (output lengths " +
                           std::to_string(out_n) + ", " + std::to_string(err_n) + ")");
  }
  std::string payload;
  if (auto st = readExact(&payload, out_n + err_n, deadline); !st.ok()) {
    kill();
    return st.error().wrap("fncall worker " + config_.id);
  }
  r.stderr_data.assign(payload, out_n, std::string::npos);
  payload.resize(out_n);
  r.stdout_data = std::move(payload);
  // A kill the call did not ask for (SIGKILL without a timeout) is how the memory cgroup's OOM killer shows.
  if (r.signal != 0 || r.exit_code != 0) r.oom_killed = oomKilledSince();
  drainStderr();
  *healthy = clean && !dead();
  if (!clean) DSEC_LOG(kWarn, kLog) << config_.id << ": could not clean up after a call; replacing the worker";
  return r;
}

Status Worker::destroy() {
  if (destroyed_) return okStatus();
  destroyed_ = true;
  if (zygote_.pidfd) {
    (void)syscall(SYS_pidfd_send_signal, zygote_.pidfd.get(), SIGKILL, nullptr, 0);
    siginfo_t info{};
    while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(zygote_.pidfd.get()), &info, WEXITED) < 0 &&
           errno == EINTR) {
    }
  }
  zygote_pidfd_ = -1;
  Status st = sandbox_ ? sandbox_->destroy() : okStatus();
  sandbox_.reset();
  zygote_ = LongRunningProcess{};
  return st;
}

}  // namespace dsec::backends::fncall
