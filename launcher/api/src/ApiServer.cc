// The node API's handlers (ApiServer.h); POST /v1/call is in CallApi.cc.
#include "dsec/launcher/api/ApiServer.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <limits>
#include <mutex>
#include <thread>

#include "dsec/common/FdIo.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ExecResponse.h"
#include "dsec/launcher/api/JsonEscape.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr const char* kLog = "api";
constexpr size_t kFileChunk = size_t{256} * 1024;
constexpr size_t kStderrKept = size_t{64} * 1024;   // of a tar run, for its error message
constexpr size_t kEscapeSlice = size_t{16} * 1024;  // output bytes escaped at a time (at most 96 KiB out)

// A file in a sandbox: a full disk is the sandbox's quota (429 to the client), not a node error.
Status writeToSandboxFile(int fd, const char* data, size_t size) {
  Status st = writeAll(fd, std::string_view(data, size), "to the sandbox's file");
  if (!st.ok() && (st.error().sysErrno() == ENOSPC || st.error().sysErrno() == EDQUOT)) {
    return Error(ErrorCode::kResourceExhausted, "the sandbox's disk is full");
  }
  return st;
}

// Streams exec output as NDJSON lines; the backend may call it from its reader threads. Each piece of output
// is escaped and written a slice at a time, so a connection never holds more than one escaped slice; a UTF-8
// sequence split between pieces is carried to the next line by the stream's escaper.
class NdjsonSink : public backends::ExecSink {
 public:
  explicit NdjsonSink(HttpExchange& ex) : ex_(ex) {}
  bool onStdout(const char* data, size_t size) override { return emit("{\"stdout\":\"", &out_escaper_, data, size); }
  bool onStderr(const char* data, size_t size) override { return emit("{\"stderr\":\"", &err_escaper_, data, size); }

  // Flushes held-back partial UTF-8 (as U+FFFD) and opens the stream if no output came.
  bool finish() {
    std::lock_guard lock(mu_);
    for (auto [prefix, escaper] :
         {std::pair{"{\"stdout\":\"", &out_escaper_}, std::pair{"{\"stderr\":\"", &err_escaper_}}) {
      if (escaper->pending() == 0) continue;
      if (!open()) return false;
      std::string line = prefix;
      escaper->finish(&line);
      line += "\"}\n";
      if (!ex_.writeStream(line.data(), line.size())) return false;
    }
    return open();
  }
  bool started() const { return started_; }
  bool writeLast(const json& j) {
    std::lock_guard lock(mu_);
    std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    return ex_.writeStream(line.data(), line.size());
  }

 private:
  bool open() {
    if (!started_) {
      started_ = true;
      return ex_.beginStream(200, "application/x-ndjson", std::nullopt, {{"Cache-Control", "no-store"}});
    }
    return !ex_.broken();
  }
  bool emit(const char* prefix, JsonStringEscaper* escaper, const char* data, size_t size) {
    std::lock_guard lock(mu_);
    bool line_open = false;
    for (size_t off = 0; off < size; off += kEscapeSlice) {
      buf_.clear();
      if (!line_open) buf_ = prefix;
      size_t before = buf_.size();
      escaper->append(std::string_view(data + off, std::min(kEscapeSlice, size - off)), &buf_);
      if (buf_.size() == before) continue;  // only part of a UTF-8 sequence so far
      if (!line_open && !open()) return false;
      line_open = true;
      if (!ex_.writeStream(buf_.data(), buf_.size())) return false;
    }
    if (!line_open) return !ex_.broken();
    return ex_.writeStream("\"}\n", 3);
  }

  HttpExchange& ex_;
  std::mutex mu_;
  bool started_ = false;
  JsonStringEscaper out_escaper_, err_escaper_;
  std::string buf_;
};

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

