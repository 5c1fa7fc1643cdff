// POST /v1/sandboxes/{id}/exec, buffered or streamed as NDJSON (ApiServer.h).
#include <mutex>

#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/ExecResponse.h"
#include "dsec/launcher/api/JsonEscape.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr size_t kEscapeSlice = size_t{16} * 1024;  // output bytes escaped at a time (at most 96 KiB out)

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

}  // namespace dsec::launcher
