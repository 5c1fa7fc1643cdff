// The file routes of a sandbox (ApiServer.h): read, write, remove, list and stat a path, and a directory as a
// tar stream in either direction.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "dsec/common/FdIo.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr const char* kLog = "api";
constexpr size_t kFileChunk = size_t{256} * 1024;
constexpr size_t kStderrKept = size_t{64} * 1024;  // of a tar run, for its error message

// A file in a sandbox: a full disk is the sandbox's quota (429 to the client), not a node error.
Status writeToSandboxFile(int fd, const char* data, size_t size) {
  Status st = writeAll(fd, std::string_view(data, size), "to the sandbox's file");
  if (!st.ok() && (st.error().sysErrno() == ENOSPC || st.error().sysErrno() == EDQUOT)) {
    return Error(ErrorCode::kResourceExhausted, "the sandbox's disk is full");
  }
  return st;
}

// tar's stdout goes to the client as a chunked body, opened on the first byte so that a tar that fails at
// once (missing in the image, bad path) still gets a proper error status.
class TarSink : public backends::ExecSink {
 public:
  explicit TarSink(HttpExchange& ex) : ex_(ex) {}
  bool onStdout(const char* data, size_t size) override {
    std::lock_guard lock(mu_);
    if (!started_) {
      started_ = true;
      if (!ex_.beginStream(200, "application/x-tar", std::nullopt)) return false;
    }
    return ex_.writeStream(data, size);
  }
  bool onStderr(const char* data, size_t size) override {
    std::lock_guard lock(mu_);
    if (stderr_.size() < kStderrKept) stderr_.append(data, std::min(size, kStderrKept - stderr_.size()));
    return true;
  }
  bool started() const { return started_; }
  const std::string& stderrText() const { return stderr_; }

 private:
  HttpExchange& ex_;
  std::mutex mu_;
  bool started_ = false;
  std::string stderr_;
};

// tar -x's output: stdout dropped, the start of stderr kept for the error message. (A sandbox can replace tar
// and sh, so whatever they print must not be held whole.)
class KeepStderrSink : public backends::ExecSink {
 public:
  bool onStdout(const char*, size_t) override { return true; }
  bool onStderr(const char* data, size_t size) override {
    std::lock_guard lock(mu_);
    if (stderr_.size() < kStderrKept) stderr_.append(data, std::min(size, kStderrKept - stderr_.size()));
    return true;
  }
  std::string stderrText() {
    std::lock_guard lock(mu_);
    return stderr_;
  }

 private:
  std::mutex mu_;
  std::string stderr_;
};

Error tarFailure(const char* what, const backends::ExecResult& r, const std::string& err) {
  std::string msg = std::string(what) + " failed (exit " + std::to_string(r.exit_code) + ")";
  if (r.exit_code == 127) msg += ": tar (and sh) must be installed in the image";
  std::string trimmed = err.size() > 2000 ? err.substr(0, 2000) : err;
  if (!trimmed.empty()) msg += ": " + trimmed;
  return Error::invalid(msg);
}

bool queryFlag(const QueryParams& q, const std::string& key) {
  std::string v = q.get(key, "0");
  return v == "1" || v == "true" || v == "yes";
}

}  // namespace

json fileStatToJson(const backends::FileStat& st) {
  return json{{"name", st.name}, {"type", st.type}, {"size", st.size}, {"mode", st.mode}, {"mtime", st.mtime}};
}

void ApiServer::fileOp(HttpExchange& ex, const RouteMatch& m) {
  std::string path = m.query.get("path");
  if (auto st = validateSandboxPath(path); !st.ok()) return sendError(ex, st.error());
  auto lease = agent_->use(m.sandbox_id);
  if (!lease.ok()) return sendError(ex, lease.error());
  if (m.op == Op::kRemoveFile) {
    auto st = lease->sandbox().remove(path, queryFlag(m.query, "recursive"));
    if (!st.ok()) return sendError(ex, st.error());
    ex.sendJson(200, {{"path", path}, {"removed", true}});
  } else if (m.op == Op::kListDir) {
    auto entries = lease->sandbox().listDir(path);
    if (!entries.ok()) return sendError(ex, entries.error());
    json out = json::array();
    for (const auto& e : *entries) out.push_back(fileStatToJson(e));
    ex.sendJson(200, {{"path", path}, {"entries", out}});
  } else {
    auto st = lease->sandbox().stat(path);
    if (!st.ok()) return sendError(ex, st.error());
    json j = fileStatToJson(*st);
    j["path"] = path;
    ex.sendJson(200, j);
  }
}