size_t completeUtf8Prefix(std::string_view data) {
  size_t n = data.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(data[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0x80) == 0 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

json execResultToJson(const backends::ExecResult& r) {
  return json{{"exit_code", r.exit_code},   {"signal", r.signal},
              {"stdout", r.stdout_data},    {"stderr", r.stderr_data},
              {"timed_out", r.timed_out},   {"truncated", r.truncated},
              {"oom_killed", r.oom_killed}, {"duration", r.duration_seconds}};
}

json fileStatToJson(const backends::FileStat& st) {
  return json{{"name", st.name}, {"type", st.type}, {"size", st.size}, {"mode", st.mode}, {"mtime", st.mtime}};
}

ApiServer::ApiServer(NodeAgent* agent, std::string token, const ApiServerOptions& options)
    : agent_(agent),
      token_(std::move(token)),
      output_budget_(options.output_budget_bytes > 0
                         ? options.output_budget_bytes
                         : defaultOutputBudget(static_cast<uint64_t>(std::max<int64_t>(0, agent->nodeMemoryBytes()))),
                     options.output_wait_seconds) {}

void ApiServer::renderMetrics(std::string* out) {
  OutputBudget::Stats b = output_budget_.stats();
  auto line = [out](const char* type, const char* name, uint64_t v) {
    prometheus::family(out, name, type);
    prometheus::sample(out, name, prometheus::number(v));
  };
  line("gauge", "dsec_output_budget_bytes", b.capacity);
  line("gauge", "dsec_output_budget_used_bytes", b.used);
  line("gauge", "dsec_output_budget_peak_bytes", b.peak);
  line("gauge", "dsec_output_budget_responses", b.shares);
  line("counter", "dsec_output_budget_refusals_total", b.refusals);
  line("counter", "dsec_output_budget_too_large_total", b.too_large);
  line("counter", "dsec_output_budget_evictions_total", b.evictions);
  if (const HttpServer* http = transport()) http->renderMetrics(out);
}

json ApiServer::nodeInfo() {
  json info = agent_->nodeInfo();
  OutputBudget::Stats b = output_budget_.stats();
  info["output_budget"] = json{{"capacity_bytes", b.capacity}, {"used_bytes", b.used},   {"peak_bytes", b.peak},
                               {"responses", b.shares},        {"refusals", b.refusals}, {"too_large", b.too_large},
                               {"evictions", b.evictions}};
  if (const HttpServer* http = transport()) info["http"] = http->info();
  return info;
}

bool ApiServer::acceptsCredentials(std::string_view value) const { return bearerTokenMatches(value, token_); }

void ApiServer::handle(HttpExchange& ex) {
  RouteMatch m = matchRoute(ex.method(), ex.target());
  bool healthz = m.error_status == 0 && m.op == Op::kHealthz;
  const bool authed = requestAuthorized(ex, token_);
  if (authed) ex.markAuthenticated();  // the connection leaves its client's unauthenticated budget
  if (!healthz && !authed) {
    sendUnauthorized(ex);
    return;
  }
  if (m.error_status != 0) return sendRouteError(ex, m.error_status, m.error, m.allow);
  try {
    dispatch(ex, m);
  } catch (const json::exception& e) {
    if (!ex.responded()) {
      ex.sendError(400, "invalid_request", std::string("bad JSON value: ") + e.what());
    } else {
      ex.forceClose();
    }
  } catch (const std::bad_alloc&) {
    if (!ex.responded()) ex.sendError(500, "internal", "out of memory");
    ex.forceClose();
  } catch (const std::exception& e) {
    DSEC_LOG(kError, kLog) << opName(m.op) << ": " << e.what();
    if (!ex.responded()) {
      ex.sendError(500, "internal", e.what());
    } else {
      ex.forceClose();
    }
  }
}

void ApiServer::dispatch(HttpExchange& ex, const RouteMatch& m) {
  if (bodyKind(m.op) == BodyKind::kNone) ex.discardBody(kDiscardLimit);
  if (!m.session.empty() || m.op == Op::kListSessions) return dispatchSession(ex, m);
  if (!m.sandbox_id.empty()) return dispatchSandbox(ex, m);
  dispatchNode(ex, m);
}

void ApiServer::dispatchNode(HttpExchange& ex, const RouteMatch& m) {
  switch (m.op) {
    case Op::kHealthz:
      ex.sendJson(200,
                  {{"status", "ok"}, {"fleet", agent_->options().fleet_name}, {"node", agent_->options().node_name}});
      return;
    case Op::kMetrics: {
      std::string text = agent_->metrics().render();
      renderMetrics(&text);
      sendMetrics(ex, std::move(text));
      return;
    }
    case Op::kNodeInfo:
      ex.sendJson(200, nodeInfo());
      return;
    case Op::kListLayers: {
      auto layers = agent_->layers();
      if (!layers.ok()) return sendError(ex, layers.error());
      ex.sendJson(200, *layers);
      return;
    }
    case Op::kListSandboxes: {
      auto want = parseLabelSelectors(m.query.all("label"));
      if (!want.ok()) return sendError(ex, want.error());
      ex.sendJson(200, agent_->list(*want));
      return;
    }
    case Op::kCreateSandbox:
      return createSandbox(ex);
    case Op::kCall:
      return call(ex);
    default:
      ex.sendError(404, "not_found", "no route");
  }
}

void ApiServer::dispatchSandbox(HttpExchange& ex, const RouteMatch& m) {
  const std::string& id = m.sandbox_id;
  switch (m.op) {
    case Op::kGetSandbox: {
      auto info = agent_->info(id);
      if (!info.ok()) return sendError(ex, info.error());
      ex.sendJson(200, *info);
      return;
    }
    case Op::kDestroySandbox: {
      auto st = agent_->destroy(id);
      if (!st.ok()) return sendError(ex, st.error());
      ex.sendJson(200, {{"id", id}, {"destroyed", true}});
      return;
    }
    case Op::kPause:
    case Op::kResume: {
      auto info = m.op == Op::kPause ? agent_->pause(id) : agent_->resume(id);
      if (!info.ok()) return sendError(ex, info.error());
      ex.sendJson(200, *info);
      return;
    }
    case Op::kExec:
      return exec(ex, id, false);
    case Op::kExecStream:
      return exec(ex, id, true);
    case Op::kReadFile:
      return readFile(ex, m);
    case Op::kWriteFile:
      return writeFile(ex, m);
    case Op::kGetTar:
      return getTar(ex, m);
    case Op::kPutTar:
      return putTar(ex, m);
    case Op::kRemoveFile:
    case Op::kListDir:
    case Op::kStatFile:
      return fileOp(ex, m);
    default:
      ex.sendError(404, "not_found", "no route");
  }
}

void ApiServer::dispatchSession(HttpExchange& ex, const RouteMatch& m) {
  switch (m.op) {
    case Op::kListSessions:
      ex.sendJson(200, agent_->listSessions());
      return;
    case Op::kGetSession:
    case Op::kDeleteSession: {
      auto r = m.op == Op::kGetSession ? agent_->getSession(m.session) : agent_->deleteSession(m.session);
      if (!r.ok()) return sendError(ex, r.error());
      ex.sendJson(200, *r);
      return;
    }
    case Op::kPutSession:
    case Op::kAttachSession: {
      // Both bodies are optional: no body (or an empty one) means "all defaults".
      auto body = readJsonBody(ex, kJsonBodyLimit, EmptyBody::kEmptyObject);
      if (!body) return;
      bool put = m.op == Op::kPutSession;
      auto settings = parseSessionSettings(*body, /*allow_retention=*/put);
      if (!settings.ok()) return sendError(ex, settings.error());
      auto r = put ? agent_->putSession(m.session, *settings) : agent_->attachSession(m.session, settings->lease);
      if (!r.ok()) return sendError(ex, r.error());
      ex.sendJson(200, *r);
      return;
    }
    default:
      ex.sendError(404, "not_found", "no route");
  }
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

void ApiServer::createSandbox(HttpExchange& ex) {
  auto body = readJsonBody(ex, kJsonBodyLimit);
  if (!body) return;
  auto params = parseCreateRequest(*body, agent_->nodeMemoryBytes());
  if (!params.ok()) {
    agent_->metrics().create_failures_total++;
    return sendError(ex, params.error());
  }
  auto info = agent_->create(*params);
  if (!info.ok()) return sendError(ex, info.error());
  ex.sendJson(201, *info);
}

void ApiServer::exec(HttpExchange& ex, const std::string& id, bool stream) {
  auto body = readJsonBody(ex, kExecBodyLimit);
  if (!body) return;
  auto req = parseExecRequest(*body);
  if (!req.ok()) return sendError(ex, req.error());
  auto lease = agent_->use(id);
  if (!lease.ok()) return sendError(ex, lease.error());
  agent_->metrics().execs_total++;
  if (!stream) {
    // The output is collected within the node's output budget and escaped only as it is written.
    BufferedExecOutput output(&output_budget_);
    auto result = lease->sandbox().execStream(*req, output);
    if (!result.ok()) return sendError(ex, result.error());
    output.respond(ex, *result);
    return;
  }
  NdjsonSink sink(ex);
  auto result = lease->sandbox().execStream(*req, sink);
  if (!result.ok()) {
    if (!sink.started()) return sendError(ex, result.error());
    // Headers are out: report the failure as the last line.
    auto [status, code] = httpStatusFor(result.error().code());
    (void)status;
    sink.writeLast({{"error", {{"code", code}, {"message", result.error().message()}}}, {"done", true}});
    ex.endStream();
    return;
  }
  if (!sink.finish()) return;
  json last = execResultToJson(*result);
  last["stdout"] = "";
  last["stderr"] = "";
  last["done"] = true;
  if (sink.writeLast(last)) ex.endStream();
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
