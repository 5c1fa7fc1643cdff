// One fncall worker (Worker.h): starting it (sandbox, zygote, control socket), one call at a time through
// the zygote with the call's own pipes, and tearing it down.
#include "Worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "CallStreams.h"
#include "ZygoteProtocol.h"
#include "ZygoteScript.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::fncall {
namespace {

constexpr const char* kLog = "fncall";
// The worker's memory limit while the zygote starts (before any call sets its own).
constexpr int64_t kStartMemoryBytes = 512LL << 20;
// On top of the call's timeout: the zygote's own cleanup after a call, on a loaded machine.
constexpr double kAnswerGraceSeconds = 30;
constexpr size_t kMaxReadyBytes = 4096;
constexpr size_t kMaxStderrLog = 4096;

int pollMs(double deadline) {
  double left = deadline - monotonicSeconds();
  return left <= 0 ? 0 : static_cast<int>(left * 1000) + 1;
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
  // From here the destructor (destroy) undoes whatever was done when a step fails. Every call sets its
  // memory limit: a sandbox that cannot is refused here rather than running calls without their limit.
  Status limited = worker->sandbox_->setMemoryLimit(kStartMemoryBytes);
  if (!limited.ok()) {
    limited = limited.error().wrap("fncall workers set the memory limit of every call, and this sandbox could not");
  } else {
    limited = worker->spawnZygote();
  }
  if (auto st = limited; !st.ok()) {
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

  const double deadline = monotonicSeconds() + config_.ready_timeout_seconds;
  auto ready = readReadyFrame(deadline);
  if (!ready.ok()) {
    drainStderr();
    return ready.error().wrap("waiting for the zygote");
  }
  int control_fd = -1;
  try {
    auto j = nlohmann::json::parse(*ready);
    if (!j.value("ready", false)) return Error::internal("zygote sent something else than ready: " + *ready);
    control_fd = j.value("control_fd", -1);
  } catch (const nlohmann::json::exception& e) {
    return Error::internal(std::string("zygote sent a bad ready frame: ") + e.what());
  }
  DSEC_ASSIGN_OR_RETURN(control_, takeControlSocket(zygote_.pidfd.get(), control_fd));
  if (auto st = greetZygote(control_.get(), deadline); !st.ok()) {
    drainStderr();
    return st.error().wrap("greeting the zygote");
  }
  // From here the zygote speaks only on the control socket.
  zygote_.stdin_fd.reset();
  zygote_.stdout_fd.reset();
  auto usage = sandbox_->usage();
  if (!usage.ok()) return usage.error().wrap("reading worker usage");
  baseline_memory_ = usage->memory_bytes;
  oom_kills_ = usage->oom_kills;
  return okStatus();
}

// The zygote's one message on its stdout: a 4-byte big-endian length and a JSON object.
Result<std::string> Worker::readReadyFrame(double deadline) {
  std::string got;
  size_t want = 4;
  while (got.size() < want) {
    pollfd p{zygote_.stdout_fd.get(), POLLIN, 0};
    int rc = poll(&p, 1, pollMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "poll zygote");
    if (rc == 0) return Error(ErrorCode::kTimeout, "the zygote did not start in time");
    char buf[kMaxReadyBytes];
    ssize_t n = read(zygote_.stdout_fd.get(), buf, std::min(sizeof buf, want - got.size()));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return Error::sys(errno, "read from zygote");
    if (n == 0) return Error(ErrorCode::kUnavailable, "the zygote exited");
    got.append(buf, static_cast<size_t>(n));
    if (want == 4 && got.size() == 4) {
      const uint32_t len = (static_cast<uint32_t>(static_cast<unsigned char>(got[0])) << 24) |
                           (static_cast<uint32_t>(static_cast<unsigned char>(got[1])) << 16) |
                           (static_cast<uint32_t>(static_cast<unsigned char>(got[2])) << 8) |
                           static_cast<uint32_t>(static_cast<unsigned char>(got[3]));
      if (len > kMaxReadyBytes) return Error::internal("zygote ready frame too large");
      want += len;
    }
  }
  return got.substr(4);
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

Status Worker::setCallMemoryLimit(const CallRequest& request, bool* started) {
  // The call's memory on top of what the worker itself uses (interpreter, loaded modules).
  const int64_t limit = ((request.memory_bytes + baseline_memory_ + (1 << 20) - 1) >> 20) << 20;
  if (limit == memory_limit_) return okStatus();
  Status set = sandbox_->setMemoryLimit(limit);
  if (set.ok()) {
    memory_limit_ = limit;
    return okStatus();
  }
  if (dead()) return Error(ErrorCode::kUnavailable, "fncall worker " + config_.id + " died while idle");
  *started = true;  // not retried elsewhere: the call's memory may be what does not fit
  if (set.error().code() == ErrorCode::kUnsupported) {
    return Error(ErrorCode::kUnsupported, "fncall worker " + config_.id + " cannot enforce the call's memory limit (" +
                                              std::to_string(request.memory_bytes) +
                                              " bytes), so the call was refused: " + set.error().message());
  }
  return set.error().wrap("setting the memory limit of fncall worker " + config_.id);
}

// The zygote died under the call (or stopped answering and was killed): an OOM kill is the call's result,
// anything else an error.
Result<ExecResult> Worker::zygoteDied(const Error& why, double start) {
  drainStderr();
  kill();
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
  return Error(ErrorCode::kUnavailable, "fncall worker " + config_.id + " died during the call: " + why.message());
}

Result<ExecResult> Worker::call(const CallRequest& request, bool* healthy, bool* started) {
  *healthy = false;
  *started = false;
  const double start = monotonicSeconds();
  ++calls_;
  DSEC_TRY(setCallMemoryLimit(request, started));

  auto opened = CallStreams::open(request);
  if (!opened.ok()) {
    *started = true;  // a local failure (fds): another worker would not fare better
    return opened.error().wrap("fncall worker " + config_.id);
  }
  CallStreams* streams = opened->get();
  Status sent = sendCall(control_.get(), request.timeout_seconds, streams->zygoteEnds());
  // Only the child the zygote forks holds these now (our copies would keep the output pipes open).
  streams->closeZygoteEnds();
  // A send refused (the zygote's end is closed) means no zygote took the call: nothing ran.
  *started = sent.ok() || sent.error().code() != ErrorCode::kUnavailable;
  if (!*started) return Error(ErrorCode::kUnavailable, "fncall worker " + config_.id + " died while idle");
  if (!sent.ok()) return zygoteDied(sent.error(), start);

  // Feed the request and collect the output until the zygote answers: by then the call and everything it
  // started are dead, so what the output pipes hold is the rest of its output.
  const double deadline = start + request.timeout_seconds + kAnswerGraceSeconds;
  streams->writeRequest();
  std::vector<pollfd> fds;
  Result<ZygoteAnswer> answer = Error(ErrorCode::kTimeout, "the zygote did not answer in time");
  for (;;) {
    fds.clear();
    fds.push_back({control_.get(), POLLIN, 0});
    streams->addPollFds(&fds);
    int rc = poll(fds.data(), fds.size(), pollMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) {
      answer = Error::sys(errno, "poll fncall worker " + config_.id);
      break;
    }
    if (rc == 0) break;  // the timeout answer above
    streams->handle(fds.data() + 1, fds.size() - 1);
    if (fds[0].revents != 0) {
      answer = receiveAnswer(control_.get());
      break;
    }
  }
  if (!answer.ok()) return zygoteDied(answer.error(), start);
  streams->drain();
  ExecResult r;
  r.exit_code = answer->exit_code;
  r.signal = answer->signal;
  r.timed_out = answer->timed_out;
  r.duration_seconds = answer->duration_seconds;
  streams->finish(&r);
  // A kill the call did not ask for (SIGKILL without a timeout) is how the memory cgroup's OOM killer shows.
  if (r.signal != 0 || r.exit_code != 0) r.oom_killed = oomKilledSince();
  drainStderr();
  *healthy = answer->clean && !dead();
  if (!answer->clean) DSEC_LOG(kWarn, kLog) << config_.id << ": could not clean up after a call; replacing the worker";
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
  control_.reset();
  Status st = sandbox_ ? sandbox_->destroy() : okStatus();
  sandbox_.reset();
  zygote_ = LongRunningProcess{};
  return st;
}

}  // namespace dsec::backends::fncall