void ApiServer::readFile(HttpExchange& ex, const RouteMatch& m) {
  std::string path = m.query.get("path");
  if (auto st = validateSandboxPath(path); !st.ok()) return sendError(ex, st.error());
  auto lease = agent_->use(m.sandbox_id);
  if (!lease.ok()) return sendError(ex, lease.error());
  auto fd = lease->sandbox().openForRead(path);
  if (!fd.ok()) return sendError(ex, fd.error());
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return sendError(ex, Error::sys(errno, "stat " + path));
  if (!S_ISREG(st.st_mode)) return sendError(ex, Error::invalid(path + " is not a regular file"));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (!ex.beginStream(200, "application/octet-stream", size)) return;
  std::vector<char> buf(kFileChunk);
  uint64_t left = size;
  while (left > 0) {
    ssize_t n = ::read(fd->get(), buf.data(), std::min<uint64_t>(buf.size(), left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The file shrank or failed under us: the client learns it from the short, closed response.
      DSEC_LOG(kWarn, kLog) << "reading " << path << " in " << m.sandbox_id << ": "
                            << (n < 0 ? strerror(errno) : "short file");
      ex.forceClose();
      break;
    }
    if (!ex.writeStream(buf.data(), static_cast<size_t>(n))) return;
    left -= static_cast<uint64_t>(n);
  }
  ex.endStream();
}

void ApiServer::writeFile(HttpExchange& ex, const RouteMatch& m) {
  std::string path = m.query.get("path");
  if (auto st = validateSandboxPath(path); !st.ok()) return sendError(ex, st.error());
  uint32_t mode = 0644;
  if (m.query.has("mode")) {
    auto parsed = parseFileMode(m.query.get("mode"));
    if (!parsed.ok()) return sendError(ex, parsed.error());
    mode = *parsed;
  }
  auto lease = agent_->use(m.sandbox_id);
  if (!lease.ok()) return sendError(ex, lease.error());
  auto fd = lease->sandbox().openForWrite(path, mode);
  if (!fd.ok()) return sendError(ex, fd.error());
  int64_t size = 0;
  Status write_error;
  auto st = ex.readBodyStream([&](const char* data, size_t n) -> Status {
    auto w = writeToSandboxFile(fd->get(), data, n);
    if (!w.ok()) {
      write_error = w;
      return w;
    }
    size += static_cast<int64_t>(n);
    return okStatus();
  });
  if (!write_error.ok()) {
    const Error& e = write_error.error();
    if (e.code() == ErrorCode::kResourceExhausted)
      return ex.sendError(413, "too_large", e.message() + " writing " + path);
    return sendError(ex, e.wrap("writing " + path));
  }
  if (!st.ok()) return;  // the client went away mid-body
  ex.sendJson(200, {{"path", path}, {"size", size}});
}

void ApiServer::getTar(HttpExchange& ex, const RouteMatch& m) {
  std::string path = m.query.get("path");
  if (auto st = validateSandboxPath(path); !st.ok()) return sendError(ex, st.error());
  auto lease = agent_->use(m.sandbox_id);
  if (!lease.ok()) return sendError(ex, lease.error());
  auto st = lease->sandbox().stat(path);
  if (!st.ok()) return sendError(ex, st.error());
  if (st->type != "dir") return sendError(ex, Error::invalid(path + " is not a directory"));
  backends::ExecRequest req;
  req.argv = {"tar", "-C", path, "-cf", "-", "."};
  req.output_cap = kMaxOutputCap;
  TarSink sink(ex);
  agent_->metrics().execs_total++;
  auto result = lease->sandbox().execStream(req, sink);
  if (!result.ok()) {
    if (!sink.started()) return sendError(ex, result.error().wrap("running tar"));
    ex.forceClose();
    return;
  }
  if (result->exit_code != 0 || result->timed_out) {
    if (!sink.started()) return sendError(ex, tarFailure("tar -c", *result, sink.stderrText()));
    DSEC_LOG(kWarn, kLog) << "tar download of " << path << " from " << m.sandbox_id << " failed: " << sink.stderrText();
    ex.forceClose();  // no last chunk: the client sees a truncated transfer, not a short archive
    return;
  }
  if (!sink.started()) {
    if (!ex.beginStream(200, "application/x-tar", std::nullopt)) return;
  }
  ex.endStream();
}

void ApiServer::putTar(HttpExchange& ex, const RouteMatch& m) {
  std::string path = m.query.get("path");
  if (auto st = validateSandboxPath(path); !st.ok()) return sendError(ex, st.error());
  auto lease = agent_->use(m.sandbox_id);
  if (!lease.ok()) return sendError(ex, lease.error());
  backends::Sandbox& sandbox = lease->sandbox();
  agent_->metrics().execs_total++;
  if (!sandbox.supportsStdinFd()) return putTarViaFile(ex, sandbox, path);
  // A socketpair rather than a pipe: shutdown() gives tar its EOF even if a concurrently forked process
  // holds a copy of our end, and send(MSG_NOSIGNAL) cannot raise SIGPIPE when tar exits early.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return sendError(ex, Error::sys(errno, "socketpair"));
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);
  backends::ExecRequest req;
  req.argv = {"/bin/sh", "-c", "mkdir -p -- \"$1\" && exec tar -C \"$1\" -xf -", "sh", path};
  req.stdin_fd = theirs.get();
  std::optional<Result<backends::ExecResult>> result;
  KeepStderrSink output;
  std::thread runner([&] {
    result.emplace(sandbox.execStream(req, output));
    // tar is gone (done or failed): make a feeder blocked on a full socket buffer fail instead of hanging.
    ::shutdown(theirs.get(), SHUT_RDWR);
  });
  Status feed_error;
  auto st = ex.readBodyStream([&](const char* data, size_t n) -> Status {
    auto s = sendAll(ours.get(), std::string_view(data, n), "to tar");
    if (!s.ok()) feed_error = s;
    return s;
  });
  ::shutdown(ours.get(), SHUT_WR);
  ours.reset();
  runner.join();
  theirs.reset();
  if (!st.ok() && feed_error.ok()) return;  // the client went away
  if (!result->ok()) return sendError(ex, result->error().wrap("running tar"));
  const auto& r = result->value();
  if (r.exit_code != 0 || r.timed_out) return sendError(ex, tarFailure("tar -x", r, output.stderrText()));
  ex.sendJson(200, {{"path", path}});
}

void ApiServer::putTarViaFile(HttpExchange& ex, backends::Sandbox& sandbox, const std::string& path) {
  // The archive is streamed to a file in the sandbox's /tmp (never held in node memory), extracted there
  // and removed. It counts against the sandbox's disk while it exists.
  const std::string archive = "/tmp/.dsec-upload-" + randomHex(16) + ".tar";
  auto fd = sandbox.openForWrite(archive, 0600);
  if (!fd.ok()) return sendError(ex, fd.error().wrap("staging the tar upload"));
  Status write_error;
  auto st = ex.readBodyStream([&](const char* data, size_t n) -> Status {
    auto w = writeToSandboxFile(fd->get(), data, n);
    if (!w.ok()) write_error = w;
    return w;
  });
  fd->reset();
  if (!write_error.ok() || !st.ok()) {
    (void)sandbox.remove(archive, false);
    if (write_error.ok()) return;  // the client went away
    if (write_error.error().code() == ErrorCode::kResourceExhausted) {
      return ex.sendError(413, "too_large", write_error.error().message() + " staging the tar upload");
    }
    return sendError(ex, write_error.error());
  }
  backends::ExecRequest req;
  req.argv = {"/bin/sh", "-c", "mkdir -p -- \"$1\" && tar -C \"$1\" -xf \"$2\"; rc=$?; rm -f -- \"$2\"; exit $rc",
              "sh",      path, archive};
  KeepStderrSink output;
  auto result = sandbox.execStream(req, output);
  if (!result.ok()) {
    (void)sandbox.remove(archive, false);
    return sendError(ex, result.error().wrap("running tar"));
  }
  if (result->exit_code != 0 || result->timed_out) {
    (void)sandbox.remove(archive, false);
    return sendError(ex, tarFailure("tar -x", *result, output.stderrText()));
  }
  ex.sendJson(200, {{"path", path}});
}

}  // namespace dsec::launcher
